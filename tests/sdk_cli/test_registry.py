"""The model registry (localdet/operations/registry.py): models and their numbered versions,
the listings' order and filters, the refusals, and retention and gc keeping a registered
checkpoint until its version is deleted."""

from __future__ import annotations

import time
import uuid as uuidlib

import pytest

from localdet.checkpoints import gc
from localdet.checkpoints.manifest import build_manifest
from localdet.checkpoints.store import Store
from localdet.config.experiment import parse_config
from localdet.operations import registry
from localdet.operations.errors import NotFound, OperationError
from localdet.records.db import CheckpointDeleted, StateDB


def make_experiment(db: StateDB) -> tuple[int, int]:
    """An ended single-trial experiment that keeps only its latest checkpoint."""
    config = parse_config({
        "name": "reg", "entrypoint": "model_def:Trial",
        "hyperparameters": {"global_batch_size": 8},
        "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 300}},
        "checkpoint_storage": {"save_trial_latest": 1, "save_trial_best": 0}}).config
    experiment_id = db.create_experiment(
        name="reg", description="", config=config, original_config="", searcher="single",
        metric="val_loss", smaller_is_better=True, experiment_seed=1, model_dir="")
    trial_id = db.create_trial(experiment_id=experiment_id, request_id=1, hparams={}, seed=1,
                               target_batches=300)
    return experiment_id, trial_id


def save(db: StateDB, store: Store, experiment_id: int, trial_id: int, batches: int) -> str:
    uuid = str(uuidlib.uuid4())
    with store.writing():
        files = {"weights.h5": store.put_bytes(f"{uuid} weights".encode())}
        db.add_checkpoint(build_manifest(uuid=uuid, experiment_id=experiment_id,
                                         trial_id=trial_id, batches_trained=batches,
                                         files=files, metadata={"note": batches}))
    return uuid


@pytest.fixture
def checkpoints(layout, db):
    """Three checkpoints of a COMPLETED trial: retention keeps only the newest."""
    store = Store(layout.store)
    experiment_id, trial_id = make_experiment(db)
    uuids = [save(db, store, experiment_id, trial_id, b) for b in (100, 200, 300)]
    db.record_metrics(trial_id, "validation", 300, {"val_loss": 0.25})
    db.update_trial(trial_id, state="COMPLETED")
    db.set_experiment_state(experiment_id, "COMPLETED")
    return experiment_id, uuids


def test_models_are_created_listed_sorted_filtered_and_updated(db):
    first = registry.create_model(db, "mnist", description="digits", labels=["prod", "cv"],
                                  metadata={"owner": "ana"}, notes="# readme")
    assert first["name"] == "mnist" and first["labels"] == ["prod", "cv"]
    assert first["metadata"] == {"owner": "ana"} and first["num_versions"] == 0
    registry.create_model(db, "Audio", description="a")
    registry.create_model(db, "zeta", description="b")
    assert registry.get_model(db, first["id"]) == registry.get_model(db, "mnist")

    names = [m["name"] for m in registry.list_models(db)]
    assert names == ["Audio", "mnist", "zeta"]  # by name, as Determined's default
    assert [m["name"] for m in registry.list_models(db, order="desc")] == names[::-1]
    by_creation = [m["name"] for m in registry.list_models(db, sort_by="creation_time")]
    assert by_creation == ["mnist", "Audio", "zeta"]  # ties broken by id, in order
    assert [m["name"] for m in registry.list_models(db, sort_by="description")] == \
        ["Audio", "zeta", "mnist"]
    assert [m["name"] for m in registry.list_models(db, name="NIS")] == ["mnist"]
    assert [m["name"] for m in registry.list_models(db, labels=["cv", "nope"])] == ["mnist"]

    time.sleep(0.002)  # the times are in milliseconds: the update comes strictly later
    updated = registry.update_model(db, "mnist", description="handwritten digits",
                                    labels=["prod"], metadata={"owner": "bo"})
    assert (updated["description"], updated["labels"], updated["metadata"]) == \
        ("handwritten digits", ["prod"], {"owner": "bo"})
    assert updated["last_updated_time"] >= first["last_updated_time"]
    assert registry.list_models(db, sort_by="last_updated_time")[-1]["name"] == "mnist"

    registry.archive_model(db, "zeta")
    assert [m["name"] for m in registry.list_models(db)] == ["Audio", "mnist"]
    assert [m["name"] for m in registry.list_models(db, archived=True)] == ["zeta"]
    assert len(registry.list_models(db, archived=None)) == 3
    with pytest.raises(OperationError, match="archived and cannot be changed"):
        registry.update_model(db, "zeta", description="x")
    assert registry.unarchive_model(db, "zeta")["archived"] is False


@pytest.mark.parametrize("name, problem", [
    ("", "blank"), ("  ", "blank"), ("a  b", "two spaces"), ("a/b", "slash"),
    ("123", "only digits"),
])
def test_model_names_follow_determined_rules(db, name, problem):
    with pytest.raises(OperationError, match=problem):
        registry.create_model(db, name)


