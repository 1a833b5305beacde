"""Trials on a real Ray cluster on this machine: a head and two worker nodes, each its own
raylet with its own `localdet_slot`, as Ray's `cluster_utils.Cluster` starts them (every
Ray process on 127.0.0.1).

The trial is `tests/trials/counter` (a real trial process that trains in milliseconds,
through the TrialReporter seam, here over HTTP): its "weights" move by a deterministic step
per batch, so a lost or repeated batch shows in them.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import TEST_TRIALS, Home, wait_for

# Before Ray is imported (it reads this once): every Ray process on 127.0.0.1, none on the
# machine's other addresses. The daemons these tests start inherit it.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

pytestmark = pytest.mark.slow
pytest.importorskip("ray")

COUNTER = TEST_TRIALS / "counter"


@pytest.fixture(scope="module")
def cluster():
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    assert not ray_constants.ENABLE_RAY_CLUSTER, "Ray was imported before the test set it"
    # A node's death is noticed within ~1.5 s rather than Ray's default 15 s.
    fast = {"health_check_period_ms": 500, "health_check_failure_threshold": 3}
    ray_cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "include_dashboard": False, "_system_config": fast})  # no slots
    workers = [ray_cluster.add_node(num_cpus=1, resources={"localdet_slot": 1})
               for _ in range(2)]
    ray_cluster.workers = workers
    yield ray_cluster
    ray_cluster.shutdown()


def counter_config(folder: Path, name: str, searcher: dict, batch_seconds: float,
                   **top) -> Path:
    config = {
        "name": name, "entrypoint_script": "python3 train.py",
        "hyperparameters": {"variant": searcher.pop("variant", 0),
                            "batch_seconds": batch_seconds, "checkpoint_seconds": 0.0,
                            "crash_at": 0},
        "searcher": {"metric": "val_loss", "smaller_is_better": True, **searcher},
        "scheduling_unit": 4, "min_checkpoint_period": {"batches": 4}, "max_restarts": 0,
        "reproducibility": {"experiment_seed": 3}, **top,
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def expected_weights(seed: int, variant: int, batches: int) -> list[float]:
    """The counter trial's weights after `batches` uninterrupted batches."""
    sys.path.insert(0, str(COUNTER))
    try:
        from train import step
    finally:
        sys.path.remove(str(COUNTER))
    weights = np.zeros(4)
    for batch in range(batches):
        weights = step(weights, batch, seed, variant)
    return weights.tolist()


def outcomes(home: Home, experiment_id: int) -> dict:
    """Per trial (by its hyperparameters): state, batches, metric rows and final weights."""
    from localdet.paths import Layout
    from localdet.records.db import StateDB
    from localdet.reporting.sqlite_reporter import CheckpointReader

    layout = Layout(home.path)
    db = StateDB.open(layout.db)
    try:
        found = {}
        for trial in db.trials(experiment_id):
            exported = home.path / "exported" / str(trial.id)
            CheckpointReader(layout).materialize(trial.latest_checkpoint, exported)
            state = json.loads((exported / "state.json").read_text())
            found[json.dumps(trial.hparams, sort_keys=True)] = {
                "state": trial.state, "batches": trial.batches_trained,
                "metrics": [(m.kind, m.batches_trained, m.metrics)
                            for m in db.metrics(trial.id)],
                "weights": state["weights"], "restarts": trial.restarts}
        return found
    finally:
        db.close()


def launches(home: Home, experiment_id: int) -> list[dict]:
    from localdet.records.db import StateDB

    db = StateDB.open(home.path / "localdet.db")
    try:
        return [json.loads(row["payload"]) | {"trial_id": row["trial_id"]}
                for row in db.db.query("SELECT trial_id, payload FROM events WHERE kind = ? "
                                       "AND experiment_id = ? ORDER BY id",
                                       ["trial_launched", experiment_id])]
    finally:
        db.close()


def trial_row(home: Home, trial_id: int):
    from localdet.records.db import StateDB

    db = StateDB.open(home.path / "localdet.db")
    try:
        return db.trial(trial_id)
    finally:
        db.close()


def events(home: Home, kind: str) -> list:
    from localdet.records.db import StateDB

    db = StateDB.open(home.path / "localdet.db")
    try:
        return list(db.db.query("SELECT trial_id FROM events WHERE kind = ?", [kind]))
    finally:
        db.close()


