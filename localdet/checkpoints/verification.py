"""Checking a checkpoint's blobs against their hashes, shareable between threads.

    check = Verification(store.blob_path, files)
    background = pool.submit(check.run)     # checks blobs while the caller loads the files
    ...load...
    check.run()                             # the caller, done loading, checks what is left
    background.result()
    assert not check.bad                    # names of files with a missing or corrupt blob

Each runner takes the next unchecked blob, so a restore's caller that has finished loading
helps the background thread finish instead of waiting for it: for a 70 MB model, hashing
(about 40 ms of one core) is then shared by both cores.
"""
from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Mapping

from localdet.checkpoints.errors import StoreError

if TYPE_CHECKING:
    from localdet.checkpoints.store import FileEntry

_BUFFER_SIZE = 1 << 20


class Verification:
    """The blobs of `files` to check; `checked` (shared with the caller) holds blobs taken
    as sound, and gains those found sound, so a caller checking many checkpoints reads a
    shared chunk once."""

    def __init__(self, blob_path: Callable[[str], Path], files: Mapping[str, FileEntry],
                 checked: set[str] | None = None) -> None:
        self._blob_path = blob_path
        self._order = list(files)
        self._todo: Iterator[tuple[str, str, int]] = iter(
            [(name, sha256, size) for name, entry in files.items()
             for sha256, size in entry.blobs])
        self._checked = set() if checked is None else checked
        self._bad: set[str] = set()
        self._lock = threading.Lock()

    @property
    def bad(self) -> list[str]:
        """Files with a missing or corrupt blob, in the order given; complete once every
        runner has returned."""
        return [name for name in self._order if name in self._bad]

    def run(self) -> list[str]:
        """Check blobs until none is left unchecked; returns `bad` as this runner sees it."""
        buffer = bytearray(_BUFFER_SIZE)  # one a runner: not one a blob
        while (item := self._next()) is not None:
            name, sha256, size = item
            if self._sound(sha256, size, buffer):
                with self._lock:
                    self._checked.add(sha256)
            else:
                with self._lock:
                    self._bad.add(name)
        return self.bad

    def _next(self) -> tuple[str, str, int] | None:
        with self._lock:
            for name, sha256, size in self._todo:
                if name not in self._bad and sha256 not in self._checked:
                    return name, sha256, size
        return None

    def _sound(self, sha256: str, size: int, buffer: bytearray) -> bool:
        try:
            fd = os.open(self._blob_path(sha256), os.O_RDONLY | os.O_CLOEXEC)
        except (OSError, StoreError):  # missing, or a digest that cannot name a blob
            return False
        view = memoryview(buffer)
        try:
            if size < len(buffer):
                # A chunk in one read (one byte more: a longer file shows), hashed in one
                # call: few hand-overs of the GIL while the caller loads beside it.
                got = os.readv(fd, [view[:size + 1]])
                while 0 < got < size and (more := os.readv(fd, [view[got:size + 1]])):
                    got += more
                return got == size and hashlib.sha256(view[:size]).hexdigest() == sha256
            digest = hashlib.sha256()
            while n := os.readv(fd, [buffer]):
                digest.update(view[:n])  # hashlib lets go of the GIL for large updates
            return digest.hexdigest() == sha256
        except OSError:
            return False
        finally:
            os.close(fd)
