"""What the daemon knows of processes: who holds a lock file, whether a pid is alive and
still the process it was, and how one ended. Process facts come from psutil.

    lock = DaemonLock(layout.daemon_lock); lock.acquire()   # DaemonAlreadyRunning if held
    DaemonLock.holder(layout.daemon_lock)                    # the holder's pid, or None
    alive(pid) and process_start(pid) == recorded_start      # the same process, still running
    exit_description(-9)                                     # "killed by SIGKILL (...)"
"""

from __future__ import annotations

import fcntl
import os
import signal
from pathlib import Path
from typing import TextIO

import psutil

_TICKS = os.sysconf("SC_CLK_TCK")

class DaemonAlreadyRunning(RuntimeError):
    pass


class DaemonLock:
    """An exclusive lock on `$LOCALDET_HOME/daemon.lock`, released by the OS if we die."""

    def __init__(self, path: Path):
        self.path = path
        self._file: TextIO | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise DaemonAlreadyRunning(
                f"another localdet daemon (pid {holder}) is running on {self.path.parent}; "
                "stop it first, or set LOCALDET_HOME to use another state folder") from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        self._file = handle

    def release(self) -> None:
        if self._file:
            self._file.close()
            self._file = None

    @staticmethod
    def holder(path: Path) -> int | None:
        """The pid of the running daemon, or None when none holds the lock."""
        if not path.exists():
            return None
        with open(path, "a+") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                text = handle.read().strip()
                return int(text) if text.isdigit() else -1
            fcntl.flock(handle, fcntl.LOCK_UN)
            return None


def exit_description(returncode: int | None) -> str:
    if returncode is None:
        return "its process ended while no daemon watched it, without finishing"
    if returncode < 0:
        name = signal.Signals(-returncode).name
        if returncode == -signal.SIGKILL:
            return f"killed by {name} (`kill -9`, or the kernel when memory ran out)"
        return f"killed by {name}"
    return f"exit status {returncode}"


def process_start(pid: int) -> int | None:
    """The kernel's start time of a process, None if it is gone: in clock ticks since boot,
    the unit the records have always kept it in (psutil gives seconds since the epoch, which
    it derived from those ticks; rounding back gives them exactly)."""
    try:
        created = psutil.Process(pid).create_time()
    except (psutil.Error, ValueError):  # gone, not ours to see, or no pid
        return None
    return round((created - psutil.boot_time()) * _TICKS)


def alive(pid: int) -> bool:
    """Whether the process runs; a zombie child of ours is dead for our purposes."""
    if pid <= 0:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True
