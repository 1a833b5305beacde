"""The report server's checkpoint requests: begin, ask which blobs the store lacks, upload
(chunks, or whole files from trials before chunked uploads), commit, and the downloads of a
restore.

    POST checkpoints/<uuid>/begin     the disk reserve is checked; the store is held from
                                      here to the commit (ReportServer.begin)
    POST checkpoints/<uuid>/missing   {"hashes": [...]} -> {"missing": [...]}
    PUT  chunks                       CHUNKS_HEADER lists the body's chunks (chunk_intake)
    PUT  blobs/<sha256>               one whole file (the wire before chunked uploads)
    POST checkpoints/<uuid>/commit    refused (MISSING_BLOBS) while a named blob is missing
    GET  checkpoints/<uuid>           the manifest's files
    GET  checkpoints/<uuid>/blobs/<sha256>   one file's bytes, each chunk checked

What may block (the store's files read, hashed and written, its leases, S3) runs in a
worker thread, the rest on the event loop; an upload of at most a batch of chunks is read
whole before it is stored, a larger one as it arrives (`StreamedBody`), a download is
streamed.
"""

from __future__ import annotations

import contextlib
import io
import re
import shutil
import tempfile
from typing import Any, Iterator

from starlette.concurrency import run_in_threadpool
from starlette.responses import StreamingResponse

from localdet.checkpoints.manifest import files_of
from localdet.checkpoints.store import Store, StoreError
from localdet.records.db import NotFound
from localdet.reporting import chunk_intake
from localdet.reporting import report_wire as wire
from localdet.reporting.report_request import ReportRequest, RequestRefused, StreamedBody
from localdet.reporting.sqlite_reporter import SQLiteReporter

_SHA256 = re.compile(r"[0-9a-f]{64}")
_UUID = re.compile(r"[0-9A-Za-z][0-9A-Za-z_-]{0,127}")


class CheckpointRoutes(ReportRequest):
    """The checkpoint requests of a report request handler."""

    def _checkpoint_routes(self) -> dict:
        """Those answered in JSON: (method, operation, arguments) -> handler(reporter,
        payload, *arguments), run in a worker thread; the uploads and downloads stream
        (ReportHandler.serve)."""
        return {
            ("POST", "checkpoints", 2): self._checkpoint_step,
            ("GET", "checkpoints", 1): self._manifest,
        }

    async def _manifest(self, reporter: SQLiteReporter, payload: Any, uuid: str) -> dict:
        return await self.db_async(reporter, lambda w: _manifest(w, uuid), write=False)

    async def _checkpoint_step(self, reporter: SQLiteReporter, payload: dict | None,
                               uuid: str, step: str) -> dict:
        """On the event loop; what may block (a store's lease, S3, the commit) in a worker
        thread."""
        app = self.app
        if not _UUID.fullmatch(uuid):
            raise RequestRefused(400, f"{uuid!r} is not a checkpoint uuid")
        if step == "begin":
            await self.db_async(reporter, write=False)

            def begin() -> None:
                reporter._reserve.check_before_writing(app.layout.store)  # DiskFull: 507
                app.begin(reporter.store, uuid)  # waits while a collector deletes blobs
            await run_in_threadpool(begin)
            return {"chunks": True}  # this server takes chunked uploads (PUT chunks)
        if step == "missing":
            hashes = (payload or {}).get("hashes", [])
            if not isinstance(hashes, list):
                raise RequestRefused(400, "\"hashes\" must be a list of sha256 digests")
            await self.db_async(reporter, write=False)
            if isinstance(reporter.store, Store):  # a stat a blob: no thread needed
                return {"missing": chunk_intake.missing(reporter.store, hashes)}
            return {"missing": await run_in_threadpool(chunk_intake.missing, reporter.store,
                                                       hashes)}  # S3: requests
        if step == "commit":
            return await run_in_threadpool(self._commit, reporter, payload, uuid)
        raise RequestRefused(404, f"no such checkpoint step {step!r}")

    @staticmethod
    def _has(reporter: SQLiteReporter, sha256: str) -> bool:
        if not _SHA256.fullmatch(sha256):
            raise RequestRefused(400, f"{sha256!r} is not a sha256 digest (64 lowercase hex "
                                      "digits)")
        return reporter.store.has(sha256)

    def _commit(self, reporter: SQLiteReporter, payload: dict | None, uuid: str) -> dict:
        app = self.app
        payload = payload or {}
        batches = payload.get("batches_trained")
        if not isinstance(batches, int) or isinstance(batches, bool):
            raise RequestRefused(400, "a checkpoint's commit needs a whole number "
                                      "\"batches_trained\"")
        # A retried commit whose answer was lost.
        if self.db(reporter, lambda w: _committed(w, uuid), write=False):
            app.end(uuid)
            return {}
        with reporter.store.writing():  # a begun hold may have died with a former daemon
            try:  # every blob named present, at its size, until the manifest is committed
                files = chunk_intake.stored_files(reporter.store, payload.get("files"))
            except chunk_intake.Missing as lacking:
                raise RequestRefused(wire.MISSING_BLOBS, str(lacking),
                                     missing=lacking.hashes) from None

            def commit(writing: SQLiteReporter) -> None:
                if _committed(writing, uuid):  # a retry that raced its first attempt
                    return
                writing.commit_checkpoint(writing.db, uuid, batches,
                                          files, payload.get("metadata") or {})

            try:
                self.db(reporter, commit)
            except ValueError as error:  # the manifest refused a field
                raise RequestRefused(400, str(error)) from None
        app.end(uuid)
        return {}

    def _put_blob(self, reporter: SQLiteReporter, sha256: str, body: StreamedBody) -> dict:
        store = reporter.store
        self._has(reporter, sha256)  # refuses a name that is no sha256
        if isinstance(store, Store):
            # Hashed while written, durable before it is named: the store's own writer.
            entry = store._put_stream(body, None)
        else:  # another kind of store (s3) takes files
            uploads = self.app.layout.home / "uploads"
            uploads.mkdir(exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=uploads) as spool:
                shutil.copyfileobj(body, spool, wire.CHUNK)
                spool.flush()
                entry = store.put_file(spool.name)
        if entry.sha256 != sha256:
            raise RequestRefused(wire.MISSING_BLOBS, f"the uploaded bytes hash to "
                                                     f"{entry.sha256}, not {sha256}; sending "
                                                     "them again", missing=[sha256])
        return {}

    def _put_chunks(self, reporter: SQLiteReporter, listing: list[tuple[str, int]],
                    body: StreamedBody) -> dict:
        bad = chunk_intake.receive(reporter.store, listing, body)
        if bad:  # the others are stored: only these are sent again
            raise RequestRefused(wire.MISSING_BLOBS, f"{len(bad)} uploaded chunk(s) hash to "
                                                     "other bytes than their names; sending "
                                                     "them again", missing=bad)
        return {}

    def _send_blob(self, reporter: SQLiteReporter, uuid: str,
                   sha256: str) -> StreamingResponse:
        """The file's bytes, streamed; the checkpoint is leased against collection until the
        last byte is sent (or the download is abandoned)."""
        parts = _blob_parts(self, reporter, uuid, sha256)
        size = next(parts)  # the checks, before the answer's status is sent
        return StreamingResponse(parts, media_type="application/octet-stream",
                                 headers={"Content-Length": str(size)})


