"""The daemon's report server: where trials on other machines (and local trials under
`localdet daemon --report http`) report, since they cannot write the daemon's SQLite file.

    server = ReportServer(layout, host="127.0.0.1").start()   # port remembered in the home
    env = trial_environment(layout, trial_id, launch=trial.restarts + 1, url=server.url)
    ...start the trial with `env` added...
    server.close()

Every operation is done by the local `SQLiteReporter` (metric merging, the PAUSE -> PAUSING
acknowledgement, the disk reserve, store-then-commit of checkpoints, the first-batch event),
so a trial records the same things over either transport; the trial side is
`localdet.reporting.http_reporter.HTTPReporter`.

Writes go through one thread (`GroupWriter`): the request threads queue their work, the
writer runs everything queued in one transaction (each request in a savepoint of its own)
and commits, and only then are the requests answered. One connection writes instead of one
per trial connection, so hundreds of trials do not take turns at SQLite's write lock (and
sleep in its busy handler while it sits free); a report is still acknowledged only once it
is committed. Reads (the launch check, trial info, manifests) stay on each request
thread's own connection.

Authentication: each launch of a trial gets its own token, HMAC-SHA256 of (trial id, launch
number) under a daemon secret kept in `$LOCALDET_HOME/report_secret` (mode 0600): a daemon
restarted later derives the same tokens, so nothing is stored per launch. A wrong token is
refused (403); a launch that is no longer the trial's current one, or a trial that is not
running, is answered 410 or 409, and the process exits: never two processes training one
trial. The port is chosen once and kept in `$LOCALDET_HOME/report_port`, so trials adopted
by a restarted daemon reach it again.
"""

from __future__ import annotations

import collections
import copy
import datetime
import hashlib
import hmac
import io
import json
import os
import re
import secrets
import shutil
import socketserver
import sqlite3
import tempfile
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, cast

from determined.core._reporting import (
    LAUNCH_VAR,
    REPORT_CHECK_PGRP_VAR,
    REPORT_TOKEN_VAR,
    REPORT_URL_VAR,
    TRIAL_ID_VAR,
)
from localdet.checkpoints.disk_space import DiskFull, Reserve
from localdet.checkpoints.manifest import files_of
from localdet.checkpoints.store import FileEntry, Lease, Store, StoreError
from localdet.paths import Layout
from localdet.records.db import NotFound, StateDB
from localdet.records.states import TERMINAL_STATES, TrialState
from localdet.reporting import chunk_intake
from localdet.reporting import http_reporter as wire
from localdet.reporting.sqlite_reporter import SQLiteReporter

SECRET_FILE = "report_secret"
PORT_FILE = "report_port"
BEGUN_SECONDS = 3600.0  # a begun checkpoint's hold on the store, if its commit never comes
REPORTERS = 4096  # trials whose SQLiteReporter is kept between requests (the most recent)
_SHA256 = re.compile(r"[0-9a-f]{64}")
_UUID = re.compile(r"[0-9A-Za-z][0-9A-Za-z_-]{0,127}")


class ReportServerError(RuntimeError):
    """The report server cannot start; the message says why and what to change."""


def daemon_secret(layout: Layout) -> bytes:
    """The daemon's secret: created once (mode 0600), then read back by every daemon."""
    path = layout.home / SECRET_FILE
    if not path.exists():
        layout.home.mkdir(parents=True, exist_ok=True)
        fresh = layout.home / f".{SECRET_FILE}.{os.getpid()}.{threading.get_ident()}"
        fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(32))
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(fresh, path)  # atomic: a daemon racing us keeps its secret or takes ours
        except FileExistsError:
            pass
        finally:
            os.unlink(fresh)
    try:
        return bytes.fromhex(path.read_text().strip())
    except ValueError:
        raise ReportServerError(f"{path} is not a hex secret; delete it (running remote "
                                "trials then cannot report) and restart the daemon") from None


def launch_token(secret: bytes, trial_id: int, launch: int) -> str:
    return hmac.new(secret, f"trial {trial_id} launch {launch}".encode(),
                    hashlib.sha256).hexdigest()


