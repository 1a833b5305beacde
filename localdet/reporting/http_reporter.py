"""The networked `TrialReporter`: a trial on another machine reports to the daemon over HTTP.

    reporter = HTTPReporter.from_environment()   # LOCALDET_REPORT_URL, _TOKEN, LOCALDET_LAUNCH
    info = reporter.trial_info()
    reporter.report_training_metrics(100, {"loss": 0.4})   # returns at once; sent in batches

The daemon's side is `localdet.reporting.report_server`; it does every operation with the local
`SQLiteReporter`, so both transports record the same things. Metrics, heartbeats and the
first-batch mark are queued and sent by a background thread; they are flushed before a
checkpoint is registered, before `should_pause` answers and at exit. A checkpoint's files are
cut into the store's content-defined chunks on this node (`checkpoint_chunks`), the daemon
is asked once which of them its store lacks, and only those are uploaded, many to a request;
the commit lists each file's chunks (a daemon from before chunked uploads gets whole files,
as it asked for them). Every request is
idempotent (metrics merge by (trial, kind, batches), a checkpoint commits once by its uuid),
so a lost connection is simply retried, with backoff, for `LOCALDET_REPORT_RETRY_SECONDS`
(default 600). Imports only the standard library, `determined.core` and the chunking
module: it runs on nodes without the daemon's state.
"""

from __future__ import annotations

import atexit
import hashlib
import http.client
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid as uuidlib
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Callable, Collection, Dict, Optional
from urllib.parse import urlsplit

from determined.core import TrialInfo
from determined.core._reporting import (
    LAUNCH_VAR,
    MODEL_DIR_VAR,
    REPORT_CHECK_PGRP_VAR,
    REPORT_RETRY_SECONDS_VAR,
    REPORT_TOKEN_VAR,
    REPORT_URL_VAR,
    TRIAL_DIR_VAR,
    TRIAL_ID_VAR,
)
from localdet.reporting.checkpoint_chunks import CheckpointCut, cut_checkpoint

# The wire: every request names its launch and carries that launch's token.
API = "/v1/trials"
TOKEN_HEADER = "Authorization"
LAUNCH_HEADER = "X-Localdet-Launch"
PGRP_HEADER = "X-Localdet-Pgrp"  # a local launch's process group, checked like SQLite's
CHUNKS_HEADER = "X-Localdet-Chunks"  # a chunk upload's [[sha256, size], ...], body order
# 409: this launch is not (or not yet) the trial's running one; 410: it never will be again.
NOT_RUNNING, STALE = 409, 410
MISSING_BLOBS = 422       # blobs the store lacks (or arrived changed): upload, commit again
INSUFFICIENT_STORAGE = 507
DEFAULT_RETRY_SECONDS = 600.0
START_SECONDS = 30.0      # how long a new process waits for the daemon to record its launch
CHUNK = 1 << 20
UPLOADS_IN_FLIGHT = 2     # chunk uploads of one checkpoint sent at once


class ReportError(RuntimeError):
    """The daemon could not be reached, or refused a report; the message says which."""


class StaleLaunch(SystemExit):
    """This process's launch is no longer the trial's running one: it exits, so that only
    one process trains the trial."""

    status: int  # the report server's answer: NOT_RUNNING or STALE


class _Retry(Exception):
    pass


def _hash_file(path: Path) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def _files_under(base: Path) -> Dict[str, Path]:
    """The checkpoint folder's files by their relative POSIX names (file symlinks followed),
    as the store takes them."""
    found: Dict[str, Path] = {}
    for root, folders, files in os.walk(base, followlinks=False):
        for name in folders:
            if os.path.islink(os.path.join(root, name)):
                raise ReportError(f"cannot checkpoint '{os.path.join(root, name)}': folder "
                                  "symlinks cannot be checkpointed")
        for name in files:
            path = Path(root, name)
            if not path.is_file():
                raise ReportError(f"cannot checkpoint '{path}': only files and symlinks to "
                                  "files can be checkpointed")
            found[path.relative_to(base).as_posix()] = path
    return dict(sorted(found.items()))


