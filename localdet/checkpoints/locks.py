"""The flock-based leases of the local checkpoint store (`localdet.checkpoints.store`): a
reader's shared hold on a checkpoint, a writer's on blob deletion, and the collector's
exclusive ones."""
from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path


class Lease:
    """An open lock file holding a shared or exclusive `flock`; `release()` (or leaving its
    `with` block) lets it go. flock locks belong to the open file, so two leases conflict
    even inside one process, and a process that dies releases its leases."""

    _fd: int | None  # None once released

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self._fd = path, fd

    @classmethod
    def take(cls, path: Path, *, exclusive: bool, wait: bool) -> "Lease | None":
        """The lease, or None if it is not free and `wait` is False."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        flags = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | (0 if wait else fcntl.LOCK_NB)
        try:
            fcntl.flock(fd, flags)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self, *, remove: bool = False) -> None:
        """Let the lock go; with `remove` (an exclusive holder only), delete the lock file
        first, for a checkpoint that no one can read any more."""
        if self._fd is None:
            return
        if remove:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        os.close(self._fd)  # closing the last descriptor releases the flock
        self._fd = None

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
