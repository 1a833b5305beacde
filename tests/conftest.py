"""Shared helpers: a state folder per test, the `localdet` command, a real daemon."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

# TensorFlow's inter-op thread pool spins while it waits for work: with three workers on two
# cores, every test process's pool takes cycles from the tests beside it (about 10% of the
# CPU of the in-process tests, measured). One inter-op thread runs the same kernels in the
# same order of dependencies, so results do not change (the intra-op threads, which split a
# kernel's work, keep TensorFlow's default). Set before anything imports TensorFlow, and
# inherited by every daemon, trial and the Keras 2 session; TF_NUM_INTEROP_THREADS=0 gives
# TensorFlow's default back.
os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "digits_trial"
TEST_TRIALS = Path(__file__).resolve().parent / "trials"
# The digits trial sleeping `batch_sleep` seconds a batch: a test can act mid-trial cheaply.
SLOW_DIGITS = TEST_TRIALS / "slow_digits"
ENDED = ("COMPLETED", "CANCELED", "ERROR")


def wait_for(predicate, timeout: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def module_from_file(name: str, path: Path):
    """A module loaded from a file outside any package (a benchmark, a migration)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def records_bench():
    """scripts/bench/records.py, whose `fill_experiment` records a large search quickly."""
    return module_from_file("records_bench", REPO / "scripts" / "bench" / "records.py")


def one_error_line(result: subprocess.CompletedProcess) -> str:
    """The one line a command that failed as it should (exit 1, no traceback) said."""
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


# Commands that read or change the records and return: Home.cli runs them in the test's own
# process (tests/test_cli.py and tests/test_installed_wheel.py run them as processes).
IN_PROCESS_COMMANDS = {"submit", "status", "pause", "resume", "kill", "checkpoints",
                       "metrics", "logs"}


