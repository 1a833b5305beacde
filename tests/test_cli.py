"""The `localdet` command without a daemon: it reads the database, and every mistake a user
can make gets one sentence on stderr, exit status 1 and no traceback."""

from __future__ import annotations

import json

import pytest
from conftest import EXAMPLE, Home, write_config

from localdet.daemon.submissions import Intake
from localdet.paths import Layout
from localdet.records.db import StateDB


@pytest.fixture
def home(tmp_path) -> Home:
    """Every command as its own process, as a user runs it (elsewhere some run in-process)."""
    return Home(tmp_path / "home", in_process=False)


def ingest_example(home) -> int:
    """Record an experiment the way the daemon would, without running it."""
    layout = Layout(home.path).ensure()
    home.cli("submit", EXAMPLE / "const.yaml", EXAMPLE)
    intake = Intake(layout, StateDB.open(layout.db), settle_seconds=0)
    intake.poll()
    (experiment_id,) = intake.poll()
    return experiment_id


def assert_one_sentence_error(result, *fragments: str) -> None:
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


def test_status_without_a_daemon_reads_the_database_and_says_so(home):
    experiment_id = ingest_example(home)
    result = home.cli("status")
    assert "the daemon is not running" in result.stdout
    assert "digits-const" in result.stdout and "ACTIVE" in result.stdout
    facts = home.json("status")
    assert [(e["id"], e["name"], e["state"], e["searcher"], e["trials"]) for e in facts] == [
        (experiment_id, "digits-const", "ACTIVE", "single", [])]
    assert home.json("status", experiment_id)["metric"] == "val_accuracy"
    assert home.json("checkpoints", experiment_id) == []


def test_submit_warns_about_keys_that_mean_nothing_on_one_machine(home, tmp_path):
    config = write_config(tmp_path, "with-image", environment={"image": "determinedai/x:1"},
                          bind_mounts=[{"host_path": "/data", "container_path": "/data"}])
    result = home.cli("submit", config, EXAMPLE)
    assert "environment.image" in result.stderr and "bind_mounts" in result.stderr
    assert result.stdout.startswith("queued with-image-")


def test_user_mistakes_get_one_sentence(home, tmp_path):
    bad = write_config(tmp_path, "bad", searcher={"name": "single", "metric": "m",
                                                  "max_length": {"batches": "ten"}})
    assert_one_sentence_error(home.cli("submit", bad, EXAMPLE, check=False),
                              "searcher.max_length")
    assert sorted(p.name for p in (home.path / "queue").iterdir()) == ["jobs", "rejected"]
    good = write_config(tmp_path, "good")
    assert_one_sentence_error(home.cli("submit", good, tmp_path / "missing", check=False),
                              "does not exist")
    empty = home.cli("status")  # nothing yet is no error (as `det e list`): exit 0
    assert "no experiments yet" in empty.stdout and "`localdet daemon start`" in empty.stdout
    ingest_example(home)
    assert_one_sentence_error(home.cli("status", "99", check=False), "no experiment 99")
    assert_one_sentence_error(home.cli("checkpoints", "99", check=False), "no experiment 99")
    assert_one_sentence_error(home.cli("checkpoint", "export", "abc", tmp_path / "x",
                                       check=False), "no checkpoint matches 'abc'")


def test_json_output_is_machine_readable(home):
    experiment_id = ingest_example(home)
    facts = json.loads(home.cli("status", experiment_id, "--json").stdout)
    assert {"id", "name", "state", "searcher", "trials", "progress", "best_metric"} <= set(facts)


def record(home, *, kind: str = "experiment", runner: str = "daemon") -> int:
    from localdet.config.experiment import parse_config, parse_job_config
    layout = Layout(home.path).ensure()
    config = (parse_job_config({"entrypoint": "python3 infer.py"}) if kind == "job" else
              parse_config({"entrypoint": "python3 train.py"})).config
    db = StateDB.open(layout.db)
    experiment_id = db.create_experiment(
        name=f"{kind}-{runner}", description="", config=config, original_config="",
        searcher="none" if kind == "job" else "single", metric="", smaller_is_better=True,
        experiment_seed=1, model_dir="/nowhere", kind=kind, runner=runner)
    db.create_trial(experiment_id=experiment_id, request_id=0, hparams={}, seed=1,
                    target_batches=0)
    return experiment_id


