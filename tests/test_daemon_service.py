"""The daemon as a service (issue 33, item 2): `localdet daemon start/status/stop`, the systemd
user unit `install-service` writes, the "no daemon" messages, `det e create` checking its
config before it starts anything, and a state folder that cannot be used as one sentence."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner
from conftest import (
    EXAMPLE,
    end_running_trials,
    end_warm_processes,
    one_error_line,
    wait_for,
    write_config,
)

from localdet.daemon import service
from localdet.daemon.systemd_unit import unit_text
from localdet.paths import Layout
from localdet.pids import DaemonLock


@pytest.fixture
def stopped_at_end(home):
    """Whatever daemon the test started on `home` is stopped at its end (with its trials)."""
    yield home
    if DaemonLock.holder(home.path / "daemon.lock") is not None:
        home.cli("daemon", "stop", "--now", "--timeout", "30", check=False)
    end_running_trials(home)
    end_warm_processes(home)


def test_start_status_stop(stopped_at_end):
    home = stopped_at_end
    absent = home.cli("daemon", "status", check=False)
    assert absent.returncode == 1 and "`localdet daemon start`" in absent.stderr

    started = home.cli("daemon", "start", "--slots", "2", "--warm", "0")
    pid = DaemonLock.holder(home.path / "daemon.lock")
    assert f"pid {pid}" in started.stdout and str(home.path / "daemon.log") in started.stdout
    assert "watching" in (home.path / "daemon.log").read_text()

    facts = json.loads(home.cli("daemon", "status", "--json").stdout)
    assert facts["running"] and facts["pid"] == pid and facts["here"]
    assert facts["slots"] == 2  # the options reached the detached daemon
    assert facts["version"] == service.version() and facts["dashboard"] is None
    assert facts["uptime_seconds"] >= 0
    shown = home.cli("daemon", "status").stdout
    assert f"pid:       {pid}" in shown and "2 CPU slots" in shown

    refused = home.cli("daemon", "start", check=False)
    assert f"already runs on {home.path}" in one_error_line(refused)

    stopped = home.cli("daemon", "stop")
    assert f"stopped the localdet daemon (pid {pid}); no trial was running" in stopped.stdout
    assert DaemonLock.holder(home.path / "daemon.lock") is None
    assert not (home.path / service.RUNTIME_FILE).exists()
    assert "stopping: no trial left running; exiting" in (home.path / "daemon.log").read_text()
    again = home.cli("daemon", "stop")  # nothing to stop is what was asked: exit 0
    assert "no localdet daemon is running" in again.stdout


def test_the_foreground_daemon_options_go_after_a_subcommand(home):
    refused = home.cli("daemon", "--slots", "2", "start", check=False)
    assert "after `start`" in one_error_line(refused)
    assert not home.path.exists()


@pytest.mark.slow
def test_stop_checkpoints_running_trials_and_queues_them_again(
        stopped_at_end, tmp_path):
    home = stopped_at_end
    length, unit = 4000, 20
    home.cli("daemon", "start", "--warm", "0")
    config = write_config(tmp_path, "long", scheduling_unit=unit, searcher={
        "name": "single", "metric": "val_accuracy", "smaller_is_better": False,
        "max_length": {"batches": length}}, min_validation_period={"batches": 200})
    home.cli("submit", config, EXAMPLE)
    experiment_id = home.experiment_named("long")["id"]
    wait_for(lambda: home.first_trial(experiment_id).get("batches_trained", 0) >= 2 * unit,
             180, "the trial to train a while", 0.1)

    stopped = home.cli("daemon", "stop", "--timeout", "120")
    assert "its 1 running trial(s) checkpointed and wait queued" in stopped.stdout
    trial = home.first_trial(experiment_id)
    # At a boundary, checkpointed, and queued again rather than paused.
    assert trial["state"] == "QUEUED" and trial["stop_requested"] is None
    assert 0 < trial["batches_trained"] < length and trial["batches_trained"] % unit == 0
    assert trial["latest_checkpoint"]
    assert home.experiment(experiment_id)["state"] == "ACTIVE"
    assert trial["restarts"] == 0  # held, not failed: the next daemon launches it again
    assert home.cli("daemon", "status", check=False).returncode == 1


def test_submit_with_no_daemon_says_nothing_runs_it(home):
    result = home.cli("submit", EXAMPLE / "const.yaml", EXAMPLE)
    assert result.stdout.startswith("queued ")
    assert result.stderr.strip() == (f"note: no localdet daemon is running on {home.path}, so "
                                     "nothing will run it until `localdet daemon start`")
    status = home.cli("status")
    assert (f"1 submission(s) wait in {home.path / 'queue'}; nothing runs them until "
            "`localdet daemon start`") in status.stdout.replace("\n", " ")


@pytest.mark.parametrize("command", [["daemon"], ["daemon", "start"],
                                     ["submit", str(EXAMPLE / "const.yaml"), str(EXAMPLE)]],
                         ids=" ".join)
def test_a_records_file_that_is_a_folder_is_one_sentence(home, command):
    (home.path / "localdet.db").mkdir(parents=True)
    line = one_error_line(home.cli(*command, check=False))
    assert line == (f"error: {home.path / 'localdet.db'} is a folder, not localdet's records "
                    "(a SQLite file); move it aside, or set LOCALDET_HOME to another state "
                    "folder")
    assert not (home.path / "daemon.lock").exists()


@pytest.mark.parametrize("command", [["daemon"], ["daemon", "start"]], ids=" ".join)
def test_a_state_folder_that_cannot_be_made_is_one_sentence(home, tmp_path, command):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    home.env["LOCALDET_HOME"] = str(blocker / "home")
    line = one_error_line(home.cli(*command, check=False))
    assert line.startswith(f"error: cannot make the state folder {blocker / 'home'}")
    assert line.endswith("set LOCALDET_HOME to a folder you can write")
    home.env["LOCALDET_HOME"] = str(blocker)
    line = one_error_line(home.cli(*command, check=False))
    assert line == (f"error: the state folder {blocker} is a file, not a folder; move it "
                    "aside or set LOCALDET_HOME to another folder")


def test_det_e_create_checks_the_config_before_starting_anything(home, tmp_path):
    bad = write_config(tmp_path, "bad", searcher={"name": "single", "metric": "val_loss",
                                                  "max_length": {"batches": -3}})
    result = subprocess.run(
        [sys.executable, "-c", "from localdet.ui.det import main; main()", "e", "create",
         str(bad), str(EXAMPLE)],
        env=home.env, capture_output=True, text=True, timeout=60)
    assert "searcher.max_length.batches" in one_error_line(result)
    assert not home.path.exists()  # no state folder, no daemon


def test_stop_never_signals_a_pid_of_another_namespace(tmp_path):
    """A state folder shared with a container: the lock's pid is the container's, so the
    kernel's start time recorded beside it does not match any process here by that pid."""
    layout = Layout(tmp_path).ensure()
    lock = DaemonLock(layout.daemon_lock)
    lock.acquire()  # this test's process stands for the daemon
    try:
        service.record_start(layout, slots=1, slot_description="1 CPU slot", dashboard=None)
        facts = json.loads(service.runtime_file(layout).read_text())
        assert facts["pid"] == os.getpid()
        assert service.runtime_file(layout).stat().st_mode & 0o077 == 0  # its token's
        found = service.running(layout)
        assert found is not None and found.here and found.slots == 1
        facts["process_start"] += 1
        service.runtime_file(layout).write_text(json.dumps(facts))
        assert not service.running(layout).here
        with pytest.raises(service.ServiceError, match="runs in a container: stop it there"):
            service.stop(layout, timeout=1)
        service.runtime_file(layout).unlink()  # still starting (or an older daemon)
        with pytest.raises(service.ServiceError, match="has not said it is ready"):
            service.stop(layout, timeout=0.3)
    finally:
        lock.release()