def trial_environment(layout: Layout, trial_id: int, launch: int, url: str, *,
                      local: bool = False) -> dict[str, str]:
    """What a launch puts in its trial's environment to report over HTTP to `url`.
    `launch` is the trial's restarts + 1; `local`: the process runs on the daemon's machine,
    in a process group the daemon records (its launch record is checked as SQLite's is)."""
    env = {REPORT_URL_VAR: url, TRIAL_ID_VAR: str(trial_id),
           LAUNCH_VAR: str(launch),
           REPORT_TOKEN_VAR: launch_token(daemon_secret(layout), trial_id, launch)}
    if local:
        env[REPORT_CHECK_PGRP_VAR] = "1"
    return env


class WriteTurns:
    """Lets the write transactions of one process's connections to one database take turns,
    in the order they asked (re-entrant for the thread holding it); `StateDB.turns`.

    SQLite's lock alone serves threads badly: one that finds it taken sleeps in the busy
    handler (1, 2, 5 ... 100 ms a try) while the lock may sit free, and the thread that
    just committed can take it again at once. The daemon's loop lost most of its time that
    way to the report server's writer. Waiting here, the next writer is woken the moment the
    holder lets go. Other processes still meet at SQLite's lock. After `seconds` (SQLite's
    busy timeout) a waiter gives up as SQLite would: "database is locked"."""

    def __init__(self, seconds: float = 30.0):
        self.seconds = seconds
        self._changed = threading.Condition(threading.Lock())
        self._owner: int | None = None
        self._depth = 0
        self._asked: collections.deque = collections.deque()

    def __enter__(self) -> "WriteTurns":
        me = threading.get_ident()
        with self._changed:
            if self._owner == me:
                self._depth += 1
                return self
            self._asked.append(me)
            try:
                if not self._changed.wait_for(
                        lambda: self._owner is None and self._asked[0] == me, self.seconds):
                    raise sqlite3.OperationalError(
                        f"database is locked (another writer of this process held it for "
                        f"{self.seconds:g} s)")
            finally:
                self._asked.remove(me)
                self._changed.notify_all()  # the next in line may be free to go now
            self._owner, self._depth = me, 1
        return self

    def __exit__(self, *exc_info) -> None:
        with self._changed:
            self._depth -= 1
            if self._depth == 0:
                self._owner = None
                self._changed.notify_all()


