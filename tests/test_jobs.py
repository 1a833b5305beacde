"""Batch jobs under a real daemon, with tiny scripts that do not import determined; and what
the daemon does (and does not do) with experiments it does not run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
import yaml
from conftest import Home, wait_for

from localdet.daemon.daemon import SCRIPT_GONE
from localdet.paths import Layout
from localdet.pids import DaemonLock
from localdet.records.db import StateDB

SCRIPT = textwrap.dedent("""\
    import os, pathlib, sys
    attempt = pathlib.Path("attempts.txt")  # the model folder's snapshot is the working folder
    attempt.write_text(attempt.read_text() + "x" if attempt.exists() else "x")
    print(f"job says {os.environ['GREETING']} from {sys.executable} in {os.getcwd()}", flush=True)
    pathlib.Path(os.environ["OUT_FILE"]).write_text(os.environ["LOCALDET_SLOTS"])
    sys.exit(int(os.environ.get("EXIT", "0")))
    """)


def job_folder(tmp_path, name: str, **config) -> tuple:
    code = tmp_path / f"{name}-code"
    code.mkdir()
    (code / "job.py").write_text(SCRIPT)
    raw = {"name": name, "entrypoint_script": "python3 job.py",
           "data": {"trial_id": 777}, "resources": {"slots": 1}}
    raw.update(config)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path, code


def env(out, exit_code: int = 0) -> dict:
    variables = ["GREETING=hello", f"OUT_FILE={out}", f"EXIT={exit_code}"]
    return {"environment": {"environment_variables": variables}}


def test_job_run_without_a_daemon_is_refused_in_one_sentence(home, tmp_path):
    config, code = job_folder(tmp_path, "lonely", **env(tmp_path / "out"))
    result = home.cli("job", "run", config, code, check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: ")
    assert "`localdet daemon start`" in result.stderr and "--detach" in result.stderr
    jobs = home.path / "queue" / "jobs"
    assert not jobs.exists() or not any(jobs.iterdir())  # nothing queued


def test_job_run_detached_queues_it_without_a_daemon(home, tmp_path):
    config, code = job_folder(tmp_path, "later", **env(tmp_path / "out"))
    result = home.cli("job", "run", config, code, "--detach")
    assert result.stdout.startswith("queued job later-")
    [queued] = (home.path / "queue" / "jobs").iterdir()
    assert (queued / "job.py").is_file() and (queued / "experiment.yaml").is_file()


def test_job_run_refuses_a_trial_class(home, tmp_path):
    config = tmp_path / "job.yaml"
    config.write_text("entrypoint: model_def:Trial\n")
    result = home.cli("job", "run", config, "--detach", check=False)
    assert result.returncode == 1 and "a job runs a script" in result.stderr
    assert result.stderr.count("\n") == 1


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, module_daemons):
    home = Home(tmp_path_factory.mktemp("jobs") / "home")
    running = module_daemons(home)
    yield home, running
    running.stop()


def db_of(home) -> StateDB:
    return StateDB.open(home.path / "localdet.db")


@pytest.mark.slow
def test_a_job_runs_to_completion_and_its_log_is_streamed(daemon, tmp_path):
    home, running = daemon
    out = tmp_path / "out.txt"
    config, code = job_folder(tmp_path, "ok", **env(out))
    result = home.cli("job", "run", config, code)
    first, *rest = result.stdout.splitlines()
    job_id = int(first.removeprefix("job "))
    assert any(line.startswith(f"job says hello from {sys.executable}") for line in rest)
    assert out.read_text() == "0"
    facts = home.json("status", job_id)
    assert (facts["kind"], facts["state"], facts["slots"]) == ("job", "COMPLETED", 1)
    assert str(Layout(home.path).model_dir(job_id)) in result.stdout  # ran in its snapshot
    assert "job says hello" in facts["log_tail"]
    text = home.cli("status").stdout
    assert "Jobs" in text and "ok" in text
    assert "job says hello" in home.cli("status", job_id).stdout
    assert running.process.poll() is None


@pytest.mark.slow
def test_a_failing_job_is_restarted_max_restarts_times_then_errors(daemon, tmp_path):
    home, _ = daemon
    config, code = job_folder(tmp_path, "fails", max_restarts=1, **env(tmp_path / "out", 3))
    result = home.cli("job", "run", config, code, check=False)
    assert result.returncode == 1
    job_id = int(result.stdout.splitlines()[0].removeprefix("job "))
    assert result.stdout.count("job says hello") == 2  # the first run and one restart
    assert result.stderr.startswith(f"error: job {job_id} failed")
    assert result.stderr.count("\n") == 1
    facts = home.json("status", job_id)
    assert facts["state"] == "ERROR" and "job says hello" in facts["error"]
    assert facts["trials"][0]["restarts"] == 1
    assert (Layout(home.path).model_dir(job_id) / "attempts.txt").read_text() == "xx"


@pytest.mark.slow
def test_a_job_can_be_killed_but_not_paused(daemon, tmp_path):
    home, _ = daemon
    config = tmp_path / "sleepy.yaml"
    config.write_text("name: sleepy\nentrypoint: sleep 300\n")
    home.cli("job", "run", config, "--detach")
    job_id = home.experiment_named("sleepy")["id"]
    wait_for(lambda: home.first_trial(job_id).get("state") == "RUNNING", 120, "the start", 0.1)
    pid = home.first_trial(job_id)["pid"]
    for action in ("pause", "resume"):
        refused = home.cli(action, job_id, check=False)
        assert refused.returncode == 1 and refused.stderr.count("\n") == 1
        assert "cannot be" in refused.stderr and f"`localdet kill {job_id}`" in refused.stderr
    assert home.cli("kill", job_id).stdout.startswith(f"kill requested for job {job_id}")
    assert home.wait_until_ended(job_id, timeout=30)["state"] == "CANCELED"
    wait_for(lambda: not os.path.exists(f"/proc/{pid}"), 60, "the process to be gone")


@pytest.mark.slow
def test_a_bare_job_yaml_dropped_in_queue_jobs_runs(daemon, tmp_path):
    home, _ = daemon
    out = tmp_path / "bare.txt"
    (tmp_path / "bare.yaml").write_text(
        f"name: bare\nentrypoint: python3 -c \"open('{out}', 'w').write('bare')\"\n")
    os.rename(tmp_path / "bare.yaml", home.path / "queue" / "jobs" / "bare.yaml")
    job_id = home.experiment_named("bare")["id"]
    assert home.wait_until_ended(job_id, timeout=30)["state"] == "COMPLETED"
    assert out.read_text() == "bare"


@pytest.mark.slow
def test_a_job_whose_program_is_missing_errors_and_the_daemon_carries_on(daemon, tmp_path):
    home, running = daemon
    config = tmp_path / "missing.yaml"
    config.write_text("name: missing\nentrypoint: no-such-program-here --flag\n")
    result = home.cli("job", "run", config, check=False)
    assert result.returncode == 1
    assert "cannot start 'no-such-program-here'" in result.stdout  # its log, streamed
    job_id = int(result.stdout.splitlines()[0].removeprefix("job "))
    assert "no such program" in home.json("status", job_id)["error"]
    assert running.process.poll() is None


@pytest.mark.slow
def test_a_job_wanting_more_slots_than_the_daemon_has_errors(daemon, tmp_path):
    home, _ = daemon
    config = tmp_path / "big.yaml"
    config.write_text("name: big\nentrypoint: python3 -c pass\nresources: {slots: 4}\n")
    result = home.cli("job", "run", config, check=False)
    assert result.returncode == 1
    assert "resources.slots is 4" in result.stderr and "--slots 4" in result.stderr


# -- experiments the daemon does not run ---------------------------------------------------------

def record_unmanaged(home, runner: str, state: str = "ACTIVE", trial_state: str = "RUNNING",
                     pid: int | None = None, command: str = "python3 -c pass") -> tuple[int, int]:
    from localdet.config.experiment import parse_config
    layout = Layout(home.path)
    db = db_of(home)
    config = parse_config({"name": f"{runner}-run", "entrypoint": command}).config
    experiment_id = db.create_experiment(
        name=f"{runner}-run", description="", config=config, original_config="",
        searcher="single", metric="val_loss", smaller_is_better=True, experiment_seed=1,
        model_dir="", runner=runner)
    model_dir = layout.model_dir(experiment_id)
    model_dir.mkdir(parents=True)
    db.db["experiments"].update(experiment_id, {"model_dir": str(model_dir), "state": state})
    trial_id = db.create_trial(experiment_id=experiment_id, request_id=1, hparams={}, seed=1,
                               target_batches=0)
    db.update_trial(trial_id, state=trial_state, pid=pid)
    db.close()
    return experiment_id, trial_id


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


@pytest.mark.slow
def test_the_daemon_marks_a_killed_script_run_and_leaves_a_live_one_alone(daemon):
    home, _ = daemon
    live = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        alive_id, alive_trial = record_unmanaged(home, "script", pid=live.pid)
        dead_id, dead_trial = record_unmanaged(home, "script", pid=dead_pid())
        wait_for(lambda: home.rows("SELECT 1 FROM experiments WHERE id = ? AND state = 'ERROR'",
                                   dead_id), 30, "the dead script to be noticed", 0.1)
        facts = home.experiment(dead_id)
        assert facts["state"] == "ERROR"
        assert facts["error"] == SCRIPT_GONE and facts["trials"][0]["error"] == SCRIPT_GONE
        time.sleep(1.5)
        still = home.experiment(alive_id)
        assert still["state"] == "ACTIVE" and still["trials"][0]["state"] == "RUNNING"
        assert "(script)" in home.cli("status").stdout
        for action in ("pause", "resume", "kill"):
            refused = home.cli(action, alive_id, check=False)
            assert refused.returncode == 1 and refused.stderr.count("\n") == 1
            assert "a script running outside the daemon" in refused.stderr
            assert "Ctrl-C in its terminal" in refused.stderr
        assert live.poll() is None  # never signalled
    finally:
        live.kill()
        live.wait()


@pytest.mark.slow
def test_a_request_for_a_foreground_run_waits_for_it_then_the_daemon_takes_over(daemon, tmp_path):
    home, _ = daemon
    experiment_id, trial_id = record_unmanaged(
        home, "foreground", state="PAUSED", trial_state="PAUSED",
        command="python3 -c \"print('resumed by the daemon')\"")
    layout = Layout(home.path)
    lock = DaemonLock(layout.run_lock(experiment_id))
    lock.acquire()  # stands in for a live `localdet run`
    try:
        result = home.cli("resume", experiment_id)
        assert "daemon is not running" not in result.stderr
        time.sleep(2)
        db = db_of(home)
        assert db.experiment(experiment_id).runner == "foreground"
        assert [r["handled_at"] for r in db.pending_requests()
                if r["experiment_id"] == experiment_id] == [None]
    finally:
        lock.release()  # `localdet run` ended
    wait_for(lambda: db_of(home).experiment(experiment_id).runner == "daemon", 120, "the takeover")
    home.wait_until_ended(experiment_id, timeout=30)
    log = layout.trial_log(experiment_id, trial_id).read_text()
    assert "resumed by the daemon" in log