class Home:
    """A `$LOCALDET_HOME` and the `localdet` command pointed at it."""

    def __init__(self, path: Path, python: str = sys.executable, in_process: bool = True):
        self.path = path
        self.python = python  # the environment localdet runs in (the Horovod one, say)
        self.in_process = in_process  # False: every command a process (tests of commands)
        self.env = {**os.environ, "LOCALDET_HOME": str(path), "TF_CPP_MIN_LOG_LEVEL": "2"}

    def cli(self, *args: str, check: bool = True, process: bool = False
            ) -> subprocess.CompletedProcess:
        """`localdet ARGS`; `process=True`: as its own process whatever the command."""
        args = tuple(map(str, args))
        result = (None if process else self._cli_in_process(args)) or subprocess.run(
            [self.python, "-m", "localdet", *args], env=self.env, capture_output=True,
            text=True, timeout=120)
        if check and result.returncode != 0:
            raise AssertionError(f"localdet {' '.join(map(str, args))} failed:\n"
                                 f"{result.stdout}\n{result.stderr}")
        return result

    def _cli_in_process(self, args: tuple[str, ...]) -> subprocess.CompletedProcess | None:
        """The command run in this process through click's test runner, where that is the
        command as it runs alone: a command that only reads or writes the state folder and
        returns, in this interpreter (each process's start costs a busy core about 0.35 s, a
        few hundred a run). None where the command must run as its own process, or raised
        what `localdet`'s own main turns into a message (the process gives that message)."""
        if not self.in_process or self.python != sys.executable or not args \
                or args[0] not in IN_PROCESS_COMMANDS \
                or {"-f", "--follow"} & set(args) \
                or threading.current_thread() is not threading.main_thread():
            # The runner sets os.environ and sys.stdout for the whole process: a test's
            # threads (two homes side by side) would see each other's.
            return None
        from click.testing import CliRunner

        from localdet.ui.cli import cli

        outcome = CliRunner().invoke(cli, args, env={"LOCALDET_HOME": str(self.path)},
                                     prog_name="localdet")
        if outcome.exception is not None and not isinstance(outcome.exception, SystemExit):
            return None
        return subprocess.CompletedProcess(["localdet", *args], outcome.exit_code,
                                           outcome.stdout, outcome.stderr)

    def json(self, *args: str, process: bool = False):
        return json.loads(self.cli(*args, "--json", process=process).stdout)

    def experiment(self, experiment_id: int) -> dict:
        """What `localdet status ID --json` prints."""
        return self.status(experiment_id)

    def status(self, experiment_id: int | None = None):
        """What `localdet status [ID] --json` prints, computed in this process where localdet
        runs in this interpreter (the command's own output is tests/test_cli.py's): the waits
        below ask often, and each command's start costs a busy core about 0.35 s. Not through
        `cli`'s runner: the waits also poll from a test's threads, where it cannot run."""
        if self.python != sys.executable:
            return self.json("status", *([] if experiment_id is None else [experiment_id]))
        from localdet.paths import Layout
        from localdet.records.db import StateDB
        from localdet.ui.cli import status_facts

        layout = Layout(self.path)
        with StateDB.open_readonly(layout.db) as db:
            return json.loads(json.dumps(status_facts(layout, db, experiment_id)))

    def rows(self, sql: str, *args) -> list[sqlite3.Row]:
        """Rows read straight from the state database (none before it exists): cheap to
        poll, where each `localdet` command costs a Python start on a busy core. The waits
        below poll it, then take what they return from the command, as before."""
        path = self.path / "localdet.db"
        if not path.exists():
            return []
        conn = sqlite3.connect(path, timeout=30)
        try:
            conn.row_factory = sqlite3.Row
            return conn.execute(sql, args).fetchall()
        except sqlite3.OperationalError as error:
            if "no such table" in str(error):  # the daemon is creating it
                return []
            raise
        finally:
            conn.close()

    def trials(self, experiment_id: int) -> list[sqlite3.Row]:
        """The experiment's trial rows, in the order `status` lists them (by id)."""
        return self.rows("SELECT * FROM trials WHERE experiment_id = ? ORDER BY id",
                         experiment_id)

    def ended_report(self, experiment_id: int, lines: int = 30) -> str:
        """What a failed assertion on an experiment's end should show: each trial's state,
        restarts and error, the last lines of its log and of the daemon's (CI keeps no files)."""
        parts = []
        for trial in self.trials(experiment_id):
            parts.append(f"trial {trial['id']}: {trial['state']}, restarts {trial['restarts']}, "
                         f"error: {trial['error']}")
            log = self.path / "experiments" / str(experiment_id) / "trials" / str(
                trial["id"]) / "trial.log"
            if log.exists():
                parts += log.read_text(errors="replace").splitlines()[-lines:]
        daemon_log = self.path / "daemon.log"
        if daemon_log.exists():
            parts += ["daemon.log:", *daemon_log.read_text(errors="replace").splitlines()[-lines:]]
        return "\n".join(parts)

    def first_trial(self, experiment_id: int) -> dict:
        """The experiment's first trial's row ({} before it has one)."""
        rows = self.trials(experiment_id)
        return dict(rows[0]) if rows else {}

    def wait_until_ended(self, experiment_id: int, timeout: float = 300) -> dict:
        def ended():
            if not self.rows("SELECT 1 FROM experiments WHERE id = ? AND state IN (?, ?, ?)",
                             experiment_id, *ENDED):
                return None
            facts = self.experiment(experiment_id)
            return facts if facts["state"] in ENDED else None
        return wait_for(ended, timeout, f"experiment {experiment_id} to end", interval=0.1)

    def experiment_named(self, name: str, timeout: float = 180) -> dict:
        def find():
            if not self.rows("SELECT 1 FROM experiments WHERE name = ?", name):
                return None
            return next((e for e in self.status() if e["name"] == name), None)
        return wait_for(find, timeout, f"experiment '{name}' to be ingested", interval=0.1)


