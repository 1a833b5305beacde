"""The state enums, their transition table and migration 0005's CHECK constraints: the
table refuses what it does not list, every change the lifecycle can answer is listed, SQLite
refuses values no enum defines, and a database made before 0005 upgrades with its rows."""

from __future__ import annotations

import importlib.util
import itertools
import json
import sqlite3

import pytest

from localdet.paths import state_formats_dir
from localdet.records import lifecycle
from localdet.records.db import StateDB, _Database, migrations
from localdet.records.states import (
    EXPERIMENT_TRANSITIONS,
    TERMINAL_STATES,
    TRIAL_INITIAL_STATES,
    TRIAL_TRANSITIONS,
    CheckpointState,
    ExperimentKind,
    ExperimentState,
    IllegalTransition,
    Runner,
    StopRequest,
    TrialState,
    UnknownValue,
)

BEFORE_CHECKS = "0005_state_checks"


def make_experiment(db: StateDB, **extra) -> int:
    return db.create_experiment(
        name="exp", description="", config={"searcher": {"name": "single"}},
        original_config="name: exp\n", searcher="single", metric="val_loss",
        smaller_is_better=True, experiment_seed=7, model_dir="/nowhere", **extra)


def make_trial(db: StateDB, experiment_id: int, request_id: int = 1, **extra) -> int:
    return db.create_trial(experiment_id=experiment_id, request_id=request_id,
                           hparams={"lr": 0.1}, seed=3, target_batches=100, **extra)


# -- the enums store the strings the database always held ---------------------------------

def test_the_members_are_the_stored_strings():
    assert [str(s) for s in ExperimentState] == ["ACTIVE", "PAUSED", "COMPLETED", "CANCELED",
                                                 "ERROR"]
    assert list(TrialState) == ["QUEUED", "RUNNING", "PAUSED", "WAITING", "COMPLETED",
                                "CANCELED", "ERROR"]
    assert list(ExperimentKind) == ["experiment", "job"]
    assert list(Runner) == ["daemon", "foreground", "script"]
    assert json.dumps({"state": TrialState.RUNNING}) == '{"state": "RUNNING"}'
    assert f"{ExperimentState.PAUSED}" == "PAUSED"


def test_a_state_written_through_an_enum_reads_back_as_the_plain_string(db):
    experiment_id = make_experiment(db, kind=ExperimentKind.JOB, runner=Runner.FOREGROUND)
    trial_id = make_trial(db, experiment_id)
    db.update_trial(trial_id, state=TrialState.RUNNING)
    row = db.db.execute("SELECT state, typeof(state) FROM trials").fetchone()
    assert tuple(row) == ("RUNNING", "text")
    assert db.db.execute("SELECT kind, runner FROM experiments").fetchone() == (
        "job", "foreground")


# -- the transition table -----------------------------------------------------------------

def test_the_table_covers_every_state_and_ends_nowhere_from_a_terminal_one():
    assert set(TRIAL_TRANSITIONS) == set(TrialState)
    assert set(EXPERIMENT_TRANSITIONS) == set(ExperimentState)
    for state in TERMINAL_STATES:
        assert TRIAL_TRANSITIONS[state] == frozenset()
        assert EXPERIMENT_TRANSITIONS[state] == frozenset()


def test_the_database_refuses_an_illegal_trial_change_with_one_sentence(db):
    experiment_id = make_experiment(db)
    trial_id = make_trial(db, experiment_id, state=TrialState.PAUSED)
    with pytest.raises(IllegalTransition) as refused:
        db.update_trial(trial_id, state="RUNNING", pid=42)
    assert str(refused.value) == (f"trial {trial_id} cannot go from PAUSED to RUNNING; from "
                                  "PAUSED it can go to QUEUED, PAUSED, COMPLETED, CANCELED, "
                                  "ERROR")
    trial = db.trial(trial_id)
    assert (trial.state, trial.pid) == ("PAUSED", None)  # nothing of the update was written
    assert [e["payload"]["state"] for e in db.events(experiment_id)
            if e["kind"] == "trial_state"] == []

    db.update_trial(trial_id, state="CANCELED")
    with pytest.raises(IllegalTransition, match="cannot go from CANCELED to QUEUED: CANCELED "
                                                "is final"):
        db.update_trial(trial_id, state="QUEUED")
    with pytest.raises(UnknownValue, match="'DONE' is not a trial state"):
        db.update_trial(trial_id, state="DONE")
    with pytest.raises(UnknownValue, match="a trial starts PAUSED or QUEUED, not RUNNING"):
        make_trial(db, experiment_id, request_id=2, state="RUNNING")


