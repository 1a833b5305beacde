"""The daemon's report server in a process of its own, so that the daemon's loop has its core
(and its interpreter lock) to itself.

    reporting = start_report_server(layout, host, port, reserve, log, on_failure=daemon.stop)
    daemon.db.turns = reporting.turns       # our transactions and its writer's alternate
    ...trials report to reporting.url...
    reporting.close()

The child, `python -m localdet.reporting.report_process`, runs the same `ReportServer`
(the same wire, the same per-launch tokens from the secret in `LOCALDET_HOME`, the same
port remembered there) and is SQLite's only writer for remote trials, as the server was in
the daemon's process. It tells the daemon, one JSON line at a time on its standard output,
that it serves (and on which port), what it logs, and as it stops what it did (its
writer's groups and its threads' CPU, for benchmarks).

It dies with the daemon. The daemon's `close()` asks it to stop on its standard input (a
pipe from the daemon): it commits what is queued, answers, and exits. If the daemon dies
instead (a `kill -9` included), the pipe closes without that word and the kernel kills the
child too (PR_SET_PDEATHSIG, sent when the daemon's thread that started it ends): the
port is free at once for the next daemon, which adopts the trials still running, and what
was not committed was not acknowledged (the trials send it again). If it dies while the
daemon runs, the daemon
says so in its log and starts it again on the same port (trials retry their reports
meanwhile); after `RESTARTS` deaths within a minute it says so and stops the daemon.

`LOCALDET_REPORT_IN_PROCESS=1` keeps the server in the daemon's process (as before; for
comparisons, and where a second process is not wanted).
"""

from __future__ import annotations

import collections
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any, Callable

from localdet.checkpoints.disk_space import Reserve
from localdet.paths import Layout
from localdet.reporting.group_writer import WriteTurns
from localdet.reporting.launch_tokens import ReportServerError

IN_PROCESS_VARIABLE = "LOCALDET_REPORT_IN_PROCESS"
RESTARTS = 5  # deaths within RESTART_WINDOW before the daemon gives up
RESTART_WINDOW = 60.0
CLOSE_SECONDS = 60.0  # for the child to commit what is queued and exit
TURN_FILES = (".write-turns-gate", ".write-turns")


class ProcessTurns(WriteTurns):
    """WriteTurns between the daemon's process and its report server's: within a process,
    WriteTurns' order; between them, a turnstile of two file locks. A writer takes the gate,
    then the turn, then lets the gate go; so a writer that lets the turn go and asks again
    at once waits at the gate behind the one already waiting for the turn: the two
    processes alternate instead of one sleeping in SQLite's busy handler while the other
    takes the lock again and again. A process that dies holding a lock lets it go."""

    def __init__(self, layout: Layout, seconds: float = 30.0):
        super().__init__(seconds)
        self._paths = [layout.home / name for name in TURN_FILES]
        self._fds: list[int] | None = None  # opened in the process that uses them

    def __enter__(self) -> "ProcessTurns":
        super().__enter__()
        if self._depth == 1:  # (only the holding thread changes it)
            try:
                self._take()
            except BaseException:
                super().__exit__(None, None, None)
                raise
        return self

    def __exit__(self, *exc_info) -> None:
        if self._depth == 1 and self._fds is not None:
            fcntl.flock(self._fds[1], fcntl.LOCK_UN)
        super().__exit__(*exc_info)

    def _take(self) -> None:
        if self._fds is None:
            self._fds = [os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                         for path in self._paths]
        gate, turn = self._fds
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(turn, fcntl.LOCK_EX)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._fds is not None:
            for fd in self._fds:
                os.close(fd)
            self._fds = None


def start_report_server(layout: Layout, host: str, port: int | None, reserve: Reserve,
                        log: Callable[[str], None], on_failure: Callable[[], None]) -> Any:
    """The daemon's report server, serving once this returns: in a process of its own
    (`ReportProcess`), or with `LOCALDET_REPORT_IN_PROCESS=1` in this one (`ReportServer`,
    whose `writer.turns` is then the daemon's). Both have `url`, `turns` and `close()`."""
    if os.environ.get(IN_PROCESS_VARIABLE, "") not in ("", "0"):
        from localdet.reporting.report_server import ReportServer

        server = ReportServer(layout, host, port, reserve, log).start()
        if server.writer is None:  # start() makes it
            raise RuntimeError("the report server started without its writer")
        server.turns = server.writer.turns
        return server
    return ReportProcess(layout, host, port, reserve, log, on_failure).start()