def test_an_asha_search_across_nodes_ends_as_on_the_local_launcher(cluster, tmp_path,
                                                                   daemons):
    asha = {"name": "adaptive_asha", "max_length": {"batches": 16}, "max_trials": 4,
            "max_rungs": 2, "divisor": 2, "max_concurrent_trials": 1,
            "variant": {"type": "int", "minval": 0, "maxval": 9}}
    # The two searches run side by side, each under a daemon of its own.
    homes = {where: Home(tmp_path / where) for where in ("local", "ray")}
    started = {where: daemons(homes[where], *args) for where, args in (
        ("local", ("--slots", "1", "--warm", "1")), ("ray", ("--ray", cluster.address)))}
    for where, home in homes.items():
        home.cli("submit", counter_config(tmp_path, f"asha-{where}", dict(asha), 0.0), COUNTER)
    results = {}
    for where, home in homes.items():
        home.experiment_named(f"asha-{where}")
        facts = home.wait_until_ended(1, timeout=240)
        assert facts["state"] == "COMPLETED", home.ended_report(1)
        results[where] = (outcomes(home, 1), launches(home, 1))
    for daemon in started.values():
        daemon.stop()
    (local, _), (on_ray, ray_launches) = results["local"], results["ray"]
    assert on_ray == local and len(local) == 4
    assert {len(t["metrics"]) for t in local.values()} != {0}
    # Each launch recorded where it ran; the search used both worker nodes.
    nodes = {launch["node"] for launch in ray_launches}
    assert len(nodes) == 2 and all(launch["host"] == "127.0.0.1" for launch in ray_launches)
    status = Home(tmp_path / "ray").cli("status", "1").stdout
    assert "Node" in status and "127.0.0.1" in status
    trial_log = (tmp_path / "ray" / "experiments" / "1" / "trials" / "1" / "trial.log")
    assert "on Ray node 127.0.0.1" in trial_log.read_text().splitlines()[0]


def test_remote_trials_pause_resume_and_outlive_a_daemon_killed_with_9(cluster, tmp_path,
                                                                       daemons):
    home = Home(tmp_path / "home")
    single = {"name": "single", "max_length": {"batches": 80}, "variant": 1}
    config = counter_config(tmp_path, "remote", single, 0.04)
    daemon = daemons(home, "--ray", cluster.address)
    home.cli("submit", config, COUNTER)
    home.experiment_named("remote")
    wait_for(lambda: home.first_trial(1).get("batches_trained", 0) >= 12, 120,
             "the trial to train on its node", 0.1)
    home.cli("pause", "1")
    wait_for(lambda: home.first_trial(1)["state"] == "PAUSED", 60,
             "the remote trial to pause", 0.1)
    paused_at = home.experiment(1)["trials"][0]["batches_trained"]
    assert 12 <= paused_at < 80
    home.cli("resume", "1")
    wait_for(lambda: home.first_trial(1)["batches_trained"] > paused_at + 8,
             120, "the resumed trial to train", 0.1)
    daemon.process.send_signal(signal.SIGKILL)  # its actor is detached: it goes on
    daemon.process.wait()
    daemon = daemons(home, "--ray", cluster.address)
    facts = home.wait_until_ended(1, timeout=180)
    assert facts["state"] == "COMPLETED", home.ended_report(1)
    assert "adopted trial 1 (Ray actor" in daemon.log_path.read_text()
    daemon.stop()
    # Two launches (before and after the pause), none after the kill: adopted, not rerun.
    assert len(launches(home, 1)) == 2
    (trial,) = outcomes(home, 1).values()
    assert trial["weights"] == expected_weights(trial_row(home, 1).seed, 1, 80)
    assert [b for kind, b, _ in trial["metrics"] if kind == "training"] == list(range(4, 81, 4))

    # Killing a remote trial ends its actor and its process.
    home2 = Home(tmp_path / "kill")
    daemons(home2, "--ray", cluster.address)
    home2.cli("submit", counter_config(tmp_path, "killed", dict(single), 0.05), COUNTER)
    home2.experiment_named("killed")
    wait_for(lambda: home2.first_trial(1).get("batches_trained", 0) >= 4, 120,
             "the trial to train", 0.1)
    running = trial_row(home2, 1)
    home2.cli("kill", "1")
    assert home2.wait_until_ended(1, timeout=60)["state"] == "CANCELED"
    import ray

    from localdet.scheduling.ray_cluster import actor_name

    ray.init(address=cluster.address, namespace=_namespace(home2), log_to_driver=False)
    try:
        wait_for(lambda: not _actor_alive(actor_name(running)), 30,
                 "the trial's actor to end", 0.1)
    finally:
        ray.shutdown()
    pid = running.pid
    wait_for(lambda: not Path(f"/proc/{pid}").exists(), 30, "the trial process to end", 0.1)


def _namespace(home: Home) -> str:
    from localdet.paths import Layout
    from localdet.scheduling.ray_cluster import namespace_of

    return namespace_of(Layout(home.path))


def _actor_alive(name: str) -> bool:
    import ray

    try:
        ray.get_actor(name)  # a dead actor's name is free again
        return True
    except ValueError:
        return False


# Appended to a model_def.py: its process lingers 6 s after its work, then notes when.
LINGER = """

import atexit as _atexit
import os as _os
import time as _time


@_atexit.register
def _linger():
    _time.sleep(6)
    with open(_os.path.join(_os.environ["LOCALDET_TRIAL_DIR"], "torn-down"), "w") as out:
        out.write(str(_time.time()))
"""


