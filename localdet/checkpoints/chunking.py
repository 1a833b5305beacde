"""Content-defined chunks of checkpoint files (FastCDC), and making many new files durable
at once.

The store keeps each chunk once under its sha256, so bytes that recur anywhere in any file
(a frozen base's weights in every checkpoint of every trial) are stored once, whatever their
offset: FastCDC cuts where the content says, not at fixed offsets, so an insertion moves only
the cuts around it.

    for piece in cut_file(path):         # memoryviews, in order, covering the file
        sha = hashlib.sha256(piece).hexdigest()

`AVERAGE_SIZE` was chosen by measurement (scripts/bench/checkpoint.py's docstring): small
enough that a trainable head's changes rewrite little, large enough that a 70 MB file is a few
hundred chunk files and the manifest stays small.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import hashlib
import mmap
import os
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterator

from pyfastcdc import FastCDC

AVERAGE_SIZE = 128 * 1024
MIN_SIZE = AVERAGE_SIZE // 4
MAX_SIZE = AVERAGE_SIZE * 4


def cut_buffer(data: bytes | bytearray | memoryview) -> Iterator[memoryview]:
    """The chunks of `data`, in order; none for empty data."""
    view = memoryview(data)
    if not len(view):
        return
    # A FastCDC object is not safe to share between threads; it is cheap to make.
    for chunk in FastCDC(AVERAGE_SIZE, min_size=MIN_SIZE, max_size=MAX_SIZE).cut_buf(view):
        yield chunk.data


def cut_file(path: str | os.PathLike[str]) -> Iterator[memoryview]:
    """The chunks of the file at `path`, read through a memory map; none for an empty file.
    The views are valid until the generator is closed."""
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return
        mapped = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
    try:
        yield from cut_buffer(memoryview(mapped))
    finally:
        with contextlib.suppress(BufferError):  # a view still held: unmapped once freed
            mapped.close()


# Files at least this big are hashed whole in a second thread, beside the chunking
# (hashlib lets go of the GIL): the two hashes of every byte then cost one's wall time.
HASH_BESIDE_BYTES = 4 << 20


@functools.lru_cache(maxsize=1)
def _hasher() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=2, thread_name_prefix="localdet-hash")


# A forked child has none of the parent's threads: it makes its own pool.
os.register_at_fork(after_in_child=_hasher.cache_clear)


def _sha256_of_file(path: str | os.PathLike[str]) -> str:
    digest, buf = hashlib.sha256(), bytearray(1 << 20)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            digest.update(view[:n])
    return digest.hexdigest()


def sha256_beside(path: str | os.PathLike[str]) -> Future[str]:
    """The sha256 of the whole file, computed in a background thread."""
    return _hasher().submit(_sha256_of_file, path)


@functools.lru_cache(maxsize=1)
def _libc_syncfs():  # type: ignore[no-untyped-def]
    name = ctypes.util.find_library("c")
    try:
        function = ctypes.CDLL(name, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int]
    return function


def sync_filesystem(folder: Path) -> bool:
    """Flush everything written to the file system holding `folder`, names included (Linux's
    syncfs): one flush instead of an fsync per file and folder, which costs about 20 times
    as much for a few hundred chunk files. False where it is unavailable: fsync each then."""
    function = _libc_syncfs()
    if function is None:
        return False
    fd = os.open(folder, os.O_RDONLY)
    try:
        if function(fd) != 0:
            return False
    finally:
        os.close(fd)
    return True


def fsync_dirs(paths: set[Path]) -> None:
    # A rename is only durable once the directory holding the new entry is fsynced;
    # otherwise a crash can forget the blob even though its bytes reached disk.
    if os.name != "posix":
        return
    for path in sorted(paths, key=lambda p: len(p.parts), reverse=True):  # children first
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class NewBlobs:
    """Blobs a put adds: each written to a temporary file, then all made durable and
    renamed to their hashes together (`settle`), with one file-system flush before the
    renames and one after where the system has it, instead of an fsync per file."""

    def __init__(self, root: Path, tmp: Path, blob_path: Callable[[str], Path]) -> None:
        self.root, self.tmp, self.blob_path = root, tmp, blob_path
        self.pending: dict[str, str] = {}  # sha256 -> its temporary file
        self.dirs: set[Path] = set()        # folders of the blobs named or reused

    def add(self, sha256: str, data: bytes | memoryview) -> None:
        if sha256 in self.pending:
            return
        target = self.blob_path(sha256)
        if target.is_file():
            self.dirs.add(target.parent)
            # A fresh mtime makes delete_unreferenced(min_age_seconds=...) spare a blob
            # that an in-flight (not yet referenced) checkpoint has just reused.
            with contextlib.suppress(OSError):
                os.utime(target)
            return
        fd, tmp_name = tempfile.mkstemp(dir=self.tmp, prefix="put-", suffix=".tmp")
        self.pending[sha256] = tmp_name  # before writing: discarded if the write fails
        with open(fd, "wb", buffering=0) as out:
            view = memoryview(data)
            while view:
                view = view[out.write(view) or 0:]

    def settle(self) -> None:
        """Durable bytes first, then the names: a crash never leaves a blob whose name is
        there and whose bytes are not. Synced even when all were reused: whoever renamed a
        blob in may not have synced yet."""
        if not self.pending and not self.dirs:
            return
        root = self.root
        if self.pending and not sync_filesystem(root):
            for tmp_name in self.pending.values():
                fd = os.open(tmp_name, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        for sha256, tmp_name in list(self.pending.items()):
            target = self.blob_path(sha256)
            target.parent.mkdir(exist_ok=True)
            os.chmod(tmp_name, 0o444)  # blobs are immutable
            os.replace(tmp_name, target)  # atomic; losing a race to equal bytes is fine
            del self.pending[sha256]
            self.dirs.add(target.parent)
        if not sync_filesystem(root):  # the fan-out folder may be new: its parent too
            fsync_dirs(self.dirs | {self.root / "objects"})

    def discard(self) -> None:
        for tmp_name in self.pending.values():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp_name)
        self.pending.clear()