def end_running_trials(home: Home) -> None:
    """Trials run in sessions of their own and outlive the daemon (or `localdet run`) that
    started them: ends those the home's records say are running."""
    for row in home.rows("SELECT pid FROM trials WHERE state = 'RUNNING'"):
        if row["pid"]:
            try:
                os.killpg(row["pid"], signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _parent(pid: int) -> int:
    """The process's parent's pid (0 when it cannot be read)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[1])  # after "pid (command) state"


def _is_daemon(pid: int) -> bool:
    try:
        return b"\0localdet\0daemon" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def end_warm_processes(home: Home) -> None:
    """A daemon's warm processes (localdet/processes/warm_process.py) exit once they read
    that it has gone, but one still importing TensorFlow reads it only when done: seconds
    of a core, taken from the tests that run next. Ends the home's that no running daemon
    owns (and the trials forked from them, which carry their command line)."""
    marker = f"LOCALDET_HOME={home.path}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            if b"localdet.processes.warm_process" not in (entry / "cmdline").read_bytes() \
                    or marker not in (entry / "environ").read_bytes().split(b"\0"):
                continue
        except OSError:  # gone meanwhile, or not ours to read
            continue
        parent = _parent(pid)  # a forked trial's parent is its warm process
        if _is_daemon(parent) or _is_daemon(_parent(parent)):
            continue  # a running daemon's (another test's daemon for this home)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class Daemon:
    started = 0

    def __init__(self, home: Home, *args: str):
        self.home = home
        Daemon.started += 1
        self.log_path = home.path / f"daemon-test-{Daemon.started}.log"
        home.path.mkdir(parents=True, exist_ok=True)
        self.log = open(self.log_path, "ab")
        # LOCALDET_TEST_WARM=N runs every daemon with `--warm N` unless the test chose, so
        # the suite can be run with warm processes off (0) or on where cores are short.
        if os.environ.get("LOCALDET_TEST_WARM") and "--warm" not in args:
            args = (*args, "--warm", os.environ["LOCALDET_TEST_WARM"])
        self.process = subprocess.Popen([home.python, "-m", "localdet", "daemon", *args],
                                        env=home.env, stdout=self.log, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: "watching" in self.log_path.read_text()
                     or self.process.poll() is not None, 180, "the daemon to start", 0.1)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Ends the daemon (SIGTERM), the trials it left running and its warm processes;
        harmless to repeat, and after the daemon was killed."""
        stuck = False
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                stuck = True
                self.process.kill()
                self.process.wait()
        self.log.close()
        end_running_trials(self.home)
        end_warm_processes(self.home)
        if stuck:
            raise AssertionError("the daemon did not stop within 30 s of SIGTERM (killed)")


@contextlib.contextmanager
def _daemon_starter():
    started: list[Daemon] = []

    def start(home: Home, *args: str) -> Daemon:
        daemon = Daemon(home, *args)
        started.append(daemon)
        return daemon

    try:
        yield start
    finally:
        errors = []
        for daemon in reversed(started):  # each one, even when another's stop fails
            try:
                daemon.stop()
            except Exception as error:
                errors.append(error)
        if errors:
            raise errors[0]


@pytest.fixture
def daemons():
    """`daemons(home, *args)` starts a real daemon for `home`; every daemon started so is
    stopped at the test's end (passed, failed or interrupted), and the trials it left
    running are ended. `daemon.stop()` may still be called early (to read a final log)."""
    with _daemon_starter() as start:
        yield start


@pytest.fixture(scope="module")
def module_daemons():
    """As `daemons`, for daemons shared by the tests of a module (stopped after its last)."""
    with _daemon_starter() as start:
        yield start


@pytest.fixture
def processes():
    """`processes(command, home=None, end=None, **popen_arguments)` starts a process (a
    `localdet run`, a web server, a Ray cluster); each still running at the test's end is
    ended by `end(process)` if given (its own way to stop), else terminated, killed after
    30 s, and reaped; with `home`, the trials it left running are ended too."""
    started: list[tuple[subprocess.Popen, Home | None, object]] = []

    def start(command: list, home: Home | None = None, end=None, **kwargs) -> subprocess.Popen:
        process = subprocess.Popen([str(part) for part in command], **kwargs)
        started.append((process, home, end))
        return process

    yield start
    for process, home, end in reversed(started):
        if process.poll() is None and end is not None:
            try:
                end(process)
            except Exception:  # then as any other
                pass
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None:
                stream.close()
        if home is not None:
            end_running_trials(home)


@pytest.fixture
def layout(tmp_path):
    """A fresh state folder."""
    from localdet.paths import Layout

    return Layout(tmp_path / "home").ensure()


@pytest.fixture
def db(layout):
    """The state folder's database, open."""
    from localdet.records.db import StateDB

    state = StateDB.open(layout.db)
    yield state
    state.close()


@pytest.fixture
def home(tmp_path) -> Home:
    return Home(tmp_path / "home")


def write_config(folder: Path, name: str, **overrides) -> Path:
    """A short digits experiment config in `folder`, with top-level keys overridden."""
    import yaml

    config = {
        "name": name,
        "entrypoint": "model_def:DigitsTrial",
        "hyperparameters": {"global_batch_size": 32, "hidden_units": 32, "dropout": 0.0,
                            "learning_rate": 0.01},
        "searcher": {"name": "single", "metric": "val_accuracy", "smaller_is_better": False,
                     "max_length": {"batches": 20}},
        "max_restarts": 0,
        "reproducibility": {"experiment_seed": 7},
    }
    config.update(overrides)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def start_trial(tmp_path: Path, target: int, hparams: dict | None = None, **config_overrides):
    """An experiment and trial recorded in a fresh state folder, ready for an in-process
    `TrialController`; returns (db, trial id, reporter, trial info)."""
    from localdet.config.experiment import parse_config
    from localdet.paths import Layout
    from localdet.records.db import StateDB
    from localdet.reporting.sqlite_reporter import SQLiteReporter

    hparams = hparams or {"global_batch_size": 4}
    layout = Layout(tmp_path / "home").ensure()
    model_dir = tmp_path / "model"
    model_dir.mkdir(exist_ok=True)
    (model_dir / "model_def.py").write_text("# the trial lives in the test module\n")
    raw = {"entrypoint": "model_def:Trial", "hyperparameters": hparams,
           "searcher": {"name": "single", "metric": "val_loss",
                        "max_length": {"batches": target}}}
    raw.update(config_overrides)
    config = parse_config(raw).config
    db = StateDB.open(layout.db)
    experiment_id = db.create_experiment(
        name="t", description="", config=config, original_config="", searcher="single",
        metric="val_loss", smaller_is_better=True, experiment_seed=1, model_dir=str(model_dir))
    trial_id = db.create_trial(experiment_id=experiment_id, request_id=1,
                               hparams={k: v["val"] if isinstance(v, dict) else v
                                        for k, v in hparams.items()},
                               seed=3, target_batches=target)
    reporter = SQLiteReporter(layout, trial_id)
    return db, trial_id, reporter, reporter.trial_info()


def save_checkpoint(db, store, tmp_path: Path, experiment_id: int, trial_id: int, batches: int,
                    weights: bytes | None = None) -> str:
    """A checkpoint stored and committed the way a trial does: blobs first, then the row. Its
    code file is the same in every checkpoint (one blob, shared); its weights differ by trial
    and batch unless given."""
    import uuid as uuidlib

    from localdet.checkpoints.manifest import build_manifest

    uuid = str(uuidlib.uuid4())
    folder = tmp_path / "saving" / uuid
    (folder / "code").mkdir(parents=True)
    (folder / "code" / "model_def.py").write_bytes(b"class Trial: pass\n")
    (folder / "determined-keras-model.h5").write_bytes(
        weights if weights is not None else f"weights of {trial_id} at {batches}".encode())
    with store.writing():
        files = store.put_directory(folder, consume=True)
        db.add_checkpoint(build_manifest(uuid=uuid, experiment_id=experiment_id,
                                         trial_id=trial_id, batches_trained=batches,
                                         files=files, metadata={}))
    return uuid


def older_database(path: Path) -> Path:
    """A database at `path` as the localdet before the newest migration left it."""
    import sqlite_utils

    from localdet.records import db as db_module

    older = sqlite_utils.Database(path)
    db_module.migrations().apply(older, stop_before=db_module._migration_names()[-1])
    older.close()
    return path


# The files that take longest, longest first. `scripts/test` runs whole files per worker
# (`--dist loadfile`) in collection order (`--no-loadscope-reorder`: xdist would otherwise
# order files by their number of tests), so a long file collected last would run alone at
# the end while the other worker idles. Seconds of wall time, each file alone on the 2-core
# machine beside other work (noisy), and the CPU seconds of all its processes where measured
# (a cgroup's count, so trials in sessions of their own and warm processes are counted
# too): the CPU-bound files stretch most under two workers. CI's log ends with the 25
# slowest tests (`--durations=25`): re-rank from it when a file moves.
LONGEST_FILES = [
    "test_keras_2_line.py",     # ~190 (the tests marked keras2, again under Keras 2)
    "test_multi_slot_e2e.py",   # ~370 (CPU ~200: seven daemon runs of 2-3 processes each)
    "test_scripts.py",          # ~120 (every benchmark's --smoke and the demo, two at a time)
    "test_request_races.py",    # ~110 (some 250 launches of the counter, forked warm)
    "test_exact_resume.py",     # ~135 (CPU ~85, a third of it the spawned Sequence readers)
    "test_stateful_pipelines.py",  # ~150 (12 pipelines x forms here, then under Keras 2)
    "test_cross_line_layers.py",   # ~90 (nine Keras 2 trials in one process, loaded here)
    "test_mixed_precision.py",  # ~80 (a trial paused twice, in each line)
    "test_h5_fallbacks.py",     # ~75 (two trials paused, in each line)
    "test_installed_wheel.py",  # ~75 (build, a fresh venv, every import, a short `localdet run`)
    "test_old_releases.py",     # ~70 (three trials under localdet run)
    "test_search_e2e.py",       # ~110 (CPU ~125)
    "test_ray_cluster.py",      # ~110 (CPU ~100, mostly waiting on Ray)
    "test_horovod_e2e.py",      # ~105 (CPU ~75)
    "test_compat.py",           # ~100 (CPU ~75: 19 trials forked from two warm processes)
    "test_memory_limit.py",     # ~75 (CPU ~35, mostly waiting on the processes it watches)
    "test_warm.py",             # ~65 (CPU ~85)
    "test_keras_api.py",        # ~60
    "test_script_e2e.py",       # ~55
    "test_callback_order.py",   # ~50 (CPU ~40)
    "test_custom_search.py",    # ~45 (two runner scripts, a runner and a daemon killed -9)
    "test_backends.py",         # ~40 (one JAX process of eight tiny fits; a localdet run)
    "test_pause_resume_e2e.py", # ~30 (CPU ~27)
    "test_det_cli.py",          # ~30 (sdk_cli/: det against the daemon it starts)
    "test_fuzz_intake.py",      # ~30
    "test_core_api.py",         # ~30
    "test_callback_models.py",  # ~30 (and again under Keras 2)
    "test_startup_hook.py",     # ~30 (real venvs and pip; one daemon run)
    "test_foreground.py",       # ~30
    "test_sdk.py",              # ~25 (sdk_cli/: the seeds' downstream flow)
    "test_data.py",             # ~25
    "test_disk_space.py",       # ~25
    "test_remote_reporting.py", # ~25
    "test_subclassed_models.py",  # ~25
    "test_cross_line.py",       # ~20
    "test_web_manage.py",       # ~20 (sdk_cli/: a browser)
    "test_records_scale.py",    # ~25 (a browser: a 40-trial search's thinned curves)
    "test_container_image.py",  # ~15 once scripts/test has built the image
    "test_chunks.py",           # ~15 (a frozen-base search's .h5 files; writers killed)
    "test_s3_chunks.py",        # ~11 (moto's server; an S3 writer and collector killed)
    "test_web_insight.py",      # ~15 (a browser: importances, compare)
]


_CAPTURE_CLOSED_BY: list[str] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test whose code closed pytest's capture file (sys.stdout or sys.stderr as the test
    sees them) fails, named, instead of every later test of its worker erroring in set-up
    with "I/O operation on closed file" (as in a CI run whose culprit was off its log).

    And each test's CPU (its set-up, call and tear-down, and its processes) on its tear-down
    report: the suite is CPU-bound on two cores, so CPU, not wall time, is what a test costs
    the run (wall time also counts the other workers' load)."""
    began = _CPU_AT_START.pop(item.nodeid, None) if call.when == "teardown" else None
    if began is not None:
        item.user_properties.append(("cpu_seconds", round(_cpu_seconds() - began, 2)))
    outcome = yield
    if _CAPTURE_CLOSED_BY:
        return
    capturing = getattr(item.config.pluginmanager.getplugin("capturemanager"),
                        "_global_capturing", None)
    closed = [name for name in ("out", "err")
              if getattr(getattr(getattr(capturing, name, None), "tmpfile", None), "closed",
                         False)]
    if closed:
        _CAPTURE_CLOSED_BY.append(item.nodeid)
        report = outcome.get_result()
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} closed pytest's capture of std{closed[0]} during "
                           f"its {call.when}: its code closes sys.std{closed[0]} (or a wrapper "
                           "of its buffer) in the test's process")


