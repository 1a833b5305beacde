"""The daemon: watches the queue, runs searchers, schedules and launches trials, and
notices when they end. The only writer of scheduling state.

    Daemon(Layout.from_environment(), slots=2).run()

Trial processes run in sessions of their own, so stopping the daemon (SIGTERM, SIGINT)
leaves them training; a daemon started later adopts them. `localdet daemon stop` (SIGUSR1,
service.py) drains instead: nothing new is launched, running trials checkpoint at their next
boundary and are queued again, and the daemon exits once they have.

It manages only experiments (and jobs) whose runner is 'daemon'. `localdet run` drives the
same machinery for one experiment of its own (`Daemon(layout, only=id)`, calling `step()`);
'script' experiments record themselves and are only watched for a dead process.

This module is the loop and the wiring; each part of a pass is a collaborator of its own,
made by `open` from what it needs: requests.py (pause, resume, kill), space.py (free space),
experiments.py (searches and experiment states), exits.py (trials' processes ending),
retention.py (checkpoint retention after exits), scheduling.py (which trials start where),
launches.py (starting and adopting processes), watched.py (the processes watched), waking.py
(what wakes the loop) and scripts.py (experiments a script runs by itself).
"""

from __future__ import annotations

import os
import signal
import threading
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from watchdog.observers import Observer

from localdet.checkpoints import disk_space
from localdet.config import keras_choice
from localdet.daemon import service
from localdet.daemon.exits import Exits
from localdet.daemon.experiments import Experiments
from localdet.daemon.launches import Launches
from localdet.daemon.requests import Requests
from localdet.daemon.retention import Retention
from localdet.daemon.scheduling import Scheduler
from localdet.daemon.scripts import SCRIPT_GONE, ScriptWatch
from localdet.daemon.space import SpaceWatch
from localdet.daemon.submissions import Intake
from localdet.daemon.waking import QueueChanged, Waiters
from localdet.daemon.watched import Watched, phase_of
from localdet.monitoring.system_metrics import SystemMetrics
from localdet.paths import Layout
from localdet.pids import DaemonLock
from localdet.processes import capped_log, launcher, memory_limit
from localdet.processes.warm_pool import WarmPool, environment_kind, kind_of
from localdet.records import backups as records_copies
from localdet.records import lifecycle
from localdet.records.db import Experiment, StateDB, now
from localdet.records.states import ExperimentKind
from localdet.scheduling.local_machine import LocalMachine
from localdet.scheduling.ray_cluster import RayCluster
from localdet.scheduling.slots import Slot, describe, detect_slots, write_slot_file
from localdet.search.driver import Search

__all__ = ["SCRIPT_GONE", "Daemon", "phase_of"]


