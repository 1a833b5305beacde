"""The report server's requests, on the dashboard's stack (Starlette on uvicorn): a request's
trial, launch and token checked, then dispatched to its route.

    app = create_app(server)     # server: the ReportServer (report_request.ReportApp)

    POST hello           the launch check only: a new process waits for it before training
    GET  info            the trial's facts (TrialInfo, less the daemon's own folders)
    POST report          {"metrics": [[kind, batches, values], ...], "heartbeat", "first_batch",
                          "phases": [[phase, started, ended, details], ...]}
    POST target          {"batches": n}
    POST should_pause    -> {"pause": bool}
    ...and the checkpoint routes (checkpoint_routes.py)

These run on the event loop, awaiting the writer; what blocks (the store's files, its
leases, the checkpoint's commit) runs in worker threads. The token is checked as the
dashboard checks its own, and errors are answered as the dashboard's are
(`localdet.serving`): a wrong token 403, what the trial did wrong 4xx with one sentence, a
busy database 503 (the trial retries), a full disk 507.
"""

from __future__ import annotations

import datetime
import io
import json
import sqlite3
from typing import Any, Awaitable, Callable

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from localdet.checkpoints.disk_space import DiskFull
from localdet.records import phases
from localdet.reporting import chunk_intake
from localdet.reporting import report_wire as wire
from localdet.reporting.checkpoint_chunks import BATCH_BYTES
from localdet.reporting.checkpoint_routes import CheckpointRoutes
from localdet.reporting.launch_tokens import launch_token
from localdet.reporting.report_request import ReportApp, RequestRefused, StreamedBody
from localdet.reporting.sqlite_reporter import SQLiteReporter
from localdet.serving import ErrorRule, answer, presented_token, token_matches

_API = wire.API.strip("/").split("/")
ERRORS: tuple[ErrorRule, ...] = (
    (chunk_intake.Refused, 400),
    (DiskFull, wire.INSUFFICIENT_STORAGE),
    (sqlite3.OperationalError,  # a busy database: the trial retries
     lambda error: (503, f"the database is busy ({error})")),
    (ConnectionError, 400),  # an upload cut short: nobody reads the answer
)


