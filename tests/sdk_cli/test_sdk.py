"""The Python SDK (`from determined.experimental import client`) over localdet's records,
and the checkpoint operations under it (localdet/operations/checkpoints.py).

The first tests build records in-process (no daemon, no training): sorting, the best
checkpoint, metadata, deletion and the SDK's objects over them. The last one is the seeds'
downstream flow against a real daemon: create, wait, top_checkpoint().download(),
load_model_from_checkpoint_path, evaluate; and on the same records what the CLI shows
(listing, trial, metrics, labels, archive, the registry, pause and kill)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid as uuidlib
from pathlib import Path

import numpy as np
import pytest
from conftest import EXAMPLE, Home, wait_for, write_config

from localdet.checkpoints.manifest import build_manifest
from localdet.checkpoints.store import Store
from localdet.config.experiment import parse_config
from localdet.operations import checkpoints as ops
from localdet.operations import registry
from localdet.operations.errors import NotFound, OperationError
from localdet.records.db import StateDB


def make_experiment(db: StateDB, metric: str = "val_loss", smaller_is_better: bool = True
                    ) -> int:
    config = parse_config({
        "name": "sdk", "entrypoint": "model_def:Trial",
        "hyperparameters": {"global_batch_size": 8},
        "searcher": {"name": "single", "metric": metric, "smaller_is_better": smaller_is_better,
                     "max_length": {"batches": 400}}}).config
    return db.create_experiment(
        name="sdk", description="", config=config, original_config="", searcher="single",
        metric=metric, smaller_is_better=smaller_is_better, experiment_seed=1,
        model_dir="/nowhere")


def save(db: StateDB, store: Store, experiment_id: int, trial_id: int, batches: int,
         validation: dict | None = None) -> str:
    uuid = str(uuidlib.uuid4())
    with store.writing():
        files = {"metadata.json": store.put_bytes(json.dumps({"at": batches}).encode()),
                 "weights.h5": store.put_bytes(f"{uuid} weights".encode())}
        db.add_checkpoint(build_manifest(uuid=uuid, experiment_id=experiment_id,
                                         trial_id=trial_id, batches_trained=batches,
                                         files=files, metadata={"format": "test"}))
    if validation is not None:
        db.record_metrics(trial_id, "validation", batches, validation)
    return uuid


@pytest.fixture
def recorded(layout, db):
    """One experiment (val_loss, smaller is better), two trials, four checkpoints."""
    experiment_id = make_experiment(db)
    store = Store(layout.store)
    first = db.create_trial(experiment_id=experiment_id, request_id=1, hparams={"lr": 1},
                            seed=1, target_batches=400)
    second = db.create_trial(experiment_id=experiment_id, request_id=2, hparams={"lr": 2},
                             seed=2, target_batches=400)
    uuids = {
        "a": save(db, store, experiment_id, first, 100, {"val_loss": 0.5, "acc": 0.7}),
        "b": save(db, store, experiment_id, first, 200, {"val_loss": 0.3, "acc": 0.6}),
        "c": save(db, store, experiment_id, second, 100, {"val_loss": 0.4, "acc": 0.9}),
        "d": save(db, store, experiment_id, second, 300),  # never validated
    }
    for trial in (first, second):
        db.update_trial(trial, state="RUNNING")
        db.update_trial(trial, state="COMPLETED")
    db.set_experiment_state(experiment_id, "COMPLETED")
    return experiment_id, (first, second), uuids


def test_checkpoints_sort_as_determined_listed_them(layout, db, recorded):
    experiment_id, (first, second), u = recorded

    def listed(**arguments):
        return [c["uuid"] for c in ops.list_checkpoints(db, experiment_id, **arguments)]

    # Default: the searcher metric, best first; the unvalidated one last.
    assert listed() == [u["b"], u["c"], u["a"], u["d"]]
    assert listed(order="desc") == [u["a"], u["c"], u["b"], u["d"]]
    assert listed(metric="acc", order="desc") == [u["c"], u["a"], u["b"], u["d"]]
    assert listed(sort_by="batch_number", order="desc")[0] == u["d"]
    assert listed(sort_by="trial_id", max_results=2) == [u["a"], u["b"]]
    assert [c["uuid"] for c in ops.list_checkpoints(db, trial_id=second)] == [u["c"], u["d"]]
    assert ops.top_checkpoint(db, experiment_id)["uuid"] == u["b"]
    assert ops.top_checkpoint(db, trial_id=second)["uuid"] == u["c"]
    assert ops.top_checkpoint(db, experiment_id, metric="acc",
                              smaller_is_better=False)["uuid"] == u["c"]
    with pytest.raises(OperationError, match="cannot sort checkpoints by 'size'"):
        ops.list_checkpoints(db, experiment_id, sort_by="size")
    with pytest.raises(NotFound, match="99"):
        ops.list_checkpoints(db, 99)


def test_describe_download_metadata_and_delete(layout, db, recorded, tmp_path):
    experiment_id, (first, _), u = recorded
    facts = ops.describe_checkpoint(layout, db, u["b"][:8])
    assert facts["uuid"] == u["b"] and facts["hparams"] == {"lr": 1}
    assert facts["validation_metrics"] == {"val_loss": 0.3, "acc": 0.6}
    assert set(facts["resources"]) == {"metadata.json", "weights.h5"}
    assert facts["experiment_config"]["searcher"]["metric"] == "val_loss"

    folder = ops.download_checkpoint(layout, db, u["b"], tmp_path / "out")
    assert (folder / "weights.h5").read_text() == f"{u['b']} weights"
    # A folder already holding the checkpoint is taken as downloaded, as Determined did.
    assert ops.download_checkpoint(layout, db, u["b"], tmp_path / "out") == folder
    with pytest.raises(OperationError, match="not empty"):  # `localdet checkpoint export`
        ops.download_checkpoint(layout, db, u["b"], tmp_path / "out", reuse=False)

    assert ops.add_metadata(db, u["b"], {"stage": "prod", "n": 1}) == {
        "format": "test", "stage": "prod", "n": 1}
    assert ops.remove_metadata(db, u["b"], ["n", "absent"]) == {"format": "test",
                                                                 "stage": "prod"}
    assert db.checkpoint(u["b"]).metadata["stage"] == "prod"

    registry.create_model(db, "digits")
    registry.register_version(db, "digits", u["b"])
    with pytest.raises(OperationError, match="version 1 of model 'digits'"):
        ops.delete_checkpoint(layout, db, u["b"])
    assert ops.delete_checkpoint(layout, db, u["a"])["state"] == "DELETED"
    assert u["a"] not in [c["uuid"] for c in ops.list_checkpoints(db, experiment_id)]
    with pytest.raises(NotFound):
        ops.describe_checkpoint(layout, db, u["a"])


def test_the_sdk_reads_and_changes_the_same_records(layout, db, recorded, tmp_path,
                                                   monkeypatch):
    from determined.common.api import errors
    from determined.experimental import client

    experiment_id, (first, second), u = recorded
    monkeypatch.setenv("LOCALDET_HOME", str(layout.home))
    monkeypatch.chdir(tmp_path)
    client.login(master="http://nowhere:8080", user="determined")  # accepted, harmless

    exp = client.get_experiment(experiment_id)
    assert exp.state == client.ExperimentState.COMPLETED
    assert exp.config["searcher"]["metric"] == "val_loss"
    with pytest.warns(FutureWarning):
        best = exp.top_checkpoint()
    assert best.uuid == u["b"] and best.state == client.CheckpointState.COMPLETED
    assert best.training.trial_id == first
    assert best.training.validation_metrics["avgMetrics"]["val_loss"] == 0.3
    (latest,) = exp.list_checkpoints(client.CheckpointSortBy.BATCH_NUMBER,
                                     client.OrderBy.DESC, max_results=1)
    assert latest.uuid == u["d"]
    assert latest.training.experiment_config["searcher"]["metric"] == "val_loss"
    with pytest.raises(AssertionError):
        exp.list_checkpoints(sort_by="acc")  # both or neither, as Determined
    path = best.download()
    assert path == str(Path("checkpoints", u["b"]))
    assert (tmp_path / path / "weights.h5").exists()

    trials = exp.list_trials()
    assert [t.id for t in trials] == [first, second]
    assert trials[1].state == client.TrialState.COMPLETED and trials[1].hparams == {"lr": 2}
    trial = client.get_trial(second)
    assert trial.get_experiment().id == experiment_id
    assert trial.summary_metrics["validation_metrics"]["val_loss"]["min"] == 0.4
    assert trial.top_checkpoint().uuid == u["c"]
    reports = list(client.iter_trials_metrics([first, second], group="validation"))
    assert [(m.trial_id, m.steps_completed) for m in reports] == [(first, 100), (first, 200),
                                                                  (second, 100)]
    assert isinstance(reports[0], client.TrialMetrics) and reports[0].group == "validation"

    checkpoint = client.get_checkpoint(u["c"][:8])
    checkpoint.add_metadata({"stage": "staging"})
    assert db.checkpoint(u["c"]).metadata == {"format": "test", "stage": "staging"}
    checkpoint.remove_metadata(["stage"])
    assert client.get_checkpoint(u["c"]).metadata == {"format": "test"}

    exp.add_label("baseline")
    exp.set_description("the first try")
    assert exp.labels == {"baseline"} and exp.description == "the first try"
    assert [e.id for e in client.list_experiments(labels=["baseline"])] == [experiment_id]
    assert client.list_experiments(labels=["other"]) == []
    exp.archive()
    assert client.get_experiment(experiment_id).archived is True
    exp.unarchive()

    model = client.create_model("digits", description="handwritten", metadata={"v": 1})
    assert model.get_version() is None  # no versions yet, as Determined
    version = model.register_version(u["b"])
    assert (version.model_version, version.checkpoint.uuid) == (1, u["b"])
    assert client.get_model("digits").get_version().checkpoint.uuid == u["b"]
    assert [m.name for m in client.list_models()] == ["digits"]
    with pytest.raises(errors.NotFoundException):
        client.get_model("digits").get_version(5)
    with pytest.raises(errors.NotFoundException):
        client.Model(name="absent").get_version()
    with pytest.raises(errors.NotFoundException):
        client.get_experiment(999)
    with pytest.raises(errors.APIException, match="registered"):
        client.get_checkpoint(u["b"]).delete()


def test_without_a_backend_the_sdk_says_what_to_install(monkeypatch):
    import importlib.metadata

    from determined.common.experimental import _backend
    from determined.experimental import client

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [])
    _backend.backend.cache_clear()
    try:
        with pytest.raises(RuntimeError) as raised:
            client.get_experiment(1)
    finally:
        _backend.backend.cache_clear()
    assert str(raised.value).count(". ") == 0 and "pip install localdet" in str(raised.value)


# -- against a real daemon -----------------------------------------------------------------
CHECK_DOWNSTREAM = """
import sys
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from determined import keras
from determined.experimental import client