class GroupWriter:
    """The report server's only SQLite writer: a thread that commits queued work in groups.

        writer = GroupWriter(layout.db).start()
        writer.run(lambda db: db.record_metrics(7, "training", 100, {"loss": 0.3}))

    `run(work)` queues `work(db)` (db: the writer's own StateDB) and returns its result once
    the transaction it ran in has committed, or raises its error. Everything queued while
    the writer was busy runs in the next transaction, each piece in a savepoint of its own:
    an error rolls back that piece only and is raised to its caller only; the others commit.
    A failed BEGIN or COMMIT (a database busy past its timeout, a full disk) is raised to
    every caller of the group, none of which was acknowledged, and each retries.
    `run(work, write=False)`: work that only reads (or writes in a transaction of its own,
    StateDB.atomic) runs before the group's transaction, outside it."""

    MAX_GROUP = 512  # a bound on one transaction's length, not a target

    def __init__(self, path, log: Callable[[str], None] = print,
                 turns: WriteTurns | None = None):
        self.path, self.log = path, log
        # Shared with the daemon's connection (Daemon.run): its transactions and ours alternate.
        self.turns = turns or WriteTurns()
        self._queue: collections.deque = collections.deque()
        self._ready = threading.Condition()
        self._closed = False
        self._opened = threading.Event()
        self._open_error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name="report-writer", daemon=True)
        # For benchmarks: transactions committed, the writes in them, the reads done.
        self.groups = self.pieces = self.reads = 0

    def start(self) -> "GroupWriter":
        self._thread.start()
        self._opened.wait()
        if self._open_error is not None:
            raise self._open_error
        return self

    def close(self) -> None:
        """Commit what is queued, then stop; work queued after this is refused (503: the
        trial retries, and finds the next daemon)."""
        with self._ready:
            self._closed = True
            self._ready.notify()
        self._thread.join()

    def run(self, work: Callable[[StateDB], Any], write: bool = True) -> Any:
        piece = _Piece(work, write)
        with self._ready:
            if self._closed:
                raise sqlite3.OperationalError("the daemon's report server is stopping")
            self._queue.append(piece)
            self._ready.notify()
        piece.done.wait()
        if piece.error is not None:
            raise piece.error
        return piece.result

    def _serve(self) -> None:
        try:
            db = StateDB.open(self.path)  # SQLite connections stay in their thread
            db.turns = self.turns  # for a transaction of a piece's own (write=False)
        except BaseException as error:
            self._open_error = error
            self._opened.set()
            return
        self._opened.set()
        try:
            while True:
                with self._ready:
                    while not self._queue and not self._closed:
                        self._ready.wait()
                    if not self._queue:
                        return  # closed, and nothing left
                    group = [self._queue.popleft()
                             for _ in range(min(len(self._queue), self.MAX_GROUP))]
                try:
                    self._commit(db, group)
                except BaseException as error:  # a bug here must not leave callers waiting
                    self.log("report server: the writer failed:\n" + traceback.format_exc())
                    for piece in group:
                        piece.fail(error)
        finally:
            db.close()

    def _commit(self, db: StateDB, group: list["_Piece"]) -> None:
        # Reads first, answered at once: they were sent beside the writes, unanswered, so
        # either order is one the trials could have seen.
        for piece in group:
            if not piece.write:
                self._read(db, piece)
        pending = [piece for piece in group if piece.write]
        while pending:
            with self.turns:
                pending = self._transaction(db, pending)

    def _read(self, db: StateDB, piece: "_Piece") -> None:
        """Work that only reads: outside any transaction (no write lock, no turn)."""
        conn = db.db.conn
        try:
            piece.result = piece.work(db)
            if conn.in_transaction:  # it wrote after all: answered once that is committed
                conn.commit()
        except BaseException as error:
            if conn.in_transaction:
                conn.rollback()
            piece.fail(error)
            return
        self.reads += 1
        piece.finish()

    def _transaction(self, db: StateDB, pending: list["_Piece"]) -> list["_Piece"]:
        """Run and commit what it can of `pending` in one transaction; returns the pieces
        left to run again."""
        conn = db.db.conn
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as error:
            for piece in pending:
                piece.fail(error)
            return []
        ran: list[_Piece] = []
        rest: list[_Piece] = []
        for index, piece in enumerate(pending):
            conn.execute("SAVEPOINT report_piece")
            try:
                piece.result = piece.work(db)
            except BaseException as error:
                if conn.in_transaction:
                    conn.execute("ROLLBACK TO report_piece")
                    conn.execute("RELEASE report_piece")
                    piece.fail(error)
                    continue
                # The error ended the whole transaction (SQLite does so for some, a full
                # disk among them): the pieces before it were undone too, and run again.
                piece.fail(error)
                rest = ran + pending[index + 1:]
                ran = []
                break
            if not conn.in_transaction:  # the work committed by itself: so be it
                ran.append(piece)
                for done in ran:
                    done.finish()
                ran, rest = [], pending[index + 1:]
                break
            conn.execute("RELEASE report_piece")
            ran.append(piece)
        if conn.in_transaction:
            try:
                conn.commit()
            except sqlite3.Error as error:
                conn.rollback()
                for piece in ran:
                    piece.fail(error)
                ran = []
        for piece in ran:
            piece.finish()
        if ran:
            self.groups += 1
            self.pieces += len(ran)
        return rest


class _Piece:
    """One request's work for the writer, and how it went."""

    __slots__ = ("work", "write", "result", "error", "done")
    error: BaseException | None

    def __init__(self, work: Callable[[StateDB], Any], write: bool = True):
        self.work, self.write, self.result, self.error = work, write, None, None
        self.done = threading.Event()

    def finish(self) -> None:
        self.done.set()

    def fail(self, error: BaseException) -> None:
        self.result, self.error = None, error
        self.done.set()