class _CpuClock:
    """The CPU a test used. Where this process may make a cgroup v1 `cpuacct` group (as
    root, as in CI), it moves into one of its own (under its current one: a nested pytest
    session stays counted in its test's), and its usage counts every process the test
    started: those never waited for (daemons' warm processes, trials in sessions of their
    own, killed ones), and those that are not Python (Chromium, Ray's, podman). Elsewhere:
    this process's CPU and that of the children it reaped (with theirs), a third less in a
    full run here. `cpuacct` only counts: it limits nothing and is a hierarchy of its own,
    apart from the memory controller's that localdet's memory limits use."""

    ROOT = Path("/sys/fs/cgroup/cpuacct")

    def __init__(self):
        from localdet.pids import alive

        self.group: Path | None = None
        self.whole = False  # every process counted, or only the reaped ones
        try:
            current = next(line.split(":", 2)[2].strip() for line in
                           Path("/proc/self/cgroup").read_text().splitlines()
                           if "cpuacct" in line.split(":", 2)[1].split(","))
            group = self.ROOT / current.lstrip("/") / f"localdet-tests-{os.getpid()}"
            group.mkdir(exist_ok=True)
        except (OSError, StopIteration, IndexError):
            return
        for earlier in group.parent.glob("localdet-tests-*"):  # a run's, once emptied
            # Not another worker's, made a moment ago and not joined yet: its pytest lives.
            pid = earlier.name.rsplit("-", 1)[1]
            if earlier != group and not (pid.isdigit() and alive(int(pid))):
                with contextlib.suppress(OSError):
                    earlier.rmdir()  # refused while a process is still in it
        try:
            (group / "cgroup.procs").write_text(str(os.getpid()))
            (group / "cpuacct.usage").read_text()
            self.group, self.whole = group, True
        except OSError:  # made, but not ours to join: leave nothing behind
            with contextlib.suppress(OSError):
                group.rmdir()

    def seconds(self) -> float:
        if self.group is not None:
            return int((self.group / "cpuacct.usage").read_text()) / 1e9
        own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                             resource.RUSAGE_CHILDREN))
        return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

    def close(self) -> None:
        """Back to the group it came from; its own goes once no process is left in it."""
        if self.group is not None:
            # Refused while a process the tests left still runs in it: harmless, and the
            # next run removes it once empty.
            with contextlib.suppress(OSError):
                (self.group.parent / "cgroup.procs").write_text(str(os.getpid()))
                self.group.rmdir()