def test_install_service_writes_a_user_unit_running_the_foreground_daemon(tmp_path):
    from localdet.ui.daemon_commands import daemon

    home = tmp_path / "state 100%"  # a space and a systemd specifier, kept literal
    environment = {"LOCALDET_HOME": str(home), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    runner = CliRunner()
    printed = runner.invoke(daemon, ["install-service", "--print", "--slots", "2", "--web"],
                            env=environment)
    assert printed.exit_code == 0, printed.output
    assert not (tmp_path / "config").exists()
    lines = printed.output.splitlines()
    assert f'Environment="LOCALDET_HOME={tmp_path}/state 100%%"' in lines
    python = str(os.path.abspath(sys.executable)).replace("%", "%%")
    assert f"ExecStart={python} -m localdet daemon --slots 2 --web" in lines
    assert f"ExecStop={python} -m localdet daemon stop --timeout {service.STOP_SECONDS}" in lines
    assert "KillMode=mixed" in lines and "WantedBy=default.target" in lines
    assert f"TimeoutStopSec={service.STOP_SECONDS + 30}" in lines

    written = runner.invoke(daemon, ["install-service", "--slots", "2", "--web"],
                            env=environment)
    assert written.exit_code == 0, written.output
    path = tmp_path / "config" / "systemd" / "user" / "localdet.service"
    assert path.read_text() == printed.output
    assert f"wrote {path}" in written.output
    assert "systemctl --user enable --now localdet" in written.output
    assert "loginctl enable-linger" in written.output


def test_unit_words_are_quoted_as_systemd_reads_them(tmp_path):
    text = unit_text(Layout(tmp_path), "/opt/my env/bin/python", ["--ray", "a$b"],
                     environment={"PATH": "/my tools/bin:/usr/bin", "SECRET": "x"})
    lines = text.splitlines()
    assert 'ExecStart="/opt/my env/bin/python" -m localdet daemon --ray a$$b' in lines
    # The installing shell's PATH (and LD_LIBRARY_PATH) only; systemd starts with neither.
    assert 'Environment="PATH=/my tools/bin:/usr/bin"' in lines and "SECRET" not in text


def test_waiting_on_an_experiment_no_daemon_runs_says_so_at_once(tmp_path):
    from localdet.config.experiment import parse_config
    from localdet.operations.creation import wait
    from localdet.operations.errors import OperationError
    from localdet.records.db import StateDB

    layout = Layout(tmp_path).ensure()
    config = parse_config({
        "entrypoint": "model_def:Trial", "hyperparameters": {"global_batch_size": 8},
        "searcher": {"name": "single", "metric": "val_loss",
                     "max_length": {"batches": 10}}}).config
    with StateDB.open(layout.db) as db:
        experiment_id = db.create_experiment(
            name="tiny", description="", config=config, original_config="",
            searcher="single", metric="val_loss", smaller_is_better=True, experiment_seed=1,
            model_dir="/nowhere")
        assert db.experiment(experiment_id).managed
        with pytest.raises(OperationError, match=(
                f"no localdet daemon is running on {layout.home}, so experiment "
                f"{experiment_id} \\(ACTIVE\\) will not end while waited for; start one with "
                "`localdet daemon start`")):
            wait(db, experiment_id, interval=0.01, layout=layout)
