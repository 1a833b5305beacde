"""Pause, resume and kill through the CLI with a real daemon, across a daemon restart."""

from __future__ import annotations

import json
import os

import h5py
import numpy as np
import pytest
from conftest import SLOW_DIGITS, wait_for, write_config

pytestmark = pytest.mark.slow

# Long enough that a pause asked through the CLI lands well before the end (unslowed, it
# landed some 550 batches after the 60 the test waits for, on a loaded 2-core machine): the
# digits trial sleeping 5 ms a batch, 1,000 batches in 5 s at least, each trained for real.
LENGTH = 1000
LONG = dict(entrypoint="model_def:SlowDigitsTrial",
            searcher={"name": "single", "metric": "val_accuracy", "smaller_is_better": False,
                      "max_length": {"batches": LENGTH}},
            scheduling_unit=20, min_validation_period={"batches": 100},
            hyperparameters={"global_batch_size": 32, "hidden_units": 64, "learning_rate": 0.01,
                             "batch_sleep": 0.005},
            environment={"environment_variables": ["TF_DETERMINISTIC_OPS=1"]})


# The daemons keep no warm process: each launches one trial here, which a warm process would
# serve by importing TensorFlow as a cold start does, so the cold path is what these cover
# (the warm one: test_warm.py).
NO_WARM = ("--warm", "0")


def h5_weights(path) -> list[tuple[str, np.ndarray]]:
    """(name, array) of every weight in a saved Keras .h5 model, in file order."""
    arrays = []
    with h5py.File(path) as h5:
        h5["model_weights"].visititems(
            lambda name, obj: arrays.append((name, np.asarray(obj)))
            if isinstance(obj, h5py.Dataset) else None)
    return arrays


def final_weights(home, experiment_id, tmp_path):
    last = home.json("checkpoints", experiment_id)[-1]
    home.cli("checkpoint", "export", last["uuid"], tmp_path / f"export-{experiment_id}")
    return h5_weights(tmp_path / f"export-{experiment_id}" / "determined-keras-model.h5")


def trial_of(home, experiment_id):
    return home.experiment(experiment_id)["trials"][0]


def assert_ended_alike(home, experiment_a, experiment_b, tmp_path):
    """The two experiments' last checkpoints hold the same weights, bit for bit."""
    for (name_a, a), (name_b, b) in zip(final_weights(home, experiment_a, tmp_path),
                                        final_weights(home, experiment_b, tmp_path),
                                        strict=True):
        assert name_a == name_b
        np.testing.assert_array_equal(a, b)
    assert (trial_of(home, experiment_a)["latest_validation"]
            == trial_of(home, experiment_b)["latest_validation"])


def assert_timeline_of_a_paused_and_resumed_trial(home, experiment_id):
    """Each launch's phases (issue 34 item 2), in order, within the launch, each launch after
    the last; the second launch restored the pause's checkpoint."""
    trial_id = trial_of(home, experiment_id)["id"]
    rows = home.rows("SELECT launch, phase, started, ended, details FROM launch_phases "
                     "WHERE trial_id = ? ORDER BY started, id", trial_id)
    launches = sorted({row[0] for row in rows})
    assert len(launches) == 2
    previous_exit = 0.0
    for number, launch in enumerate(launches):
        its = [row[1:] for row in rows if row[0] == launch]
        names = [phase for phase, *_ in its]
        assert names[:6] == ["launch", "process_ready", "import", "model_built", "data_ready",
                             *(["restore"] if number else ["first_batch"])], names
        assert names[-1] == "exit" and "end" in names[-3:], names
        assert {"training", "checkpoint", "checkpoint_store"} <= set(names)
        begun, ended = its[0][1], its[-1][2]
        assert begun >= previous_exit
        for phase, started, stopped, _ in its:
            assert begun <= started <= stopped, (phase, started, stopped)
            assert stopped <= ended, (phase, started, stopped, ended)
        ready = json.loads(next(d for p, _, _, d in its if p == "process_ready"))
        assert ready["warm"] is False  # the daemons keep no warm process
        previous_exit = ended
    assert "2 launch(es) (0 warm, 2 cold) on 1 slot" in home.cli(
        "status", experiment_id, "--timeline").stdout