class ReportProcess:
    """The report server's process, seen from the daemon (see the module's docstring)."""

    def __init__(self, layout: Layout, host: str = "127.0.0.1", port: int | None = None,
                 reserve: Reserve | None = None, log: Callable[[str], None] = print,
                 on_failure: Callable[[], None] | None = None):
        self.layout, self.host, self.port = layout, host, port
        self.reserve = reserve or Reserve()
        self.log = log
        self.on_failure = on_failure
        self.turns = ProcessTurns(layout)
        self.pid: int | None = None
        self.stats: dict | None = None  # what the last child did, told as it stopped
        self.failed = False
        self._process: subprocess.Popen | None = None
        self._closing = False
        self._started = threading.Event()
        self._error: str | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> "ReportProcess":
        # One thread starts each child and reads it for as long as it runs: the kernel's
        # death signal follows the thread that started the child, so it must live as
        # long as the server should.
        self._thread = threading.Thread(target=self._watch, name="report-process",
                                        daemon=True)
        self._thread.start()
        self._started.wait()
        if self._error is not None:
            self._thread.join(10)
            raise ReportServerError(self._error)
        return self

    def close(self) -> None:
        self._closing = True
        process = self._process
        if process is not None and process.stdin is not None:
            try:  # it commits what is queued, then exits
                process.stdin.write(b"stop\n")
                process.stdin.close()
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(CLOSE_SECONDS)
        process = self._process  # (one started again meanwhile, if any)
        if process is not None and process.poll() is None:
            self.log(f"the report server (pid {process.pid}) did not stop within "
                     f"{CLOSE_SECONDS:g} s; killing it")
            process.kill()
            process.wait()
        self.turns.close()

    # -- the watching thread ------------------------------------------------------------
    def _spawn(self) -> subprocess.Popen:
        package_root = str(Path(__file__).resolve().parents[2])  # the localdet we run
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [package_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        return subprocess.Popen(
            [sys.executable, "-m", "localdet.reporting.report_process",
             str(self.layout.home), self.host, str(self.port or 0), str(os.getpid()),
             str(self.reserve.min_bytes), repr(self.reserve.min_percent)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True)

    def _watch(self) -> None:
        deaths: collections.deque[float] = collections.deque()
        while not self._closing:  # (closed while waiting to start it again: not again)
            try:
                process = self._process = self._spawn()
            except OSError as error:
                self._error = f"cannot start the report server's process ({error})"
                self._started.set()
                return
            self.pid = process.pid
            self._read(process)
            code = process.wait()
            if self._closing:
                return
            if not self._started.is_set():  # it never served
                self._error = self._error or (
                    f"the report server's process exited with code {code} as it started; "
                    "see the daemon's output")
                self._started.set()
                return
            now = time.monotonic()
            deaths.append(now)
            while deaths and now - deaths[0] > RESTART_WINDOW:
                deaths.popleft()
            if len(deaths) > RESTARTS:
                self.failed = True
                self.log(f"the report server (pid {process.pid}) exited with code {code}, "
                         f"its {len(deaths)}th death within {RESTART_WINDOW:g} s: the daemon "
                         "stops (trials reporting over HTTP cannot report); see the output "
                         "above for why it died")
                if self.on_failure is not None:
                    self.on_failure()
                return
            self.log(f"the report server (pid {process.pid}) exited with code {code}; "
                     f"starting it again on port {self.port} (its trials retry their "
                     "reports meanwhile)")
            time.sleep(0.2 * len(deaths))

    def _read(self, process: subprocess.Popen) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            try:
                kind, value = json.loads(line)
            except ValueError:
                self.log(f"report server: {line.decode(errors='replace').rstrip()}")
                continue
            if kind == "ready":
                self.port = int(value)
                self._started.set()
            elif kind == "error":
                self._error = str(value)
            elif kind == "stats":
                self.stats = value
            else:
                self.log(str(value))


# -- the child ------------------------------------------------------------------------------

def _die_with_parent(parent: int) -> None:
    """Killed when the daemon's thread that started us ends (Linux); and if the daemon is
    gone already, gone now."""
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)


def _thread_cpu() -> dict[str, float]:
    """CPU seconds of this process's live threads by name (the writer, the event loop,
    the worker threads together), and the whole process's."""
    import resource

    import psutil

    names = {thread.native_id: thread.name for thread in threading.enumerate()}
    cpu: dict[str, float] = collections.defaultdict(float)
    for thread in psutil.Process().threads():
        name = names.get(thread.id, "workers")
        key = {"report-writer": "writer", "report-server": "requests",
               "MainThread": "main"}.get(name, "workers")
        cpu[key] += thread.user_time + thread.system_time
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu["total"] = usage.ru_utime + usage.ru_stime
    return dict(cpu)


def main(argv: list[str] | None = None) -> int:
    home, host, port, parent, min_bytes, min_percent = (argv or sys.argv[1:])[:6]
    _die_with_parent(int(parent))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C is the daemon's to act on
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    out: IO[str] = sys.stdout
    said = threading.Lock()

    def say(kind: str, value: Any) -> None:
        with said:
            try:
                out.write(json.dumps([kind, value]) + "\n")
                out.flush()
            except (OSError, ValueError):
                stop.set()  # the daemon is gone

    from localdet.reporting.report_server import ReportServer

    layout = Layout(Path(home))
    turns = ProcessTurns(layout)
    server = ReportServer(layout, host, int(port) or None,
                          Reserve(int(min_bytes), float(min_percent)),
                          log=lambda message: say("log", message), turns=turns)
    try:
        server.start()
    except ReportServerError as error:
        say("error", str(error))
        return 2
    say("ready", server.port)

    def watch_stdin() -> None:
        if sys.stdin.buffer.readline().strip() != b"stop":
            os._exit(1)  # the daemon died without a word: so do we, at once (see above)
        stop.set()

    threading.Thread(target=watch_stdin, name="report-stdin", daemon=True).start()
    while not stop.wait(1.0):
        pass
    cpu = _thread_cpu()  # before close() ends the writer's thread
    server.close()
    writer = server.writer
    cpu["total"] = _thread_cpu()["total"]
    say("stats", {"groups": writer.groups if writer else 0,
                  "pieces": writer.pieces if writer else 0,
                  "reads": writer.reads if writer else 0, "cpu": cpu})
    turns.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