class _Refused(Exception):
    def __init__(self, status: int, message: str, **extra: Any):
        super().__init__(message)
        self.status, self.extra = status, extra


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    app: "ReportServer"

    def server_bind(self) -> None:
        # HTTPServer's own looks the host's name up (DNS); nothing here needs it.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = cast(str, host), port  # a str for AF_INET(6)


class ReportServer:
    """The HTTP server a daemon runs for trials that report over the network.

    Args:
        layout: the daemon's state folder.
        host: the address to serve on (default 127.0.0.1; a cluster's head node address).
        port: a fixed port (`--report-port`); default None: the one remembered in
            `$LOCALDET_HOME/report_port` if free, else a free one, then remembered.
        reserve: the daemon's free-space reserve, checked before a checkpoint is written.
        log: where to say what it does.
    """

    def __init__(self, layout: Layout, host: str = "127.0.0.1", port: int | None = None,
                 reserve: Reserve | None = None, log: Callable[[str], None] = print):
        self.layout, self.host, self.port = layout, host, port
        self.reserve = reserve or Reserve()
        self.log = log
        self.secret = daemon_secret(layout)
        self._begun: dict[str, tuple[Lease, float]] = {}  # checkpoint uuid -> store hold
        self._begun_lock = threading.Lock()
        self._server: _HTTPServer | None = None
        self.writer: GroupWriter | None = None
        # trial id -> its SQLiteReporter, made once a trial (not once a connection: making
        # one opens the database), whose connection is the writer's (see _Handler._db).
        self._reporters: collections.OrderedDict[int, SQLiteReporter] = \
            collections.OrderedDict()
        self._reporters_lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> "ReportServer":
        port_file = self.layout.home / PORT_FILE
        self.writer = GroupWriter(self.layout.db, self.log).start()
        if self.port is not None:
            try:
                self._server = _HTTPServer((self.host, self.port), _Handler)
            except OSError as error:
                raise ReportServerError(
                    f"cannot serve trial reports on {self.host}:{self.port} "
                    f"({error.strerror or error}); free the port or choose another "
                    "--report-port") from None
        else:
            remembered = _read_port(port_file)
            if remembered:
                try:
                    self._server = _HTTPServer((self.host, remembered), _Handler)
                except OSError as error:
                    self.log(f"the report port {remembered} is taken ({error.strerror}); "
                             "trials launched before cannot report until it is free again: "
                             "serving on a new port")
            if self._server is None:
                self._server = _HTTPServer((self.host, 0), _Handler)
        self._server.app = self
        self.port = self._server.server_address[1]
        if _read_port(port_file) != self.port:
            fresh = port_file.with_name(f".{PORT_FILE}.{os.getpid()}")
            fresh.write_text(f"{self.port}\n")
            os.replace(fresh, port_file)
        threading.Thread(target=self._server.serve_forever, name="report-server",
                         daemon=True).start()
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self.writer is not None:
            self.writer.close()  # what was queued is committed (and answered) first
        with self._begun_lock:
            for lease, _ in self._begun.values():
                lease.release()
            self._begun.clear()

    def reporter(self, trial_id: int) -> SQLiteReporter:
        """The trial's SQLiteReporter (its store, its experiment); its own connection is
        closed: requests read and write through the writer's."""
        with self._reporters_lock:
            reporter = self._reporters.get(trial_id)
            if reporter is not None:
                self._reporters.move_to_end(trial_id)
                return reporter
        try:
            reporter = SQLiteReporter(self.layout, trial_id)
        except NotFound:
            raise _Refused(wire.STALE, f"trial {trial_id} does not exist in this daemon's "
                                       "state; this process exits") from None
        reporter.db.close()
        reporter._reserve = self.reserve  # the daemon's, not the environment's
        with self._reporters_lock:
            reporter = self._reporters.setdefault(trial_id, reporter)
            self._reporters.move_to_end(trial_id)
            while len(self._reporters) > REPORTERS:
                self._reporters.popitem(last=False)
        return reporter

    # -- checkpoint holds -------------------------------------------------------------------
    def begin(self, store, uuid: str) -> None:
        """Hold the store against collection from a checkpoint's first blob to its commit,
        as SQLiteReporter does within one call."""
        with self._begun_lock:
            self._expire()
            if uuid not in self._begun:
                self._begun[uuid] = (store.writing(), time.monotonic())

    def end(self, uuid: str) -> None:
        with self._begun_lock:
            held = self._begun.pop(uuid, None)
        if held:
            held[0].release()

    def _expire(self) -> None:
        old = [u for u, (_, at) in self._begun.items() if time.monotonic() - at > BEGUN_SECONDS]
        for uuid in old:
            self._begun.pop(uuid)[0].release()


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