def test_pause_survives_a_daemon_restart_and_resume_ends_like_an_uninterrupted_run(
        home, tmp_path, daemons):
    daemon = daemons(home, *NO_WARM)
    home.cli("submit", write_config(tmp_path, "paused", **LONG), SLOW_DIGITS)
    paused_id = home.experiment_named("paused")["id"]
    # (The waits read the database: polling `localdet status` would take a core.)
    wait_for(lambda: home.first_trial(paused_id).get("batches_trained", 0) >= 60, 120,
             "the trial to train a while", 0.1)
    home.cli("pause", paused_id)
    wait_for(lambda: home.rows("SELECT 1 FROM experiments WHERE id = ? AND state = 'PAUSED'",
                               paused_id)
             and home.first_trial(paused_id)["state"] == "PAUSED", 60, "the pause", 0.1)
    assert home.experiment(paused_id)["state"] == "PAUSED"
    stopped_at = trial_of(home, paused_id)["batches_trained"]
    assert 60 <= stopped_at < LENGTH and stopped_at % 20 == 0  # at a workload boundary
    assert "PAUSED" in home.cli("status").stdout
    daemon.stop()

    # Sampled every second: the trial's system metrics are recorded (issue 34 item 1).
    daemon = daemons(home, *NO_WARM, "--system-metrics-period", "1")
    wait_for(lambda: "watching" in daemon.log_path.read_text(), 120, "the restart", 0.1)
    assert home.experiment(paused_id)["state"] == "PAUSED"
    assert trial_of(home, paused_id)["state"] == "PAUSED"
    home.cli("resume", paused_id)
    facts = home.wait_until_ended(paused_id)
    assert facts["state"] == "COMPLETED" and facts["trials"][0]["batches_trained"] == LENGTH

    home.cli("submit", write_config(tmp_path, "straight", **LONG), SLOW_DIGITS)
    straight_id = home.experiment_named("straight")["id"]
    assert home.wait_until_ended(straight_id)["state"] == "COMPLETED"
    daemon.stop()
    assert_ended_alike(home, paused_id, straight_id, tmp_path)
    # Each trial's system metrics were sampled while it ran, with its batches.
    for experiment_id in (paused_id, straight_id):
        trial_id = trial_of(home, experiment_id)["id"]
        (count, cpu, rss, batches), = home.rows(
            "SELECT COUNT(*), MAX(json_extract(metrics, '$.cpu_util')), "
            "MAX(json_extract(metrics, '$.memory_rss')), MAX(batches_trained) "
            "FROM system_metrics WHERE trial_id = ?", trial_id)
        assert count >= 1 and cpu > 0 and rss > 0 and 0 <= batches <= LENGTH
    log = daemon.log_path.read_text()
    assert "system metrics: each trial's CPU, memory and disk" in log
    assert " ms each on average" in log  # the sampler's cost, said as the daemon stops
    assert "CPU %" in home.cli("metrics", straight_id, "--system").stdout
    assert_timeline_of_a_paused_and_resumed_trial(home, paused_id)


def test_kill_stops_a_trial_at_once_without_a_checkpoint(home, tmp_path, daemons):
    daemon = daemons(home, *NO_WARM)
    home.cli("submit", write_config(tmp_path, "killed", **LONG), SLOW_DIGITS)
    experiment_id = home.experiment_named("killed")["id"]
    wait_for(lambda: home.first_trial(experiment_id).get("state") == "RUNNING", 180,
             "the start", 0.1)
    trial = home.first_trial(experiment_id)
    pid = trial["pid"]
    home.cli("kill", "--trial", trial["id"])
    facts = home.wait_until_ended(experiment_id, timeout=30)
    assert facts["state"] == "CANCELED" and facts["trials"][0]["state"] == "CANCELED"
    wait_for(lambda: not os.path.exists(f"/proc/{pid}"), 60, "the process to be gone", 0.1)
    result = home.cli("resume", experiment_id, check=False)
    assert result.returncode == 1 and "CANCELED" in result.stderr
    daemon.stop()