_CPU_CLOCK: list[_CpuClock] = []  # made at this process's first test


def _cpu_seconds() -> float:
    if not _CPU_CLOCK:
        _CPU_CLOCK.append(_CpuClock())
    return _CPU_CLOCK[0].seconds()


def pytest_unconfigure(config):
    for clock in _CPU_CLOCK:
        clock.close()


_CPU_AT_START: dict[str, float] = {}
_CPU_BY_TEST: list[tuple[float, str]] = []  # (CPU seconds, node id): the controller's
CPU_SHOWN = 15


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _CPU_AT_START[item.nodeid] = _cpu_seconds()
    yield


def pytest_runtest_logreport(report):
    if report.when == "teardown":
        for name, value in report.user_properties:
            if name == "cpu_seconds":
                _CPU_BY_TEST.append((value, report.nodeid))


def pytest_terminal_summary(terminalreporter):
    """What tests said about how they ran (`record_property("said", line)`): a line each in
    the run's summary, since a passing test's output is not shown (and a worker's never).
    Then the tests that used the most CPU."""
    if _CPU_BY_TEST:
        total = sum(seconds for seconds, _ in _CPU_BY_TEST)
        terminalreporter.section(f"the {CPU_SHOWN} tests that used the most CPU (of "
                                 f"{total:.0f} CPU-s counted)")
        for seconds, nodeid in sorted(_CPU_BY_TEST, reverse=True)[:CPU_SHOWN]:
            terminalreporter.write_line(f"{seconds:8.1f} s  {nodeid}")
    said = [(report.nodeid, value) for outcome in ("passed", "failed")
            for report in terminalreporter.stats.get(outcome, [])
            for name, value in getattr(report, "user_properties", ()) if name == "said"]
    if said:
        terminalreporter.section("what tests said about how they ran")
        for nodeid, line in said:
            terminalreporter.write_line(f"{nodeid.split('::')[0]}: {line}")


