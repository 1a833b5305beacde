"""The checkpoint store on S3 (or an S3-compatible server): `checkpoint_storage.type: s3`.

The same content addressing as the local `Store`: a blob is the object
``<prefix>/objects/<sha256[:2]>/<sha256>``, a checkpoint file is cut into content-defined
chunks stored once each (a file stored whole is one blob), and every read checks the hash (a
corrupted object is refused, naming the checkpoint file).

    store = S3Store("my-bucket", "experiments/", endpoint_url="http://127.0.0.1:9000")
    with store.writing():
        files = store.put_directory("/tmp/ckpt")   # {"code/model_def.py": FileEntry(...)}
        ...commit the manifest...
    with store.reading(uuid):
        store.materialize(files, "/tmp/export")

How readers, writers and the collector keep out of each other's way without locks (and so
why the collector never deletes a chunk a listed or half-written checkpoint uses):
`localdet.checkpoints.s3_leases`.

Requests for a file's chunks go out several at once (`requests_in_flight`, default
`REQUESTS_IN_FLIGHT`), from threads sharing the store's boto3 client: finding and uploading
what the bucket lacks, downloading for `materialize` and `verify`, checking and deleting for
the collector. A put returns only once every chunk's request has succeeded, so a manifest
committed after it names only uploaded chunks; the first failure is raised (as one
`StoreError` sentence) once the requests already sent have ended, and no further one starts.
"""
from __future__ import annotations

import hashlib
import io
import os
import tempfile
import threading
import time
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Callable, Iterable, Iterator, Mapping

from localdet.checkpoints import s3_leases
from localdet.checkpoints.chunking import cut_file
from localdet.checkpoints.s3_leases import S3Lease, SweepLease, WriteSession
from localdet.checkpoints.s3_requests import (
    Item,
    Result,
    import_boto3,
    in_flight,
    missing,
    server_now,
)
from localdet.checkpoints.store import (
    _LEASE_NAME_RE,
    _SHA256_RE,
    CHUNK_SIZE,
    CorruptBlobError,
    FileEntry,
    MissingBlobError,
    StoreError,
    check_export,
    undo_export,
    walk_files,
)

GRACE_SECONDS = 24 * 3600        # an unreferenced blob younger than this is never deleted
_COPY_LIMIT = 5 * 1024**3         # S3 copies at most 5 GiB in one request; bigger is re-uploaded
# Requests one store operation keeps open at once. Each is small (a chunk averages 128 KiB)
# and mostly waits on the network, so a few in flight hide the round trip; more than
# botocore's pool of connections would only queue for one.
REQUESTS_IN_FLIGHT = 8

_EMPTY = hashlib.sha256(b"").hexdigest()