@dataclass
class Daemon:
    # Exits (or launches) recorded in one transaction at most: fewer commits and turns at
    # the write lock, without holding it from the trials' reports for a whole pass.
    BATCH = 16

    layout: Layout
    slots: int = 1             # CPU slots, when the machine has no GPU
    poll_seconds: float = 0.25
    log: Callable[[str], None] = print
    only: int | None = None  # drive this one experiment (`localdet run`), nothing else
    trial_memory_fraction: float | None = None  # trials' memory limit with no max_memory
    max_log_bytes: int = capped_log.DEFAULT_MAX_BYTES  # each trial log's cap
    reserve: disk_space.Reserve = field(default_factory=disk_space.Reserve)  # free space kept
    warm: int | None = None  # warm trial processes; None: one per spare core (at most 2)
    allow_system_hooks: bool = False  # run startup hooks' apt-get, yum, conda install, sudo
    ray: str | None = None   # a Ray cluster's address ("auto"): its slots, trials run there
    cluster: Any = None      # or the cluster itself (RayCluster's methods): a simulated one
    # Where trials run, behind one interface (localdet/scheduling/local_machine.py): this
    # machine, or the cluster.
    backend: Any = None
    report: str = "sqlite"   # how trials report: "sqlite" (straight in), "http" (report server)
    report_port: int | None = None  # the report server's port; None: the remembered one
    report_url: str | None = None   # set while the report server runs
    backup_minutes: float = 30      # a copy of the database this often (and at start)
    dashboard: str | None = None    # the dashboard's address, when served beside it (--web)
    system_metrics_period: float = 5.0  # seconds between a trial's system metrics; 0: none
    watched: Watched = field(default_factory=Watched, init=False)  # the trials' processes
    _stop: threading.Event = field(default_factory=threading.Event)
    _wake: threading.Event = field(default_factory=threading.Event)
    # `localdet daemon stop`: launch nothing, hold the running trials, exit once they have.
    _draining: threading.Event = field(default_factory=threading.Event)
    _held: set[int] | None = field(default=None, init=False)  # the trials drained
    _waiters: Waiters = field(init=False)  # made with the daemon: they wake its loop (_wake)

    def __post_init__(self) -> None:
        self._waiters = Waiters(self._wake)

    def open(self, db: StateDB | None = None) -> "Daemon":
        """Find the machine's slots and connect to the state (`run` does this itself;
        `localdet run` calls it)."""
        # Trials start on this machine, or in actors on a Ray cluster
        # (localdet/scheduling/ray_cluster.py).
        if self.cluster is None and self.ray:
            self.cluster = RayCluster.connect(self.ray, self.layout)
        machine: list[Slot] = self.cluster.slots() if self.cluster else \
            detect_slots(self.slots)
        self.db = db or StateDB.open(self.layout.db)
        # Every pass reads the live trials' rows and index pages: keep them in memory (the
        # default 2 MB cache is a few thousand pages of an experiment's tens of MB).
        self.db.db.execute("PRAGMA cache_size = -65536")
        self.intake = Intake(self.layout, self.db, slots=machine)
        self.search = Search(self.db, self.log)
        self.memory = memory_limit.Guard(self.layout, self.trial_memory_fraction, self.log)
        size, beside_trials, self.warm_reason = self._warm_size(machine)
        self.pool = WarmPool(self.layout, size, self.log, beside_trials)
        self.backend = self.cluster or LocalMachine(machine, self.pool,
                                                    idle=lambda: not self.watched.ids())
        self.local = isinstance(self.backend, LocalMachine)  # pids here: watched, adopted
        self._wire(machine)
        self.system_metrics = SystemMetrics(self.system_metrics_period, machine, self.log,
                                            local=self.local)
        self.scheduler.usable_slots()  # the intake learns the largest node before any submission
        return self

    def _wire(self, machine: list[Slot]) -> None:
        """Make the parts of a pass, each with what it needs."""
        db, log, watched, layout = self.db, self.log, self.watched, self.layout
        self.scripts = ScriptWatch(db, log)
        self.space = SpaceWatch(layout, db, self.reserve, watched, log)
        self.retention = Retention(layout, db, log)
        self.experiments = Experiments(db, self.search, watched, mine=self._mine, log=log)
        self.exits = Exits(
            layout, db, self.search, self.memory, self.backend, watched,
            experiments=self.experiments, space=self.space, retention=self.retention, log=log,
            batch=self.BATCH)
        self.launches = Launches(
            layout, db, self.search, self.memory, self.pool, self.backend, local=self.local,
            watched=watched, experiments=self.experiments, exits=self.exits,
            waiters=self._waiters, mine=self._mine, log=log, batch=self.BATCH,
            max_log_bytes=self.max_log_bytes, reserve=self.reserve, report_url=self.report_url,
            allow_system_hooks=self.allow_system_hooks)
        self.scheduler = Scheduler(
            db, self.backend, local=self.local, machine=machine, intake=self.intake,
            watched=watched, experiments=self.experiments, space=self.space,
            launches=self.launches, only=self.only, mine=self._mine)
        self.requests = Requests(
            layout, db, self.search, watched, experiments=self.experiments,
            launches=self.launches, retention=self.retention, only=self.only, mine=self._mine,
            log=log)

    @property
    def machine(self) -> list[Slot]:
        """The slots trials run on (a cluster's, as of the last pass)."""
        return self.scheduler.machine

    def _warm_size(self, machine: list[Slot]) -> tuple[int, bool, str]:
        """How many warm trial processes to keep, whether one may start (import TensorFlow)
        beside running trials, and why. On CPU slots that start-up takes a core: with none
        spare, one warm process, started only while no trial runs (for the launch at hand,
        which would import TensorFlow itself otherwise, or the next), and no trial started
        ahead of its slot."""
        if self.cluster is not None:
            return 0, True, "trials run on the Ray cluster"
        if self.warm is not None:
            return self.warm, True, "--warm" if self.warm else "off (--warm 0)"
        if any(slot.kind == "gpu" for slot in machine):
            return 1, True, "they use no GPU until given a trial"
        spare = (os.cpu_count() or 1) - len(machine)
        if spare <= 0:
            return 1, False, (f"no spare core ({os.cpu_count()} cores, {len(machine)} "
                              "slots): started only while no trial runs; --warm N to start "
                              "them beside trials too")
        return min(spare, 2), True, f"{spare} spare core(s) beside {len(machine)} slot(s)"

    def _keep_warm_at_start(self) -> None:
        """The warm process kept before the first submission: of the kind the last trial
        launched here wanted (a returning user's next experiment is most likely like their
        last: its Keras line, its environment variables; a restart's adopted and queued
        trials are), started at once (with no spare core, once no trial runs); else of the
        line most trials run under (a trial class's, keras_choice.default), which an
        experiment of them that sets no environment variables wants, started once nothing
        has come for a moment (an experiment submitted with the start brings its own kind)."""
        last = self.db.last_event(["trial_launched"])
        if last is not None and last["trial_id"] is not None:
            try:
                trial = self.db.trial(last["trial_id"])
                spec = launcher.launch_spec(
                    self.layout, self.db.experiment(trial.experiment_id), trial, [0],
                    reserve=self.reserve, report_url=self.report_url, report_local=self.local)
                if self.pool.beside_trials:
                    self.pool.keep_for(kind_of(spec))
                else:  # not beside the trials it adopted: once none runs
                    self.pool.keep_at_start(kind_of(spec), after=0)
                return
            except Exception:  # its records or model folder gone: any guess serves
                pass
        self.pool.keep_at_start(environment_kind(launcher.experiment_environment(
            self.layout, {}, keras_choice.default()[0], self.reserve)))

    def run(self) -> None:
        # Before the lock: `localdet daemon stop` signals whoever holds it (SIGUSR1's
        # default would end the daemon at once).
        signal.signal(service.DRAIN_SIGNAL, lambda *_: self.drain())
        self.layout.ensure()
        lock = DaemonLock(self.layout.daemon_lock)
        lock.acquire()
        self._keep_log()
        try:
            records_copies.check_at_start(self.layout.db)  # DamagedDatabase: refused
            # The daemon alone migrates older records (after a backup), under its lock.
            StateDB.open(self.layout.db, migrate=True).close()
        except BaseException:
            lock.release()
            raise
        self.open()
        copies = records_copies.Schedule(self.layout.db, self.backup_minutes * 60, self.log)
        # watchdog re-adds its inotify watch when a folder is moved within the queue (every
        # submission is), and warns each time; nothing is lost, so the warning is noise.
        warnings.filterwarnings("ignore", "Callback with id", RuntimeWarning)
        observer = Observer()
        observer.schedule(QueueChanged(self._wake), str(self.layout.queue), recursive=True)
        observer.start()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop())
        reporting = None
        try:
            # Trials on a cluster report over HTTP: they cannot reach the SQLite file.
            if self.report == "http" or not self.local:
                # Before adopting: adopted trials report to it at once. In a process of
                # its own: this loop keeps its core (localdet/reporting/report_process.py).
                from localdet.reporting.report_process import start_report_server

                host = self.backend.report_host()
                reporting = start_report_server(self.layout, host, self.report_port,
                                                self.reserve, self.log, on_failure=self.stop)
                # Our write transactions and the report writer's alternate, instead of each
                # sleeping in SQLite's busy handler while the other holds the lock.
                self.db.turns = reporting.turns
                self.report_url = self.launches.report_url = reporting.url
                self.log(f"trials report over HTTP to {reporting.url}")
            write_slot_file(self.layout.slot_file, self.machine)  # `localdet submit` checks it
            self.db.log_event("daemon_started", pid=os.getpid(), slots=len(self.machine),
                              devices=[slot.name for slot in self.machine])
            self.intake.recover()
            self.launches.adopt_running_trials()
            self.log(self.scheduler.slot_table())
            self.log(f"warm trial processes: {self.pool.size} ({self.warm_reason})")
            self._keep_warm_at_start()
            self.log(f"localdet daemon (pid {os.getpid()}) on {self.layout.home}: "
                     f"{describe(self.machine)}, watching {self.layout.queue}")
            service.record_start(self.layout, slots=len(self.machine),
                                 slot_description=describe(self.machine),
                                 dashboard=self.dashboard)
            while not self._stop.is_set():
                try:
                    self.step()
                    copies.maybe(self.db.db.conn)
                except Exception:  # a bug must not take the other experiments down
                    self.log("localdet daemon: unexpected error, carrying on:\n"
                             + traceback.format_exc())
                self._wake.wait(self.poll_seconds)
                self._wake.clear()
        finally:
            # A launch whose work is all recorded and that is only tearing down is ended: on
            # a cluster its detached actor would otherwise hold its slots after it exits,
            # with no daemon left to let it go (no next daemon adopts a finished trial).
            for process in self.watched.tearing_down.values():
                if hasattr(process, "end"):
                    process.end()
            self.launches.ahead.end()
            self.system_metrics.close()
            self.pool.close()
            self.backend.close()
            if reporting is not None:
                reporting.close()
            observer.stop()
            observer.join()
            self.db.log_event("daemon_stopped", pid=os.getpid())
            self.db.close()
            service.record_stop(self.layout)
            lock.release()

    def _keep_log(self) -> None:
        """Say everything also in `$LOCALDET_HOME/daemon.log`, capped as trial logs are."""
        kept = capped_log.CappedLog(self.layout.daemon_log, self.max_log_bytes,
                                    wait_seconds=0)  # the daemon lock makes it the only writer
        shown = self.log

        def log(message: str) -> None:
            shown(message)
            kept.write(f"{now()} {message}\n".encode())

        self.log = log

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def drain(self) -> None:
        """Stop once the running trials have checkpointed and exited (each is queued again
        for the next daemon); launch nothing meanwhile. Jobs, which cannot checkpoint, are
        left running for the next daemon to adopt."""
        self._draining.set()
        self._wake.set()

    def _drain_pass(self) -> None:
        """One pass of draining, in place of scheduling: hold what runs, stop when none
        is left."""
        if self._held is None:
            self._held = set()
            with self.db.atomic():
                for trial_id in sorted(self.watched.ids()):
                    trial = self.db.trial(trial_id)
                    if self.db.experiment(trial.experiment_id).kind == ExperimentKind.JOB:
                        continue
                    self._held.add(trial_id)
                    held = lifecycle.hold(phase_of(trial))
                    if held != phase_of(trial):
                        self.db.update_trial(trial_id, stop_requested=held.stop)
            self.db.log_event("daemon_stopping", pid=os.getpid(), trials=sorted(self._held))
            self.log(f"stopping: {len(self._held)} running trial(s) checkpoint at their next "
                     "boundary and are queued again; nothing new is launched")
        left = self._held & self.watched.ids()
        if not left:
            self.log("stopping: no trial left running; exiting")
            self.stop()

    def step(self) -> None:
        """One pass of the data flow: queue, searcher, scheduler, launcher, exits."""
        if self.only is None:
            for experiment_id in self.intake.poll():
                self.log(f"{self.db.experiment(experiment_id).kind} {experiment_id} accepted")
            self.scripts.watch()
        self.requests.handle()
        self.space.watch()
        self.experiments.start_searches()
        try:
            self.exits.reap()
        finally:
            self.retention.collect_exited()
        if self._draining.is_set():
            self.launches.ahead.end()
            self._drain_pass()
        else:
            self.launches.ahead.drop_stale(self.db)
            self.scheduler.schedule()
        if not self.watched.processes and not self.watched.adopted:
            self.pool.keep_when_idle()
        self.system_metrics.note(self.db, self.watched)  # samples taken in its own thread

    def _mine(self, experiment: Experiment) -> bool:
        if self.only is not None:
            return experiment.id == self.only
        return experiment.managed

    def running(self) -> set[int]:
        """The trials whose processes this daemon is watching."""
        return self.watched.ids()

    @property
    def _processes(self) -> dict:
        """Trial id -> the process this daemon launched (`localdet run` kills them on a bug)."""
        return self.watched.processes