def test_refusals_are_one_sentence(db, checkpoints):
    registry.create_model(db, "mnist")
    with pytest.raises(OperationError, match="already exists"):
        registry.create_model(db, "mnist")
    with pytest.raises(NotFound, match="no model 'nope'"):
        registry.get_model(db, "nope")
    with pytest.raises(NotFound, match="no model '99'"):
        registry.get_model(db, 99)
    with pytest.raises(NotFound, match="no checkpoint matches"):
        registry.register_version(db, "mnist", "not-a-checkpoint")
    with pytest.raises(NotFound, match="has no version 4"):
        registry.get_version(db, "mnist", 4)
    with pytest.raises(OperationError, match="sorted by"):
        registry.list_models(db, sort_by="size")
    with pytest.raises(OperationError, match="cannot be set"):
        registry.update_model(db, "mnist", owner="x")
    registry.archive_model(db, "mnist")
    with pytest.raises(OperationError, match="archived and cannot register"):
        registry.register_version(db, "mnist", checkpoints[1][-1])


def test_versions_are_numbered_from_one_and_never_reuse_a_deleted_number(db, checkpoints):
    _, uuids = checkpoints
    registry.create_model(db, "mnist")
    assert registry.get_version(db, "mnist") is None  # none yet, as Determined's -1
    first = registry.register_version(db, "mnist", uuids[2][:8], name="v-one",
                                      comment="first", labels=["a"], metadata={"k": 1},
                                      notes="n")
    assert first["version"] == 1 and first["checkpoint_uuid"] == uuids[2]  # a prefix works
    assert first["checkpoint"]["uuid"] == uuids[2]
    assert first["checkpoint"]["batches_trained"] == 300
    assert first["checkpoint"]["validation_metrics"] == {"val_loss": 0.25}
    assert (first["name"], first["comment"], first["labels"], first["metadata"],
            first["notes"]) == ("v-one", "first", ["a"], {"k": 1}, "n")
    assert registry.register_version(db, "mnist", uuids[2])["version"] == 2
    assert registry.register_version(db, "mnist", uuids[2])["version"] == 3
    assert [v["version"] for v in registry.list_versions(db, "mnist")] == [3, 2, 1]
    assert [v["version"] for v in registry.list_versions(db, "mnist", "asc")] == [1, 2, 3]

    registry.delete_version(db, "mnist", 3)  # the newest: its number is not given again
    assert registry.get_version(db, "mnist")["version"] == 2
    assert registry.register_version(db, "mnist", uuids[2])["version"] == 4
    assert registry.get_model(db, "mnist")["num_versions"] == 3

    changed = registry.update_version(db, "mnist", 1, comment="better", labels=["b"])
    assert (changed["comment"], changed["labels"], changed["name"]) == ("better", ["b"], "v-one")
    # Another model numbers its own versions from 1.
    registry.create_model(db, "other")
    assert registry.register_version(db, "other", uuids[2])["version"] == 1

    deleted = registry.delete_model(db, "mnist")  # with its versions, as Determined
    assert deleted["versions"] == [1, 2, 4]
    assert [m["name"] for m in registry.list_models(db)] == ["other"]
    assert db.db.execute("SELECT count(*) FROM model_versions").fetchone()[0] == 1


def test_retention_and_gc_keep_a_registered_checkpoint_until_its_version_is_deleted(
        layout, db, checkpoints):
    experiment_id, (oldest, middle, newest) = checkpoints
    registry.create_model(db, "mnist")
    registry.register_version(db, "mnist", oldest)
    registry.create_model(db, "other")  # a second version naming it keeps it too
    registry.register_version(db, "other", oldest)

    report = gc.collect(layout, db, experiment_id)
    assert {d.uuid for d in report.deleted} == {middle}  # retention keeps only the newest
    assert {c.uuid for c in db.checkpoints(experiment_id)} == {oldest, newest}
    blob = db.checkpoint(oldest).manifest["files"]["weights.h5"]["sha256"]
    assert Store(layout.store).has(blob)  # its files too

    registry.delete_version(db, "mnist", 1)
    assert gc.collect(layout, db, experiment_id).deleted == []  # "other" still names it
    registry.delete_model(db, "other")
    report = gc.collect(layout, db, experiment_id)
    assert {d.uuid for d in report.deleted} == {oldest} and report.blobs_deleted == 1
    assert [c.uuid for c in db.checkpoints(experiment_id)] == [newest]
    assert not Store(layout.store).has(blob)

    # Registering a checkpoint that retention deleted: refused, naming the retention.
    registry.create_model(db, "late")
    with pytest.raises(CheckpointDeleted, match="deleted by retention"):
        registry.register_version(db, "late", oldest)
    assert registry.list_versions(db, "late") == []


def test_trial_code_cannot_delete_a_registered_checkpoint(layout, db, checkpoints,
                                                          monkeypatch):
    from localdet.reporting.factory import LocaldetReporterFactory

    _, (oldest, middle, _) = checkpoints
    registry.create_model(db, "mnist")
    registry.register_version(db, "mnist", oldest)
    monkeypatch.setenv("LOCALDET_HOME", str(layout.home))
    with pytest.raises(RuntimeError, match="registered as a model version"):
        LocaldetReporterFactory().delete_checkpoint(oldest)
    assert db.checkpoint(oldest).state == "COMPLETED"
    LocaldetReporterFactory().delete_checkpoint(middle)  # one no version names: deleted
    assert [c.uuid for c in db.checkpoints(include_deleted=True)
            if c.state == "DELETED"] == [middle]
