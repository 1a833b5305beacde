"""The daemon as a service: started detached, found, and stopped.

    pid = start(layout, ["--slots", "2"])     # a detached `localdet daemon`, once it watches
    found = running(layout)                   # Running(pid, started, slots, ...) or None
    said = stop(layout, timeout=300)          # trials checkpoint, are queued again; it exits
    check_state_folder(layout)                # ServiceError: one sentence, no traceback

A running daemon holds `daemon.lock` (localdet/pids.py) and, once it watches its queue,
describes itself in `daemon.json` beside it: pid, the kernel's start time of that pid (so
a pid read from a state folder shared with a container, another pid namespace, is never
signalled by mistake), start time, slots, version and the dashboard's address.

Stopping is a signal: SIGUSR1 asks the daemon to stop launching, ask its running trials to
checkpoint at their next boundary (they are queued again, as when the disk runs short) and
exit once they have; SIGTERM (`--now`) stops it at once, leaving its trials training for
the next daemon to adopt. Jobs cannot checkpoint: they are always left running, adopted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from localdet.paths import Layout
from localdet.pids import DaemonLock, alive, process_start

RUNTIME_FILE = "daemon.json"
# What a detached daemon prints (start-up errors, the dashboard's address); the daemon keeps
# its own log, daemon.log, as well.
OUTPUT_FILE = "daemon.out"
START_SECONDS = 120   # a first start on a busy machine imports a lot
STOP_SECONDS = 300    # trials reach their next checkpoint
DRAIN_SIGNAL = signal.SIGUSR1
POLL_SECONDS = 0.1
START_COMMAND = "localdet daemon start"


class ServiceError(RuntimeError):
    """The daemon cannot be started, found or stopped as asked; one sentence saying why."""


class NotRunning(ServiceError):
    pass


class AlreadyRunning(ServiceError):
    pass


def runtime_file(layout: Layout) -> Path:
    return layout.home / RUNTIME_FILE


def output_file(layout: Layout) -> Path:
    return layout.home / OUTPUT_FILE


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("localdet")
    except PackageNotFoundError:  # a source tree on sys.path, not installed
        return "unknown"


@dataclass(frozen=True)
class Running:
    pid: int
    started: float | None = None    # time.time() when it began watching
    slots: int | None = None
    slot_description: str | None = None
    version: str | None = None
    dashboard: str | None = None
    here: bool = True   # its pid is a process of this pid namespace (not a container's)

    def uptime(self, now: float | None = None) -> float | None:
        return None if self.started is None else max(0.0, (now or time.time()) - self.started)


def record_start(layout: Layout, *, slots: int, slot_description: str,
                 dashboard: str | None) -> None:
    """Written by the daemon once it watches its queue (the dashboard's token is in it:
    readable by its owner only)."""
    pid = os.getpid()
    facts = {"pid": pid, "process_start": process_start(pid), "started": time.time(),
             "slots": slots, "slot_description": slot_description, "version": version(),
             "dashboard": dashboard, "home": str(layout.home)}
    path = runtime_file(layout)
    temporary = path.with_name(f".{path.name}.{pid}")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(facts, indent=2) + "\n")
    os.replace(temporary, path)


def record_stop(layout: Layout) -> None:
    """The daemon's last act: its description goes with it (if it is still its own)."""
    facts = _read_runtime(layout)
    if facts is not None and facts.get("pid") == os.getpid():
        runtime_file(layout).unlink(missing_ok=True)


