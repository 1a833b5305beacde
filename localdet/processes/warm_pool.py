"""Warm trial processes: TensorFlow and Keras imported once, ahead of need, and a process
forked from them for each trial, so that a trial skips the interpreter's and TensorFlow's
start-up (several seconds a trial).

    pool = WarmPool(layout, size=1)
    pool.keep_at_start(kind)     # at start: one for the trials expected most, once idle a moment
    warm = pool.for_launch(spec) # one of the same kind (started now if none), or None: cold
    warm = pool.take(spec)       # one of the same kind, or None (beside running trials)
    launcher.start(spec, warm)   # the trial runs in a process forked from it
    pool.keep(spec, expected)    # after a launch: another for trials like it, if one is expected
    pool.keep_when_idle()        # nothing runs: one of the last kind (a resume, a next submission)
    pool.close()                 # the daemon stops: the warm processes exit

A warm process forks every trial of its kind that comes. A launch that finds none while no
trial runs starts one and is forked from it once its imports are done (as long as a cold
start would take): one import of TensorFlow serves the trial, its resumes and restarts, and
the search's next trials, where a cold start beside a warm process kept for them would import
it twice. Beside running trials such a launch starts cold (the daemon would otherwise wait
on the import), and a warm process is started after it only where another launch of its
kind is expected (trials queued, or a search that may make more), else once the daemon has
nothing running: for the paused trial's resume, a restart, or the next submission like it.

A warm process fits a trial when it was started with the same environment but for what is
the trial's own (its id, slots and devices): the same Keras line, the same experiment
environment variables, the same interpreter. Trials whose command is this interpreter (the
trial runner, a module or a `.py` file) run warm (a mirrored trial's several devices too:
they are set up after the fork), and so do the ranks of a multi-process trial of such a
command (forked by its supervisor, itself forked from the warm process); others start cold.
Each trial still has a process of its own (forked, in its own session), so a crash, a leak
or a stuck device context dies with its trial, and the daemon signals and adopts it as any.
"""

from __future__ import annotations

import json
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from determined.core._reporting import (
    ENGINE_VAR,
    KERAS_LINE_REASON_VAR,
    LAUNCH_VAR,
    MODEL_DIR_VAR,
    REPORT_CHECK_PGRP_VAR,
    REPORT_TOKEN_VAR,
    REPORT_URL_VAR,
    SLOTS_VAR,
    STAGED_VAR,
    TRIAL_DIR_VAR,
    TRIAL_ID_VAR,
)
from localdet.config import engines
from localdet.paths import Layout
from localdet.pids import alive
from localdet.processes.warm_process import RANK_SUPERVISOR, is_warm_command

# What a launch sets for its trial alone; everything else must match for a process to fit.
TRIAL_OWN = (TRIAL_ID_VAR, SLOTS_VAR, "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER",
             KERAS_LINE_REASON_VAR, ENGINE_VAR,
             # reporting over HTTP (localdet/reporting/report_server.py): the launch's URL and token
             REPORT_URL_VAR, REPORT_TOKEN_VAR, LAUNCH_VAR,
             REPORT_CHECK_PGRP_VAR, MODEL_DIR_VAR, TRIAL_DIR_VAR,
             STAGED_VAR)  # started ahead of its slot (localdet/daemon/ahead.py)
ANSWER_SECONDS = 60.0  # a warm process still importing answers once it has
# A new daemon's first warm process (of the default kind) waits this long with nothing
# launched: an experiment submitted along with the start (`localdet daemon start && localdet
# submit`, a script, a test) brings its own kind, and a guess of another would be imported for
# nothing.
AT_START_AFTER_SECONDS = 5.0


def kind_of(spec) -> tuple | None:
    """What a warm process for this launch must have been started with; None when the
    launch cannot run warm."""
    argv = spec.argv
    # One process (a mirrored trial's devices are set up in it after the fork, as in a
    # cold one: the warm process touched none), or a rank supervisor that forks the ranks.
    if spec.engine not in (engines.SINGLE, engines.MIRRORED):
        if argv[1:4] != RANK_SUPERVISOR or "--" not in argv:
            return None
        argv = argv[argv.index("--") + 1:]
    return environment_kind(spec.env) if is_warm_command(argv) else None


