"""Tests of localdet.records.db.StateDB on a real SQLite file: schema, metrics, events,
checkpoints."""

from __future__ import annotations

import sqlite3
import uuid as uuidlib

import pytest

from localdet.checkpoints.manifest import build_manifest
from localdet.checkpoints.store import FileEntry
from localdet.records.db import CheckpointDeleted, NotFound, StateDB

TABLES = ("experiments", "trials", "metrics", "checkpoints", "events")


def make_experiment(db: StateDB, name: str = "exp", metric: str = "val_loss",
                    smaller_is_better: bool = True) -> int:
    return db.create_experiment(
        name=name, description="", config={"searcher": {"name": "single"}},
        original_config="name: exp\n", searcher="single", metric=metric,
        smaller_is_better=smaller_is_better, experiment_seed=7, model_dir="/nowhere")


def make_trial(db: StateDB, experiment_id: int, request_id: int = 1,
               target_batches: int = 100) -> int:
    return db.create_trial(experiment_id=experiment_id, request_id=request_id,
                           hparams={"lr": 0.1}, seed=3, target_batches=target_batches)


def make_manifest(experiment_id: int, trial_id: int, batches: int, uuid: str | None = None,
                  metadata: dict | None = None) -> dict:
    return build_manifest(uuid=uuid or str(uuidlib.uuid4()), experiment_id=experiment_id,
                          trial_id=trial_id, batches_trained=batches,
                          files={"determined-keras-model.h5": FileEntry("a" * 64, 1000),
                                 "code/model_def.py": FileEntry("b" * 64, 24)},
                          metadata=metadata or {})


# -- schema and migrations ------------------------------------------------------------------

def test_open_creates_the_tables_in_wal_mode(layout, db):
    assert layout.db.is_file()
    for table in TABLES:
        assert db.db[table].exists(), table
    assert db.db.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal"
    # A second, independent connection sees WAL too: it is a property of the file.
    raw = sqlite3.connect(layout.db)
    try:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal"
    finally:
        raw.close()


def test_open_creates_missing_parent_folders(tmp_path):
    path = tmp_path / "deep" / "er" / "localdet.db"
    StateDB.open(path).close()
    assert path.is_file()


def test_reopening_applies_no_migration_twice(layout):
    first = StateDB.open(layout.db)
    experiment_id = make_experiment(first)
    applied = [tuple(r) for r in first.db.execute(
        "SELECT migration_set, name FROM _sqlite_migrations").fetchall()]
    first.close()
    assert applied and all(s == "localdet" for s, _ in applied)
    assert len(applied) == len(set(applied))

    second = StateDB.open(layout.db)  # would fail with "table already exists" if re-applied
    try:
        again = [tuple(r) for r in second.db.execute(
            "SELECT migration_set, name FROM _sqlite_migrations").fetchall()]
        assert again == applied
        assert second.experiment(experiment_id).name == "exp"  # data survives the reopen
    finally:
        second.close()


# -- experiments and trials -----------------------------------------------------------------

def test_experiment_round_trip_and_not_found(db):
    experiment_id = make_experiment(db, smaller_is_better=False)
    experiment = db.experiment(experiment_id)
    assert experiment.state == "ACTIVE"
    assert experiment.config == {"searcher": {"name": "single"}}
    assert experiment.smaller_is_better is False
    assert experiment.ended_at is None
    with pytest.raises(NotFound, match="no experiment 99"):
        db.experiment(99)
    with pytest.raises(NotFound, match="no trial 99"):
        db.trial(99)


def test_experiment_state_change_is_logged_and_terminal_sets_ended_at(db):
    experiment_id = make_experiment(db)
    db.set_experiment_state(experiment_id, "PAUSED")
    assert db.experiment(experiment_id).ended_at is None
    db.set_experiment_state(experiment_id, "ERROR", error="boom")
    experiment = db.experiment(experiment_id)
    assert (experiment.state, experiment.error) == ("ERROR", "boom")
    assert experiment.ended_at is not None
    states = [e["payload"]["state"] for e in db.events(experiment_id)
              if e["kind"] == "experiment_state"]
    assert states == ["PAUSED", "ERROR"]
    assert [e.id for e in db.experiments(states=("ERROR",))] == [experiment_id]
    assert db.experiments(states=("ACTIVE",)) == []


