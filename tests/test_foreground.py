"""`localdet run`: one experiment in the foreground, no daemon; a real TFKerasTrial trains."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import EXAMPLE, wait_for, write_config

from localdet.paths import Layout
from localdet.records.db import StateDB

SHORT = dict(searcher={"name": "single", "metric": "val_accuracy", "smaller_is_better": False,
                       "max_length": {"batches": 40}},
             scheduling_unit=20, min_validation_period={"batches": 20})
LONG = dict(SHORT, searcher={**SHORT["searcher"], "max_length": {"batches": 3000}})


def start_run(processes, home, config, model_dir, *args) -> subprocess.Popen:
    """`localdet run` in the background (ended with its trials at the test's end)."""
    return processes([sys.executable, "-m", "localdet", "run", config, model_dir, *args],
                     home=home, env=home.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                     text=True)


@pytest.mark.parametrize("problem", ["config", "folder", "missing config"])
def test_a_bad_config_or_folder_is_one_sentence_exit_2_and_nothing_recorded(home, tmp_path,
                                                                              problem):
    config = write_config(tmp_path, "bad", **({"serarcher": {}} if problem == "config" else {}))
    if problem == "missing config":
        config = tmp_path / "missing.yaml"
    model_dir = tmp_path / "nowhere" if problem == "folder" else EXAMPLE
    result = home.cli("run", config, model_dir, check=False)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr
    assert {"config": "serarcher", "folder": "does not exist",
            "missing config": "does not exist"}[problem] in result.stderr
    db_path = home.path / "localdet.db"
    assert not db_path.exists() or StateDB.open(db_path).experiments() == []


@pytest.mark.slow
def test_run_trains_in_the_foreground_and_leaves_the_daemons_records(home, tmp_path):
    config = write_config(tmp_path, "fg", **SHORT)
    result = home.cli("run", config, EXAMPLE)
    db = StateDB.open(home.path / "localdet.db")
    [experiment] = db.experiments()
    assert (experiment.runner, experiment.kind, experiment.state) == ("foreground", "experiment",
                                                                      "COMPLETED")
    # The same snapshot and events an ingested submission leaves.
    model_dir = Layout(home.path).model_dir(experiment.id)
    assert experiment.model_dir == str(model_dir)
    assert (model_dir / "model_def.py").is_file() and (model_dir / "experiment.yaml").is_file()
    assert not (model_dir / "const.yaml").exists()  # the given config replaces the folder's
    kinds = [e["kind"] for e in db.events(experiment.id)]
    assert "submission_ingested" in kinds and "trial_launched" in kinds
    [trial] = db.trials(experiment.id)
    assert trial.state == "COMPLETED" and trial.batches_trained == 40
    best = home.json("checkpoints", experiment.id, "--best")[0]
    out = result.stdout
    assert f"experiment {experiment.id}: COMPLETED" in out
    assert "best validation val_accuracy: " in out and f"best checkpoint: {best['uuid']}" in out
    assert "validation at 40" in out  # the trial's log lines
    assert "40/40 batches" in out  # its progress bar
    assert "(foreground)" in home.cli("status").stdout
    assert not (home.path / "daemon.lock").exists() or home.cli("status").stdout.startswith(
        "the daemon is not running")


@pytest.mark.slow
def test_ctrl_c_pauses_and_a_daemon_resumes_it_to_the_end(home, tmp_path, daemons, processes):
    config = write_config(tmp_path, "interrupted", **LONG)
    run = start_run(processes, home, config, EXAMPLE, "--quiet")
    db_path = home.path / "localdet.db"
    wait_for(lambda: home.rows("SELECT 1 FROM trials WHERE batches_trained >= 40"), 120,
             "training", 0.1)
    run.send_signal(signal.SIGINT)
    out, err = run.communicate(timeout=120)
    assert run.returncode == 1, err
    db = StateDB.open(db_path)
    [experiment] = db.experiments()
    [trial] = db.trials(experiment.id)
    assert experiment.state == "PAUSED" and trial.state == "PAUSED", out + err
    assert 40 <= trial.batches_trained < 3000 and trial.latest_checkpoint
    assert f"`localdet resume {experiment.id}`" in out and "best checkpoint: " in out

    daemon = daemons(home)
    home.cli("resume", experiment.id)
    facts = home.wait_until_ended(experiment.id, timeout=180)
    assert facts["state"] == "COMPLETED" and facts["trials"][0]["batches_trained"] == 3000
    assert StateDB.open(db_path).experiment(experiment.id).runner == "daemon"
    daemon.stop()


@pytest.mark.slow
def test_ctrl_c_twice_kills_the_trials(home, tmp_path, processes):
    # One workload to the end: the pause the first Ctrl-C asks for cannot land in between.
    config = write_config(tmp_path, "killed", **dict(LONG, scheduling_unit=3000,
                                                     min_validation_period={"batches": 0}))
    run = start_run(processes, home, config, EXAMPLE, "--quiet")
    db_path = home.path / "localdet.db"
    wait_for(lambda: home.rows("SELECT 1 FROM trials WHERE state = 'RUNNING'"), 120,
             "the start", 0.1)
    pid = StateDB.open(db_path).trials()[0].pid
    run.send_signal(signal.SIGINT)
    time.sleep(1)  # two signals at once are one pending signal
    run.send_signal(signal.SIGINT)
    out, err = run.communicate(timeout=60)
    assert run.returncode == 1
    [experiment] = StateDB.open(db_path).experiments()
    assert experiment.state == "CANCELED", out + err
    assert "was CANCELED" in err
    wait_for(lambda: not os.path.exists(f"/proc/{pid}"), 60, "the process to end")