def test_requests_for_a_script_run_are_refused_naming_ctrl_c(home):
    script_id = record(home, runner="script")
    for action in ("pause", "resume", "kill"):
        assert_one_sentence_error(home.cli(action, script_id, check=False),
                                  f"experiment {script_id} is a script running outside the "
                                  "daemon", "Ctrl-C in its terminal")
    trial_id = StateDB.open(Layout(home.path).db).trials(script_id)[0].id
    assert_one_sentence_error(home.cli("kill", "--trial", trial_id, check=False), "Ctrl-C")


def test_a_job_cannot_be_paused_or_resumed_but_can_be_killed(home):
    job_id = record(home, kind="job")
    for action in ("pause", "resume"):
        assert_one_sentence_error(home.cli(action, job_id, check=False),
                                  f"job {job_id} cannot be", f"`localdet kill {job_id}`")
    assert home.cli("kill", job_id).stdout == f"kill requested for job {job_id}\n"


def test_status_shows_jobs_apart_and_json_has_kind_and_runner(home):
    experiment_id = record(home, runner="foreground")
    job_id = record(home, kind="job")
    text = home.cli("status").stdout
    assert "Experiments" in text and "Jobs" in text and "experiment-foreground (foreground)" in text
    facts = {f["id"]: f for f in home.json("status")}
    assert (facts[experiment_id]["kind"], facts[experiment_id]["runner"]) == ("experiment",
                                                                              "foreground")
    assert (facts[job_id]["kind"], facts[job_id]["slots"]) == ("job", 1)
    job = home.json("status", job_id)
    assert {"log", "log_tail", "slots", "started_at", "duration_seconds"} <= set(job)
    shown = home.cli("status", job_id).stdout
    assert f"Job {job_id}" in shown and "Slots" in shown and "trial.log" in shown


def test_submit_refuses_more_slots_than_the_running_daemon_has(home, tmp_path):
    from localdet.pids import DaemonLock
    from localdet.scheduling.slots import Slot, cpu_only, write_slot_file

    layout = Layout(home.path).ensure()
    wide = write_config(tmp_path, "wide", resources={"slots_per_trial": 4})
    write_slot_file(layout.slot_file, cpu_only(2))
    running = DaemonLock(layout.daemon_lock)
    running.acquire()  # as a running daemon does
    assert_one_sentence_error(
        home.cli("submit", wide, EXAMPLE, check=False),
        "resources.slots_per_trial is 4 but this machine has 2 CPU slots; lower "
        "resources.slots_per_trial or start `localdet daemon --slots 4`")
    write_slot_file(layout.slot_file, [Slot(i, "gpu", "NVIDIA H100 80GB HBM3", 81559, str(i))
                                       for i in range(3)])
    assert_one_sentence_error(home.cli("submit", wide, EXAMPLE, check=False),
                              "resources.slots_per_trial is 4 but this machine has 3 GPUs",
                              "to 3 or fewer")
    job = tmp_path / "job.yaml"
    job.write_text("entrypoint: python3 infer.py\nresources: {slots: 5}\n")
    assert_one_sentence_error(home.cli("job", "run", "--detach", job, tmp_path, check=False),
                              "resources.slots is 5 but this machine has 3 GPUs")
    assert sorted(p.name for p in (home.path / "queue").iterdir()) == ["jobs", "rejected"]
    assert list((home.path / "queue" / "jobs").iterdir()) == []
    fits = write_config(tmp_path, "fits", resources={"slots_per_trial": 3})
    assert home.cli("submit", fits, EXAMPLE).stdout.startswith("queued fits-")
    running.release()