def _blob_parts(request: ReportRequest, reporter: SQLiteReporter, uuid: str,
                sha256: str) -> Iterator[Any]:
    """Its file's size, then its bytes. Its first step checks (RequestRefused); the rest
    runs as the answer is sent, under the checkpoint's read lease, released at the end or
    when the generator is closed."""
    store = reporter.store
    with contextlib.ExitStack() as held:
        held.enter_context(store.reading(uuid))  # the collector leaves it alone
        try:  # looked up under the lease
            checkpoint = request.db(reporter, lambda w: w.db.checkpoint(uuid), write=False)
        except NotFound as error:
            raise RequestRefused(404, str(error)) from None
        entry = next((e for e in files_of(checkpoint.manifest).values()
                      if e.sha256 == sha256), None)
        if entry is None:
            raise RequestRefused(404, f"checkpoint {uuid} has no file with sha256 {sha256}")
        if entry.chunks:  # its chunks, each checked, in order
            try:
                first = store.read_bytes(entry.chunks[0][0])
            except StoreError:
                raise RequestRefused(404, f"a chunk of file {entry.sha256} of checkpoint "
                                          f"{uuid} is missing or corrupt in the store; resume "
                                          "from an earlier checkpoint") from None
            yield entry.size
            yield first
            for chunk, _ in entry.chunks[1:]:  # a bad one now cuts the body short
                yield store.read_bytes(chunk)
            return
        try:
            blob = held.enter_context(
                open(store.blob_path(sha256), "rb") if isinstance(store, Store)
                else io.BytesIO(store.read_bytes(sha256)))
        except (FileNotFoundError, StoreError):
            raise RequestRefused(404, f"blob {sha256} of checkpoint {uuid} is missing from "
                                      "the store; resume from an earlier checkpoint") from None
        size = blob.seek(0, io.SEEK_END)
        blob.seek(0)
        yield size
        while data := blob.read(wire.CHUNK):
            yield data


def _committed(reporter: SQLiteReporter, uuid: str) -> bool:
    try:
        return reporter.db.checkpoint(uuid).uuid == uuid
    except NotFound:
        return False


def _manifest(reporter: SQLiteReporter, uuid: str) -> dict:
    try:
        checkpoint = reporter.db.checkpoint(uuid)
    except NotFound as error:
        raise RequestRefused(404, str(error)) from None
    return {"uuid": checkpoint.uuid,
            "files": {name: [e.sha256, e.size]
                      for name, e in files_of(checkpoint.manifest).items()}}