# The groups of tests that need a tool beyond .venv (scripts/test-tools provisions them), by
# file or by file::test. scripts/test names in LOCALDET_TEST_MISSING those it could not
# provision (never as root, so never in CI): their tests are skipped saying so, and
# scripts/test lists them with the command that provisions each.
TOOL_GROUPS = {
    "browser": ("Chromium", {
        "test_dashboard.py::test_a_running_experiment_in_the_browser_grows_and_pauses_from_its_button",
        "test_records_scale.py::test_chromium_draws_the_large_search_from_thinned_data",
        "test_web_insight.py", "test_web_manage.py"}),
    "image": ("root, podman and debootstrap", {"test_container_image.py"}),
    "horovod": ("the Horovod environment", {"test_horovod_e2e.py"}),
    "jax": ("the JAX environment", {"test_backends.py"}),
}


def missing_tool_groups() -> list[str]:
    named = os.environ.get("LOCALDET_TEST_MISSING", "").split()
    unknown = set(named) - set(TOOL_GROUPS)
    if unknown:
        raise pytest.UsageError(f"LOCALDET_TEST_MISSING names {sorted(unknown)}; the groups are "
                                f"{sorted(TOOL_GROUPS)}")
    return named


def pytest_collection_modifyitems(config, items):
    rank = {name: place for place, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FILES)))  # stable
    for group in missing_tool_groups():
        tool, files = TOOL_GROUPS[group]
        skip = pytest.mark.skip(reason=f"needs {tool}, which scripts/test could not provision "
                                       f"here (group {group!r}; it names the command)")
        for item in items:
            if item.path.name in files or f"{item.path.name}::{item.originalname}" in files:
                item.add_marker(skip)
