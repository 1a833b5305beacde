"""A checkpoint restore in progress on the local side: its files linked into a folder or read
in place from the store, their hashes checked beside the caller's loading, and the
checkpoint's reading lease held until both are done.

    restore = Restore.begin(store, uuid, files_of_uuid, destination, read_in_place, pool)
    with restore.open("determined-keras-model.h5") as f: ...load...
    bad = restore.finish()      # helps the check finish; names of corrupt or missing files

The lease keeps the collector away from the checkpoint's blobs; it is let go once no one
reads them: the background check has returned, the caller is not helping it, and the files
read in place are done with (`finish`).
"""
from __future__ import annotations

import threading
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import Any, BinaryIO, Callable, Collection, Dict, Mapping

from localdet.checkpoints.hash_worker import HashWorker
from localdet.checkpoints.locks import Lease
from localdet.checkpoints.store import FileEntry, Store
from localdet.checkpoints.verification import Verification


class Restore:
    def __init__(self, path: Path, store: Any, in_place: Dict[str, FileEntry],
                 lease: Lease) -> None:
        self.path, self._store, self._in_place = path, store, in_place
        self._lease = lease
        self._lock = threading.Lock()
        # Who still reads the blobs: the background check, and the caller while files are
        # read in place; the caller also while it helps the check.
        self._readers = 1 + bool(in_place)
        self._check: Verification | None = None
        self._verifying: Future | None = None

    @classmethod
    def begin(cls, store: Any, uuid: str, files_of: Callable[[str], Mapping[str, FileEntry]],
              destination: Path, read_in_place: Collection[str], pool: Executor,
              worker: HashWorker | None = None) -> "Restore":
        """Take the checkpoint's lease, then look its files up (`files_of(uuid)`, under the
        lease: a collector may have deleted it just before), link or write them into
        `destination` except the chunked ones named in `read_in_place` (local store only),
        and start checking every blob on `pool`, hashed by `worker` where given."""
        lease = store.reading(uuid)
        try:
            files = files_of(uuid)
            in_place = {name: files[name] for name in read_in_place
                        if name in files and files[name].chunks and isinstance(store, Store)}
            path = store.materialize({n: e for n, e in files.items() if n not in in_place},
                                     destination, link=True, verify=False)
        except BaseException:
            lease.release()
            raise
        restore = cls(path, store, in_place, lease)
        # The local store's check is shared: the caller, done loading, helps it finish.
        restore._check = store.verification(files) if isinstance(store, Store) else None
        restore._verifying = pool.submit(restore._verify_in_background, files, worker)
        return restore

    def open(self, name: str) -> BinaryIO:
        """One of the checkpoint's files, open for reading (FileNotFoundError: none such)."""
        entry = self._in_place.get(name)
        if entry is not None:
            return self._store.open_file(entry, name)  # type: ignore[no-any-return]
        return open(self.path / name, "rb")

    def finish(self) -> list[str]:
        """Names of the files a blob of which is corrupt or missing, once every blob is
        checked (the caller checks what is left meanwhile); the restore is over."""
        try:
            if self._check is not None and self._hold():
                try:
                    self._check.run()
                finally:
                    self._drop()
            bad = self._verifying.result() if self._verifying is not None else []
            return self._check.bad if self._check is not None else bad
        finally:
            self.close()

    def close(self) -> None:
        """Done with the files read in place (idempotent)."""
        with self._lock:
            in_place, self._in_place = self._in_place, {}
        if in_place:
            self._drop()

    def _verify_in_background(self, files: Mapping[str, FileEntry],
                              worker: HashWorker | None) -> list[str]:
        try:
            return self._check.run(worker) if self._check is not None else \
                self._store.verify(files)  # type: ignore[no-any-return]
        finally:
            self._drop()

    def _hold(self) -> bool:
        with self._lock:
            if not self._readers:  # all is checked and let go of
                return False
            self._readers += 1
            return True

    def _drop(self) -> None:
        with self._lock:
            self._readers -= 1
            if not self._readers:
                self._lease.release()