def environment_kind(env: dict[str, str]) -> tuple:
    """The kind of a warm process for trials launched with `env`."""
    return tuple(sorted((k, v) for k, v in env.items() if k not in TRIAL_OWN))


class Forked:
    """A trial's process forked from a warm one: what the daemon needs of a Popen (pid,
    poll, wait, returncode), its exit status told by the warm process. If the warm process
    ended first, `orphaned` is set: the daemon then watches the pid as an adopted one."""

    warm = True

    def __init__(self, pid: int, parent: "Warm"):
        self.pid = pid
        self.returncode: int | None = None
        self.log_writer = None
        self._parent = parent
        self._ended = threading.Event()

    @property
    def orphaned(self) -> bool:
        return self.returncode is None and not self._parent.alive()

    def _exited(self, code: int) -> None:
        self.returncode = code
        self._ended.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        # Woken by the exit report, or, orphaned, by polling the pid.
        while not self._ended.wait(timeout if timeout is not None else 0.5):
            if timeout is not None:
                raise subprocess.TimeoutExpired("forked trial", timeout)
            if self.orphaned and not alive(self.pid):
                return None
        return self.returncode


@dataclass
class Warm:
    """One warm process, and the trials it has forked."""
    kind: tuple
    process: subprocess.Popen
    channel: socket.socket
    ready: threading.Event = field(default_factory=threading.Event)
    children: dict = field(default_factory=dict)  # pid -> Forked
    handed: int = 0  # trials handed to it (some may not be forked yet)
    _exits: dict = field(default_factory=dict)    # pid -> code, told before it was handed
    _pids: queue.Queue = field(default_factory=queue.Queue)
    _handing: threading.Lock = field(default_factory=threading.Lock)   # one order at a time
    _children: threading.Lock = field(default_factory=threading.Lock)  # children and _exits

    def alive(self) -> bool:
        return self.process.poll() is None

    def listen(self) -> None:
        """Read what it says (a thread's loop): ready, a forked pid, a child's exit."""
        buffer = b""
        while True:
            try:
                data = self.channel.recv(65536)
            except OSError:
                data = b""
            if not data:
                self.ready.clear()
                self._pids.put(None)
                return
            buffer += data
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                message = json.loads(line)
                if message.get("ready"):
                    self.ready.set()
                elif "pid" in message:
                    self._pids.put(message["pid"])
                elif "exit" in message:  # never waits on a hand-over: its pid may be next
                    with self._children:
                        child = self.children.pop(message["exit"], None)
                        if child is None:
                            self._exits[message["exit"]] = message["code"]
                    if child is not None:
                        child._exited(message["code"])

    def hand_over(self, spec, log_fd: int) -> Forked | None:
        """Fork the trial from it: its environment, folder, command and log. None if the
        warm process has ended (start the trial cold then)."""
        order = {"env": spec.env, "cwd": str(spec.cwd), "argv": spec.argv}
        with self._handing:
            self.handed += 1
            try:
                socket.send_fds(self.channel, [json.dumps(order).encode()], [log_fd])
                pid = self._pids.get(timeout=ANSWER_SECONDS)
            except (OSError, queue.Empty):
                pid = None
            if pid is None:  # dead, or an answer that may yet come and be taken for another's
                self.close()
                return None
        child = Forked(pid, self)
        with self._children:
            code = self._exits.pop(pid, None)
            if code is None:
                self.children[pid] = child
        if code is not None:
            child._exited(code)
        return child

    def close(self) -> None:
        # Still importing with no trial handed to it: what is left of its imports is
        # all it would do before reading end-of-file, a core's seconds for nothing.
        importing = not self.ready.is_set() and not self.handed
        try:
            self.channel.shutdown(socket.SHUT_RDWR)  # it reads end-of-file and exits
        except OSError:
            pass
        self.channel.close()
        if importing and self.alive():
            self.process.terminate()