def test_a_keras_2_trial_on_two_nodes_paused_and_resumed_ends_like_one_slot(cluster, tmp_path,
                                                                            daemons):
    """Each worker node has one slot: a 2-slot Keras 2 trial runs one rank on each, in a
    placement group, their gradients averaged through the trial's process group
    (gradient_allreduce, Horovod's semantics without Horovod); paused and
    resumed (both ranks stop, and start again on both nodes), it ends within 1e-5 of the
    same trial on one slot. A Keras 3 trial (one process) cannot span nodes: refused at
    submission.

    The 1-slot trial runs while the 2-node one is paused, and lingers after its work is
    recorded (as a slow TensorFlow teardown does): its actor holds its node's slot until it
    ends, so the resumed trial starts after that, with no launch deferred meanwhile (in CI
    the launch waited on a slot the daemon had let go of early, blocking the daemon, which
    never reaped the actor holding it)."""
    import shutil

    from conftest import EXAMPLE, write_config
    from test_multi_slot_e2e import KERAS2, assert_same_weights, pause_soon_after

    lingering = tmp_path / "lingering"
    shutil.copytree(EXAMPLE, lingering)
    with open(lingering / "model_def.py", "a") as model_def:
        model_def.write(LINGER)
    config = dict(KERAS2, scheduling_unit=10,
                  searcher=dict(KERAS2["searcher"], max_length={"batches": 100}))
    home = Home(tmp_path / "home")
    daemon = daemons(home, "--ray", cluster.address)
    for name, slots, folder in (("two", 2, EXAMPLE), ("one", 1, lingering)):
        # two first: it takes both nodes
        home.cli("submit", write_config(tmp_path, name, resources={"slots_per_trial": slots},
                                        **config), folder)
    two, one = (home.experiment_named(name)["id"] for name in ("two", "one"))
    pause_soon_after(home, two, 20)
    wait_for(lambda: home.first_trial(two)["state"] == "PAUSED", 120,
             "the 2-node trial to pause", 0.1)
    assert home.experiment(two)["trials"][0]["batches_trained"] < 100
    wait_for(lambda: home.first_trial(one).get("state") == "RUNNING", 120,
             "the 1-slot trial to start on a freed node", 0.1)
    home.cli("resume", str(two))
    for experiment in (one, two):
        facts = home.wait_until_ended(experiment, timeout=300)
        assert facts["state"] == "COMPLETED", home.ended_report(experiment)
    one_trial, two_trial = home.first_trial(one), home.first_trial(two)
    torn_down = float((home.path / "experiments" / str(one) / "trials" / str(one_trial["id"])
                       / "torn-down").read_text())
    assert datetime.fromisoformat(two_trial["started_at"]).timestamp() > torn_down
    assert not events(home, "trial_launch_deferred")
    keras3 = tmp_path / "keras3"
    write_config(keras3, "keras3", resources={"slots_per_trial": 2},
                 environment={"environment_variables": ["TF_USE_LEGACY_KERAS=0"]})
    (keras3 / "model_def.py").write_text((EXAMPLE / "model_def.py").read_text())
    keras3.rename(home.path / "queue" / "keras3")  # whole, at once
    error = home.path / "queue" / "rejected" / "keras3" / "error.txt"
    wait_for(error.exists, 60, "the Keras 3 submission to be refused", 0.1)
    assert ("no node of the Ray cluster has more than 1 slot(s), and engine mirrored keeps "
            "a trial within one node") in error.read_text()
    daemon.stop()
    first, second = launches(home, two)
    for launch in (first, second):
        assert launch["engine"] == "gradient_allreduce" and len(set(launch["nodes"])) == 2
    assert_same_weights(home, one, two, tmp_path)
    # status names both nodes of the trial's latest launch
    assert home.experiment(two)["trials"][0]["node"].count("127.0.0.1 (") == 2
    trial = home.experiment(two)["trials"][0]["id"]
    log = (home.path / "experiments" / str(two) / "trials" / str(trial) / "trial.log").read_text()
    assert "ranks on Ray nodes" in log.splitlines()[0]
    assert "[rank 0] " in log and "[rank 1] " in log


def test_a_trial_whose_node_dies_restarts_elsewhere_and_ends_bit_identical(cluster, tmp_path,
                                                                            daemons):
    home = Home(tmp_path / "home")
    single = {"name": "single", "max_length": {"batches": 80}, "variant": 2}
    daemon = daemons(home, "--ray", cluster.address)
    home.cli("submit", counter_config(tmp_path, "node-lost", single, 0.05), COUNTER)
    home.experiment_named("node-lost")
    wait_for(lambda: home.first_trial(1).get("batches_trained", 0) >= 16, 120,
             "the trial to checkpoint on its node", 0.1)
    (first,) = launches(home, 1)
    node = next(n for n in cluster.workers if n.node_id == first["node"])
    cluster.remove_node(node, allow_graceful=False)  # the machine goes away
    facts = home.wait_until_ended(1, timeout=180)
    assert facts["state"] == "COMPLETED", home.ended_report(1)
    daemon.stop()
    first, second = launches(home, 1)
    assert second["node"] != first["node"]
    assert len(events(home, "trial_node_lost")) == 1
    trial = trial_row(home, 1)
    assert trial.restarts == 0  # a lost node is not the trial's failure
    (outcome,) = outcomes(home, 1).values()
    assert outcome["weights"] == expected_weights(trial.seed, 2, 80)
    assert "was lost; the trial starts again" in daemon.log_path.read_text()
