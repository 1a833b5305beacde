"""A trial that grows without bound is stopped: `resources.max_memory`, or the daemon's
`--trial-memory-fraction`, caps the memory of the trial's whole process tree; the trial ends
ERROR with "exceeded its memory limit of N GB" and is not restarted, while the daemon and
the other trials run on. The end-to-end tests run under both mechanisms: the one the
machine allows (a cgroup here, where the kernel enforces it) and the watcher."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import yaml
from conftest import TEST_TRIALS, Daemon, wait_for
from test_fail_fast import experiment as tiny_experiment
from test_fail_fast import model_folder

from localdet.config.experiment import ConfigError, parse_config, parse_job_config
from localdet.processes import memory_limit

HOG = TEST_TRIALS / "memory_hog"
SCRIPT = {"entrypoint": "python3 hog.py"}


# -- the config key ---------------------------------------------------------------------------
@pytest.mark.parametrize("given, expected", [
    ("300MB", 300_000_000), ("0.5GiB", 2**29), ("1.5 gb", 1_500_000_000),
    (200_000_000, 200_000_000), (2e8, 200_000_000), (None, None),
])
def test_max_memory_becomes_bytes(given, expected):
    config = parse_config({**SCRIPT, "resources": {"max_memory": given}}).config
    assert config["resources"]["max_memory"] == expected


@pytest.mark.parametrize("given, says", [
    (0, "expected a size above zero, such as '4GB' (got 0)"),
    (-1, "expected a size above zero, such as '4GB' (got -1)"),
    ("-2GB", "expected a size above zero"),
    ("lots", "expected a size such as '4GB', '512MB' or '2GiB', or a number of bytes "
             "(got 'lots')"),
    ("4 gigs", "expected a size such as '4GB'"),
    ([4], "expected a size such as '4GB'"),
    (True, "expected a size such as '4GB'"),
    (300, "300 is less than 1 MB, too little for any trial; did you mean '300MB'?"),
    (float("nan"), "expected a size such as '4GB'"),
])
def test_a_bad_max_memory_is_one_sentence_naming_the_key(given, says):
    with pytest.raises(ConfigError) as caught:
        parse_config({**SCRIPT, "resources": {"max_memory": given}})
    assert str(caught.value).startswith(f"resources.max_memory: {says}")
    assert caught.value.path == "resources.max_memory"
    assert "\n" not in str(caught.value)


def test_a_max_memory_above_the_machines_memory_is_refused():
    total = memory_limit.physical_memory()
    with pytest.raises(ConfigError) as caught:
        parse_config({**SCRIPT, "resources": {"max_memory": 2 * total}})
    assert str(caught.value) == (
        f"resources.max_memory: {2 * total} is more than this machine's "
        f"{memory_limit.gigabytes(total)} of memory; lower it, or leave it out for no limit")


def test_a_job_takes_max_memory_too():
    job = parse_job_config({"entrypoint_script": "python3 hog.py",
                            "resources": {"max_memory": "1GiB"}}).config
    assert job["resources"]["max_memory"] == 2**30
    with pytest.raises(ConfigError, match=r"^resources\.max_memory: expected a size"):
        parse_job_config({"entrypoint_script": "python3 hog.py",
                          "resources": {"max_memory": "much"}})


# -- the limit of a launch ----------------------------------------------------------------------
def test_the_daemons_fraction_applies_when_the_config_sets_no_limit(layout, db):
    from localdet.daemon.daemon import Daemon as RealDaemon

    guard = RealDaemon(layout, trial_memory_fraction=0.25).open(db).memory
    total = memory_limit.physical_memory()
    unset = parse_config(SCRIPT).config
    assert guard.limit_for(unset) == (
        int(0.25 * total), "localdet daemon --trial-memory-fraction 0.25")
    configured = parse_config({**SCRIPT, "resources": {"max_memory": "300MB"}}).config
    assert guard.limit_for(configured) == (300_000_000, "resources.max_memory")
    assert RealDaemon(layout).open(db).memory.limit_for(unset) is None


def test_the_error_names_the_limit_and_what_to_change():
    assert memory_limit.message(300_000_000, "resources.max_memory") == (
        "the trial exceeded its memory limit of 0.3 GB (resources.max_memory) and was "
        "stopped; raise resources.max_memory, or make the trial use less memory")
    assert "set a higher resources.max_memory" in memory_limit.message(
        10**9, "localdet daemon --trial-memory-fraction 0.5")
    assert memory_limit.gigabytes(2**31) == "2.15 GB"
    assert memory_limit.gigabytes(512 * 10**9) == "512 GB"


@pytest.mark.parametrize("fraction", ["0", "-0.5", "1.5", "half"])
def test_the_daemon_refuses_a_fraction_outside_zero_to_one(home, fraction):
    result = home.cli("daemon", "--trial-memory-fraction", fraction, check=False)
    assert result.returncode == 2
    assert "--trial-memory-fraction" in result.stderr
    assert not (home.path / "localdet.db").exists()  # refused before it started


# -- end to end -----------------------------------------------------------------------------
MECHANISMS = ["auto", "watcher"]


def start_daemon(daemons, home, mechanism: str, *args: str) -> Daemon:
    """A daemon from the `daemons` fixture (stopped, its trials ended, at the test's end),
    without a warm process: no trial here ran in one (a 1-slot daemon's imported TensorFlow
    for nothing, some 4 CPU seconds, and outlived the daemons stopped early)."""
    home.env.pop("LOCALDET_MEMORY_WATCHER", None)
    if mechanism == "watcher":
        home.env["LOCALDET_MEMORY_WATCHER"] = "1"
    return daemons(home, *args, "--warm", "0")


def stop_leaving_trials(daemon: Daemon) -> None:
    """Stop the daemon alone: its trials run on, for the next daemon to adopt."""
    daemon.process.terminate()
    daemon.process.wait(timeout=30)
    daemon.log.close()


def expected_enforcement(mechanism: str) -> str:
    """How the trial's log says its limit is enforced."""
    if mechanism == "auto" and memory_limit.enforcement()[0] is not None:
        return "enforced by a cgroup"
    return "enforced by a watcher"


def submit(home, tmp_path: Path, name: str, args: str = "", job: bool = False,
           max_restarts: int = 3, environment: list[str] | None = None, **resources) -> int:
    config = {"name": name, "entrypoint_script": f"python3 hog.py {args}".strip(),
              "resources": resources,
              "environment": {"environment_variables": environment or []}}
    if not job:
        config["max_restarts"] = max_restarts
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    if job:
        home.cli("job", "run", "--detach", path, HOG)
    else:
        home.cli("submit", path, HOG)
    return home.experiment_named(name)["id"]


def trial_log(home, experiment_id: int) -> str:
    """The log of the experiment's one trial ("" before it starts)."""
    logs = sorted((home.path / "experiments" / str(experiment_id)).glob("trials/*/trial.log"))
    return logs[0].read_text() if logs else ""


def launches(home, experiment_id: int) -> int:
    with sqlite3.connect(home.path / "localdet.db", timeout=30) as db:
        return db.execute("SELECT COUNT(*) FROM events WHERE kind = 'trial_launched' "
                          "AND experiment_id = ?", [experiment_id]).fetchone()[0]


def assert_stopped_for_memory(home, experiment_id: int, limit: str, source: str,
                              enforcement: str) -> None:
    facts = home.wait_until_ended(experiment_id, timeout=120)
    assert facts["state"] == "ERROR"
    (trial,) = facts["trials"]
    assert trial["state"] == "ERROR"
    assert trial["error"].startswith(
        f"the trial exceeded its memory limit of {limit} ({source}) and was stopped")
    assert "a restart would only reach the limit again, so it was not restarted" in trial["error"]
    assert trial["restarts"] == 0 and launches(home, experiment_id) == 1
    log = trial_log(home, experiment_id)
    assert f"[localdet] memory limit {limit} ({source}) over all its processes, " \
           f"{enforcement}" in log
    assert f"[localdet] the trial exceeded its memory limit of {limit}" in log


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_a_trial_over_its_limit_ends_error_and_the_others_run_on(home, tmp_path, mechanism,
                                                                 daemons):
    # The daemon-wide default: about 400 MB on any machine.
    fraction = f"{400e6 / memory_limit.physical_memory():.6f}"
    default = memory_limit.gigabytes(int(float(fraction) * memory_limit.physical_memory()))
    daemon = start_daemon(daemons, home, mechanism, "--slots", "4",
                          "--trial-memory-fraction", fraction)
    release = tmp_path / "release"
    # A TensorFlow trial that trains within its limit, meanwhile.
    home.cli("submit", tiny_experiment(tmp_path, "within", resources={"max_memory": "3GB"}),
             model_folder(tmp_path / "within"))
    within = home.experiment_named("within")["id"]
    # A job that runs meanwhile and ends when told.
    bystander = submit(home, tmp_path, "bystander", f"--release {release}", job=True)
    wait_for(lambda: "waiting for release" in trial_log(home, bystander), 60,
             "the job to start", 0.1)
    # One process that grows without end, over its config's limit.
    grows = submit(home, tmp_path, "grows", max_memory="200MB")
    # Four processes of 150 MB each: none alone reaches the daemon's 400 MB default,
    # their sum does.
    tree = submit(home, tmp_path, "tree", "--children 4 --each 150")
    # Two ranks under the rank supervisor (localdet.processes.ranks), 150 MB each.
    ranks = submit(home, tmp_path, "ranks", "--hold 150", max_memory="250MB",
                   slots_per_trial=2, engine="multi_worker_mirrored",
                   environment=["TF_USE_LEGACY_KERAS=1"])
    enforcement = expected_enforcement(mechanism)
    assert_stopped_for_memory(home, grows, "0.2 GB", "resources.max_memory", enforcement)
    assert_stopped_for_memory(home, tree, default,
                              f"localdet daemon --trial-memory-fraction {float(fraction):g}",
                              enforcement)
    assert_stopped_for_memory(home, ranks, "0.25 GB", "resources.max_memory", enforcement)
    assert home.experiment(bystander)["state"] == "ACTIVE"
    release.touch()
    assert home.wait_until_ended(bystander, timeout=60)["state"] == "COMPLETED"
    assert home.wait_until_ended(within, timeout=120)["state"] == "COMPLETED"
    assert f"[localdet] memory limit 3 GB (resources.max_memory) over all its processes, " \
           f"{enforcement}" in trial_log(home, within)
    assert daemon.process.poll() is None  # the daemon lived through it all
    told = daemon.log_path.read_text()
    assert "trial memory limits are enforced by " in told
    daemon.stop()


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_an_adopted_trial_is_still_held_to_its_limit(home, tmp_path, mechanism, daemons):
    go = tmp_path / "go"
    first = start_daemon(daemons, home, mechanism)
    grows = submit(home, tmp_path, "adopted", f"--wait {go}", max_memory="300MB")
    wait_for(lambda: "holding 50 MB" in trial_log(home, grows), 60, "the trial to start",
             0.1)
    stop_leaving_trials(first)
    second = start_daemon(daemons, home, mechanism)
    wait_for(lambda: "adopted trial 1" in second.log_path.read_text(), 30, "the adoption",
             0.1)
    go.touch()  # only now does it grow
    assert_stopped_for_memory(home, grows, "0.3 GB", "resources.max_memory",
                              expected_enforcement(mechanism))
    assert second.process.poll() is None
    second.stop()


@pytest.mark.slow
def test_a_trial_the_kernel_stopped_while_no_daemon_ran_is_told_as_over_its_limit(
        home, tmp_path, daemons):
    if memory_limit.enforcement()[0] is None:
        pytest.skip("no enforcing cgroup v1 memory controller here: only a running daemon's "
                    "watcher enforces limits")
    go = tmp_path / "go"
    first = start_daemon(daemons, home, "auto")
    grows = submit(home, tmp_path, "unwatched", f"--wait {go}", max_memory="300MB")
    wait_for(lambda: "holding 50 MB" in trial_log(home, grows), 60, "the trial to start",
             0.1)
    stop_leaving_trials(first)
    from localdet.pids import alive
    from localdet.records.db import StateDB

    db = StateDB.open(home.path / "localdet.db")
    pid = db.trial(1).pid
    db.close()
    go.touch()
    wait_for(lambda: not alive(pid), 60, "the kernel to stop the trial", 0.1)
    second = start_daemon(daemons, home, "auto")
    assert_stopped_for_memory(home, grows, "0.3 GB", "resources.max_memory",
                              "enforced by a cgroup")
    second.stop()