checkpoint = client.get_experiment(int(sys.argv[1])).top_checkpoint()
path = checkpoint.download(sys.argv[2])
model = keras.load_model_from_checkpoint_path(path)
x, y = load_digits(return_X_y=True)
_, x_val, _, y_val = train_test_split((x / 16.0).astype("float32"), y.astype("int32"),
                                      test_size=0.2, random_state=0)
loss, accuracy = model.evaluate(x_val, y_val, verbose=0)
print(checkpoint.uuid, accuracy)
"""


@pytest.mark.slow
def test_the_seeds_downstream_flow_against_a_daemon(tmp_path, daemons, monkeypatch):
    from determined.common.api import errors
    from determined.experimental import client

    home = Home(tmp_path / "home")
    daemons(home)
    monkeypatch.setenv("LOCALDET_HOME", str(home.path))
    monkeypatch.chdir(tmp_path)
    config = write_config(tmp_path, "sdk-digits", searcher={
        "name": "single", "metric": "val_accuracy", "smaller_is_better": False,
        "max_length": {"batches": 20}}, min_validation_period={"batches": 10},
        min_checkpoint_period={"batches": 10})

    exp = client.create_experiment(str(config), str(EXAMPLE))
    assert exp.state == client.ExperimentState.ACTIVE
    assert exp.wait(interval=0.5) == client.ExperimentState.COMPLETED

    # The seed's downstream script, in a process of its own.
    result = subprocess.run([sys.executable, "-c", CHECK_DOWNSTREAM, str(exp.id),
                             str(tmp_path / "best")], env=home.env, capture_output=True,
                            text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    best_uuid, accuracy = result.stdout.split()[-2:]
    status = home.json("status", exp.id)
    assert status["state"] == "COMPLETED" and 0.0 <= float(accuracy) <= 1.0
    # The CLI's best checkpoint is the SDK's.
    assert home.json("checkpoints", exp.id, "--best")[0]["uuid"] == best_uuid

    # The same records as the CLI shows.
    assert exp.id in [e.id for e in client.list_experiments()]
    (trial,) = exp.list_trials()
    assert trial.id == status["trials"][0]["id"]
    assert client.get_trial(trial.id).state == client.TrialState.COMPLETED
    validations = list(trial.iter_metrics("validation"))
    assert [m.steps_completed for m in validations] == [10, 20]
    assert validations[-1].metrics["val_accuracy"] == \
        status["trials"][0]["latest_validation"]["val_accuracy"]
    assert any("val_accuracy" in line or "batch" in line for line in trial.iter_logs(tail=50))

    checkpoint = client.get_checkpoint(best_uuid)
    checkpoint.add_metadata({"stage": "prod"})
    assert {c["uuid"]: c["metadata"] for c in home.json("checkpoints", exp.id)}[
        best_uuid]["stage"] == "prod"
    exp.add_label("sdk")
    exp.archive()
    assert client.get_experiment(exp.id).archived is True
    assert exp.id not in [e.id for e in client.list_experiments(labels=["other"])]

    model = client.create_model("digits-sdk")
    version = model.register_version(best_uuid)
    path = version.checkpoint.download(str(tmp_path / "registered"))
    assert (Path(path) / "metadata.json").exists()
    # Determined 0.17's Checkpoint.load: the folder already downloaded, then the model.
    assert version.checkpoint.load(path).predict(np.zeros((1, 64)), verbose=0).shape == (1, 10)

    # Pause and kill on a second, longer experiment.
    longer = write_config(tmp_path, "sdk-long", searcher={
        "name": "single", "metric": "val_accuracy", "smaller_is_better": False,
        "max_length": {"batches": 100000}})
    second = client.create_experiment(longer, EXAMPLE)
    second.pause()
    wait_for(lambda: client.get_experiment(second.id).state == client.ExperimentState.PAUSED,
             60, "the experiment to pause", 0.2)
    with pytest.raises(ValueError, match="paused"):
        second.wait(interval=0.1)
    second.activate()
    wait_for(lambda: home.experiment(second.id)["state"] == "ACTIVE", 60,
             "the experiment to be active again", 0.2)
    second.kill()  # a request the daemon acts on: the experiment ends, as the CLI shows
    wait_for(lambda: home.experiment(second.id)["state"] == "CANCELED", 60,
             "the killed experiment to end", 0.5)
    assert second.wait(interval=0.2) == client.ExperimentState.CANCELED
    second.delete()
    with pytest.raises(errors.NotFoundException):
        client.get_experiment(second.id)
    assert second.id not in [e["id"] for e in home.json("status")]