def test_the_database_refuses_an_illegal_experiment_change(db):
    experiment_id = make_experiment(db)
    with pytest.raises(IllegalTransition, match="experiment .* cannot go from ACTIVE to "
                                                "ACTIVE"):
        db.set_experiment_state(experiment_id, "ACTIVE")
    db.set_experiment_state(experiment_id, "COMPLETED")
    with pytest.raises(IllegalTransition, match="from COMPLETED to ERROR: COMPLETED is final"):
        db.set_experiment_state(experiment_id, "ERROR", error="late")
    experiment = db.experiment(experiment_id)
    assert (experiment.state, experiment.error) == ("COMPLETED", None)
    with pytest.raises(UnknownValue, match="'local' is not a runner"):
        db.set_runner(experiment_id, "local")


def _trial_changes_the_lifecycle_answers():
    """Every (before, after) trial state change on_request, on_exit and hold can answer, with
    the daemon's verdicts on an exit it judges ("complete": the searcher makes it WAITING, a
    job is COMPLETED, a missing metric is an ERROR; "failed": restart_to, or ERROR)."""
    phases = [lifecycle.TrialPhase(state, stop) for state in TrialState
              for stop in lifecycle.STOPS if stop is None or state == TrialState.RUNNING]
    changes = set()
    for phase in phases:
        for action in lifecycle.ACTIONS:
            changes.add((phase.state, lifecycle.on_request(action, phase).phase.state))
        changes.add((phase.state, lifecycle.hold(phase).state))
        if phase.state != TrialState.RUNNING:
            continue
        for clean, reached_end in itertools.product((True, False), repeat=2):
            outcome = lifecycle.on_exit(phase, lifecycle.Exit(clean, reached_end))
            if outcome.phase is not None:
                changes.add((phase.state, outcome.phase.state))
            elif outcome.judge == "complete":
                changes |= {(phase.state, s) for s in (TrialState.WAITING,
                                                       TrialState.COMPLETED, TrialState.ERROR)}
            else:
                changes |= {(phase.state, outcome.restart_to), (phase.state, TrialState.ERROR)}
    for experiment_state in ExperimentState:  # trials queued under a paused experiment
        for trial_state in TrialState:
            if lifecycle.held(experiment_state, trial_state):
                changes.add((trial_state, TrialState.PAUSED))
    return changes


def test_every_trial_change_the_lifecycle_can_answer_is_in_the_table():
    changes = _trial_changes_the_lifecycle_answers()
    # The walk reaches the interesting ones (else it would prove nothing).
    assert {("RUNNING", "PAUSED"), ("PAUSED", "QUEUED"), ("RUNNING", "WAITING"),
            ("QUEUED", "PAUSED"), ("RUNNING", "QUEUED")} <= changes
    for before, after in changes:
        if before in TERMINAL_STATES:  # left as it was: the daemon writes nothing for it
            assert after == before, (before, after)
        else:
            assert after in TRIAL_TRANSITIONS[before], (before, after)


def test_every_experiment_change_the_lifecycle_can_answer_is_in_the_table():
    changes = set()
    for state in ExperimentState:
        for action, whole in itertools.product(lifecycle.ACTIONS, (True, False)):
            changes.add((state, lifecycle.experiment_after(action, state, whole)))
        for trial_states in itertools.product(TrialState, repeat=2):
            after = lifecycle.settle(state, trial_states)
            if after is not None:
                changes.add((state, after))
    assert {("ACTIVE", "PAUSED"), ("PAUSED", "ACTIVE"), ("ACTIVE", "CANCELED")} <= changes
    # The daemon writes an experiment's state only when it changes (Requests._carry_out).
    for before, after in changes:
        assert before == after or after in EXPERIMENT_TRANSITIONS[before], (before, after)
    assert TRIAL_INITIAL_STATES == {"QUEUED", "PAUSED"}


# -- migration 0005: CHECK constraints ------------------------------------------------------

