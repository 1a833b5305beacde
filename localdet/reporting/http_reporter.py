"""The networked `TrialReporter`: a trial on another machine reports to the daemon over HTTP.

    reporter = HTTPReporter.from_environment()   # LOCALDET_REPORT_URL, _TOKEN, LOCALDET_LAUNCH
    info = reporter.trial_info()
    reporter.report_training_metrics(100, {"loss": 0.4})   # returns at once; sent in batches

The daemon's side is `localdet.reporting.report_server`; it does every operation with the local
`SQLiteReporter`, so both transports record the same things. Metrics, heartbeats and the
first-batch mark are queued and sent by a background thread; they are flushed before a
checkpoint is registered, before `should_pause` answers and at exit. A checkpoint's files go
as the store's chunks, only those the store lacks (`chunk_upload`); a daemon from before
chunked uploads gets whole files, as it asked for them (`whole_file_upload`). Every request
is idempotent (metrics merge by (trial, kind, batches), a checkpoint commits once by its
uuid), so a lost connection is simply retried, with backoff, for
`LOCALDET_REPORT_RETRY_SECONDS` (default 600): `report_transport`. Imports only the standard
library, `determined.core` and the chunking module: it runs on nodes without the daemon's
state.
"""

from __future__ import annotations

import atexit
import hashlib
import http.client
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid as uuidlib
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Collection, Dict, Optional

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
from localdet.reporting import chunk_upload, whole_file_upload
from localdet.reporting.report_transport import (
    DEFAULT_RETRY_SECONDS,
    ReportError,
    ReportTransport,
    StaleLaunch,
)
from localdet.reporting.report_wire import CHUNK, STALE

START_SECONDS = 30.0      # how long a new process waits for the daemon to record its launch


class HTTPReporter(ReportTransport):
    """A `TrialReporter` that talks to the daemon's report server (through its
    `ReportTransport`: requests retried until they get through).

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
        super().__init__(url, trial_id, launch, token, retry_seconds=retry_seconds,
                         pgrp=pgrp)
        self.model_dir = Path(model_dir) if model_dir else Path.cwd()
        self._trial_dir = Path(trial_dir) if trial_dir else None
        self._batch = threading.Condition()
        self._metrics: list = []
        self._heartbeat = self._first_batch = self._sending = self._closed = False
        self._first_batch_reported = False
        self._phases: list = []  # the timeline's, sent with the next report
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

    def record_phase(self, phase: str, started: Optional[float], ended: float,
                     details: Optional[Dict[str, Any]] = None) -> None:
        with self._batch:  # no request of its own: it goes with the next report
            self._phases.append([phase, started, ended, details])

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
                         "first_batch": self._first_batch, "phases": self._phases}
                self._metrics, self._heartbeat, self._first_batch = [], False, False
                self._phases = []
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
        upload = (chunk_upload.upload_and_commit if begun.get("chunks") and self.chunked
                  else whole_file_upload.upload_and_commit)
        self._pending = self._saver.submit(self._upload, upload, Path(directory),
                                           batches_trained, metadata, uuid)
        return uuid

    def _upload(self, upload: Any, directory: Path, batches_trained: int,
                metadata: Dict[str, Any], uuid: str) -> None:
        submitted = time.time()
        upload(self, directory, batches_trained, metadata, uuid)
        self.record_phase("checkpoint_store", submitted, time.time(),
                          {"uuid": uuid, "batches": batches_trained})

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


