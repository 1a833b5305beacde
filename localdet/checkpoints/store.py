"""Content-addressed, crash-safe blob store for checkpoint files.

Blobs live at ``<root>/objects/<sha256[:2]>/<sha256>``; identical bytes are stored once. A
checkpoint file is cut into content-defined chunks (`localdet.checkpoints.chunking`), each a
blob, so bytes shared by files (a frozen base in every checkpoint) are stored once too; its
`FileEntry` lists them. A file stored whole (by localdet before chunking, or by an older
remote trial) is one blob named by its own hash: a file whose chunk list is itself, read as it is.

    store = Store("/var/lib/localdet/store")
    files = store.put_directory("/tmp/ckpt")   # {"code/model_def.py": FileEntry(...), ...}
    # ... commit a manifest naming `files` to SQLite, then later:
    store.materialize(files, "/tmp/export")    # plain directory, every byte verified

Garbage collection (`localdet.checkpoints.gc`) never deletes what is in use: a reader holds a
checkpoint with ``with store.reading(uuid):`` (a shared lock on ``<root>/leases/<uuid>``), and
a writer holds ``with store.writing():`` from its first blob until its manifest is committed
(a shared lock on ``<root>/writers.lock``); the collector only takes these locks exclusively,
without waiting, and leaves alone what it cannot lock.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import os
import re
import shutil
import tempfile
import time
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Iterator, Mapping, Protocol

from localdet.checkpoints.chunked_file import ChunkedFile
from localdet.checkpoints.chunking import (
    HASH_BESIDE_BYTES,
    NewBlobs,
    cut_file,
    fsync_dirs,
    sha256_beside,
)
from localdet.checkpoints.errors import CorruptBlobError, MissingBlobError, StoreError
from localdet.checkpoints.file_entry import Blob, FileEntry
from localdet.checkpoints.locks import Lease
from localdet.checkpoints.verification import Verification

__all__ = ["Blob", "CorruptBlobError", "FileEntry", "MissingBlobError", "Store", "StoreError"]

CHUNK_SIZE = 1 << 20
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_LEASE_NAME_RE = re.compile(r"[0-9A-Za-z][0-9A-Za-z_-]{0,127}")


class _ReadsInto(Protocol):
    """A binary source read in chunks: a file opened "rb", io.BytesIO, an HTTP body."""

    def readinto(self, buffer: bytearray, /) -> int: ...


def _copy_hashing(src: _ReadsInto, out: BinaryIO | None) -> tuple[str, int]:
    """Stream `src` into `out` (if given) in one pass; return (sha256 hex, size)."""
    digest, size = hashlib.sha256(), 0
    buf = bytearray(CHUNK_SIZE)
    view = memoryview(buf)
    while n := src.readinto(buf):
        digest.update(view[:n])
        if out is not None:
            out.write(view[:n])  # buffered writer: writes it all, big chunks uncopied
        size += n
    return digest.hexdigest(), size


def walk_files(folder: Path, rel: PurePosixPath = PurePosixPath()) -> Iterator[PurePosixPath]:
    """The files of a checkpoint folder, relative to it; symlinks to files are followed,
    folder symlinks, broken symlinks and special files raise StoreError."""
    with os.scandir(folder) as it:
        for entry in it:
            if entry.is_dir(follow_symlinks=False):
                yield from walk_files(Path(entry.path), rel / entry.name)
            elif entry.is_file():  # follows symlinks to files
                yield rel / entry.name
            else:  # refused rather than silently left out of the checkpoint
                raise StoreError(f"cannot store '{entry.path}': only files and symlinks to "
                                 "files can be checkpointed, not folder symlinks, broken "
                                 "symlinks or special files")


def check_export(files: Mapping[str, FileEntry], dest: Path) -> bool:
    """Refuse unsafe names and a non-empty `dest`, then create `dest`; returns whether it
    was created (for `undo_export`)."""
    for name in files:  # a manifest must not be able to write outside `dest`
        rel = PurePosixPath(name)
        if rel.is_absolute() or not rel.parts or ".." in rel.parts or "\\" in name:
            raise StoreError(f"refusing to export unsafe file name {name!r}")
    if dest.exists() and not (dest.is_dir() and not any(dest.iterdir())):
        raise StoreError(f"export destination '{dest}' already exists and is not empty; "
                         "choose another folder")
    created = not dest.exists()
    dest.mkdir(parents=True, exist_ok=True)
    return created


def undo_export(dest: Path, created: bool) -> None:
    """Remove what a failed export wrote, leaving `dest` as it was."""
    if created:
        shutil.rmtree(dest, ignore_errors=True)
        return
    for child in dest.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


class Store:
    """A directory of immutable blobs named by their sha256.

        store = Store(tmp_path / "store")
        entry = store.put_bytes(b"hello")          # FileEntry(sha256="2cf2...", size=5)
        assert store.read_bytes(entry.sha256) == b"hello"
    """

    def __init__(self, root: str | os.PathLike[str], *, chunked: bool = True) -> None:
        self.root = Path(root)
        self.chunked = chunked  # False: put_directory stores files whole, as before chunking
        self.objects = self.root / "objects"
        self.tmp = self.root / "tmp"
        self.leases = self.root / "leases"
        self.writers_lock = self.root / "writers.lock"
        self.objects.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(parents=True, exist_ok=True)

    @property
    def location(self) -> str:
        """Where the blobs live, as a user reads it (and as gc tells stores apart)."""
        return str(self.root)

    def blob_path(self, sha256: str) -> Path:
        """``<root>/objects/ab/ab12...``; rejects anything but 64 lowercase hex digits."""
        if not isinstance(sha256, str) or not _SHA256_RE.fullmatch(sha256):
            raise StoreError(f"{sha256!r} is not a sha256 digest (64 lowercase hex digits)")
        return self.objects / sha256[:2] / sha256

    def has(self, sha256: str) -> bool:
        return self.blob_path(sha256).is_file()

    # -- leases ---------------------------------------------------------------------------
    def lease_path(self, uuid: str) -> Path:
        """``<root>/leases/<uuid>``; rejects names that are not a plain file name."""
        if not isinstance(uuid, str) or not _LEASE_NAME_RE.fullmatch(uuid):
            raise StoreError(f"{uuid!r} is not a checkpoint uuid")
        return self.leases / uuid

    def reading(self, uuid: str) -> Lease:
        """A reader's shared hold on checkpoint `uuid`: the garbage collector never deletes a
        checkpoint while one is held. ``with store.reading(uuid): ...read its blobs...``, or
        keep the returned lease and `release()` it later (from any thread). Waits only while
        a collector is deciding about this checkpoint; look the checkpoint up in the
        database *after* taking the lease, since a collector may have deleted it just
        before."""
        lease = Lease.take(self.lease_path(uuid), exclusive=False, wait=True)
        if lease is None:  # taken waiting: never refused
            raise StoreError("a reader's lease was refused although it waited")
        return lease

    def try_exclusive(self, uuid: str) -> Lease | None:
        """The collector's hold on checkpoint `uuid`, or None at once if a reader holds it."""
        return Lease.take(self.lease_path(uuid), exclusive=True, wait=False)

    def writing(self) -> Lease:
        """``with store.writing(): put the blobs, commit the manifest``: while any writer
        holds this, the collector deletes no blob (an unreferenced blob may be the writer's,
        or one it is about to reuse). Waits only while a collector is deleting blobs."""
        lease = Lease.take(self.writers_lock, exclusive=False, wait=True)
        if lease is None:  # taken waiting: never refused
            raise StoreError("a writer's lease was refused although it waited")
        return lease

    def try_sweeping(self) -> Lease | None:
        """The collector's exclusive hold on blob deletion, or None at once while a
        checkpoint is being written."""
        return Lease.take(self.writers_lock, exclusive=True, wait=False)

    # -- writing ----------------------------------------------------------------------
    def _put_stream(self, src: _ReadsInto, dirty: set[Path] | None) -> FileEntry:
        """Copy `src` to a temp file while hashing, then rename it to its hash.

        Directories needing an fsync go into `dirty` (deferred) or are synced now."""
        fd, tmp_name = tempfile.mkstemp(dir=self.tmp, prefix="put-", suffix=".tmp")
        try:
            with open(fd, "wb") as out:
                sha256, size = _copy_hashing(src, out)
                target = self.blob_path(sha256)
                exists = target.is_file()
                if not exists:  # a duplicate is thrown away, so it need not reach the disk
                    out.flush()
                    os.fsync(out.fileno())
            self._settle(Path(tmp_name), target, exists)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp_name)
            raise
        # Synced even on dedup: whoever renamed the blob in may not have synced yet. The
        # fan-out folder may be new too, so its parent is synced as well.
        to_sync = {target.parent, self.objects}
        if dirty is None:
            fsync_dirs(to_sync)
        else:
            dirty |= to_sync
        return FileEntry(sha256, size)

    def _settle(self, candidate: Path, target: Path, exists: bool) -> None:
        """Make a hashed, durable `candidate` file the blob `target`, or drop it as a
        duplicate."""
        if exists:
            os.unlink(candidate)
            # A fresh mtime makes delete_unreferenced(min_age_seconds=...) spare a blob
            # that an in-flight (not yet referenced) checkpoint has just reused.
            with contextlib.suppress(OSError):
                os.utime(target)
        else:
            target.parent.mkdir(exist_ok=True)
            os.chmod(candidate, 0o444)  # blobs are immutable; restores may hard-link them
            os.replace(candidate, target)  # atomic; losing a race to equal bytes is fine

    def _put_in_place(self, path: Path, dirty: set[Path]) -> FileEntry:
        """Hash `path` where it lies and move it into the store: no copy. The file is the
        caller's to give away (a checkpoint folder about to be deleted anyway)."""
        with open(path, "rb", buffering=0) as src:
            sha256, size = _copy_hashing(src, None)
            target = self.blob_path(sha256)
            exists = target.is_file()
            if not exists:
                os.fsync(src.fileno())
        self._settle(path, target, exists)
        dirty |= {target.parent, self.objects}
        return FileEntry(sha256, size)

    def put_file(self, path: str | os.PathLike[str]) -> FileEntry:
        """Store one file (hashed and copied in a single pass); durable on return."""
        with open(path, "rb", buffering=0) as src:
            return self._put_stream(src, None)

    def put_bytes(self, data: bytes) -> FileEntry:
        """``store.put_bytes(json.dumps(meta).encode())``; durable on return."""
        return self._put_stream(io.BytesIO(data), None)

    def put_directory(self, directory: str | os.PathLike[str], *,
                      consume: bool = False) -> dict[str, FileEntry]:
        """Store every file under `directory`; returns ``{"code/model_def.py": entry}``.

        Symlinks to files are followed; empty directories are ignored; symlinked
        directories and special files raise StoreError rather than being dropped silently.
        With `consume`, the folder's files are the store's to take: each is removed once
        stored (stored whole, moved in without a copy). Returns only after every blob and
        its directory entry are durable."""
        base = Path(directory)
        if not base.is_dir():
            raise StoreError(f"checkpoint folder '{base}' does not exist or is not a folder")
        if self.chunked:
            return self._put_directory_chunked(base, consume)
        dirty: set[Path] = set()
        result: dict[str, FileEntry] = {}
        for rel in sorted(walk_files(base)):
            path = base / rel
            try:
                if consume and not path.is_symlink():
                    try:
                        result[str(rel)] = self._put_in_place(path, dirty)
                        continue
                    except OSError as error:
                        if error.errno != errno.EXDEV:  # another filesystem: copy instead
                            raise
                with open(path, "rb", buffering=0) as src:
                    result[str(rel)] = self._put_stream(src, dirty)
            except OSError as e:
                raise StoreError(f"cannot store checkpoint file '{base / rel}': {e}") from e
        fsync_dirs(dirty)
        return result

    def _put_directory_chunked(self, base: Path, consume: bool) -> dict[str, FileEntry]:
        new = NewBlobs(self.root, self.tmp, self.blob_path)
        result: dict[str, FileEntry] = {}
        try:
            for rel in sorted(walk_files(base)):
                path = base / rel
                try:
                    result[str(rel)] = self._put_chunks(path, new)
                    if consume:  # at most one file's new chunks beside the folder on disk
                        path.unlink()
                except OSError as e:
                    raise StoreError(f"cannot store checkpoint file '{path}': {e}") from e
            new.settle()
        except BaseException:
            new.discard()
            raise
        return result

    def _put_chunks(self, path: Path, new: NewBlobs) -> FileEntry:
        """Cut the file into chunks and add those the store lacks to `new`."""
        beside = sha256_beside(path) if path.stat().st_size >= HASH_BESIDE_BYTES else None
        whole, chunks = hashlib.sha256(), []
        for piece in cut_file(path):
            sha256 = hashlib.sha256(piece).hexdigest()
            new.add(sha256, piece)
            if beside is None:
                whole.update(piece)
            chunks.append((sha256, len(piece)))
        if not chunks:  # an empty file: the blob of no bytes
            new.add(whole.hexdigest(), b"")
        digest = beside.result() if beside is not None else whole.hexdigest()
        if beside is not None and len(chunks) == 1 and digest != chunks[0][0]:
            raise StoreError(f"checkpoint file '{path}' changed while it was being stored")
        return FileEntry(digest, sum(size for _, size in chunks),
                         tuple(chunks) if len(chunks) > 1 else ())

    def rechunk(self, entry: FileEntry, name: str = "") -> FileEntry:
        """Store a whole-file blob's chunks (durable on return; the caller holds
        `writing()`) and return the file's chunked entry; the blob itself is left for the
        collector. Its bytes are checked against their name first."""
        new = NewBlobs(self.root, self.tmp, self.blob_path)
        try:
            try:
                chunked = self._put_chunks(self.blob_path(entry.sha256), new)
            except FileNotFoundError:
                raise MissingBlobError(entry.sha256, self.blob_path(entry.sha256),
                                       name) from None
            if chunked.sha256 != entry.sha256:
                raise CorruptBlobError(entry.sha256, chunked.sha256, name)
            new.settle()
        except BaseException:
            new.discard()
            raise
        return chunked

    # -- reading ----------------------------------------------------------------------
    def _open_blob(self, sha256: str, name: str) -> io.FileIO:
        path = self.blob_path(sha256)
        try:
            return open(path, "rb", buffering=0)
        except FileNotFoundError:
            raise MissingBlobError(sha256, path, name) from None

    def read_bytes(self, sha256: str, name: str = "") -> bytes:
        """Whole blob, after checking its hash:
        ``store.read_bytes(entry.sha256, "metadata.json")``."""
        with self._open_blob(sha256, name) as f:
            data = f.read()
        actual = hashlib.sha256(data).hexdigest()
        if actual != sha256:
            raise CorruptBlobError(sha256, actual, name)
        return data

    def open_file(self, entry: FileEntry, name: str = "") -> ChunkedFile:
        """The file's bytes, read from its blobs where they lie (`ChunkedFile`), unchecked:
        for a restore that verifies beside loading, holding the checkpoint's lease."""
        return ChunkedFile(self.blob_path, entry, name)

    def materialize(self, files: Mapping[str, FileEntry], dest: str | os.PathLike[str], *,
                    link: bool = False, verify: bool = True) -> Path:
        """Write the checkpoint's files into `dest` (missing or empty), verifying while copying.

        With `link`, files are hard links to the (read-only) blobs where the filesystem
        allows, still verified: for localdet's own restores, never for a user's export,
        whose files the user may change; `verify=False` (with `link` only) leaves the hash
        check to the caller (`verify`), to run beside loading. On any failure everything
        written so far is removed, so `dest` is left as it was and the export can simply be
        retried."""
        if not verify and not link:
            raise ValueError("materialize(verify=False) is only for linked restores")
        dest = Path(dest)
        created = check_export(files, dest)
        try:
            for name, entry in files.items():
                target = dest.joinpath(*PurePosixPath(name).parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                actual: str | None = None
                if entry.chunks:
                    with open(target, "xb", buffering=0) as out:
                        actual = self._join_chunks(entry, name, out, verify)
                elif link:
                    actual = self._link(entry.sha256, name, target, verify)
                if actual is None:
                    with self._open_blob(entry.sha256, name) as src, open(target, "xb") as out:
                        actual, _ = _copy_hashing(src, out)
                if actual != entry.sha256:
                    raise CorruptBlobError(entry.sha256, actual, name)
        except BaseException:
            undo_export(dest, created)
            raise
        return dest

    def _join_chunks(self, entry: FileEntry, name: str, out: BinaryIO, verify: bool) -> str:
        """Write the file's chunks to `out`, each checked against its name with `verify`;
        returns the sha256 of all the bytes (the expected one without `verify`)."""
        whole = hashlib.sha256()
        for sha256, _ in entry.chunks:
            with self._open_blob(sha256, name) as src:
                data = src.read()
            if verify:
                actual = hashlib.sha256(data).hexdigest()
                if actual != sha256:
                    raise CorruptBlobError(sha256, actual, name)
                whole.update(data)
            out.write(data)
        return whole.hexdigest() if verify else entry.sha256

    def _link(self, sha256: str, name: str, target: Path, verify: bool) -> str | None:
        """Hard-link a blob to `target` and hash it (unless not asked to: then its expected
        hash is returned); None where links are impossible."""
        try:
            os.link(self.blob_path(sha256), target)
        except FileNotFoundError:
            raise MissingBlobError(sha256, self.blob_path(sha256), name) from None
        except OSError:
            return None
        if not verify:
            return sha256
        with open(target, "rb", buffering=0) as src:
            return _copy_hashing(src, None)[0]

    def verify(self, files: Mapping[str, FileEntry], checked: set[str] | None = None
               ) -> list[str]:
        """Names of files a blob of which is missing or corrupt: ``assert not
        store.verify(files)``. Blobs in `checked` are taken as sound; those found sound are
        added to it (a caller checking many checkpoints reads a shared chunk once)."""
        return self.verification(files, checked).run()

    def verification(self, files: Mapping[str, FileEntry], checked: set[str] | None = None
                     ) -> Verification:
        """`verify`, run by as many threads as call its `run()` (`Verification`)."""
        return Verification(self.blob_path, files, checked)

    # -- garbage collection -------------------------------------------------------------
    def unreferenced(self, referenced: set[str], *,
                     min_age_seconds: float = 0) -> dict[str, int]:
        """``{sha256: size}`` of the blobs not in `referenced` and older than
        `min_age_seconds`; deletes nothing."""
        cutoff = time.time() - min_age_seconds if min_age_seconds > 0 else None
        found: dict[str, int] = {}
        for blob in self.objects.glob("??/*"):
            if _SHA256_RE.fullmatch(blob.name) and blob.name not in referenced:
                try:
                    stat = blob.stat()
                except FileNotFoundError:
                    continue
                if cutoff is None or stat.st_mtime <= cutoff:
                    found[blob.name] = stat.st_size
        return found

    def delete_blobs(self, hashes: set[str], *, min_age_seconds: float = 0) -> dict[str, int]:
        """Delete these blobs (each only if older than `min_age_seconds`); returns
        ``{sha256: size}`` of those deleted. The caller makes sure that no live checkpoint
        refers to them and that no writer is between its puts and its commit."""
        cutoff = time.time() - min_age_seconds if min_age_seconds > 0 else None
        deleted: dict[str, int] = {}
        for sha256 in sorted(hashes):
            path = self.blob_path(sha256)
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                continue
            if self._unlink_if_older(path, cutoff):
                deleted[sha256] = size
        return deleted

    def delete_temporary(self, *, min_age_seconds: float) -> int:
        """Delete leftovers of interrupted puts older than `min_age_seconds`."""
        cutoff = time.time() - min_age_seconds if min_age_seconds > 0 else None
        return sum(self._unlink_if_older(tmp, cutoff) for tmp in self.tmp.iterdir())

    def delete_unreferenced(self, referenced: set[str], *, min_age_seconds: float = 0) -> int:
        """Delete blobs not in `referenced`, and temp files; returns the number of blobs deleted.

        Only files older than `min_age_seconds` go. While checkpoints may be in flight (their
        blobs are not referenced yet) pass more than any put-then-commit takes:
        ``store.delete_unreferenced(live_hashes, min_age_seconds=3600)``"""
        cutoff = time.time() - min_age_seconds if min_age_seconds > 0 else None
        deleted = 0
        # Fan-out folders are kept even when empty: removing one could race a put that
        # has just created it and is about to rename a blob into it.
        for blob in self.objects.glob("??/*"):
            if _SHA256_RE.fullmatch(blob.name) and blob.name not in referenced:
                deleted += self._unlink_if_older(blob, cutoff)
        for tmp in self.tmp.iterdir():
            self._unlink_if_older(tmp, cutoff)
        return deleted

    @staticmethod
    def _unlink_if_older(path: Path, cutoff: float | None) -> bool:
        try:
            if cutoff is not None and path.stat().st_mtime > cutoff:
                return False
            path.unlink()
            return True
        except FileNotFoundError:  # removed concurrently
            return False