@dataclass
class WarmPool:
    layout: Layout
    size: int = 1            # warm processes at most, all kinds together
    log: Callable[[str], None] = print
    # False where no core is spare: one is started only while no trial runs (for the
    # launch at hand, which would otherwise import TensorFlow itself, or the next one).
    beside_trials: bool = True
    _warm: list = field(default_factory=list)
    _when_idle: tuple | None = None  # the kind keep_when_idle keeps
    _not_before: float = 0.0  # ... not before this time.monotonic() (keep_at_start)

    def keep(self, spec, expected: bool = True) -> None:
        """After a launch like `spec`: keep a warm process for launches like it (one per
        kind, `size` in all) if another is `expected`; otherwise once the daemon is idle.
        Either way the guess of `keep_at_start` is dropped: the launches say the kind."""
        kind = kind_of(spec)
        if self._not_before:  # keep_at_start's guess, not needed now
            self._when_idle, self._not_before = None, 0.0
        if expected and self.beside_trials:
            self.keep_for(kind)
        elif kind is not None:
            self._when_idle = kind

    def keep_at_start(self, kind: tuple | None,
                      after: float = AT_START_AFTER_SECONDS) -> None:
        """Before any launch: keep a warm process of this kind (the daemon's guess of the
        trials expected most) once the daemon has had nothing to launch for `after` seconds;
        a launch before then keeps its own kind instead (`for_launch`, `keep`)."""
        self._when_idle, self._not_before = kind, time.monotonic() + after

    def keep_when_idle(self) -> None:
        """The daemon runs no trial: keep a warm process of the kind launched last and not
        kept then (or of `keep_at_start`'s, once its time has come). Once per idle spell, so
        a warm process that cannot start is not retried every pass."""
        if time.monotonic() < self._not_before:
            return
        kind, self._when_idle, self._not_before = self._when_idle, None, 0.0
        if kind is not None:
            self.keep_for(kind)

    def keep_for(self, kind: tuple | None) -> None:
        """Keep a warm process of this kind (`environment_kind`): before any launch, for the
        trials the daemon expects most (see `launcher.experiment_environment`)."""
        self._drop_dead()
        if kind is None or self.size <= 0 or any(w.kind == kind for w in self._warm):
            return
        if len(self._warm) >= self.size:  # make room: the oldest kind goes
            self._warm.pop(0).close()
        ours, theirs = socket.socketpair()
        log = self._warm_log()
        try:
            process = subprocess.Popen(
                [sys.executable, "-P", "-m", "localdet.processes.warm_process",
                 str(self.layout.warm_imports)],
                stdin=theirs.fileno(),  # the socket's descriptor, as Popen takes it from a file
                stdout=log, stderr=subprocess.STDOUT, env=dict(kind), cwd=self.layout.home,
                start_new_session=True)
        except OSError as error:
            self.log(f"cannot start a warm trial process ({error}); trials start cold")
            ours.close()
            return
        finally:
            theirs.close()
            log.close()
        warm = Warm(kind, process, ours)
        threading.Thread(target=warm.listen, name="warm-listen", daemon=True).start()
        threading.Thread(target=process.wait, name="warm-wait", daemon=True).start()
        self._warm.append(warm)

    def for_launch(self, spec) -> Warm | None:
        """The warm process to fork the launch from: one that fits, else one started now of
        its kind, since the launch would otherwise import TensorFlow itself, and its next
        launch (a resume, a restart, the search's next trial) again. None where the launch
        cannot run warm or no warm process is kept (`size` 0)."""
        kind = kind_of(spec)
        if kind is not None and self.size > 0 and self.take(spec) is None:
            self.keep_for(kind)
        return self.take(spec)

    def take(self, spec) -> Warm | None:
        """The warm process that fits the launch, or None. One still importing is taken
        too: it is nearer a first batch than a cold start would be."""
        kind = kind_of(spec)
        self._drop_dead()
        return next((w for w in self._warm if kind is not None and w.kind == kind), None)

    def ready_for(self, spec) -> bool:
        """Whether a warm process that fits the launch has done its imports."""
        warm = self.take(spec)
        return warm is not None and warm.ready.is_set()

    def close(self) -> None:
        for warm in self._warm:
            warm.close()
        self._warm.clear()

    def describe(self) -> str:
        ready = sum(w.ready.is_set() for w in self._warm)
        return f"{len(self._warm)} warm process(es), {ready} ready"

    def _warm_log(self):
        """Where warm processes' own output goes (TensorFlow's start-up messages): one
        file, begun anew once it passes 1 MB."""
        path = self.layout.home / "warm.log"
        return open(path, "ab" if not path.exists() or path.stat().st_size < 10**6 else "wb")

    def _drop_dead(self) -> None:
        for warm in list(self._warm):
            if not warm.alive():
                warm.close()
                self._warm.remove(warm)
