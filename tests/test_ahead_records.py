"""What decides the fate of a trial started ahead of its slot (localdet/daemon/ahead.py), on
real records and real processes, without TensorFlow: it is launched only as it was started
(its trial, its slots, still running), ended as soon as its trial stops being queued, and its
process trains only once its launch is recorded (the reporter's gate)."""

from __future__ import annotations

import os
import subprocess
import threading
import time

import pytest
from conftest import start_trial

from determined.core._reporting import STAGED_VAR, TRIAL_ID_VAR, await_launch, started_ahead
from localdet.daemon.ahead import Ahead, Staged
from localdet.processes.launcher import LaunchSpec
from localdet.records.db import StateDB
from localdet.records.states import ExperimentState, TrialState
from localdet.reporting.sqlite_reporter import SQLiteReporter


def staged_process(tmp_path, db, trial_id: int, slots=(0,)) -> Staged:
    """A process standing for the trial's, in a session of its own, as launches start them."""
    process = subprocess.Popen(["sleep", "60"], start_new_session=True)
    process.log_writer = subprocess.Popen(["true"])  # type: ignore[attr-defined]
    spec = LaunchSpec(argv=["sleep"], env={}, cwd=tmp_path, log_path=tmp_path / "trial.log",
                      keras_line="keras2", keras_line_reason="test")
    return Staged(db.trial(trial_id), list(slots), spec, process, 0, time.time())


@pytest.fixture
def queued(tmp_path):
    db, trial_id, _, _ = start_trial(tmp_path, 10)
    yield db, trial_id
    db.close()


@pytest.fixture
def held(tmp_path, queued):
    """(db, trial id, Ahead, Staged): a queued trial's process held as started ahead on slot
    0; killed at the end if still running."""
    db, trial_id = queued
    ahead = Ahead()
    staged = staged_process(tmp_path, db, trial_id)
    ahead.hold(staged)
    yield db, trial_id, ahead, staged
    if staged.process.poll() is None:
        staged.process.kill()
        staged.process.wait()


def test_a_trial_started_ahead_is_launched_as_it_was_started(held):
    db, trial_id, ahead, staged = held
    ahead.drop_stale(db)  # still queued, unchanged: kept
    assert ahead.take(db.trial(trial_id), [0]) is staged and ahead.staged is None
    assert staged.process.poll() is None


@pytest.mark.parametrize("change", ["other slots", "new hparams", "exited"])
def test_a_trial_started_ahead_that_no_longer_fits_its_launch_is_ended(held, change):
    db, trial_id, ahead, staged = held
    slots = [1] if change == "other slots" else [0]
    if change == "new hparams":
        db.db.execute("UPDATE trials SET hparams = ? WHERE id = ?", ['{"x": 2}', trial_id])
    if change == "exited":
        staged.process.kill()
        staged.process.wait()
    assert ahead.take(db.trial(trial_id), slots) is None
    assert staged.process.poll() is not None  # ended, reaped
    assert ahead.staged is None


@pytest.mark.parametrize("change", ["trial killed", "experiment paused"])
def test_a_trial_started_ahead_ends_when_its_trial_is_no_longer_queued(held, change):
    db, trial_id, ahead, staged = held
    if change == "trial killed":
        db.update_trial(trial_id, state=TrialState.CANCELED)
    else:
        db.db.execute("UPDATE experiments SET state = ? WHERE id = ?",
                      [ExperimentState.PAUSED, db.trial(trial_id).experiment_id])
    ahead.drop_stale(db)
    assert ahead.staged is None and staged.process.poll() is not None


@pytest.mark.timeout(60)
def test_a_process_started_ahead_waits_for_its_launch_record(tmp_path, queued, monkeypatch):
    db, trial_id = queued
    monkeypatch.setenv("LOCALDET_HOME", str(tmp_path / "home"))
    monkeypatch.setenv(TRIAL_ID_VAR, str(trial_id))
    monkeypatch.setenv(STAGED_VAR, "1")
    reporter = SQLiteReporter.from_environment(trial_id)  # returns at once: it is not launched
    assert started_ahead(reporter) and STAGED_VAR not in os.environ
    recording = threading.Event()  # set before the write, so a return before it is caught

    def launch() -> None:  # the daemon, on its own connection
        time.sleep(0.3)
        daemon_db = StateDB.open(tmp_path / "home" / "localdet.db")
        recording.set()
        daemon_db.update_trial(trial_id, state=TrialState.RUNNING, pid=os.getpgrp())
        daemon_db.close()

    threading.Thread(target=launch).start()
    await_launch(reporter)
    assert recording.is_set() and not started_ahead(reporter)
    assert db.trial(trial_id).state == TrialState.RUNNING
    await_launch(reporter)  # once launched, a no-op


def test_a_trial_started_ahead_ends_when_another_takes_its_slot(held):
    db, trial_id, ahead, staged = held
    other = db.create_trial(experiment_id=db.trial(trial_id).experiment_id, request_id=2,
                            hparams={}, seed=4, target_batches=10)
    assert ahead.take(db.trial(other), [1]) is None
    assert ahead.staged is staged and staged.process.poll() is None  # not its slot
    assert ahead.take(db.trial(other), [0]) is None
    assert ahead.staged is None and staged.process.poll() is not None