def _read_port(path: Path) -> int | None:
    try:
        port = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return port if 0 < port < 65536 else None


class _Body:
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


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a trial keeps one connection per thread
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line a request would drown the daemon's log

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    # -- dispatch -------------------------------------------------------------------------
    def _serve(self, method: str) -> None:
        app = self.server.app
        length = int(self.headers.get("Content-Length") or 0)
        body_read = False
        try:
            parts = self.path.split("?")[0].strip("/").split("/")
            if parts[:2] != wire.API.strip("/").split("/") or len(parts) < 4:
                raise _Refused(404, f"no such report endpoint: {method} {self.path}")
            try:
                trial_id = int(parts[2])
                self._launch = int(self.headers.get(wire.LAUNCH_HEADER, ""))
            except ValueError:
                raise _Refused(400, "the request names no trial id or launch number") from None
            token = self.headers.get(wire.TOKEN_HEADER, "").removeprefix("Bearer ")
            expected = launch_token(app.secret, trial_id, self._launch)
            if not hmac.compare_digest(token.encode(), expected.encode()):
                raise _Refused(403, f"the report token is not trial {trial_id}'s for launch "
                                    f"{self._launch}; start trials with the environment from "
                                    "`trial_environment`")
            reporter = app.reporter(trial_id)
            op, args = parts[3], parts[4:]
            if method == "PUT" and op == "blobs" and len(args) == 1:
                self._db(reporter, write=False)  # the launch check, before the upload
                body_read = True
                return self._answer(self._put_blob(reporter, args[0],
                                                   _Body(self.rfile, length)))
            if method == "PUT" and op == "chunks" and not args:
                listing = chunk_intake.parse_listing(
                    self.headers.get(wire.CHUNKS_HEADER, ""), length)
                self._db(reporter, write=False)  # the launch check, before the upload
                body_read = True
                return self._answer(self._put_chunks(reporter, listing,
                                                     _Body(self.rfile, length)))
            payload = json.loads(self.rfile.read(length) or b"null") if length else None
            body_read = True
            if method == "GET" and op == "checkpoints" and len(args) == 3 and args[1] == "blobs":
                return self._send_blob(reporter, args[0], args[2])
            handler = self._routes().get((method, op, len(args)))
            if handler is None:
                raise _Refused(404, f"no such report endpoint: {method} {self.path}")
            self._answer(handler(reporter, payload, *args))
        except _Refused as refused:
            self._answer({"error": str(refused), **refused.extra}, refused.status, body_read,
                         length)
        except chunk_intake.Refused as refused:
            self._answer({"error": str(refused)}, 400, body_read, length)
        except DiskFull as error:
            self._answer({"error": str(error)}, wire.INSUFFICIENT_STORAGE, body_read, length)
        except sqlite3.OperationalError as error:  # a busy database: the trial retries
            self._answer({"error": f"the database is busy ({error})"}, 503, body_read, length)
        except (ConnectionError, TimeoutError):
            self.close_connection = True
        except Exception as error:
            app.log(f"report server: unexpected error on {method} {self.path}:\n"
                    + traceback.format_exc())
            self._answer({"error": f"the daemon failed on this report ({error}); see its log"},
                         500, body_read, length)

    def _routes(self) -> dict:
        db = self._db
        return {
            ("POST", "hello", 0): lambda r, p: db(r, write=False) or {"ok": True},
            ("GET", "info", 0): lambda r, p: db(r, _info, write=False),
            ("POST", "report", 0): self._report,
            ("POST", "target", 0): lambda r, p: db(
                r, lambda w: w.set_target_batches(int(p["batches"]))),
            # A read, unless a pause is to be acknowledged (PAUSE -> PAUSING): then
            # SQLiteReporter writes that in a transaction of its own, committed before the
            # answer.
            ("POST", "should_pause", 0): lambda r, p: {"pause": db(
                r, lambda w: w.should_pause(), write=False)},
            ("POST", "checkpoints", 2): self._checkpoint_step,
            ("GET", "checkpoints", 1): lambda r, p, uuid: db(
                r, lambda w: _manifest(w, uuid), write=False),
        }

    def _db(self, reporter: SQLiteReporter,
            work: Callable[[SQLiteReporter], Any] | None = None, write: bool = True) -> Any:
        """Check that this request's launch is the trial's running one, then run `work` on
        the reporter, both in the server's writer thread on its connection (GroupWriter);
        returns work's result once its transaction has committed. `write=False`: the work
        reads only, or writes in a transaction of its own (run outside the group's)."""
        launch, pgrp = self._launch, self.headers.get(wire.PGRP_HEADER)

        def piece(db: StateDB) -> Any:
            _check_launch(db, reporter.trial_id, launch, pgrp)
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

    # -- operations -----------------------------------------------------------------------
    def _report(self, reporter: SQLiteReporter, payload: dict) -> dict:
        metrics = payload.get("metrics", [])
        for kind, _, _ in metrics:  # before anything is written: a report is all or nothing
            if kind not in ("training", "validation"):
                raise _Refused(400, f"metric kind {kind!r} is neither training nor validation")

        def write(writing: SQLiteReporter) -> None:
            for kind, batches, values in metrics:
                # A retried batch merges into the rows it already wrote: nothing twice.
                report = (writing.report_training_metrics if kind == "training"
                          else writing.report_validation_metrics)
                report(int(batches), values)
            if payload.get("first_batch") and not _first_batch_recorded(writing):
                writing.report_first_batch()
            if payload.get("heartbeat"):
                writing.heartbeat()

        self._db(reporter, write)
        return {}

    def _checkpoint_step(self, reporter: SQLiteReporter, payload: dict, uuid: str,
                         step: str) -> dict:
        app = self.server.app
        if not _UUID.fullmatch(uuid):
            raise _Refused(400, f"{uuid!r} is not a checkpoint uuid")
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
        raise _Refused(404, f"no such checkpoint step {step!r}")

    @staticmethod
    def _has(reporter: SQLiteReporter, sha256: str) -> bool:
        if not _SHA256.fullmatch(sha256):
            raise _Refused(400, f"{sha256!r} is not a sha256 digest (64 lowercase hex digits)")
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
                raise _Refused(wire.MISSING_BLOBS, str(lacking), missing=lacking.hashes) \
                    from None

            def commit(writing: SQLiteReporter) -> None:
                if _committed(writing, uuid):  # a retry that raced its first attempt
                    return
                writing.commit_checkpoint(writing.db, uuid, int(payload["batches_trained"]),
                                          files, payload.get("metadata") or {})

            try:
                self._db(reporter, commit)
            except ValueError as error:  # the manifest refused a field
                raise _Refused(400, str(error)) from None
        app.end(uuid)
        return {}

    def _put_blob(self, reporter: SQLiteReporter, sha256: str, body: _Body) -> dict:
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
            raise _Refused(wire.MISSING_BLOBS, f"the uploaded bytes hash to {entry.sha256}, "
                                               f"not {sha256}; sending them again",
                           missing=[sha256])
        return {}

    def _put_chunks(self, reporter: SQLiteReporter, listing: list[tuple[str, int]],
                    body: _Body) -> dict:
        bad = chunk_intake.receive(reporter.store, listing, body)
        if bad:  # the others are stored: only these are sent again
            raise _Refused(wire.MISSING_BLOBS, f"{len(bad)} uploaded chunk(s) hash to other "
                                               "bytes than their names; sending them again",
                           missing=bad)
        return {}

    def _send_blob(self, reporter: SQLiteReporter, uuid: str, sha256: str) -> None:
        store = reporter.store
        with store.reading(uuid):  # the collector leaves a checkpoint being read alone
            try:  # looked up under the lease
                checkpoint = self._db(reporter, lambda w: w.db.checkpoint(uuid), write=False)
            except NotFound as error:
                raise _Refused(404, str(error)) from None
            entry = next((e for e in files_of(checkpoint.manifest).values()
                          if e.sha256 == sha256), None)
            if entry is None:
                raise _Refused(404, f"checkpoint {uuid} has no file with sha256 {sha256}")
            if entry.chunks:  # its chunks, each checked, in order
                self._send_chunks(store, uuid, entry)
                return
            try:
                blob = (open(store.blob_path(sha256), "rb") if isinstance(store, Store)
                        else io.BytesIO(store.read_bytes(sha256)))
            except (FileNotFoundError, StoreError):
                raise _Refused(404, f"blob {sha256} of checkpoint {uuid} is missing from the "
                                    "store; resume from an earlier checkpoint") from None
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
            raise _Refused(404, f"a chunk of file {entry.sha256} of checkpoint {uuid} is "
                                "missing or corrupt in the store; resume from an earlier "
                                "checkpoint") from None
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(entry.size))
        self.end_headers()
        self.wfile.write(first)
        for sha256, _ in entry.chunks[1:]:  # a bad one now cuts the body short: refused there
            self.wfile.write(store.read_bytes(sha256))


