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

It runs on the dashboard's stack, Starlette on uvicorn (one event loop in a thread of
the daemon), sharing its token check and error handling (`localdet.serving`). It is in
parts: `launch_tokens` (who may report: a token per launch), `report_handler` (the ASGI
app: a request's checks and routes), `checkpoint_routes` (uploads, commits, restore
downloads, in worker threads), `report_request` (the launch check, an upload's stream) and
`group_writer` (all database work goes through one thread, writes committed in groups,
answered once committed). This module starts and stops them, keeps the port, one
`SQLiteReporter` per trial, and the store holds of checkpoints being uploaded.

A launch that is no longer the trial's current one, or a trial that is not running, is
answered 410 or 409, and the process exits: never two processes training one trial. The
port is chosen once and kept in `$LOCALDET_HOME/report_port`, so trials adopted by a
restarted daemon reach it again.
"""

from __future__ import annotations

import collections
import os
import socket
import threading
import time
from pathlib import Path
from typing import Callable

import uvicorn

from localdet.checkpoints.disk_space import Reserve
from localdet.checkpoints.store import Lease
from localdet.paths import Layout
from localdet.records.db import NotFound, StateDB
from localdet.reporting import report_wire as wire
from localdet.reporting.group_writer import GroupWriter, WriteTurns
from localdet.reporting.launch_tokens import (
    SECRET_FILE,
    ReportServerError,
    daemon_secret,
    launch_token,
    trial_environment,
)
from localdet.reporting.report_handler import ReportHandler, create_app
from localdet.reporting.report_request import RequestRefused
from localdet.reporting.sqlite_reporter import SQLiteReporter

# Its parts' names, importable from here as before.
__all__ = [
    "BEGUN_SECONDS", "PORT_FILE", "REPORTERS", "SECRET_FILE", "GroupWriter", "ReportServer",
    "ReportServerError", "WriteTurns", "daemon_secret", "launch_token", "trial_environment",
]

PORT_FILE = "report_port"
BEGUN_SECONDS = 3600.0  # a begun checkpoint's hold on the store, if its commit never comes
REPORTERS = 4096  # trials whose SQLiteReporter is kept between requests (the most recent)
# A trial keeps one connection per thread between its reports (uvicorn's default closes an
# idle one after 5 s, and each next report would reconnect).
KEEP_ALIVE_SECONDS = 3600
_Handler = ReportHandler  # by its former name


class ReportServer:
    """The HTTP server a daemon runs for trials that report over the network.

    Args:
        layout: the daemon's state folder.
        host: the address to serve on (default 127.0.0.1; a cluster's head node address).
        port: a fixed port (`--report-port`); default None: the one remembered in
            `$LOCALDET_HOME/report_port` if free, else a free one, then remembered.
        reserve: the daemon's free-space reserve, checked before a checkpoint is written.
        log: where to say what it does.
        turns: how its writer and the daemon's connection take turns (default: a
            WriteTurns of its own, for a server in the daemon's process).
    """

    def __init__(self, layout: Layout, host: str = "127.0.0.1", port: int | None = None,
                 reserve: Reserve | None = None, log: Callable[[str], None] = print,
                 turns: WriteTurns | None = None):
        self.layout, self.host, self.port = layout, host, port
        self.turns = turns  # shared with the daemon's writes (report_process.ProcessTurns)
        self.reserve = reserve or Reserve()
        self.log = log
        self.secret = daemon_secret(layout)
        self._begun: dict[str, tuple[Lease, float]] = {}  # checkpoint uuid -> store hold
        self._begun_lock = threading.Lock()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.writer: GroupWriter | None = None
        # trial id -> its SQLiteReporter, made once a trial (not once a connection: making
        # one opens the database), whose connection is the writer's (see ReportRequest._db).
        self._reporters: collections.OrderedDict[int, SQLiteReporter] = \
            collections.OrderedDict()
        self._reporters_lock = threading.Lock()
        self._stores: dict = {}  # experiment id -> its checkpoint store (SQLiteReporter)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> "ReportServer":
        port_file = self.layout.home / PORT_FILE
        self.writer = GroupWriter(self.layout.db, self.log, self.turns).start()
        listener = None
        if self.port is not None:
            try:
                listener = _listen(self.host, self.port)
            except OSError as error:
                self.writer.close()
                raise ReportServerError(
                    f"cannot serve trial reports on {self.host}:{self.port} "
                    f"({error.strerror or error}); free the port or choose another "
                    "--report-port") from None
        else:
            remembered = _read_port(port_file)
            if remembered:
                try:
                    listener = _listen(self.host, remembered)
                except OSError as error:
                    self.log(f"the report port {remembered} is taken ({error.strerror}); "
                             "trials launched before cannot report until it is free again: "
                             "serving on a new port")
            if listener is None:
                listener = _listen(self.host, 0)
        self.port = listener.getsockname()[1]
        if _read_port(port_file) != self.port:
            fresh = port_file.with_name(f".{PORT_FILE}.{os.getpid()}")
            fresh.write_text(f"{self.port}\n")
            os.replace(fresh, port_file)
        # log_config=None: a server in a thread leaves the process's logging as it is (see
        # localdet/ui/web/server.py)
        config = uvicorn.Config(create_app(self), log_level="warning", access_log=False,
                                log_config=None,
                                lifespan="off", proxy_headers=False,
                                timeout_keep_alive=KEEP_ALIVE_SECONDS,
                                timeout_graceful_shutdown=10,
                                h11_max_incomplete_event_size=1 << 20)
        self._server = server = uvicorn.Server(config)
        self._thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]},
                                        name="report-server", daemon=True)
        self._thread.start()
        while not server.started:  # serving once this returns
            if not self._thread.is_alive():
                listener.close()
                self.writer.close()
                raise ReportServerError(f"the report server on {self.url} stopped as it "
                                        "started; see the daemon's log")
            time.sleep(0.005)
        return self  # (uvicorn closes the listener when it stops)

    def close(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(30)
        if self.writer is not None:
            self.writer.close()  # what was queued is committed (and answered) first
        with self._begun_lock:
            for lease, _ in self._begun.values():
                lease.release()
            self._begun.clear()

    def cached_reporter(self, trial_id: int) -> SQLiteReporter | None:
        """The trial's SQLiteReporter if it is made already (made, it costs no I/O)."""
        with self._reporters_lock:
            reporter = self._reporters.get(trial_id)
            if reporter is not None:
                self._reporters.move_to_end(trial_id)
            return reporter

    def reporter(self, trial_id: int, db: StateDB | None = None) -> SQLiteReporter:
        """The trial's SQLiteReporter (its store, its experiment), made on `db` (the
        writer's connection, in its thread; by default a connection of its own, closed
        once made): requests read and write through the writer's."""
        with self._reporters_lock:
            reporter = self._reporters.get(trial_id)
            if reporter is not None:
                self._reporters.move_to_end(trial_id)
                return reporter
        try:
            # A trial's store is its experiment's: made once an experiment, not a trial.
            reporter = SQLiteReporter(self.layout, trial_id, db, self._stores)
        except NotFound:
            raise RequestRefused(wire.STALE, f"trial {trial_id} does not exist in this daemon's "
                                             "state; this process exits") from None
        if db is None:
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


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (0: a free port). Named TCP, so that asyncio sets
    TCP_NODELAY on its connections: an answer's head and body go out at once, not the
    body after the client's delayed acknowledgement of the head (40 ms a request)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(2048)
    except BaseException:
        listener.close()
        raise
    return listener


def _read_port(path: Path) -> int | None:
    try:
        port = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return port if 0 < port < 65536 else None