def test_trial_state_changes_are_logged_as_events(db):
    experiment_id = make_experiment(db)
    trial_id = make_trial(db, experiment_id)
    db.update_trial(trial_id, state="RUNNING", pid=1234)
    db.update_trial(trial_id, heartbeat_at="2024-01-01T00:00:00")  # not a state change
    db.update_trial(trial_id, state="ERROR", error="exit 1")

    trial = db.trial(trial_id)
    assert (trial.state, trial.pid, trial.error) == ("ERROR", 1234, "exit 1")
    assert trial.ended_at is not None  # terminal states stamp ended_at

    trial_events = [e for e in db.events(experiment_id) if e["trial_id"] == trial_id]
    assert [e["kind"] for e in trial_events] == ["trial_created", "trial_state", "trial_state"]
    assert [e["payload"].get("state") for e in trial_events[1:]] == ["RUNNING", "ERROR"]
    assert trial_events[2]["payload"]["error"] == "exit 1"
    assert all(e["experiment_id"] == experiment_id for e in trial_events)


def test_trial_request_ids_are_unique_per_experiment(db):
    first, second = make_experiment(db), make_experiment(db)
    make_trial(db, first, request_id=1)
    make_trial(db, second, request_id=1)  # same request id, other experiment: fine
    with pytest.raises(sqlite3.IntegrityError):
        make_trial(db, first, request_id=1)
    assert len(db.trials(first)) == 1
    assert len(db.trials()) == 2


def test_trials_filter_by_state(db):
    experiment_id = make_experiment(db)
    a, b = make_trial(db, experiment_id, 1), make_trial(db, experiment_id, 2)
    db.update_trial(b, state="RUNNING")
    assert [t.id for t in db.trials(experiment_id, states=("QUEUED",))] == [a]
    assert [t.id for t in db.trials(states=("RUNNING",))] == [b]


# -- metrics --------------------------------------------------------------------------------

def test_record_metrics_keeps_the_first_report_and_max_batches(db):
    experiment_id = make_experiment(db)
    trial_id = make_trial(db, experiment_id)
    db.record_metrics(trial_id, "validation", 50, {"val_loss": 0.5})
    db.record_metrics(trial_id, "validation", 50, {"val_loss": 9.9})  # a restart re-reports
    db.record_metrics(trial_id, "training", 50, {"loss": 0.7})  # same batches, other kind
    db.record_metrics(trial_id, "training", 100, {"loss": 0.3})
    db.record_metrics(trial_id, "training", 20, {"loss": 0.9})  # an older report, late

    validations = db.metrics(trial_id, "validation")
    assert [(m.batches_trained, m.metrics) for m in validations] == [(50, {"val_loss": 0.5})]
    training = db.metrics(trial_id, "training")
    assert [m.batches_trained for m in training] == [20, 50, 100]
    assert len(db.metrics(trial_id)) == 4
    assert db.trial(trial_id).batches_trained == 100  # max, not the last report


def test_record_metrics_for_an_unknown_trial_fails(db):
    experiment_id = make_experiment(db)
    trial_id = make_trial(db, experiment_id)
    with pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"):  # foreign keys are on
        db.record_metrics(trial_id + 100, "training", 1, {"x": 1.0})
    assert db.metrics(trial_id) == []
    assert db.trial(trial_id).batches_trained == 0


def test_record_metrics_rejects_an_unknown_kind(db):
    experiment_id = make_experiment(db)
    trial_id = make_trial(db, experiment_id)
    with pytest.raises(sqlite3.IntegrityError):
        db.record_metrics(trial_id, "testing", 7, {"x": 1.0})
    assert db.metrics(trial_id) == []
    assert db.trial(trial_id).batches_trained == 0


# -- events ---------------------------------------------------------------------------------

def test_events_are_append_only(layout, db):
    db.log_event("hello", note="first")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        db.db.execute("UPDATE events SET kind = 'rewritten'")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        db.db.execute("DELETE FROM events")
    # Another connection cannot do it either: the rule lives in the file, not in StateDB.
    raw = sqlite3.connect(layout.db)
    try:
        with pytest.raises(sqlite3.IntegrityError):
            raw.execute("DELETE FROM events WHERE kind = 'hello'")
    finally:
        raw.close()
    events = db.events()
    assert [(e["kind"], e["payload"]) for e in events] == [("hello", {"note": "first"})]


