"""One request of a trial launch to the report server: checked against the trial's running
launch, its work run by the server's writer, its upload read as a stream.

    handling = ReportRequest(app, request, launch)
    await handling.db_async(reporter, lambda w: w.heartbeat())   # on the event loop
    handling.db(reporter, lambda w: w.heartbeat())               # in a worker thread

Only the trial's current launch, running, may report: an older launch is answered 410
(STALE), one not (or not yet) running 409 (NOT_RUNNING), and the process exits: never two
processes training one trial. A refusal is raised as `RequestRefused` (the servers' shared
`localdet.serving.Refused`) and answered as `{"error": ...}` with its status.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Protocol

import anyio.from_thread
from starlette.requests import Request

from localdet.paths import Layout
from localdet.records.db import StateDB
from localdet.records.states import TERMINAL_STATES, TrialState
from localdet.reporting import report_wire as wire
from localdet.reporting.group_writer import GroupWriter
from localdet.reporting.sqlite_reporter import SQLiteReporter
from localdet.serving import Refused

RequestRefused = Refused  # by its former name


class StreamedBody:
    """A request's body as a file of exactly Content-Length bytes, read from a worker
    thread while the event loop receives it (an upload is never held whole in memory)."""

    def __init__(self, request: Request, length: int):
        self._chunks = request.stream()
        self._pending = memoryview(b"")
        self.left = length

    def readinto(self, buffer) -> int:
        if self.left <= 0:
            return 0
        while not self._pending:
            try:
                self._pending = memoryview(anyio.from_thread.run(self._chunks.__anext__))
            except StopAsyncIteration:
                raise ConnectionError("the upload ended early") from None
        size = min(len(buffer), len(self._pending), self.left)
        memoryview(buffer)[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        self.left -= size
        return size

    def read(self, size: int = -1) -> bytes:
        buffer = bytearray(min(self.left, wire.CHUNK if size < 0 else size))
        return bytes(buffer[:self.readinto(buffer)])


class ReportApp(Protocol):
    """What a request reaches of the server it came to (`ReportServer`)."""

    layout: Layout
    secret: bytes
    writer: GroupWriter | None
    log: Callable[[str], None]

    def reporter(self, trial_id: int, db: StateDB | None = None) -> SQLiteReporter: ...

    def cached_reporter(self, trial_id: int) -> SQLiteReporter | None: ...

    def begin(self, store: Any, uuid: str) -> None: ...

    def end(self, uuid: str) -> None: ...


class ReportRequest:
    """A request of one trial launch: the launch check and the writer, from the event loop
    (`db_async`) or from a worker thread (`db`)."""

    def __init__(self, app: ReportApp, request: Request, launch: int):
        self.app, self.request, self._launch = app, request, launch
        self._pgrp = request.headers.get(wire.PGRP_HEADER)

    def _piece(self, reporter: SQLiteReporter,
               work: Callable[[SQLiteReporter], Any] | None) -> Callable[[StateDB], Any]:
        launch, pgrp = self._launch, self._pgrp

        def piece(db: StateDB) -> Any:
            check_launch(db, reporter.trial_id, launch, pgrp)
            if work is None:
                return None
            bound = copy.copy(reporter)  # the same trial and store, the writer's connection
            bound.db = db
            return work(bound)
        return piece

    def _writer(self) -> GroupWriter:
        if self.app.writer is None:  # start() makes it before serving
            raise RuntimeError("the report server serves without its writer")
        return self.app.writer

    def db(self, reporter: SQLiteReporter,
           work: Callable[[SQLiteReporter], Any] | None = None, write: bool = True) -> Any:
        """Check that this request's launch is the trial's running one, then run `work` on
        the reporter, both in the server's writer thread on its connection (GroupWriter);
        returns work's result once its transaction has committed. `write=False`: the work
        reads only, or writes in a transaction of its own (run outside the group's).
        Blocks: for a worker thread."""
        return self._writer().run(self._piece(reporter, work), write=write)

    async def db_async(self, reporter: SQLiteReporter,
                       work: Callable[[SQLiteReporter], Any] | None = None,
                       write: bool = True) -> Any:
        """`db` awaited on the event loop: no worker thread waits for the writer."""
        return await self._writer().run_async(self._piece(reporter, work), write=write)


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
