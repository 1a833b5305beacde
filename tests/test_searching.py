"""The search driver on a real SQLite file, with trials simulated (no processes): events are
recorded with the operations they cause, replay rebuilds the same method, a failure leaves
nothing half done; and the daemon's guards around trial processes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from localdet.config.experiment import parse_config
from localdet.records.db import StateDB
from localdet.search.driver import Search, SearchError, replay


def asha_config(**searcher) -> dict:
    return parse_config({
        "entrypoint": "model_def:Trial",
        "hyperparameters": {"global_batch_size": 8,
                            "x": {"type": "double", "minval": 0.0, "maxval": 1.0}},
        "searcher": {"name": "adaptive_asha", "metric": "loss", "smaller_is_better": True,
                     "max_length": {"batches": 16}, "max_trials": 8, "max_rungs": 2,
                     "divisor": 4, "mode": "aggressive", "max_concurrent_trials": 2,
                     **searcher},
    }).config


def new_experiment(db: StateDB, config: dict) -> int:
    return db.create_experiment(
        name="search", description="", config=config, original_config="", searcher=
        config["searcher"]["name"], metric=config["searcher"]["metric"],
        smaller_is_better=config["searcher"]["smaller_is_better"], experiment_seed=5,
        model_dir="/nowhere")


def finish(db: StateDB, search: Search, experiment_id: int, trial_id: int) -> None:
    """The trial trained to its target and validated: loss = its x (best: small x)."""
    trial = db.trial(trial_id)
    db.update_trial(trial_id, state="RUNNING")
    db.record_metrics(trial_id, "validation", trial.target_batches,
                      {"loss": trial.hparams["x"]})
    search.validation_completed(db.experiment(experiment_id), db.trial(trial_id),
                                trial.hparams["x"])


def run_to_the_end(db: StateDB, search: Search, experiment_id: int) -> None:
    """Like a one-slot daemon: the lowest queued trial runs next."""
    for _ in range(100):
        queued = db.trials(experiment_id, states=("QUEUED",))
        if not queued:
            return
        finish(db, search, experiment_id, queued[0].id)
    raise AssertionError("the search never ended")


def test_a_search_records_its_events_and_replays_to_the_same_decisions(db):
    experiment_id = new_experiment(db, asha_config())
    search = Search(db, log=lambda message: None)
    experiment = db.experiment(experiment_id)
    assert not search.started(experiment)
    search.start(experiment)
    assert search.started(experiment)
    assert [t.state for t in db.trials(experiment_id)] == ["QUEUED", "QUEUED"]  # concurrency 2
    run_to_the_end(db, search, experiment_id)

    trials = db.trials(experiment_id)
    assert len(trials) == 8 and {t.state for t in trials} == {"COMPLETED"}
    promoted = [t for t in trials if t.target_batches == 16]
    assert promoted and all(t.batches_trained == 16 for t in promoted)
    kinds = [e["kind"] for e in db.searcher_events(experiment_id)]
    assert kinds[0] == "initialized"
    assert kinds.count("validation_completed") == 8 + len(promoted)
    assert kinds.count("trial_closed") == 8

    # A fresh daemon rebuilds the method from the events alone, to the same state.
    fresh = replay(db.experiment(experiment_id), db.searcher_events(experiment_id))
    assert fresh.rungs() == search.method(db.experiment(experiment_id)).rungs()
    assert fresh.rungs()[0]["reached"] == 8
    assert fresh.rungs()[1]["reached"] == len(promoted)


def test_the_same_search_twice_makes_the_same_trials_and_decisions(db):
    outcomes = []
    for _ in range(2):
        experiment_id = new_experiment(db, asha_config())
        search = Search(db, log=lambda message: None)
        search.start(db.experiment(experiment_id))
        run_to_the_end(db, search, experiment_id)
        outcomes.append(([(t.request_id, t.hparams, t.seed, t.target_batches)
                          for t in db.trials(experiment_id)],
                         [(e["kind"], e["request_id"], e["length"])
                          for e in db.searcher_events(experiment_id)]))
    assert outcomes[0] == outcomes[1]


def test_a_failing_searcher_leaves_no_event_and_no_trial_behind(db, monkeypatch):
    experiment_id = new_experiment(db, asha_config())
    search = Search(db, log=lambda message: None)
    search.start(db.experiment(experiment_id))
    first = db.trials(experiment_id)[0]
    before = (len(db.searcher_events(experiment_id)), len(db.trials(experiment_id)))

    method = search.method(db.experiment(experiment_id))
    monkeypatch.setattr(type(method), "on_validation_completed",
                        lambda *args: (_ for _ in ()).throw(ValueError("boom")))
    with pytest.raises(SearchError, match="the searcher failed: boom"):
        finish(db, search, experiment_id, first.id)
    # The trial's WAITING and the event were one transaction with the searcher's answer.
    assert (len(db.searcher_events(experiment_id)), len(db.trials(experiment_id))) == before
    assert db.trial(first.id).state == "RUNNING"


def test_trials_created_while_the_experiment_is_paused_wait_paused(db):
    experiment_id = new_experiment(db, asha_config())
    search = Search(db, log=lambda message: None)
    search.start(db.experiment(experiment_id))
    first = db.trials(experiment_id)[0]
    db.set_experiment_state(experiment_id, "PAUSED")
    finish(db, search, experiment_id, first.id)
    newest = db.trials(experiment_id)[-1]
    assert newest.id != first.id and newest.state == "PAUSED"


def test_nan_counts_as_the_worst_result(db):
    config = asha_config(max_trials=4, max_concurrent_trials=4)
    experiment_id = new_experiment(db, config)
    search = Search(db, log=lambda message: None)
    search.start(db.experiment(experiment_id))
    trials = db.trials(experiment_id)
    for trial in trials[:3]:
        finish(db, search, experiment_id, trial.id)
    last = trials[3]
    db.update_trial(last.id, state="RUNNING")
    search.validation_completed(db.experiment(experiment_id), db.trial(last.id), float("nan"))
    events = db.searcher_events(experiment_id)
    nan_event = next(e for e in events if e["kind"] == "validation_completed"
                     and e["request_id"] == last.request_id)
    assert nan_event["metric"] == float("inf")
    assert db.trial(last.id).target_batches == 4  # never promoted


# -- the daemon's guards around trial processes -----------------------------------------------

def test_a_recorded_pid_now_held_by_another_process_is_not_adopted(layout, db):
    from localdet.daemon.daemon import Daemon
    from localdet.pids import process_start

    experiment_id = new_experiment(db, parse_config({
        "entrypoint": "model_def:Trial", "hyperparameters": {"global_batch_size": 8},
        "searcher": {"name": "single", "metric": "loss", "max_length": 10},
        "max_restarts": 1}).config)
    trial_id = db.create_trial(experiment_id=experiment_id, request_id=1, hparams={},
                               seed=1, target_batches=10)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # The pid is alive, but it started at another time than the trial's process did.
        db.update_trial(trial_id, state="RUNNING", pid=stranger.pid,
                        process_start=process_start(stranger.pid) - 1)
        daemon = Daemon(layout, log=lambda message: None).open(db)
        daemon.launches.adopt_running_trials()
        assert daemon.running() == set()
        trial = db.trial(trial_id)
        assert trial.state == "QUEUED" and trial.restarts == 1  # restarted, not adopted
        assert stranger.poll() is None  # and the stranger left alone

        db.update_trial(trial_id, state="RUNNING", pid=stranger.pid,
                        process_start=process_start(stranger.pid))
        daemon.launches.adopt_running_trials()
        assert daemon.running() == {trial_id}
    finally:
        stranger.kill()
        stranger.wait()


def test_a_process_the_daemon_did_not_record_never_trains(layout, db, monkeypatch):
    from localdet.reporting.sqlite_reporter import SQLiteReporter

    experiment_id = new_experiment(db, parse_config({
        "entrypoint": "model_def:Trial", "hyperparameters": {"global_batch_size": 8},
        "searcher": {"name": "single", "metric": "loss", "max_length": 10}}).config)
    trial_id = db.create_trial(experiment_id=experiment_id, request_id=1, hparams={},
                               seed=1, target_batches=10)
    reporter = SQLiteReporter(layout, trial_id)
    # Started by a daemon killed before it recorded the process: the trial is still QUEUED.
    with pytest.raises(SystemExit, match="not recorded as running in this process"):
        reporter._await_launch_record(seconds=0.2)
    db.update_trial(trial_id, state="RUNNING", pid=os.getpgrp())
    reporter._await_launch_record(seconds=0.2)  # recorded: it may train


def test_a_search_started_over_a_trial_recorded_before_it_takes_that_trial(db):
    # An experiment from before searcher events existed, or one `localdet run` began.
    config = parse_config({
        "entrypoint": "model_def:Trial", "hyperparameters": {"global_batch_size": 8},
        "searcher": {"name": "single", "metric": "loss", "max_length": 10}}).config
    experiment_id = new_experiment(db, config)
    trial_id = db.create_trial(experiment_id=experiment_id, request_id=1, hparams={"x": 0.5},
                               seed=1, target_batches=10)
    db.update_trial(trial_id, state="RUNNING")  # a trial starts QUEUED (or PAUSED)
    search = Search(db, log=lambda message: None)
    search.start(db.experiment(experiment_id))
    assert [t.id for t in db.trials(experiment_id)] == [trial_id]
    finish(db, search, experiment_id, trial_id)
    assert db.trial(trial_id).state == "COMPLETED"


@pytest.mark.parametrize(("stop", "ends"), [("PAUSING", "PAUSED"), (None, "COMPLETED"),
                                            ("PAUSE", "COMPLETED")])
def test_a_script_with_no_recorded_length_that_answered_a_pause_is_paused(layout, db, stop,
                                                                           ends):
    """A script's length may be unknown until it ends (no searcher length; a fit over data of
    unknown length): its clean exit is its end, unless it answered a pause request (PAUSING),
    which it exited for. A pause asked but never answered (PAUSE) came too late."""
    from localdet.daemon.daemon import Daemon

    experiment_id = new_experiment(db, parse_config({
        "entrypoint": "python3 train.py", "hyperparameters": {"global_batch_size": 8},
        "searcher": {"name": "single", "metric": "loss"}}).config)
    Search(db, log=lambda message: None).start(db.experiment(experiment_id))
    trial_id = db.trials(experiment_id)[0].id
    assert db.trial(trial_id).target_batches == 0  # no length recorded
    db.update_trial(trial_id, state="RUNNING", batches_trained=24, latest_checkpoint="c0ffee",
                    stop_requested=stop)
    db.record_metrics(trial_id, "validation", 24, {"loss": 0.5})
    daemon = Daemon(layout, log=lambda message: None).open(db)
    daemon.exits.finish(trial_id, 0, tearing_down=True)
    assert db.trial(trial_id).state == ends
