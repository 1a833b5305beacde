"""The next trial started ahead of its slot (localdet/daemon/ahead.py): while the one slot is
busy, the daemon forks the trial that will take it; it makes its model and data, then waits
for its launch before its first batch. Real daemons, warm processes and TensorFlow trials."""

from __future__ import annotations

import json
import os
import re
import signal

import psutil
import pytest
from conftest import EXAMPLE, Home, wait_for, write_config

pytestmark = pytest.mark.slow

GRID = {"global_batch_size": 32, "dropout": 0.0, "learning_rate": 0.01,
        "hidden_units": {"type": "categorical", "vals": [16, 32, 48]}}


def grid_config(tmp_path, name: str, batches: int, values: list[int]):
    return write_config(tmp_path, name, hyperparameters=dict(
        GRID, hidden_units={"type": "categorical", "vals": values}), searcher={
        "name": "grid", "metric": "val_accuracy", "smaller_is_better": False,
        "max_length": {"batches": batches}})


def phases_of(home: Home, experiment_id: int) -> dict[int, dict[str, list]]:
    """Trial id -> phase -> [(started, ended, details)] of its (one) launch."""
    found: dict[int, dict[str, list]] = {}
    for row in home.rows("SELECT trial_id, phase, started, ended, details FROM launch_phases "
                         "WHERE experiment_id = ? ORDER BY started, id", experiment_id):
        found.setdefault(row["trial_id"], {}).setdefault(row["phase"], []).append(
            (row["started"], row["ended"], json.loads(row["details"] or "{}")))
    return found


def results(home: Home, experiment_id: int) -> dict[int, tuple]:
    """hidden_units -> the trial's validation metrics, in order."""
    by_trial = {trial["id"]: json.loads(trial["hparams"])["hidden_units"]
                for trial in home.trials(experiment_id)}
    found: dict[int, list] = {}
    for row in home.rows("SELECT trial_id, batches_trained, metrics FROM metrics WHERE kind "
                         "= 'validation' AND trial_id IN (SELECT id FROM trials WHERE "
                         "experiment_id = ?) ORDER BY batches_trained", experiment_id):
        found.setdefault(by_trial[row["trial_id"]], []).append(
            (row["batches_trained"], json.loads(row["metrics"])))
    return {units: tuple(map(str, rows)) for units, rows in found.items()}


def started_ahead(home: Home, trial_id: int) -> psutil.Process | None:
    """The process the daemon started trial `trial_id` in ahead of its slot, while it runs
    (its pid from the daemon's log: a fork of a warm process shows that one's command and
    environment)."""
    log = (home.path / "daemon.log").read_text(errors="replace") \
        if (home.path / "daemon.log").exists() else ""
    found = re.findall(rf"trial {trial_id} of experiment \d+ started ahead of its slot \[\d+\] "
                       r"\(pid (\d+)\)", log)
    if not found:
        return None
    try:
        process = psutil.Process(int(found[-1]))
        return process if process.status() != psutil.STATUS_ZOMBIE else None
    except psutil.NoSuchProcess:
        return None


def test_a_search_on_one_slot_starts_each_next_trial_ahead_and_trains_the_same(
        tmp_path, daemons):
    ahead, cold = Home(tmp_path / "ahead"), Home(tmp_path / "cold")
    daemons(ahead, "--slots", "1", "--warm", "1")
    daemons(cold, "--slots", "1", "--warm", "0")  # nothing started ahead without warm ones
    for home in (ahead, cold):
        home.cli("submit", grid_config(tmp_path / home.path.name, "grid", 60, [16, 32, 48]),
                 EXAMPLE)
    for home in (ahead, cold):
        facts = home.wait_until_ended(1)
        assert facts["state"] == "COMPLETED", home.ended_report(1)
    timeline = phases_of(ahead, 1)
    first, *later = sorted(timeline)
    assert not timeline[first]["launch"][0][2]["ahead"]  # the slot was free for the first
    previous = timeline[first]
    for trial in later:
        its = timeline[trial]
        launched = its["launch"][0][1]
        assert its["launch"][0][2]["ahead"], its["launch"]
        assert its["process_ready"][0][0] < launched  # made ready while the slot was busy
        assert its["steps_traced"][0][1] <= its["first_batch"][0][0]  # traced before it
        # ... and trained only once that one's work was done: one at a time on the slot.
        worked = max(end for phase, rows in previous.items()
                     if phase in ("training", "validation", "checkpoint") for _, end, _ in rows)
        assert its["first_batch"][0][0] >= worked
        previous = its
    assert "; 2 started ahead of the slot) on 1 slot" in ahead.cli(
        "status", 1, "--timeline").stdout
    assert not any(its["launch"][0][2]["ahead"] for its in phases_of(cold, 1).values())
    assert results(ahead, 1) == results(cold, 1)  # the same weights' metrics, to the digit


def test_a_trial_started_ahead_ends_when_its_experiment_is_paused(tmp_path, daemons):
    home = Home(tmp_path / "home")
    daemons(home, "--slots", "1", "--warm", "1")
    home.cli("submit", grid_config(tmp_path, "paused", 3000, [16, 32]), EXAMPLE)
    wait_for(lambda: started_ahead(home, 2), 120, "trial 2 to be started ahead", 0.1)
    assert [t["state"] for t in home.trials(1)] == ["RUNNING", "QUEUED"]
    home.cli("pause", 1)
    wait_for(lambda: not started_ahead(home, 2), 60, "the one started ahead to end", 0.1)
    wait_for(lambda: home.trials(1)[0]["state"] == "PAUSED", 120, "trial 1 to pause", 0.1)
    assert not home.rows("SELECT 1 FROM events WHERE kind = 'trial_launched' AND trial_id = 2")
    home.cli("kill", 1)
    facts = home.wait_until_ended(1, timeout=120)
    assert facts["state"] == "CANCELED", home.ended_report(1)
    assert not started_ahead(home, 2)


def test_a_trial_started_ahead_goes_with_its_daemon_and_the_next_daemon_runs_it(
        tmp_path, daemons):
    home = Home(tmp_path / "home")
    first = daemons(home, "--slots", "1", "--warm", "1")
    home.cli("submit", grid_config(tmp_path, "orphan", 400, [16, 32]), EXAMPLE)
    wait_for(lambda: started_ahead(home, 2), 120, "trial 2 to be started ahead", 0.1)
    os.kill(first.process.pid, signal.SIGKILL)  # no chance to end what it started
    first.process.wait()
    # Its warm process reads end-of-file and exits; the trial started ahead sees its parent
    # go and exits unlaunched. Trial 1, launched, runs on for the next daemon to adopt.
    wait_for(lambda: not started_ahead(home, 2), 60, "the one started ahead to exit", 0.1)
    assert home.trials(1)[1]["state"] == "QUEUED"
    daemons(home, "--slots", "1", "--warm", "1")
    facts = home.wait_until_ended(1, timeout=300)
    assert facts["state"] == "COMPLETED", home.ended_report(1)
    launched = home.rows("SELECT trial_id FROM events WHERE kind = 'trial_launched' "
                         "ORDER BY id")
    assert [row["trial_id"] for row in launched] == [1, 2]  # trial 1 adopted, not relaunched