class HTTPReporter:
    """A `TrialReporter` that talks to the daemon's report server.

    Args:
        url: the server, e.g. `http://10.0.0.1:41234` (env `LOCALDET_REPORT_URL`).
        trial_id: the trial (env `LOCALDET_TRIAL_ID`).
        launch: which launch of the trial this process is (env `LOCALDET_LAUNCH`).
        token: the launch's secret (env `LOCALDET_REPORT_TOKEN`).
        model_dir: the trial's working directory on this node (env `LOCALDET_MODEL_DIR`,
            default the current directory).
        trial_dir: a local folder for logs and TensorBoard files (env `LOCALDET_TRIAL_DIR`,
            default a new temporary folder).
        retry_seconds: how long a lost connection is retried before the trial gives up
            (env `LOCALDET_REPORT_RETRY_SECONDS`, default 600).
        pgrp: a local launch's process group, which the daemon checks against its launch
            record (env `LOCALDET_REPORT_CHECK_PGRP=1`); None for remote launches.
    """

    def __init__(self, url: str, trial_id: int, launch: int, token: str, *,
                 model_dir: Optional[Path | str] = None, trial_dir: Optional[Path | str] = None,
                 retry_seconds: float = DEFAULT_RETRY_SECONDS, pgrp: Optional[int] = None):
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname or not parts.port:
            raise ReportError(f"LOCALDET_REPORT_URL {url!r} is not an http://HOST:PORT "
                              "address; the launcher sets it from `trial_environment`")
        self.url, self.trial_id, self.launch = url, trial_id, launch
        self._host, self._port = parts.hostname, parts.port
        self._headers = {TOKEN_HEADER: f"Bearer {token}", LAUNCH_HEADER: str(launch),
                         "Content-Type": "application/json"}
        if pgrp is not None:
            self._headers[PGRP_HEADER] = str(pgrp)
        self.retry_seconds = retry_seconds
        self.model_dir = Path(model_dir) if model_dir else Path.cwd()
        self._trial_dir = Path(trial_dir) if trial_dir else None
        self._local = threading.local()  # one keep-alive connection per thread
        self._batch = threading.Condition()
        self._metrics: list = []
        self._heartbeat = self._first_batch = self._sending = self._closed = False
        self._first_batch_reported = False
        self._error: Optional[BaseException] = None
        self._sender: Optional[threading.Thread] = None
        self._saver = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        self._pending: Optional[Future] = None
        self._restored: Optional[Path] = None  # the last restore's folder
        self.chunked = True  # False: whole files, as a trial from before chunked uploads
        atexit.register(self._at_exit)

    @classmethod
    def from_environment(cls) -> "HTTPReporter":
        env = os.environ
        try:
            trial_id, launch = int(env[TRIAL_ID_VAR]), int(env[LAUNCH_VAR])
            token = env[REPORT_TOKEN_VAR]
        except (KeyError, ValueError):
            raise ReportError("LOCALDET_REPORT_URL is set but LOCALDET_TRIAL_ID, "
                              "LOCALDET_LAUNCH or LOCALDET_REPORT_TOKEN is missing or not a "
                              "number; launch trials with localdet's `trial_environment`") \
                from None
        try:
            retry = float(env.get(REPORT_RETRY_SECONDS_VAR, DEFAULT_RETRY_SECONDS))
        except ValueError:
            raise ReportError("LOCALDET_REPORT_RETRY_SECONDS must be a number of seconds") \
                from None
        reporter = cls(env[REPORT_URL_VAR], trial_id, launch, token,
                       model_dir=env.get(MODEL_DIR_VAR) or None,
                       trial_dir=env.get(TRIAL_DIR_VAR) or None, retry_seconds=retry,
                       pgrp=os.getpgrp() if env.get(REPORT_CHECK_PGRP_VAR) == "1"
                       else None)
        reporter.start()
        return reporter

    def start(self, seconds: float = START_SECONDS) -> None:
        """Train only once the daemon has recorded this launch as the trial's running one:
        a process started by a daemon killed before it recorded the launch must not train
        beside the one the next daemon starts."""
        deadline = time.monotonic() + seconds
        while True:
            try:
                self._call("POST", "hello", {})
                return
            except StaleLaunch as refused:
                if refused.status == STALE or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    # -- requests -------------------------------------------------------------------------
    def _connection(self) -> http.client.HTTPConnection:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = http.client.HTTPConnection(self._host, self._port, timeout=60)
            self._local.connection = connection
        return connection

    def _drop_connection(self) -> None:
        connection = getattr(self._local, "connection", None)
        self._local.connection = None
        if connection is not None:
            connection.close()

    def _exchange(self, method: str, path: str, body: Callable[[], Any],
                  handle: Callable[[http.client.HTTPResponse], Any],
                  headers: Optional[Dict[str, str]] = None) -> Any:
        """Send a request (`body()` gives its body afresh for each try) and `handle` the
        answer; connection failures and 5xx answers are retried with backoff."""
        deadline = time.monotonic() + self.retry_seconds
        delay, last = 0.05, ""
        while True:
            try:
                connection = self._connection()
                connection.request(method, f"{API}/{self.trial_id}/{path}", body=body(),
                                   headers={**self._headers, **(headers or {})})
                response = connection.getresponse()
                if response.status >= 500 and response.status != INSUFFICIENT_STORAGE:
                    raise _Retry(f"it answered {response.status}: {_message(response.read())}")
                return handle(response)
            except (OSError, http.client.HTTPException, _Retry) as error:
                self._drop_connection()
                last = str(error) or type(error).__name__
                if time.monotonic() + delay > deadline:
                    raise ReportError(
                        f"trial {self.trial_id} could not report to the localdet daemon at "
                        f"{self.url} for {self.retry_seconds:.0f} s (last: {last}); it stops "
                        "here and the daemon restarts it from its latest checkpoint") from None
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _call(self, method: str, path: str, payload: Any = None) -> Any:
        data = None if payload is None else json.dumps(payload).encode()
        return self._exchange(method, path, lambda: data, self._answer)

    def _answer(self, response: http.client.HTTPResponse) -> Any:
        data = response.read()
        if response.status == 200:
            return json.loads(data) if data else None
        message = _message(data)
        if response.status in (NOT_RUNNING, STALE):
            refused = StaleLaunch(message)
            refused.status = response.status
            raise refused
        if response.status == INSUFFICIENT_STORAGE:
            from localdet.checkpoints.disk_space import (
                DiskFull,  # the daemon tells a full disk apart
            )

            raise DiskFull(message)
        if response.status == MISSING_BLOBS:
            raise _MissingBlobs(json.loads(data).get("missing", []), message)
        raise ReportError(message)

    # -- identity -------------------------------------------------------------------------
    def trial_info(self) -> TrialInfo:
        facts = self._call("GET", "info")
        if self._trial_dir is None:
            self._trial_dir = Path(tempfile.mkdtemp(prefix=f"localdet-trial-{self.trial_id}-"))
        return TrialInfo(**{**facts, "model_dir": self.model_dir, "trial_dir": self._trial_dir})

    # -- batched reports ------------------------------------------------------------------
    def report_training_metrics(self, batches_trained: int, metrics: Dict[str, float]) -> None:
        self._queue(metrics=("training", batches_trained, metrics))

    def report_validation_metrics(self, batches_trained: int, metrics: Dict[str, float]) -> None:
        self._queue(metrics=("validation", batches_trained, metrics))

    def heartbeat(self) -> None:
        self._queue(heartbeat=True)

    def report_first_batch(self) -> None:
        if not self._first_batch_reported:  # once a launch, however many fits it runs
            self._first_batch_reported = True
            self._queue(first_batch=True)

    def _queue(self, metrics: Optional[tuple] = None, heartbeat: bool = False,
               first_batch: bool = False) -> None:
        with self._batch:
            self._raise_error()
            if metrics is not None:
                kind, batches, values = metrics
                self._metrics.append([kind, int(batches), {k: float(v) for k, v in values.items()}])
            self._heartbeat |= heartbeat
            self._first_batch |= first_batch
            if self._sender is None:
                self._sender = threading.Thread(target=self._send_batches, daemon=True,
                                                name="report-sender")
                self._sender.start()
            self._batch.notify_all()

    def _send_batches(self) -> None:
        while True:
            with self._batch:
                while not (self._metrics or self._heartbeat or self._first_batch or self._closed):
                    self._batch.wait()
                if self._closed and not (self._metrics or self._heartbeat or self._first_batch):
                    return
                batch = {"metrics": self._metrics, "heartbeat": self._heartbeat,
                         "first_batch": self._first_batch}
                self._metrics, self._heartbeat, self._first_batch = [], False, False
                self._sending = True
            try:
                self._call("POST", "report", batch)
            except StaleLaunch:
                # A heartbeat after the daemon has recorded the launch's end (its final
                # checkpoint and validation) loses nothing; anything else is told.
                if batch["metrics"] or batch["first_batch"]:
                    with self._batch:
                        self._error = sys.exc_info()[1]
            except BaseException as error:  # told to the trial at its next call
                with self._batch:
                    self._error = error
            finally:
                with self._batch:
                    self._sending = False
                    self._batch.notify_all()

    def flush(self) -> None:
        """Wait until every queued report is recorded; raise what went wrong sending one."""
        with self._batch:
            while self._sending or self._metrics or self._first_batch or self._heartbeat:
                if self._error is not None or self._sender is None:
                    break
                self._batch.wait()
            self._raise_error()

    def _raise_error(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error

    # -- synchronous reports ----------------------------------------------------------------
    def should_pause(self) -> bool:
        self.flush()
        return bool(self._call("POST", "should_pause", {})["pause"])

    def set_target_batches(self, batches: int) -> None:
        self.flush()
        self._call("POST", "target", {"batches": int(batches)})

    # -- checkpoints ----------------------------------------------------------------------
    def save_checkpoint(self, directory: Path, batches_trained: int,
                        metadata: Dict[str, Any], uuid: Optional[str] = None) -> str:
        """Returns the new checkpoint's uuid at once; a background thread cuts the files
        into chunks, uploads those the store lacks and commits the checkpoint. The folder is
        ours from here on, and deleted once stored."""
        self.wait_for_checkpoints()  # one at a time, and an earlier failure surfaces here
        uuid = uuid or str(uuidlib.uuid4())
        try:  # the daemon checks its disk reserve, and holds its blobs against collection
            begun = self._call("POST", f"checkpoints/{uuid}/begin", {}) or {}
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        upload = (self._upload_chunks_and_commit if begun.get("chunks") and self.chunked
                  else self._upload_and_commit)
        self._pending = self._saver.submit(upload, Path(directory), batches_trained,
                                           metadata, uuid)
        return uuid

    def _upload_chunks_and_commit(self, directory: Path, batches_trained: int,
                                  metadata: Dict[str, Any], uuid: str) -> None:
        try:
            cut = cut_checkpoint(_files_under(directory))
            missing = self._call("POST", f"checkpoints/{uuid}/missing",
                                 {"hashes": sorted(cut.blobs)})["missing"]
            commit = {"batches_trained": int(batches_trained), "metadata": metadata,
                      "files": cut.files}
            for _ in range(3):  # chunks lost meanwhile (a daemon restart) are sent again
                self._send_chunks(cut, missing)
                try:
                    self._call("POST", f"checkpoints/{uuid}/commit", commit)
                    return
                except _MissingBlobs as lacking:
                    missing = [sha for sha in lacking.missing if sha in cut.blobs]
                    if len(missing) != len(lacking.missing):
                        raise
            raise ReportError(f"checkpoint {uuid}'s chunks kept going missing in the store; "
                              "check the daemon's log")
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    def _send_chunks(self, cut: CheckpointCut, hashes: list) -> None:
        """Upload these blobs of the cut, many to a request, UPLOADS_IN_FLIGHT requests at
        once (the daemon hashes and writes one batch while the next arrives)."""
        sending: list[Future] = []
        with ThreadPoolExecutor(UPLOADS_IN_FLIGHT, thread_name_prefix="upload") as uploads:
            try:
                for listing, body in cut.batches(hashes):
                    if len(sending) >= UPLOADS_IN_FLIGHT:  # a bound on the batches in memory
                        sending.pop(0).result()
                    sending.append(uploads.submit(self._send_batch, cut, listing, body))
                for sent in sending:
                    sent.result()
            finally:
                for sent in sending:
                    sent.cancel()

    def _send_batch(self, cut: CheckpointCut, listing: list, body: bytes) -> None:
        """One upload of chunks; those that arrive changed (hashed differently) are sent
        again."""
        for _ in range(3):  # its keep-alive connection closes when the thread ends
            try:
                self._exchange("PUT", "chunks", _always(body), self._answer,
                               {"Content-Type": "application/octet-stream",
                                "Content-Length": str(len(body)),
                                CHUNKS_HEADER: json.dumps(listing, separators=(",", ":"))})
                return
            except _MissingBlobs as bad:
                resend = set(bad.missing)
                listing = [item for item in listing if item[0] in resend]
                body = b"".join(cut.read(sha) for sha, _ in listing)
        raise ReportError(f"checkpoint chunks of '{cut.blobs[listing[0][0]].path}' kept "
                          "arriving corrupted at the daemon")

    def _upload_and_commit(self, directory: Path, batches_trained: int,
                           metadata: Dict[str, Any], uuid: str) -> None:
        """Whole files, for a daemon from before chunked uploads."""
        try:
            paths = _files_under(directory)
            files = {name: _hash_file(path) for name, path in paths.items()}
            by_hash = {sha: paths[name] for name, (sha, _) in files.items()}
            missing = self._call("POST", f"checkpoints/{uuid}/missing",
                                 {"hashes": sorted(by_hash)})["missing"]
            commit = {"batches_trained": int(batches_trained), "metadata": metadata,
                      "files": {name: list(entry) for name, entry in files.items()}}
            for _ in range(3):  # blobs lost meanwhile (a daemon restart) are sent again
                for sha in missing:
                    self._upload(sha, by_hash[sha])
                try:
                    self._call("POST", f"checkpoints/{uuid}/commit", commit)
                    return
                except _MissingBlobs as lacking:
                    missing = lacking.missing
            raise ReportError(f"checkpoint {uuid}'s files kept going missing in the store; "
                              "check the daemon's log")
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    def _upload(self, sha256: str, path: Path) -> None:
        size = path.stat().st_size
        for _ in range(3):  # bytes that arrive changed (hashed differently) are sent again
            try:
                with open(path, "rb") as source:
                    def body():
                        source.seek(0)
                        return source

                    self._exchange("PUT", f"blobs/{sha256}", body, self._answer,
                                   {"Content-Type": "application/octet-stream",
                                    "Content-Length": str(size)})
                return
            except _MissingBlobs:
                continue
        raise ReportError(f"checkpoint file '{path}' kept arriving corrupted at the daemon")

    def wait_for_checkpoints(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()
        self.flush()

    def restore_checkpoint(self, uuid: str, destination: Path,
                           read_in_place: Collection[str] = ()) -> Path:
        """Download the checkpoint's files into `destination`, each verified by its hash
        (all of them: a remote trial has nothing to read in place)."""
        self.wait_for_checkpoints()
        files = self._call("GET", f"checkpoints/{uuid}")["files"]
        destination = self._restored = Path(destination)
        destination.mkdir(parents=True, exist_ok=True)
        for name, (sha256, _size) in files.items():
            rel = PurePosixPath(name)
            if rel.is_absolute() or ".." in rel.parts or not rel.parts:
                raise ReportError(f"refusing to restore unsafe file name {name!r}")
            target = destination.joinpath(*rel.parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            for _ in range(3):
                if self._download(uuid, sha256, target) == sha256:
                    break
            else:
                from localdet.checkpoints.store import StoreError

                raise StoreError(f"checkpoint file {name!r} of {uuid} kept arriving with the "
                                 "wrong hash; resume from an earlier checkpoint or restart "
                                 "the trial")
        return destination

    def _download(self, uuid: str, sha256: str, target: Path) -> str:
        def handle(response: http.client.HTTPResponse) -> str:
            if response.status != 200:
                return self._answer(response)
            digest = hashlib.sha256()
            with open(target, "wb") as out:
                while chunk := response.read(CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
            return digest.hexdigest()

        return self._exchange("GET", f"checkpoints/{uuid}/blobs/{sha256}", lambda: None, handle)

    def open_restored(self, name: str) -> BinaryIO:
        if self._restored is None:
            raise RuntimeError("open_restored before restore_checkpoint")
        return open(self._restored / name, "rb")

    def verify_restored_checkpoint(self) -> None:
        pass  # every file was verified as it arrived

    # -- exit ---------------------------------------------------------------------------
    def _at_exit(self) -> None:
        try:
            self.wait_for_checkpoints()
        except BaseException as error:
            print(f"[localdet] reports not recorded at exit: {error}", file=sys.stderr,
                  flush=True)
        with self._batch:
            self._closed = True
            self._batch.notify_all()


class _MissingBlobs(ReportError):
    def __init__(self, missing: list, message: str):
        super().__init__(message)
        self.missing = missing


def _always(value: Any) -> Callable[[], Any]:
    return lambda: value


def _message(data: bytes) -> str:
    try:
        return str(json.loads(data)["error"])
    except (ValueError, KeyError, TypeError):
        return data.decode("utf-8", "replace").strip() or "no message"
