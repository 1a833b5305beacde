"""One request of a trial launch to the report server: checked against the trial's running
launch, its work run by the server's writer, answered in JSON.

    class Handler(ReportRequest):
        def do_POST(self):
            self._answer(self._db(reporter, lambda w: w.heartbeat()))

Only the trial's current launch, running, may report: an older launch is answered 410
(STALE), one not (or not yet) running 409 (NOT_RUNNING), and the process exits: never two
processes training one trial. A refusal is raised as `RequestRefused` and answered as
`{"error": ...}` with its status.
"""

from __future__ import annotations

import copy
import json
import socketserver
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Protocol, cast

from localdet.paths import Layout
from localdet.records.db import StateDB
from localdet.records.states import TERMINAL_STATES, TrialState
from localdet.reporting import report_wire as wire
from localdet.reporting.group_writer import GroupWriter
from localdet.reporting.sqlite_reporter import SQLiteReporter


class RequestRefused(Exception):
    """A request the server refuses: answered with `status` and `{"error": message,
    **extra}`."""

    def __init__(self, status: int, message: str, **extra: Any):
        super().__init__(message)
        self.status, self.extra = status, extra


class RequestBody:
    """A request's body as a stream of exactly Content-Length bytes."""

    def __init__(self, source, length: int):
        self.source, self.left = source, length

    def readinto(self, buffer) -> int:
        if self.left <= 0:
            return 0
        view = memoryview(buffer)[:min(len(buffer), self.left)]
        got = self.source.readinto(view)
        if not got:
            raise ConnectionError("the upload ended early")
        self.left -= got
        return got

    def read(self, size: int = -1) -> bytes:
        buffer = bytearray(min(self.left, wire.CHUNK if size < 0 else size))
        return bytes(buffer[:self.readinto(buffer)])


class ReportApp(Protocol):
    """What a request reaches of the server it came to (`ReportServer`)."""

    layout: Layout
    secret: bytes
    writer: GroupWriter | None
    log: Callable[[str], None]

    def reporter(self, trial_id: int) -> SQLiteReporter: ...

    def begin(self, store: Any, uuid: str) -> None: ...

    def end(self, uuid: str) -> None: ...


class ReportHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    app: ReportApp

    def server_bind(self) -> None:
        # HTTPServer's own looks the host's name up (DNS); nothing here needs it.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = cast(str, host), port  # a str for AF_INET(6)


class ReportRequest(BaseHTTPRequestHandler):
    """A request handler's base: the launch check, the writer, the JSON answer."""

    protocol_version = "HTTP/1.1"  # keep-alive: a trial keeps one connection per thread
    server: ReportHTTPServer
    _launch: int  # the launch the request names (LAUNCH_HEADER), set once it is read

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line a request would drown the daemon's log

    def _db(self, reporter: SQLiteReporter,
            work: Callable[[SQLiteReporter], Any] | None = None, write: bool = True) -> Any:
        """Check that this request's launch is the trial's running one, then run `work` on
        the reporter, both in the server's writer thread on its connection (GroupWriter);
        returns work's result once its transaction has committed. `write=False`: the work
        reads only, or writes in a transaction of its own (run outside the group's)."""
        launch, pgrp = self._launch, self.headers.get(wire.PGRP_HEADER)

        def piece(db: StateDB) -> Any:
            check_launch(db, reporter.trial_id, launch, pgrp)
            if work is None:
                return None
            bound = copy.copy(reporter)  # the same trial and store, the writer's connection
            bound.db = db
            return work(bound)

        writer = self.server.app.writer
        if writer is None:  # start() makes it before serving
            raise RuntimeError("the report server serves without its writer")
        return writer.run(piece, write=write)

    def _answer(self, answer: Any, status: int = 200, body_read: bool = True,
                length: int = 0) -> None:
        data = json.dumps(answer if answer is not None else {}).encode()
        if not body_read and length:
            self.close_connection = True  # the unread body would be taken for a request
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)


def check_launch(db: StateDB, trial_id: int, launch: int, pgrp: str | None) -> None:
    """Only the trial's current launch, running, may report (the HTTP form of
    SQLiteReporter._await_launch_record). Checked in the transaction of the request's work."""
    row = db.db.execute("SELECT state, restarts, pid FROM trials WHERE id = ?",
                        [trial_id]).fetchone()
    if row is None:
        raise RequestRefused(wire.STALE, f"trial {trial_id} does not exist in this daemon's "
                                         "state; this process exits")
    state, restarts, pid = row
    current = restarts + 1
    if launch < current or state in TERMINAL_STATES:
        now = f"on launch {current}" if launch < current else state
        raise RequestRefused(wire.STALE, f"launch {launch} of trial {trial_id} is over (the "
                                         f"trial is {now}); this process exits so that only "
                                         "one process trains the trial")
    if launch > current or state != TrialState.RUNNING:
        raise RequestRefused(wire.NOT_RUNNING, f"trial {trial_id} is not running launch "
                                               f"{launch} (it is {state}, launch "
                                               f"{current}); this process exits")
    if pgrp is not None and pid != int(pgrp):
        raise RequestRefused(wire.NOT_RUNNING, f"trial {trial_id} is recorded as running in "
                                               f"process {pid}, not in this one ({pgrp}); "
                                               "this process exits")