def _read_runtime(layout: Layout) -> dict | None:
    try:
        facts = json.loads(runtime_file(layout).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return facts if isinstance(facts, dict) else None


def running(layout: Layout) -> Running | None:
    """The daemon holding the state folder's lock, as it described itself (only its pid
    while it is still starting, or when it predates daemon.json); None when none runs."""
    pid = DaemonLock.holder(layout.daemon_lock)
    if pid is None:
        return None
    facts = _read_runtime(layout)
    if facts is None or facts.get("pid") != pid:
        return Running(pid=pid, here=pid > 0 and alive(pid))
    here = alive(pid) and facts.get("process_start") in (None, process_start(pid))
    return Running(pid=pid, started=facts.get("started"), slots=facts.get("slots"),
                   slot_description=facts.get("slot_description"),
                   version=facts.get("version"), dashboard=facts.get("dashboard"), here=here)


def waiting_submissions(layout: Layout) -> int:
    """How many submissions wait in the queue folders for a daemon to take them."""
    count = 0
    for folder in (layout.queue, layout.job_queue):
        try:
            entries = list(folder.iterdir())
        except OSError:
            continue
        count += sum(1 for path in entries if not path.name.startswith(".")
                     and path not in (layout.rejected, layout.job_queue)
                     and (path.suffix in (".yaml", ".yml") or path.is_dir()))
    return count


def check_state_folder(layout: Layout) -> None:
    """The state folder can be made and its records opened, or ServiceError saying what to
    change."""
    home = layout.home
    if home.exists() and not home.is_dir():
        raise ServiceError(f"the state folder {home} is a file, not a folder; move it aside or "
                           "set LOCALDET_HOME to another folder")
    try:
        layout.ensure()
    except OSError as error:
        where = f" ({error.filename})" if error.filename and str(error.filename) != str(home) \
            else ""
        raise ServiceError(f"cannot make the state folder {home}{where}: "
                           f"{error.strerror or error}; set LOCALDET_HOME to a folder you can "
                           "write") from None
    if not os.access(home, os.W_OK | os.X_OK):
        raise ServiceError(f"cannot write in the state folder {home}; set LOCALDET_HOME to a "
                           "folder you can write")
    if layout.db.is_dir():
        raise ServiceError(f"{layout.db} is a folder, not localdet's records (a SQLite file); "
                           "move it aside, or set LOCALDET_HOME to another state folder")
    if layout.db.exists() and not os.access(layout.db, os.R_OK | os.W_OK):
        raise ServiceError(f"cannot read and write localdet's records {layout.db}; give your "
                           "user access to it, or set LOCALDET_HOME to another state folder")


def start(layout: Layout, arguments: list[str] | tuple[str, ...] = (), *,
          wait_seconds: float = START_SECONDS, refuse_running: bool = True) -> int:
    """Start `localdet daemon ARGUMENTS` detached (its own session; what it prints goes to
    daemon.out) and return its pid once it watches its queue. With a daemon already
    running: AlreadyRunning, or (without `refuse_running`) that one's pid."""
    check_state_folder(layout)
    found = DaemonLock.holder(layout.daemon_lock)
    if found is not None:
        if refuse_running:
            raise AlreadyRunning(f"a localdet daemon (pid {found}) already runs on "
                                 f"{layout.home}; `localdet daemon status` shows it, "
                                 "`localdet daemon stop` stops it")
        return found
    output = output_file(layout)
    try:
        with open(output, "ab") as handle:
            process = subprocess.Popen(
                [sys.executable, "-m", "localdet", "daemon", *arguments],
                stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT,
                start_new_session=True, env={**os.environ, "LOCALDET_HOME": str(layout.home)})
    except OSError as error:
        raise ServiceError(f"cannot start a localdet daemon on {layout.home} "
                           f"({error.strerror or error}); set LOCALDET_HOME to a folder you "
                           "can write") from None
    deadline = time.monotonic() + wait_seconds
    while time.monotonic() < deadline:
        found = DaemonLock.holder(layout.daemon_lock)
        facts = _read_runtime(layout)
        if found is not None and facts is not None and facts.get("pid") == found:
            return found  # watching (ours, or one started meanwhile that won the lock)
        code = process.poll()
        if code is not None:
            if found is not None:  # another daemon won the race for the lock
                return found
            raise ServiceError(f"the localdet daemon started on {layout.home} exited "
                               f"(status {code}): {_last_line(output)}")
        time.sleep(POLL_SECONDS)
    raise ServiceError(f"the localdet daemon started on {layout.home} (pid {process.pid}) was "
                       f"not watching its queue after {wait_seconds:g} s; see {output} and "
                       f"{layout.daemon_log}")


def _last_line(path: Path) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "it printed nothing"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return "it printed nothing"
    return lines[-1].removeprefix("error: ")


def stop(layout: Layout, *, timeout: float = STOP_SECONDS, now: bool = False) -> str:
    """Ask the running daemon to stop and wait up to `timeout` seconds for it to exit;
    returns what happened, in one sentence. NotRunning when none runs; ServiceError when it
    cannot be signalled, or is still stopping at the timeout (it goes on stopping)."""
    found = running(layout)
    if found is None:
        raise NotRunning(f"no localdet daemon is running on {layout.home}; nothing to stop "
                         f"(`{START_COMMAND}` starts one)")
    if not found.here:
        raise ServiceError(f"the localdet daemon on {layout.home} (pid {found.pid} where it "
                           "runs) is not a process of this machine's view, e.g. it runs in a "
                           "container: stop it there")
    if found.started is None and not now:
        # Still starting (it writes daemon.json when it watches), or older than
        # `daemon stop`: SIGUSR1 would end an older one at once, like SIGTERM.
        found = _described(layout, found.pid, timeout)
    training = _running_trials(layout)
    try:
        os.kill(found.pid, signal.SIGTERM if now else DRAIN_SIGNAL)
    except ProcessLookupError:
        return f"the localdet daemon (pid {found.pid}) had already stopped"
    except PermissionError:
        raise ServiceError(f"not allowed to signal the localdet daemon (pid {found.pid}) on "
                           f"{layout.home}: it runs as another user; stop it as that "
                           "user") from None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if DaemonLock.holder(layout.daemon_lock) != found.pid:
            if not training:
                return f"stopped the localdet daemon (pid {found.pid}); no trial was running"
            if now:
                return (f"stopped the localdet daemon (pid {found.pid}); its {training} "
                        "running trial(s) keep training and the next daemon adopts them")
            return (f"stopped the localdet daemon (pid {found.pid}); its {training} running "
                    "trial(s) checkpointed and wait queued for the next daemon")
        time.sleep(POLL_SECONDS)
    if now:
        raise ServiceError(f"the localdet daemon (pid {found.pid}) did not exit within "
                           f"{timeout:g} s of SIGTERM; see {layout.daemon_log}")
    raise ServiceError(f"the localdet daemon (pid {found.pid}) is still waiting for its "
                       f"running trials to reach a checkpoint after {timeout:g} s and exits "
                       "once they have; `localdet daemon stop --now` stops it at once (they "
                       "keep training, and the next daemon adopts them)")


def _running_trials(layout: Layout) -> int:
    """How many trials the daemon runs (read-only; 0 where the records cannot be read)."""
    from localdet.records.db import StateDB
    from localdet.records.opening import RecordsUnavailable
    from localdet.records.states import TrialState

    try:
        with StateDB.open_readonly(layout.db) as db:
            return db.db.execute("SELECT count(*) FROM trials WHERE state = ?",
                                 [TrialState.RUNNING]).fetchone()[0]
    except RecordsUnavailable:
        return 0


def _described(layout: Layout, pid: int, timeout: float) -> Running:
    deadline = time.monotonic() + min(timeout, START_SECONDS)
    while time.monotonic() < deadline:
        found = running(layout)
        if found is None or found.pid != pid:
            raise NotRunning(f"the localdet daemon (pid {pid}) on {layout.home} stopped "
                             "meanwhile; nothing to stop")
        if found.started is not None:
            return found
        time.sleep(POLL_SECONDS)
    raise ServiceError(f"the localdet daemon (pid {pid}) on {layout.home} has not said it "
                       "is ready (no daemon.json): it is still starting, or predates "
                       "`localdet daemon stop`; `localdet daemon stop --now` stops it at once")