def _check_launch(db: StateDB, trial_id: int, launch: int, pgrp: str | None) -> None:
    """Only the trial's current launch, running, may report (the HTTP form of
    SQLiteReporter._await_launch_record). Checked in the transaction of the request's work."""
    row = db.db.execute("SELECT state, restarts, pid FROM trials WHERE id = ?",
                        [trial_id]).fetchone()
    if row is None:
        raise _Refused(wire.STALE, f"trial {trial_id} does not exist in this daemon's state; "
                                   "this process exits")
    state, restarts, pid = row
    current = restarts + 1
    if launch < current or state in TERMINAL_STATES:
        now = f"on launch {current}" if launch < current else state
        raise _Refused(wire.STALE, f"launch {launch} of trial {trial_id} is over (the "
                                   f"trial is {now}); this process exits so that only "
                                   "one process trains the trial")
    if launch > current or state != TrialState.RUNNING:
        raise _Refused(wire.NOT_RUNNING, f"trial {trial_id} is not running launch "
                                         f"{launch} (it is {state}, launch "
                                         f"{current}); this process exits")
    if pgrp is not None and pid != int(pgrp):
        raise _Refused(wire.NOT_RUNNING, f"trial {trial_id} is recorded as running in "
                                         f"process {pid}, not in this one ({pgrp}); "
                                         "this process exits")


def _info(reporter: SQLiteReporter) -> dict:
    facts = dict(vars(reporter.trial_info()))
    facts.pop("model_dir"), facts.pop("trial_dir")  # the node's own, not the daemon's
    return facts


def _committed(reporter: SQLiteReporter, uuid: str) -> bool:
    try:
        return reporter.db.checkpoint(uuid).uuid == uuid
    except NotFound:
        return False


def _manifest(reporter: SQLiteReporter, uuid: str) -> dict:
    try:
        checkpoint = reporter.db.checkpoint(uuid)
    except NotFound as error:
        raise _Refused(404, str(error)) from None
    return {"uuid": checkpoint.uuid,
            "files": {name: [e.sha256, e.size]
                      for name, e in files_of(checkpoint.manifest).items()}}