def test_events_filter_by_experiment_in_order(db):
    first = make_experiment(db, "first")
    second = make_experiment(db, "second")
    db.log_event("note", experiment_id=first, n=1)
    db.log_event("note", experiment_id=second, n=2)
    db.log_event("note", experiment_id=first, n=3)
    notes = [e["payload"]["n"] for e in db.events(first) if e["kind"] == "note"]
    assert notes == [1, 3]
    ids = [e["id"] for e in db.events()]
    assert ids == sorted(ids) and len(ids) == 5  # two experiment_created, three notes


# -- checkpoints ----------------------------------------------------------------------------

def test_add_checkpoint_sets_latest_checkpoint_and_logs(db):
    experiment_id = make_experiment(db)
    trial_id = make_trial(db, experiment_id)
    first = make_manifest(experiment_id, trial_id, 50, metadata={"note": "a"})
    second = make_manifest(experiment_id, trial_id, 100)
    db.add_checkpoint(first)
    assert db.trial(trial_id).latest_checkpoint == first["uuid"]
    db.add_checkpoint(second)
    assert db.trial(trial_id).latest_checkpoint == second["uuid"]

    stored = db.checkpoint(first["uuid"])
    assert (stored.trial_id, stored.batches_trained, stored.size_bytes) == (trial_id, 50, 1024)
    assert stored.metadata == {"note": "a"}
    assert stored.manifest == first
    assert [c.uuid for c in db.checkpoints(experiment_id)] == [first["uuid"], second["uuid"]]
    assert [c.uuid for c in db.checkpoints(trial_id=trial_id + 1)] == []
    logged = [e["payload"]["uuid"] for e in db.events(experiment_id) if e["kind"] == "checkpoint"]
    assert logged == [first["uuid"], second["uuid"]]


def test_add_checkpoint_twice_fails_and_keeps_the_first(db):
    experiment_id = make_experiment(db)
    trial_id = make_trial(db, experiment_id)
    manifest = make_manifest(experiment_id, trial_id, 50)
    db.add_checkpoint(manifest)
    with pytest.raises(sqlite3.IntegrityError):
        db.add_checkpoint({**manifest, "batches_trained": 999})
    assert db.checkpoint(manifest["uuid"]).batches_trained == 50
    assert len([e for e in db.events() if e["kind"] == "checkpoint"]) == 1  # rolled back


def test_checkpoint_lookup_by_unique_prefix(db):
    experiment_id = make_experiment(db)
    trial_id = make_trial(db, experiment_id)
    a = "abc12345-0000-4000-8000-000000000001"
    b = "abc19999-0000-4000-8000-000000000002"
    c = "ffff0000-0000-4000-8000-000000000003"
    for n, uuid in enumerate((a, b, c), start=1):
        db.add_checkpoint(make_manifest(experiment_id, trial_id, 10 * n, uuid=uuid))

    assert db.checkpoint(a).uuid == a          # the full uuid
    assert db.checkpoint("abc12").uuid == a    # a unique prefix
    assert db.checkpoint("f").uuid == c
    with pytest.raises(NotFound) as none:
        db.checkpoint("0123")
    assert "no checkpoint matches '0123'" in str(none.value)
    assert "localdet checkpoints" in str(none.value)
    with pytest.raises(NotFound) as several:
        db.checkpoint("abc1")
    assert "more than one checkpoint matches 'abc1'" in str(several.value)


def test_checkpoint_lookup_ignores_unfinished_checkpoints(db):
    experiment_id = make_experiment(db)
    trial_id = make_trial(db, experiment_id)
    manifest = make_manifest(experiment_id, trial_id, 10)
    db.add_checkpoint(manifest)
    db.db.execute("UPDATE checkpoints SET state = 'DELETED' WHERE uuid = ?", [manifest["uuid"]])
    # Still NotFound, saying why: the row stays when retention deletes a checkpoint.
    with pytest.raises(CheckpointDeleted, match=f"checkpoint {manifest['uuid']} was deleted "
                                                r"by retention \(checkpoint_storage"):
        db.checkpoint(manifest["uuid"][:6])
    assert issubclass(CheckpointDeleted, NotFound)
    assert db.checkpoints(experiment_id) == []
    assert [c.state for c in db.checkpoints(experiment_id, include_deleted=True)] == ["DELETED"]
