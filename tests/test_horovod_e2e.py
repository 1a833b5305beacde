"""The Horovod engine, for real: in the second environment (TensorFlow 2.15, Keras 2.15,
Horovod 0.28.1 built with Gloo; `scripts/horovod-env` sets it up once per machine and the
test command passes its python as LOCALDET_HOROVOD_PYTHON), a 2-slot trial runs as two
Horovod ranks under the rank supervisor and ends like the same trial on one slot."""

from __future__ import annotations

import os
import subprocess

import pytest
from conftest import REPO, Home
from test_multi_slot_e2e import (
    SHORT,
    assert_same_weights,
    gan_on_one_and_two_slots,
    one_and_two_slots,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def horovod_python() -> str:
    python = os.environ.get("LOCALDET_HOROVOD_PYTHON")
    if python:
        return python
    setup = subprocess.run([str(REPO / "scripts" / "horovod-env")], capture_output=True,
                           text=True, timeout=1800)
    assert setup.returncode == 0, f"scripts/horovod-env failed:\n{setup.stderr[-4000:]}"
    return setup.stdout.strip().splitlines()[-1]


def test_two_horovod_ranks_end_like_one_slot(tmp_path, horovod_python, daemons):
    home = Home(tmp_path / "home", python=horovod_python)
    one, two, log = one_and_two_slots(home, tmp_path, SHORT, daemons)
    one_trial, trial = one["trials"][0], two["trials"][0]
    assert "[rank 0] [trial" in log and "rank 1 of 2: Horovod" in log
    # Chosen because horovod.tensorflow imports here and TensorFlow 2.15 has Keras 2 only.
    assert (one_trial["engine"], trial["engine"]) == ("single", "horovod")
    assert_same_weights(home, one["id"], two["id"], tmp_path)
    assert one_trial["latest_validation"]["val_accuracy"] == pytest.approx(
        trial["latest_validation"]["val_accuracy"], abs=1e-5)


def test_a_subclassed_gan_on_two_horovod_ranks_ends_like_one_slot(tmp_path, horovod_python,
                                                                 daemons):
    """The GAN-like compat folder's train_step hands its two optimizers their gradients
    itself. Horovod's own DistributedOptimizer averages only the gradients it computes (in
    minimize), so on TensorFlow 2.4 and later each rank would train on its own; the horovod
    engine averages in apply_gradients, and 2 slots end within 1e-5 of 1."""
    home = Home(tmp_path / "home", python=horovod_python)
    one, two, log = gan_on_one_and_two_slots(home, tmp_path, daemons)
    assert (one["engine"], two["engine"]) == ("single", "horovod")
    assert "rank 1 of 2: Horovod" in log


# A head without slots and two worker nodes with one `localdet_slot` each, every Ray process
# on 127.0.0.1, all in the Horovod environment (Ray's workers run its python).
RAY_CLUSTER = """
import sys
from ray.cluster_utils import Cluster
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1,
                                                        "include_dashboard": False})
for _ in range(2):
    cluster.add_node(num_cpus=1, resources={"localdet_slot": 1})
print(cluster.address, flush=True)
sys.stdin.read()  # until the test closes it
cluster.shutdown()
"""


def shut_down(cluster: subprocess.Popen) -> None:
    """Ends the RAY_CLUSTER process its own way: shut down once its stdin closes."""
    cluster.stdin.close()
    cluster.wait(timeout=120)


def test_two_horovod_ranks_on_two_ray_nodes_end_like_one_slot(tmp_path, horovod_python,
                                                               monkeypatch, processes, daemons):
    """Each worker node has one slot, so the 2-slot trial's ranks run one on each, in a
    placement group, joined by Horovod's Gloo rendezvous on rank 0's node. (`processes`
    before `daemons`: on a failure the daemon is stopped before the cluster.)"""
    from conftest import EXAMPLE, write_config

    from localdet.records.db import StateDB

    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    cluster = processes([horovod_python, "-c", RAY_CLUSTER], end=shut_down,
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    home = Home(tmp_path / "home", python=horovod_python)
    address = cluster.stdout.readline().strip()
    assert address, "the Ray cluster did not start"
    daemon = daemons(home, "--ray", address)
    for name, slots in (("one", 1), ("two", 2)):
        home.cli("submit", write_config(tmp_path, name, resources={"slots_per_trial": slots},
                                        **SHORT), EXAMPLE)
    one, two = home.experiment_named("one")["id"], home.experiment_named("two")["id"]
    for experiment in (one, two):
        facts = home.wait_until_ended(experiment, timeout=300)
        assert facts["state"] == "COMPLETED", home.ended_report(experiment)
    daemon.stop()
    shut_down(cluster)
    db = StateDB.open(home.path / "localdet.db")
    try:
        (launch,) = [e["payload"] for e in db.events(two) if e["kind"] == "trial_launched"]
    finally:
        db.close()
    assert launch["engine"] == "horovod" and len(set(launch["nodes"])) == 2
    trial = home.experiment(two)["trials"][0]
    log = (home.path / "experiments" / str(two) / "trials" / str(trial["id"])
           / "trial.log").read_text()
    assert "ranks on Ray nodes" in log.splitlines()[0] and "rank 1 of 2: Horovod" in log
    assert_same_weights(home, one, two, tmp_path)
