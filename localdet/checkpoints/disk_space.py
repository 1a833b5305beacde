"""Free space where localdet writes: below a reserve, nothing more is launched or
checkpointed, so the database, the logs and everything else on the machine keep working.

    reserve = Reserve(min_bytes=2 * 10**9, min_percent=5)
    shortage = reserve.shortage([layout.home, layout.store])   # None, or what is short
    reserve.check_before_writing(layout.store)                 # DiskFull when short

The reserve is the smaller of `min_bytes` and `min_percent` of the file system, so a small
disk is not held forever and a large one keeps a useful margin. The daemon passes its
reserve to trials in their environment (`env()` / `from_environment()`): the reporter checks
it before committing a checkpoint.
"""

from __future__ import annotations

import errno
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from determined.core._reporting import MIN_FREE_BYTES_VAR, MIN_FREE_PERCENT_VAR
from localdet.config.sizes import gigabytes

DEFAULT_MIN_BYTES = 2 * 10**9
DEFAULT_MIN_PERCENT = 5.0
# What a trial's failure says when the disk was full (an exception's line, or our own).
NO_SPACE_SIGNS = ("DiskFull", "No space left on device", "Errno 28", "errno = 28",
                  "Disk quota exceeded")


class DiskFull(OSError):
    """Too little free space to write; the message says where and how much."""

    def __init__(self, message: str):
        super().__init__(errno.ENOSPC, message)

    def __str__(self) -> str:
        return self.strerror or ""  # always the message: __init__ sets it


@dataclass(frozen=True)
class Shortage:
    path: Path
    free: int
    needed: int

    def describe(self) -> str:
        return (f"free space on {self.path} is {gigabytes(self.free)}, below the reserve of "
                f"{gigabytes(self.needed)}")


@dataclass(frozen=True)
class Reserve:
    min_bytes: int = DEFAULT_MIN_BYTES
    min_percent: float = DEFAULT_MIN_PERCENT

    def needed(self, total: int) -> int:
        return int(min(self.min_bytes, total * self.min_percent / 100))

    def shortage(self, paths, extra: int = 0) -> Shortage | None:
        """The first of `paths` (their file systems) with less free space than the reserve
        plus `extra` bytes; None when all have enough. A path not there yet is skipped."""
        seen = set()
        for path in paths:
            try:
                device = os.stat(path).st_dev
                usage = shutil.disk_usage(path)
            except OSError:
                continue
            if device in seen:
                continue
            seen.add(device)
            needed = self.needed(usage.total) + extra
            if usage.free < needed:
                return Shortage(Path(path), usage.free, needed)
        return None

    def check_before_writing(self, path: Path) -> None:
        shortage = self.shortage([path])
        if shortage is not None:
            raise DiskFull(f"{shortage.describe()}; the checkpoint was not written, and the "
                           "trial carries on from its previous one when space returns")

    def env(self) -> dict[str, str]:
        return {MIN_FREE_BYTES_VAR: str(self.min_bytes),
                MIN_FREE_PERCENT_VAR: str(self.min_percent)}

    @classmethod
    def from_environment(cls) -> "Reserve":
        try:
            return cls(int(os.environ.get(MIN_FREE_BYTES_VAR, DEFAULT_MIN_BYTES)),
                       float(os.environ.get(MIN_FREE_PERCENT_VAR, DEFAULT_MIN_PERCENT)))
        except ValueError:
            return cls()


def out_of_space(text: str) -> bool:
    """Whether a failure's line says the disk was full."""
    return any(sign in text for sign in NO_SPACE_SIGNS)