def _migration_module():
    path = state_formats_dir() / "migrations" / f"{BEFORE_CHECKS}.py"
    spec = importlib.util.spec_from_file_location("migration_0005", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_migration_allows_exactly_the_enum_values():
    module = _migration_module()
    assert module.EXPERIMENT_STATES == tuple(ExperimentState)
    assert module.TRIAL_STATES == tuple(TrialState)
    assert module.STOP_REQUESTS == tuple(StopRequest)
    assert module.CHECKPOINT_STATES == tuple(CheckpointState)


@pytest.mark.parametrize("sql", [
    "UPDATE experiments SET state = 'FINISHED'",
    "UPDATE experiments SET kind = 'notebook'",
    "UPDATE experiments SET runner = 'cron'",
    "UPDATE trials SET state = 'paused'",   # the case matters
    "UPDATE trials SET stop_requested = 'STOP'",
    "UPDATE checkpoints SET state = 'GONE'",
])
def test_sqlite_refuses_a_raw_write_of_a_value_no_enum_defines(db, sql):
    experiment_id = make_experiment(db)
    trial_id = make_trial(db, experiment_id)
    _add_checkpoint(db, experiment_id, trial_id)
    with pytest.raises(sqlite3.IntegrityError, match="CHECK constraint failed"):
        db.db.execute(sql)
    db.db.execute("UPDATE trials SET stop_requested = 'PAUSE'")  # a defined value is taken
    db.db.execute("UPDATE trials SET stop_requested = NULL")


def _add_checkpoint(db, experiment_id, trial_id, uuid="c0ffee"):
    db.db.execute(
        "INSERT INTO checkpoints (uuid, experiment_id, trial_id, batches_trained, size_bytes, "
        "metadata, manifest, created_at) VALUES (?, ?, ?, 10, 1, '{}', '{}', 'now')",
        [uuid, experiment_id, trial_id])


def _open_at_migration_4(path) -> _Database:
    db = _Database(path)
    db.execute("PRAGMA foreign_keys = ON")
    migrations().apply(db, stop_before=BEFORE_CHECKS)
    return db


def _dump(db) -> dict:
    return {table: [tuple(row) for row in db.execute(
                f"SELECT rowid, * FROM {table} ORDER BY rowid").fetchall()]
            for table in ("experiments", "trials", "checkpoints", "metrics", "requests",
                          "searcher_events", "events")}


def _schema_of(db) -> dict:
    return {table: [tuple(row) for row in db.execute(f"PRAGMA table_info({table})")]
            for table in ("experiments", "trials", "checkpoints")}


def test_a_database_made_before_the_checks_upgrades_with_its_rows(tmp_path):
    path = tmp_path / "localdet.db"
    old = _open_at_migration_4(path)
    assert "CHECK (state" not in old.execute(
        "SELECT sql FROM sqlite_master WHERE name = 'trials'").fetchone()[0]
    state = StateDB(old)
    for _ in range(2):
        experiment_id = make_experiment(state)
        trial_id = make_trial(state, experiment_id)
        state.update_trial(trial_id, state="RUNNING", stop_requested="PAUSING")
        state.record_metrics(trial_id, "validation", 10, {"val_loss": 0.5})
        state.add_request("pause", experiment_id=experiment_id)
        state.add_searcher_event(experiment_id, "initialized")
    state.set_experiment_state(experiment_id, "PAUSED")
    # Checkpoint rows keyed by text, written out of uuid order: their rowids must survive.
    _add_checkpoint(state, 2, 2, uuid="zz")
    _add_checkpoint(state, 1, 1, uuid="aa")
    old.execute("UPDATE checkpoints SET state = 'DELETED' WHERE uuid = 'aa'")
    before, schema_before = _dump(old), _schema_of(old)
    indexes_before = old.execute("SELECT name, tbl_name, sql FROM sqlite_master WHERE type = "
                                 "'index' ORDER BY name").fetchall()
    old.close()

    upgraded = StateDB.open(path, migrate=True)
    try:
        # Later migrations add columns at the end (0006): the ones before keep their values.
        assert {table: [row[:len(before[table][0])] for row in rows] if before[table] else rows
                for table, rows in _dump(upgraded.db).items()} == before
        assert {table: columns[:len(schema_before[table])] for table, columns
                in _schema_of(upgraded.db).items()} == schema_before  # same types and defaults
        # Every index is still there (later migrations add others, for their tables).
        assert set(indexes_before) <= set(upgraded.db.execute(
            "SELECT name, tbl_name, sql FROM sqlite_master WHERE type = 'index'").fetchall())
        assert upgraded.db.execute("PRAGMA foreign_key_check").fetchall() == []
        assert "CHECK (state IN ('QUEUED'" in upgraded.db.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'trials'").fetchone()[0]
        # Foreign keys still hold, and a new experiment takes the next id.
        with pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"):
            upgraded.db.execute("INSERT INTO trials (experiment_id, request_id, state, hparams, "
                                "seed, target_batches) VALUES (99, 1, 'QUEUED', '{}', 1, 1)")
        assert make_experiment(upgraded) == 3
        assert upgraded.experiment(2).state == "PAUSED"
    finally:
        upgraded.close()


def test_an_upgrade_names_a_row_the_checks_would_refuse_and_changes_nothing(tmp_path):
    path = tmp_path / "localdet.db"
    old = _open_at_migration_4(path)
    state = StateDB(old)
    experiment_id = make_experiment(state)
    make_trial(state, experiment_id)
    old.execute("UPDATE trials SET state = 'STUCK'")
    old.close()
    with pytest.raises(RuntimeError, match="trials row 1 has state 'STUCK', which is none of "
                                           "QUEUED, RUNNING"):
        StateDB.open(path, migrate=True)
    raw = sqlite3.connect(path)
    try:
        assert raw.execute("SELECT state FROM trials").fetchone() == ("STUCK",)
        assert BEFORE_CHECKS not in {name for (name,) in raw.execute(
            "SELECT name FROM _sqlite_migrations")}
    finally:
        raw.close()
