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
"""

from __future__ import annotations

import io
import re
import shutil
import tempfile
from typing import Any

from localdet.checkpoints.manifest import files_of
from localdet.checkpoints.store import FileEntry, Store, StoreError
from localdet.records.db import NotFound
from localdet.reporting import chunk_intake
from localdet.reporting import report_wire as wire
from localdet.reporting.report_request import ReportRequest, RequestBody, RequestRefused
from localdet.reporting.sqlite_reporter import SQLiteReporter

_SHA256 = re.compile(r"[0-9a-f]{64}")
_UUID = re.compile(r"[0-9A-Za-z][0-9A-Za-z_-]{0,127}")


class CheckpointRoutes(ReportRequest):
    """The checkpoint requests of a report request handler."""

    def _checkpoint_routes(self) -> dict:
        """Those answered in JSON: (method, operation, arguments) -> handler(reporter,
        payload, *arguments); the uploads and downloads stream (ReportHandler._serve)."""
        return {
            ("POST", "checkpoints", 2): self._checkpoint_step,
            ("GET", "checkpoints", 1): lambda r, p, uuid: self._db(
                r, lambda w: _manifest(w, uuid), write=False),
        }

    def _checkpoint_step(self, reporter: SQLiteReporter, payload: dict, uuid: str,
                         step: str) -> dict:
        app = self.server.app
        if not _UUID.fullmatch(uuid):
            raise RequestRefused(400, f"{uuid!r} is not a checkpoint uuid")
        if step == "begin":
            self._db(reporter, write=False)
            reporter._reserve.check_before_writing(app.layout.store)  # DiskFull: 507
            app.begin(reporter.store, uuid)
            return {"chunks": True}  # this server takes chunked uploads (PUT chunks)
        if step == "missing":
            self._db(reporter, write=False)
            return {"missing": chunk_intake.missing(reporter.store, payload.get("hashes", []))}
        if step == "commit":
            return self._commit(reporter, payload, uuid)
        raise RequestRefused(404, f"no such checkpoint step {step!r}")

    @staticmethod
    def _has(reporter: SQLiteReporter, sha256: str) -> bool:
        if not _SHA256.fullmatch(sha256):
            raise RequestRefused(400, f"{sha256!r} is not a sha256 digest (64 lowercase hex "
                                      "digits)")
        return reporter.store.has(sha256)

    def _commit(self, reporter: SQLiteReporter, payload: dict, uuid: str) -> dict:
        app = self.server.app
        # A retried commit whose answer was lost.
        if self._db(reporter, lambda w: _committed(w, uuid), write=False):
            app.end(uuid)
            return {}
        with reporter.store.writing():  # a begun hold may have died with a former daemon
            try:  # every blob named present, at its size, until the manifest is committed
                files = chunk_intake.stored_files(reporter.store, (payload or {}).get("files"))
            except chunk_intake.Missing as lacking:
                raise RequestRefused(wire.MISSING_BLOBS, str(lacking),
                                     missing=lacking.hashes) from None

            def commit(writing: SQLiteReporter) -> None:
                if _committed(writing, uuid):  # a retry that raced its first attempt
                    return
                writing.commit_checkpoint(writing.db, uuid, int(payload["batches_trained"]),
                                          files, payload.get("metadata") or {})

            try:
                self._db(reporter, commit)
            except ValueError as error:  # the manifest refused a field
                raise RequestRefused(400, str(error)) from None
        app.end(uuid)
        return {}

    def _put_blob(self, reporter: SQLiteReporter, sha256: str, body: RequestBody) -> dict:
        store = reporter.store
        self._has(reporter, sha256)  # refuses a name that is no sha256
        if isinstance(store, Store):
            # Hashed while written, durable before it is named: the store's own writer.
            entry = store._put_stream(body, None)
        else:  # another kind of store (s3) takes files
            uploads = self.server.app.layout.home / "uploads"
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
                    body: RequestBody) -> dict:
        bad = chunk_intake.receive(reporter.store, listing, body)
        if bad:  # the others are stored: only these are sent again
            raise RequestRefused(wire.MISSING_BLOBS, f"{len(bad)} uploaded chunk(s) hash to "
                                                     "other bytes than their names; sending "
                                                     "them again", missing=bad)
        return {}

    def _send_blob(self, reporter: SQLiteReporter, uuid: str, sha256: str) -> None:
        store = reporter.store
        with store.reading(uuid):  # the collector leaves a checkpoint being read alone
            try:  # looked up under the lease
                checkpoint = self._db(reporter, lambda w: w.db.checkpoint(uuid), write=False)
            except NotFound as error:
                raise RequestRefused(404, str(error)) from None
            entry = next((e for e in files_of(checkpoint.manifest).values()
                          if e.sha256 == sha256), None)
            if entry is None:
                raise RequestRefused(404, f"checkpoint {uuid} has no file with sha256 {sha256}")
            if entry.chunks:  # its chunks, each checked, in order
                self._send_chunks(store, uuid, entry)
                return
            try:
                blob = (open(store.blob_path(sha256), "rb") if isinstance(store, Store)
                        else io.BytesIO(store.read_bytes(sha256)))
            except (FileNotFoundError, StoreError):
                raise RequestRefused(404, f"blob {sha256} of checkpoint {uuid} is missing from "
                                          "the store; resume from an earlier checkpoint") \
                    from None
            with blob:
                size = blob.seek(0, io.SEEK_END)
                blob.seek(0)
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(size))
                self.end_headers()
                shutil.copyfileobj(blob, self.wfile, wire.CHUNK)

    def _send_chunks(self, store: Any, uuid: str, entry: FileEntry) -> None:
        try:
            first = store.read_bytes(entry.chunks[0][0])
        except StoreError:
            raise RequestRefused(404, f"a chunk of file {entry.sha256} of checkpoint {uuid} is "
                                      "missing or corrupt in the store; resume from an earlier "
                                      "checkpoint") from None
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(entry.size))
        self.end_headers()
        self.wfile.write(first)
        for sha256, _ in entry.chunks[1:]:  # a bad one now cuts the body short: refused there
            self.wfile.write(store.read_bytes(sha256))


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