class S3Store:
    """Checkpoint blobs in an S3 bucket, content addressed and verified on read.

    Args:
        bucket: the bucket (`checkpoint_storage.bucket`).
        prefix: key prefix (`checkpoint_storage.prefix`), default none.
        endpoint_url: an S3-compatible server (`checkpoint_storage.endpoint_url`); default
            AWS itself, or `AWS_ENDPOINT_URL`.
        access_key, secret_key: credentials; default boto3's own search (environment
            variables `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`, `~/.aws/credentials`, an
            instance role).
        grace_seconds: the youngest age at which an unreferenced blob may be deleted.
        requests_in_flight: requests one operation keeps open at once, default
            `REQUESTS_IN_FLIGHT`; 1 sends them one after another.
    """

    def __init__(self, bucket: str, prefix: str | None = None, *,
                 endpoint_url: str | None = None, access_key: str | None = None,
                 secret_key: str | None = None, grace_seconds: float = GRACE_SECONDS,
                 requests_in_flight: int = REQUESTS_IN_FLIGHT) -> None:
        boto3 = import_boto3()
        from botocore.config import Config
        self.bucket = bucket
        self.prefix = f"{prefix.strip('/')}/" if prefix and prefix.strip("/") else ""
        self.endpoint_url = endpoint_url
        self.grace_seconds = grace_seconds
        self.requests_in_flight = max(1, requests_in_flight)
        self.location = f"s3://{bucket}/{self.prefix}" + (f" at {endpoint_url}"
                                                            if endpoint_url else "")
        self.client = boto3.session.Session().client(
            "s3", endpoint_url=endpoint_url, aws_access_key_id=access_key or None,
            aws_secret_access_key=secret_key or None,
            config=Config(retries={"max_attempts": 5, "mode": "standard"},
                          max_pool_connections=max(10, self.requests_in_flight)))
        self._sessions: dict[int, WriteSession] = {}  # thread -> its writing() session
        self._sweeps: dict[int, SweepLease] = {}  # thread -> its try_sweeping() lease
        self._verified: set[str] = set()  # hashes this object has checked while downloading

    # -- keys and small requests ----------------------------------------------------------
    def blob_key(self, sha256: str) -> str:
        """``<prefix>objects/ab/ab12...``; rejects anything but 64 lowercase hex digits."""
        if not isinstance(sha256, str) or not _SHA256_RE.fullmatch(sha256):
            raise StoreError(f"{sha256!r} is not a sha256 digest (64 lowercase hex digits)")
        return f"{self.prefix}objects/{sha256[:2]}/{sha256}"

    def _url(self, sha256: str) -> str:
        return f"s3://{self.bucket}/{self.blob_key(sha256)}"

    def _lease_prefix(self, uuid: str) -> str:
        if not isinstance(uuid, str) or not _LEASE_NAME_RE.fullmatch(uuid):
            raise StoreError(f"{uuid!r} is not a checkpoint uuid")
        return f"{self.prefix}leases/{uuid}/"

    def _head(self, sha256: str) -> dict | None:
        try:
            return self._call("look up", "head_object", Key=self.blob_key(sha256))
        except Exception as error:
            if missing(error):
                return None
            raise

    def _delete(self, key: str) -> None:
        self._call("delete", "delete_object", Key=key)

    def _list(self, prefix: str) -> Iterator[tuple[dict, float]]:
        """(object, the server's time of the page that listed it) under `prefix`."""
        try:
            pages = list(self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=prefix))
        except Exception as error:
            raise self._error("list", error) from None
        for page in pages:
            now = server_now(page)
            for item in page.get("Contents", []):
                yield item, now

    def _list_keys(self, prefix: str) -> list[str]:
        return [item["Key"] for item, _ in self._list(prefix)]

    def _error(self, doing: str, error: Exception) -> StoreError:
        hint = ""
        if type(error).__name__ in ("NoCredentialsError", "PartialCredentialsError"):
            hint = ("; set checkpoint_storage.access_key and secret_key, or AWS_ACCESS_KEY_ID "
                    "and AWS_SECRET_ACCESS_KEY")
        return StoreError(f"cannot {doing} checkpoint files in {self.location}: "
                          f"{str(error).rstrip('.')}{hint}")

    def _call(self, doing: str, method: str, **kwargs: Any) -> Any:
        """``client.<method>(Bucket=..., **kwargs)``; a failure other than a missing key
        becomes one StoreError sentence (a missing key is the caller's to handle)."""
        try:
            return getattr(self.client, method)(Bucket=self.bucket, **kwargs)
        except Exception as error:
            if missing(error):
                raise
            raise self._error(doing, error) from None

    def has(self, sha256: str) -> bool:
        return self._head(sha256) is not None

    def present(self, hashes: Iterable[str]) -> set[str]:
        """Those of `hashes` the bucket holds, looked up `requests_in_flight` at a time."""
        ordered = sorted(set(hashes))
        found = self._each(self.has, ordered)
        return {sha256 for sha256, there in zip(ordered, found, strict=True) if there}

    def _each(self, work: Callable[[Item], Result], items: Iterable[Item]
              ) -> Iterator[Result]:
        return in_flight(work, items, self.requests_in_flight)

    # -- leases (localdet.checkpoints.s3_leases says how they work) -----------------------
    def reading(self, uuid: str) -> S3Lease:
        """A reader's hold on checkpoint `uuid`; look the checkpoint up in the database
        *after* taking it. Waits only while a collector decides about it."""
        return s3_leases.reading(self, uuid)

    def try_exclusive(self, uuid: str) -> S3Lease | None:
        """The collector's hold on checkpoint `uuid`, or None at once if a reader holds it."""
        return s3_leases.try_exclusive(self, uuid)

    def writing(self) -> WriteSession:
        """``with store.writing(): put the blobs, commit the manifest``: while it is held the
        collector deletes no blob; the blobs reused in the block are checked again once it
        ends. Waits only while a collector is deleting blobs."""
        return s3_leases.writing(self)

    def try_sweeping(self) -> SweepLease | None:
        """The collector's hold on blob deletion, or None at once while a checkpoint is
        being written."""
        return s3_leases.try_sweeping(self)

    # -- writing ----------------------------------------------------------------------
    def _upload(self, path: Path, sha256: str) -> None:
        try:
            self.client.upload_file(str(path), self.bucket, self.blob_key(sha256))
        except Exception as error:
            raise self._error("store", error) from None

    def _reuse(self, sha256: str, size: int) -> bool:
        """Refresh an object that is there (copying it onto itself refreshes LastModified:
        gc spares it a while); False if it is not."""
        if self._head(sha256) is None or size > _COPY_LIMIT:
            return False
        try:
            key = self.blob_key(sha256)
            self._call("store", "copy_object", Key=key,
                       CopySource={"Bucket": self.bucket, "Key": key},
                       MetadataDirective="REPLACE", Metadata={"reused": str(int(time.time()))})
        except Exception as error:
            if not missing(error):  # deleted since the look-up: upload it
                raise
            return False
        return True

    def _note_reused(self, sha256: str, upload: Callable[[], None]) -> None:
        """For the check at the end of this thread's `writing()` block, if any."""
        session = self._sessions.get(threading.get_ident())
        if session is not None:
            session.reused[sha256] = upload

    def put_file(self, path: str | os.PathLike[str]) -> FileEntry:
        """Store one file whole, as one blob; on return the object is in the bucket
        (refreshed if it was)."""
        path = Path(path)
        digest, size = hashlib.sha256(), 0
        with open(path, "rb", buffering=0) as src:
            while chunk := src.read(CHUNK_SIZE):
                digest.update(chunk)
                size += len(chunk)
        sha256 = digest.hexdigest()

        def upload() -> None:
            self._upload(path, sha256)

        try:
            if self._reuse(sha256, size):
                self._note_reused(sha256, upload)
            else:
                upload()
        except StoreError:
            raise
        except Exception as error:
            raise self._error("store", error) from None
        return FileEntry(sha256, size)

    def _put_files(self, paths: list[Path]) -> list[FileEntry]:
        """Cut the files into chunks and upload those the bucket lacks, `requests_in_flight`
        at once while the cutting goes on; on return every chunk is in the bucket."""
        cuts: list[tuple[Any, list[tuple[str, int]]]] = []  # each file's hash and chunks

        def pieces() -> Iterator[tuple[str, bytes, Path, int]]:
            seen: set[str] = set()
            for path in paths:
                whole, offset = hashlib.sha256(), 0
                chunks: list[tuple[str, int]] = []
                cuts.append((whole, chunks))
                try:
                    for piece in cut_file(path):
                        sha256 = hashlib.sha256(piece).hexdigest()
                        whole.update(piece)
                        chunks.append((sha256, len(piece)))
                        if sha256 not in seen:
                            seen.add(sha256)
                            yield sha256, bytes(piece), path, offset
                        offset += len(piece)
                except OSError as e:
                    raise StoreError(f"cannot store checkpoint file '{path}': {e}") from e
                if not chunks and _EMPTY not in seen:  # an empty file: the blob of no bytes
                    seen.add(_EMPTY)
                    yield _EMPTY, b"", path, 0

        for sha256, upload in self._each(self._put_chunk, pieces()):
            if upload is not None:
                self._note_reused(sha256, upload)
        return [FileEntry(whole.hexdigest(), sum(size for _, size in chunks),
                          tuple(chunks) if len(chunks) > 1 else ())
                for whole, chunks in cuts]

    def _put_chunk(self, item: tuple[str, bytes, Path, int]
                   ) -> tuple[str, Callable[[], None] | None]:
        """Upload one chunk (`_put_files`' item) unless the bucket has it; for one it had,
        and refreshed, how to upload it again from its file."""
        sha256, data, path, offset = item
        size = len(data)

        def upload_again() -> None:
            try:
                with open(path, "rb") as src:
                    src.seek(offset)
                    body = src.read(size)
            except OSError:
                body = b""  # gone: as changed
            if hashlib.sha256(body).hexdigest() != sha256:
                raise StoreError(f"checkpoint file '{path}' changed while it was being stored; "
                                 "save the checkpoint again")
            self._call("store", "put_object", Key=self.blob_key(sha256), Body=body)

        try:
            if self._reuse(sha256, size):
                return sha256, upload_again
            self._call("store", "put_object", Key=self.blob_key(sha256), Body=data)
        except StoreError:
            raise
        except Exception as error:
            raise self._error("store", error) from None
        return sha256, None

    def rechunk(self, entry: FileEntry, name: str = "") -> FileEntry:
        """Upload a whole-file blob's chunks (the caller holds `writing()`) and return the
        file's chunked entry; the blob itself is left for the collector. Its bytes are
        checked against their name first."""
        with tempfile.TemporaryDirectory(prefix="localdet-rechunk-") as tmp:
            path = Path(tmp) / "blob"
            with open(path, "wb") as out:
                actual = self._download(entry.sha256, name, out)
            if actual != entry.sha256:
                raise CorruptBlobError(entry.sha256, actual, name)
            return self._put_files([path])[0]

    def put_bytes(self, data: bytes) -> FileEntry:
        sha256 = hashlib.sha256(data).hexdigest()
        self._call("store", "put_object", Key=self.blob_key(sha256), Body=data)
        return FileEntry(sha256, len(data))

    def put_directory(self, directory: str | os.PathLike[str], *,
                      consume: bool = False) -> dict[str, FileEntry]:
        """Store every file under `directory` (as `Store.put_directory`), all their chunks
        in one stream of requests; `consume` is accepted and means nothing here: the files
        are uploaded, the caller deletes them."""
        base = Path(directory)
        if not base.is_dir():
            raise StoreError(f"checkpoint folder '{base}' does not exist or is not a folder")
        names = sorted(walk_files(base))
        entries = self._put_files([base / rel for rel in names])
        return {str(rel): entry for rel, entry in zip(names, entries, strict=True)}

    # -- reading ----------------------------------------------------------------------
    def _download(self, sha256: str, name: str, out: Any) -> str:
        """Stream the blob into `out` (None: only hash it); returns the sha256 of its bytes."""
        try:
            body = self._call("read", "get_object", Key=self.blob_key(sha256))["Body"]
        except StoreError:
            raise
        except Exception as error:
            if missing(error):
                raise MissingBlobError(sha256, self._url(sha256), name) from None
            raise
        digest = hashlib.sha256()
        try:
            with body:
                for chunk in body.iter_chunks(CHUNK_SIZE):
                    digest.update(chunk)
                    if out is not None:
                        out.write(chunk)
        except OSError:
            raise  # the local disk: the caller's error
        except Exception as error:  # the connection broke mid-download
            raise self._error("read", error) from None
        return digest.hexdigest()

    def read_bytes(self, sha256: str, name: str = "") -> bytes:
        buffer = io.BytesIO()
        actual = self._download(sha256, name, buffer)
        if actual != sha256:
            raise CorruptBlobError(sha256, actual, name)
        return buffer.getvalue()

    def materialize(self, files: Mapping[str, FileEntry], dest: str | os.PathLike[str], *,
                    link: bool = False, verify: bool = True) -> Path:
        """Download the checkpoint's files into `dest` (missing or empty), checking every
        hash while downloading, whatever `verify` says (`link` means nothing here). On any
        failure `dest` is left as it was."""
        dest = Path(dest)
        created = check_export(files, dest)
        try:
            for name, entry in files.items():
                target = dest.joinpath(*PurePosixPath(name).parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                with open(target, "xb") as out:
                    actual = self._join(entry, name, out)
                if actual != entry.sha256:
                    raise CorruptBlobError(entry.sha256, actual, name)
        except BaseException:
            undo_export(dest, created)
            raise
        return dest

    def _join(self, entry: FileEntry, name: str, out: BinaryIO) -> str:
        """Download the file's blobs into `out`, checking each; the sha256 of all."""
        if not entry.chunks:
            actual = self._download(entry.sha256, name, out)
            if actual == entry.sha256:
                self._verified.add(actual)
            return actual
        whole = hashlib.sha256()
        for sha256, data in self._each(lambda chunk: (chunk[0], self.read_bytes(chunk[0], name)),
                                       entry.chunks):
            self._verified.add(sha256)
            whole.update(data)
            out.write(data)
        return whole.hexdigest()

    def verify(self, files: Mapping[str, FileEntry], checked: set[str] | None = None
               ) -> list[str]:
        """Names of files a blob of which is missing or corrupt. Blobs this object has
        already checked while materialising, and those in `checked`, are not downloaded
        again; those found sound are added to `checked`."""
        checked = set() if checked is None else checked
        wanted: dict[str, str] = {}  # sha256 -> the first file naming it
        for name, entry in files.items():
            for sha256, _ in entry.blobs:
                if sha256 not in self._verified and sha256 not in checked:
                    wanted.setdefault(sha256, name)

        def sound(item: tuple[str, str]) -> bool:
            try:
                return self._download(item[0], item[1], None) == item[0]
            except StoreError:
                return False

        broken: set[str] = set()
        for sha256, ok in zip(wanted, self._each(sound, wanted.items()), strict=True):
            if ok:
                checked.add(sha256)
            else:
                broken.add(sha256)
        return [name for name, entry in files.items()
                if any(sha256 in broken for sha256, _ in entry.blobs)]

    # -- garbage collection -------------------------------------------------------------
    def _floor(self, min_age_seconds: float) -> float:
        return max(min_age_seconds, self.grace_seconds)

    def unreferenced(self, referenced: set[str], *,
                     min_age_seconds: float = 0) -> dict[str, int]:
        """``{sha256: size}`` of the blobs not in `referenced` and older than both
        `min_age_seconds` and the grace period; deletes nothing."""
        floor = self._floor(min_age_seconds)
        found: dict[str, int] = {}
        for item, now in self._list(f"{self.prefix}objects/"):
            name = item["Key"].rsplit("/", 1)[-1]
            if (_SHA256_RE.fullmatch(name) and name not in referenced
                    and now - item["LastModified"].timestamp() >= floor):
                found[name] = item["Size"]
        return found

    def delete_blobs(self, hashes: set[str], *, min_age_seconds: float = 0) -> dict[str, int]:
        """Delete these blobs, each only if older than both `min_age_seconds` and the grace
        period and, under `try_sweeping()`, only while its mark is fresh; returns
        ``{sha256: size}`` of those deleted."""
        floor = self._floor(min_age_seconds)
        sweep = self._sweeps.get(threading.get_ident())

        def delete_if_old(sha256: str) -> int | None:
            if sweep is not None and not sweep.fresh:
                return None  # writers may take it for a crashed collector's: left for later
            head = self._head(sha256)
            if head is None or server_now(head) - head["LastModified"].timestamp() < floor:
                return None
            self._delete(self.blob_key(sha256))
            return int(head["ContentLength"])

        ordered = sorted(hashes)
        sizes = self._each(delete_if_old, ordered)
        return {sha256: size for sha256, size in zip(ordered, sizes, strict=True)
                if size is not None}

    def delete_temporary(self, *, min_age_seconds: float) -> int:
        """Abort multipart uploads (an interrupted put's leftovers) older than
        `min_age_seconds`; returns how many."""
        response = self._call("list", "list_multipart_uploads", Prefix=self.prefix)
        now, aborted = server_now(response), 0
        for upload in response.get("Uploads", []):
            if now - upload["Initiated"].timestamp() >= min_age_seconds:
                self._call("delete", "abort_multipart_upload", Key=upload["Key"],
                           UploadId=upload["UploadId"])
                aborted += 1
        return aborted

    def delete_unreferenced(self, referenced: set[str], *, min_age_seconds: float = 0) -> int:
        """Delete blobs not in `referenced` (and older than the grace period) and stale
        multipart uploads; returns the number of blobs deleted."""
        gone = self.delete_blobs(set(self.unreferenced(referenced,
                                                       min_age_seconds=min_age_seconds)),
                                 min_age_seconds=min_age_seconds)
        self.delete_temporary(min_age_seconds=self._floor(min_age_seconds))
        return len(gone)