def create_app(server: ReportApp) -> ASGIApp:
    """The report server's ASGI application, serving `server`'s trials: every request is a
    Starlette `Request` answered by `answer`, with no router or middleware between (the
    trial's path is parsed here once; `answer` answers every error; each layer would cost
    every request some 0.1 ms of the daemon's one core)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # (lifespan is off; websockets are not served)
        request = Request(scope, receive)
        response = await answer(lambda: ReportHandler.serve(server, request), ERRORS,
                                log=server.log, server="the daemon's report server")
        await response(scope, receive, send)

    return app


class ReportHandler(CheckpointRoutes):
    """One request of a trial launch, its trial and launch checked."""

    def __init__(self, app: ReportApp, request: Request, launch: int, trial_id: int):
        super().__init__(app, request, launch)
        self.trial_id = trial_id

    @classmethod
    async def serve(cls, app: ReportApp, request: Request) -> Any:
        method, path = request.method, request.scope["path"]
        parts = path.strip("/").split("/")
        if parts[:2] != _API or len(parts) < 4:
            raise RequestRefused(404, f"no such report endpoint: {method} {path}")
        try:
            trial_id = int(parts[2])
            launch = int(request.headers.get(wire.LAUNCH_HEADER, ""))
            int(request.headers.get(wire.PGRP_HEADER, "0"))
        except ValueError:
            raise RequestRefused(400, f"the request names no trial id or launch number (or "
                                      f"its {wire.PGRP_HEADER} is not a process group)") \
                from None
        if not token_matches(presented_token(request), launch_token(app.secret, trial_id,
                                                                    launch)):
            raise RequestRefused(403, f"the report token is not trial {trial_id}'s for "
                                      f"launch {launch}; start trials with the "
                                      "environment from `trial_environment`")
        self = cls(app, request, launch, trial_id)
        reporter = await self._reporter()
        op, args = parts[3], parts[4:]
        if method == "PUT" and op in ("blobs", "chunks"):
            return await self._upload(reporter, op, args)
        if method == "GET" and op == "checkpoints" and len(args) == 3 and args[1] == "blobs":
            return await run_in_threadpool(self._send_blob, reporter, args[0], args[2])
        route = self._routes().get((method, op, len(args)))
        if route is None:
            raise RequestRefused(404, f"no such report endpoint: {method} {path}")
        result = await route(reporter, await self._payload(method), *args)
        return {} if result is None else result

    async def _reporter(self) -> SQLiteReporter:
        reporter = self.app.cached_reporter(self.trial_id)
        if reporter is None:  # made once a trial, on the writer's connection (no other)
            trial_id = self.trial_id
            reporter = await self._writer().run_async(
                lambda db: self.app.reporter(trial_id, db), write=False)
        return reporter

    async def _payload(self, method: str) -> Any:
        raw = await self.request.body()
        if not raw:
            return None
        try:
            payload = json.loads(raw)
        except ValueError as error:
            raise RequestRefused(400, f"the request's body is not JSON ({error})") from None
        if method == "POST" and not isinstance(payload, dict):
            raise RequestRefused(400, "a report request's JSON body must be an object")
        return payload

    async def _upload(self, reporter: SQLiteReporter, op: str, args: list[str]) -> Any:
        length = _length(self.request)
        if op == "chunks" and not args:
            listing = chunk_intake.parse_listing(
                self.request.headers.get(wire.CHUNKS_HEADER, ""), length)
            await self.db_async(reporter, write=False)  # the launch check, before the upload
            return await run_in_threadpool(self._put_chunks, reporter, listing,
                                           await self._body(length))
        if op == "blobs" and len(args) == 1:
            await self.db_async(reporter, write=False)
            return await run_in_threadpool(self._put_blob, reporter, args[0],
                                           await self._body(length))
        raise RequestRefused(404, f"no such report endpoint: PUT {self.request.scope['path']}")

    async def _body(self, length: int) -> Any:
        """An upload's body as a file: read whole if it is at most a batch of chunks (one
        hand-over to the worker thread), else streamed as it arrives."""
        if length > BATCH_BYTES:
            return StreamedBody(self.request, length)
        body = await self.request.body()
        if len(body) != length:
            raise ConnectionError("the upload ended early")
        return io.BytesIO(body)

    def _routes(self) -> dict[tuple[str, str, int], Callable[..., Awaitable[Any]]]:
        """(method, operation, arguments) -> handler(reporter, payload, *arguments), a
        coroutine on the event loop (what blocks, it hands to a worker thread)."""
        db = self.db_async

        async def hello(r: SQLiteReporter, p: Any) -> dict:
            await db(r, write=False)
            return {"ok": True}

        async def info(r: SQLiteReporter, p: Any) -> dict:
            return await db(r, _info, write=False)

        async def target(r: SQLiteReporter, p: Any) -> None:
            batches = _integer(p, "batches")
            await db(r, lambda w: w.set_target_batches(batches))

        async def should_pause(r: SQLiteReporter, p: Any) -> dict:
            # A read, unless a pause is to be acknowledged (PAUSE -> PAUSING): then
            # SQLiteReporter writes that in a transaction of its own, committed before the
            # answer.
            return {"pause": await db(r, lambda w: w.should_pause(), write=False)}

        return {
            ("POST", "hello", 0): hello,
            ("GET", "info", 0): info,
            ("POST", "report", 0): self._report,
            ("POST", "target", 0): target,
            ("POST", "should_pause", 0): should_pause,
            **self._checkpoint_routes(),
        }

    # -- metrics and heartbeats -----------------------------------------------------------
    async def _report(self, reporter: SQLiteReporter, payload: dict | None) -> dict:
        metrics = (payload or {}).get("metrics", [])
        if not isinstance(metrics, list) or not all(
                isinstance(row, list) and len(row) == 3 and isinstance(row[2], dict)
                for row in metrics):
            raise RequestRefused(400, "a report's \"metrics\" must be a list of [kind, "
                                      "batches, {name: value}]")
        for kind, batches, _ in metrics:  # before anything is written: all or nothing
            if kind not in ("training", "validation"):
                raise RequestRefused(400, f"metric kind {kind!r} is neither training nor "
                                          "validation")
            if not isinstance(batches, int) or isinstance(batches, bool):
                raise RequestRefused(400, f"a report's batches must be a whole number, not "
                                          f"{batches!r}")
        flags = payload or {}
        try:  # the launch's timeline (localdet/records/phases.py), with the report
            timeline = phases.from_report(flags.get("phases"))
        except ValueError as error:
            raise RequestRefused(400, str(error)) from None

        def write(writing: SQLiteReporter) -> None:
            for kind, batches, values in metrics:
                # A retried batch merges into the rows it already wrote: nothing twice.
                report = (writing.report_training_metrics if kind == "training"
                          else writing.report_validation_metrics)
                report(int(batches), values)
            if flags.get("first_batch") and not _first_batch_recorded(writing):
                writing.report_first_batch()
            writing.write_phases(writing.db, timeline)
            if flags.get("heartbeat"):
                writing.heartbeat()

        await self.db_async(reporter, write)
        return {}


def _length(request: Request) -> int:
    try:
        length = int(request.headers.get("content-length") or 0)
    except ValueError:
        length = -1
    if length < 0:
        raise RequestRefused(400, "an upload must give its size in a Content-Length header")
    return length


def _integer(payload: Any, key: str) -> int:
    value = (payload or {}).get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise RequestRefused(400, f"the request's JSON body needs a whole number \"{key}\"")
    return value


def _info(reporter: SQLiteReporter) -> dict:
    facts = dict(vars(reporter.trial_info()))
    facts.pop("model_dir"), facts.pop("trial_dir")  # the node's own, not the daemon's
    return facts


def _first_batch_recorded(reporter: SQLiteReporter) -> bool:
    """Whether this launch's first batch is already recorded (a retried report): a
    `trial_first_batch` event of the trial at or after its `started_at`. Only the events
    since the launch's `trial_launched` are read (the first-batch event comes after it, and
    the launch is recent, so SQLite finds it scanning back from the newest event), not
    every event of the experiment."""
    db, trial = reporter.db, reporter.db.trial(reporter.trial_id)
    if trial.started_at is None:
        return False
    since = datetime.datetime.fromisoformat(trial.started_at)
    launched = db.db.execute(
        "SELECT id FROM events WHERE trial_id = ? AND kind = 'trial_launched' "
        "ORDER BY id DESC LIMIT 1", [trial.id]).fetchone()
    rows = db.db.execute(
        "SELECT at FROM events WHERE id > ? AND trial_id = ? AND kind = 'trial_first_batch'",
        [launched[0] if launched else 0, trial.id]).fetchall()
    return any(datetime.datetime.fromisoformat(at) >= since for (at,) in rows)
