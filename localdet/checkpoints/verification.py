"""Checking a checkpoint's blobs against their hashes, shareable between threads.

    check = Verification(store.blob_path, files)
    background = pool.submit(check.run, worker)  # checks blobs while the caller loads them
    ...load...
    check.run()                             # the caller, done loading, checks what is left
    background.result()
    assert not check.bad                    # names of files with a missing or corrupt blob

Each runner takes the next unchecked blobs, so a restore's caller that has finished loading
helps the background thread finish instead of waiting for it. The background runner hands
its blobs to a `HashWorker` process where it has one: hashing in a thread of the loading
process would wait on the GIL that h5py and TensorFlow hold (`hash_worker` says more).
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable, Iterator, Mapping

from localdet.checkpoints.errors import StoreError
from localdet.checkpoints.file_entry import FileEntry
from localdet.checkpoints.hash_worker import BUFFER_SIZE, HashWorker, blob_is_sound


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

    def run(self, worker: HashWorker | None = None, batch: int = 64) -> list[str]:
        """Check blobs until none is left unchecked; returns `bad` as this runner sees it.
        With a `worker` (`HashWorker`), `batch` blobs at a time are hashed in its process,
        off this one's GIL (by this thread where it cannot answer)."""
        buffer = bytearray(BUFFER_SIZE)  # one a runner: not one a blob
        while taken := self._take(batch if worker is not None else 1):
            blobs = [(self._path(sha256), sha256, size) for _, sha256, size in taken]
            failed = worker.check(blobs) if worker is not None else None
            if failed is None:
                failed = [i for i, blob in enumerate(blobs) if not blob_is_sound(*blob, buffer)]
            with self._lock:
                for index, (name, sha256, _) in enumerate(taken):
                    if index in failed:
                        self._bad.add(name)
                    else:
                        self._checked.add(sha256)
        return self.bad

    def _path(self, sha256: str) -> str:
        try:
            return str(self._blob_path(sha256))
        except StoreError:  # a digest that cannot name a blob: no file has that name
            return ""

    def _take(self, count: int) -> list[tuple[str, str, int]]:
        """Up to `count` blobs no runner has taken, of files not found bad yet."""
        taken: list[tuple[str, str, int]] = []
        with self._lock:
            for name, sha256, size in self._todo:
                if name not in self._bad and sha256 not in self._checked:
                    taken.append((name, sha256, size))
                    if len(taken) == count:
                        break
        return taken
