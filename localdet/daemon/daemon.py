"""The daemon: watches the queue, runs searchers, schedules and launches trials, and
notices when they end. The only writer of scheduling state.

    Daemon(Layout.from_environment(), slots=2).run()

Trial processes run in sessions of their own, so stopping the daemon leaves them training;
a daemon started later adopts them.

It manages only experiments (and jobs) whose runner is 'daemon'. `localdet run` drives the
same machinery for one experiment of its own (`Daemon(layout, only=id)`, calling `step()`);
'script' experiments record themselves and are only watched for a dead process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import queue
import signal
import subprocess
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from watchdog.events import FileSystemEventHandler
from watchdog.observers import Observer

from localdet.checkpoints import disk_space, gc
from localdet.config import engines, keras_choice
from localdet.config.typed import CheckpointStorage, ExperimentConfig, Resources
from localdet.daemon.submissions import Intake
from localdet.paths import Layout
from localdet.pids import DaemonLock, alive, exit_description, process_start
from localdet.processes import capped_log, failures, launcher, memory_limit
from localdet.processes.warm_pool import WarmPool, environment_kind
from localdet.records import backups as records_copies
from localdet.records import lifecycle
from localdet.records.db import Experiment, NotFound, StateDB, Trial, now
from localdet.records.states import (
    TERMINAL_STATES,
    ExperimentKind,
    ExperimentState,
    Runner,
    TrialState,
)
from localdet.scheduling import placement
from localdet.scheduling.local_machine import LocalMachine
from localdet.scheduling.ray_cluster import RayCluster
from localdet.scheduling.slots import (
    Slot,
    cuda_visible_devices,
    describe,
    detect_slots,
    slot_table,
    write_slot_file,
)
from localdet.search.driver import Search, SearchError

SCRIPT_GONE = "the script ended without finishing its run (was it killed?)"


def phase_of(trial: Trial) -> lifecycle.TrialPhase:
    return lifecycle.TrialPhase(trial.state, trial.stop_requested)


class _Wake(FileSystemEventHandler):
    def __init__(self, event: threading.Event):
        self.event = event

    def on_any_event(self, event) -> None:
        self.event.set()


class _Waiters:
    """Threads that each wait for a launched trial's process to end and then wake the
    loop. A thread whose trial ended takes the next launch's: starting a thread for each
    launch made the loop wait for the new thread to run (a GIL hand-over) every time."""

    def __init__(self, wake: threading.Event):
        self.wake = wake
        self._launches: queue.SimpleQueue = queue.SimpleQueue()
        self._idle = 0
        self._lock = threading.Lock()

    def watch(self, process) -> None:
        with self._lock:
            start = self._idle == 0
            if not start:
                self._idle -= 1
        self._launches.put(process)
        if start:
            threading.Thread(target=self._wait, daemon=True, name="wait-trials").start()

    def _wait(self) -> None:
        while True:
            process = self._launches.get()
            try:
                process.wait()
            except Exception:  # its end is found by the loop's poll all the same
                pass
            self.wake.set()
            with self._lock:
                self._idle += 1


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
    ray: str | None = None   # a Ray cluster's address ("auto"): its slots, trials run there
    cluster: Any = None      # or the cluster itself (RayCluster's methods): a simulated one
    # Where trials run, behind one interface (localdet/scheduling/local_machine.py): this
    # machine, or the cluster.
    backend: Any = None
    report: str = "sqlite"   # how trials report: "sqlite" (straight in), "http" (report server)
    report_port: int | None = None  # the report server's port; None: the remembered one
    report_url: str | None = None   # set while the report server runs
    backup_minutes: float = 30      # a copy of the database this often (and at start)
    _processes: dict = field(default_factory=dict)     # trial id -> Popen (ours)
    _adopted: dict = field(default_factory=dict)       # trial id -> pid (a former daemon's)
    _tearing_down: dict = field(default_factory=dict)  # trial id -> Popen, its work recorded
    _slots_of: dict = field(default_factory=dict)      # trial id -> slots
    _to_collect: dict = field(default_factory=dict)    # experiment id -> trials exited: retain
    _to_sweep: set = field(default_factory=set)        # experiments due a whole collection
    _collect_due: dict = field(default_factory=dict)   # experiment id -> next whole one from
    _keeps_best: dict = field(default_factory=dict)    # experiment id -> save_experiment_best
    _spanning: dict = field(default_factory=dict)      # experiment id -> ranks may span nodes
    _resources: dict = field(default_factory=dict)  # experiment id -> (section, typed)
    _short: disk_space.Shortage | None = None  # launches held until space returns
    _space_extra: int = 0  # after a trial ran out of space: room for its checkpoint too
    _stop: threading.Event = field(default_factory=threading.Event)
    _wake: threading.Event = field(default_factory=threading.Event)
    _waiters: _Waiters = field(init=False)  # made with the daemon: they wake its loop (_wake)

    def __post_init__(self) -> None:
        self._waiters = _Waiters(self._wake)

    def open(self, db: StateDB | None = None) -> "Daemon":
        """Find the machine's slots and connect to the state (`run` does this itself;
        `localdet run` calls it)."""
        # Trials start on this machine, or in actors on a Ray cluster
        # (localdet/scheduling/ray_cluster.py).
        if self.cluster is None and self.ray:
            self.cluster = RayCluster.connect(self.ray, self.layout)
        self.machine: list[Slot] = self.cluster.slots() if self.cluster else \
            detect_slots(self.slots)
        self.db = db or StateDB.open(self.layout.db)
        # Every pass reads the live trials' rows and index pages: keep them in memory (the
        # default 2 MB cache is a few thousand pages of an experiment's tens of MB).
        self.db.db.execute("PRAGMA cache_size = -65536")
        self.intake = Intake(self.layout, self.db, slots=self.machine)
        self.search = Search(self.db, self.log)
        self.memory = memory_limit.Guard(self.layout, self.trial_memory_fraction, self.log)
        size, self.warm_reason = self._warm_size()
        self.pool = WarmPool(self.layout, size, self.log)
        self.backend = self.cluster or LocalMachine(self.machine, self.pool)
        self.local = isinstance(self.backend, LocalMachine)  # pids here: watched, adopted
        self._usable_slots()  # the intake learns the largest node before any submission
        return self

    def _warm_size(self) -> tuple[int, str]:
        """How many warm trial processes to keep, and why. On CPU slots a warm process's
        start-up (importing TensorFlow) takes a core: only spare cores get one."""
        if self.cluster is not None:
            return 0, "trials run on the Ray cluster"
        if self.warm is not None:
            return self.warm, "--warm" if self.warm else "off (--warm 0)"
        if any(slot.kind == "gpu" for slot in self.machine):
            return 1, "they use no GPU until given a trial"
        spare = (os.cpu_count() or 1) - len(self.machine)
        if spare <= 0:
            return 0, (f"no spare core ({os.cpu_count()} cores, {len(self.machine)} slots); "
                       "--warm N to keep some anyway")
        return min(spare, 2), f"{spare} spare core(s) beside {len(self.machine)} slot(s)"

    def run(self) -> None:
        self.layout.ensure()
        lock = DaemonLock(self.layout.daemon_lock)
        lock.acquire()
        self._keep_log()
        try:
            records_copies.check_at_start(self.layout.db)  # DamagedDatabase: refused
        except BaseException:
            lock.release()
            raise
        self.open()
        copies = records_copies.Schedule(self.layout.db, self.backup_minutes * 60, self.log)
        # watchdog re-adds its inotify watch when a folder is moved within the queue (every
        # submission is), and warns each time; nothing is lost, so the warning is noise.
        warnings.filterwarnings("ignore", "Callback with id", RuntimeWarning)
        observer = Observer()
        observer.schedule(_Wake(self._wake), str(self.layout.queue), recursive=True)
        observer.start()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop())
        reporting = None
        try:
            # Trials on a cluster report over HTTP: they cannot reach the SQLite file.
            if self.report == "http" or not self.local:
                # Before adopting: adopted trials report to it at once.
                from localdet.reporting.report_server import ReportServer

                host = self.backend.report_host()
                reporting = ReportServer(self.layout, host, self.report_port,
                                         self.reserve, self.log).start()
                # Our write transactions and the report writer's alternate, instead of each
                # sleeping in SQLite's busy handler while the other holds the lock.
                if reporting.writer is None:  # start() makes it
                    raise RuntimeError("the report server started without its writer")
                self.db.turns = reporting.writer.turns
                self.report_url = reporting.url
                self.log(f"trials report over HTTP to {reporting.url}")
            write_slot_file(self.layout.slot_file, self.machine)  # `localdet submit` checks it
            self.db.log_event("daemon_started", pid=os.getpid(), slots=len(self.machine),
                              devices=[slot.name for slot in self.machine])
            self.intake.recover()
            self._adopt_running_trials()
            self.log(self._slot_table())
            self.log(f"warm trial processes: {self.pool.size} ({self.warm_reason})")
            # Ready before the first submission, of the line most trials run under (a trial
            # class's, keras_choice.default): an experiment of them that sets no environment
            # variables has its first trial warm too.
            self.pool.keep_for(environment_kind(launcher.experiment_environment(
                self.layout, {}, keras_choice.default()[0], self.reserve)))
            self.log(f"localdet daemon (pid {os.getpid()}) on {self.layout.home}: "
                     f"{describe(self.machine)}, watching {self.layout.queue}")
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
            for process in self._tearing_down.values():
                if hasattr(process, "end"):
                    process.end()
            self.pool.close()
            self.backend.close()
            if reporting is not None:
                reporting.close()
            observer.stop()
            observer.join()
            self.db.log_event("daemon_stopped", pid=os.getpid())
            self.db.close()
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

    def step(self) -> None:
        """One pass of the data flow: queue, searcher, scheduler, launcher, exits."""
        if self.only is None:
            for experiment_id in self.intake.poll():
                self.log(f"{self.db.experiment(experiment_id).kind} {experiment_id} accepted")
            self._watch_scripts()
        self._handle_requests()
        self._watch_space()
        self._search()
        self._reap()
        self._schedule()

    def _mine(self, experiment: Experiment) -> bool:
        if self.only is not None:
            return experiment.id == self.only
        return experiment.managed

    def running(self) -> set[int]:
        """The trials whose processes this daemon is watching."""
        return set(self._processes) | set(self._adopted)

    # -- free space ---------------------------------------------------------------------
    def _watch_space(self) -> None:
        """Below the reserve where state and checkpoints are written: launch nothing, and
        hold running trials (they checkpoint if they can, exit, and wait queued); resume
        on our own once space returns."""
        shortage = self.reserve.shortage([self.layout.home, self.layout.store],
                                         extra=self._space_extra)
        if shortage is not None and self._short is None:
            self.db.log_event("disk_low", path=str(shortage.path), free=shortage.free,
                              needed=shortage.needed)
            self.log(f"{shortage.describe()}: launching nothing, and running trials stop at "
                     "their next boundary, until space returns")
            with self.db.atomic():
                for trial_id in self.running():
                    trial = self.db.trial(trial_id)
                    held = lifecycle.hold(phase_of(trial))
                    if held != phase_of(trial):
                        self.db.update_trial(trial_id, stop_requested=held.stop)
        elif shortage is None and self._short is not None:
            self.db.log_event("disk_ok")
            self.log("free space is back above the reserve: launching again")
            self._space_extra = 0
        self._short = shortage

    def _out_of_space(self, trial: Trial, experiment: Experiment, restart_to: str) -> None:
        """A trial stopped because the disk filled: not its failure. It waits (restarts
        untouched) and carries on from its latest checkpoint once there is room for another."""
        latest = self.db.checkpoint(trial.latest_checkpoint) if trial.latest_checkpoint \
            else None
        self._space_extra = max(self._space_extra, 2 * (latest.size_bytes if latest else 0))
        self.db.update_trial(trial.id, state=restart_to, stop_requested=None)
        self.db.log_event("trial_out_of_space", experiment_id=experiment.id, trial_id=trial.id)
        self.log(f"trial {trial.id} stopped: the disk is full; it carries on from its latest "
                 "checkpoint once space returns")

    # -- searcher -----------------------------------------------------------------------
    def _search(self) -> None:
        for experiment in self.db.experiments(states=(ExperimentState.ACTIVE,)):
            # A job's one trial is made with it; it has no searcher.
            if not self._mine(experiment) or experiment.kind == ExperimentKind.JOB:
                continue
            if not self.search.started(experiment):
                self._searching(experiment, self.search.start, experiment)
            elif experiment.searcher == "custom" and self.search.shut_down(experiment.id):
                # Its runner posted Shutdown from another process: end it once its trials are.
                self._settle_experiment(experiment.id)

    def _searching(self, experiment: Experiment, action, *args) -> None:
        """Tell the search something; a searcher that fails ends its experiment, not us."""
        try:
            action(*args)
        except SearchError as error:
            for trial in self.db.trials(experiment.id):
                if trial.state not in TERMINAL_STATES:
                    self._kill(trial)
            self.db.set_experiment_state(experiment.id, ExperimentState.ERROR, error=str(error))
            self.log(f"experiment {experiment.id}: {error}")

    # -- pause, resume, kill ------------------------------------------------------------
    def _handle_requests(self) -> None:
        for request in self.db.pending_requests():
            try:
                experiment = self._experiment_of(request)
            except NotFound as error:
                self.db.mark_request_handled(request["id"], str(error))
                continue
            if not self._mine(experiment):
                if self.only is not None or not self._take(experiment, request):
                    continue
                experiment = self.db.experiment(experiment.id)  # taking over may settle it
            outcome = self._carry_out(request, experiment)
            self.db.mark_request_handled(request["id"], outcome)
            self.log(outcome)

    def _experiment_of(self, request: dict) -> Experiment:
        if request["trial_id"] is not None:
            return self.db.experiment(self.db.trial(request["trial_id"]).experiment_id)
        return self.db.experiment(request["experiment_id"])

    def _take(self, experiment: Experiment, request: dict) -> bool:
        """Whether the daemon acts on a request for an experiment it does not run."""
        if experiment.runner == Runner.SCRIPT:
            self.db.mark_request_handled(request["id"], (
                f"experiment {experiment.id} is a script running outside the daemon; "
                "ignored"))
            return False
        if DaemonLock.holder(self.layout.run_lock(experiment.id)) is not None:
            return False  # its `localdet run` is alive and carries the request out
        # `localdet run` ended (paused, interrupted or killed): the daemon takes over.
        self.db.set_runner(experiment.id, Runner.DAEMON)
        self.log(f"experiment {experiment.id} handed over from `localdet run` to the daemon")
        self._adopt_running_trials(experiment.id)
        return True

    def _carry_out(self, request: dict, experiment: Experiment) -> str:
        """Apply a request through the lifecycle, reading and writing each trial in one
        write transaction: a trial acknowledging a pause meanwhile waits for it to end."""
        action, whole_experiment = request["action"], request["trial_id"] is None
        target = (f"{experiment.kind} {experiment.id}" if whole_experiment
                  else f"trial {request['trial_id']}")
        if experiment.kind == ExperimentKind.JOB and action in ("pause", "resume"):
            return f"{action} job {experiment.id}: jobs cannot be paused or resumed"
        with self.db.atomic():
            experiment = self.db.experiment(experiment.id)
            trials = (self.db.trials(experiment.id) if whole_experiment
                      else [self.db.trial(request["trial_id"])])
            live = [t for t in trials if t.state not in TERMINAL_STATES]
            state = lifecycle.experiment_after(action, experiment.state, whole_experiment)
            if state != experiment.state:
                self.db.set_experiment_state(experiment.id, state)
            for trial in live:
                before = phase_of(trial)
                outcome = lifecycle.on_request(action, before)
                if outcome.kill_process:
                    self._end_process(trial.id)
                if outcome.phase != before:
                    self.db.update_trial(trial.id, state=outcome.phase.state,
                                         stop_requested=outcome.phase.stop)
                if action == "kill" and not whole_experiment:  # the search goes on without it
                    self._searching(experiment, self.search.exited_early,
                                    self.db.experiment(experiment.id), trial)
            self._settle_experiment(experiment.id)
        if action == "kill":
            self._collect(experiment.id)
        return f"{action} {target}: {len(live)} live trial(s)"

    def _kill(self, trial: Trial) -> None:
        self._end_process(trial.id)
        self.db.update_trial(trial.id, state=TrialState.CANCELED, stop_requested=None)

    def _end_process(self, trial_id: int) -> None:
        """Kill the trial's process group, if one runs, and free its slots."""
        process = self._processes.pop(trial_id, None)
        if hasattr(process, "end"):  # a launch on a cluster
            process.end()
            self._slots_of.pop(trial_id, None)
            return
        pid = process.pid if process else self._adopted.pop(trial_id, None)
        if pid:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                # Not (yet) a group leader: waiting for it to end by itself would hold the
                # caller's write transaction, and every trial's reports, until it did.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if process:
                process.wait()
        self._slots_of.pop(trial_id, None)

    # -- scheduler and launcher -----------------------------------------------------------
    def _slot_table(self) -> str:
        busy = {}
        for trial_id, slots in self._slots_of.items():
            trial = self.db.trial(trial_id)
            busy.update({slot: f"trial {trial_id} (experiment {trial.experiment_id})"
                         for slot in slots})
        console = Console(record=True, width=100, file=io.StringIO())
        console.print(slot_table(self.machine, busy))
        return console.export_text().rstrip()

    def _schedule(self) -> None:
        if self._short is not None:
            return  # held until free space returns (_watch_space)
        busy_slots = {slot for slots in self._slots_of.values() for slot in slots}
        usable, node_of, most = self._usable_slots()
        free = [slot.index for slot in self.machine
                if slot.index not in busy_slots and slot.index in usable]
        if not free:
            return
        waiting: list[placement.Waiting] = []
        busy: dict[int, int] = {}            # experiment id -> slots its trials hold
        max_slots: dict[int, int | None] = {}  # experiment id -> resources.max_slots
        # One query for the running trials' experiments, not one read per trial a pass.
        experiment_of = self._experiments_of(list(self._slots_of))
        for trial_id, slots in self._slots_of.items():
            experiment_id = experiment_of[trial_id]
            busy[experiment_id] = busy.get(experiment_id, 0) + len(slots)
        for experiment in self.db.experiments(states=(ExperimentState.ACTIVE,)):
            if not self._mine(experiment):
                continue
            resources = self._resources_of(experiment)
            per_trial = resources.slots_per_trial
            max_slots[experiment.id] = resources.max_slots
            spans = per_trial > 1 and self._spans_nodes(experiment)
            for trial in self._queued(experiment.id):
                if per_trial > (len(self.machine) if spans else most):
                    # would wait forever and block the queue
                    key = "slots" if experiment.kind == ExperimentKind.JOB else "slots_per_trial"
                    where = (f"`localdet run --slots {per_trial}`" if self.only is not None
                             else f"`localdet daemon --slots {per_trial}`")
                    error = (f"resources.{key} is {per_trial} but only {most} slot(s) are "
                             f"available; lower it or start {where}")
                    if not self.local and spans:
                        error = (f"resources.{key} is {per_trial} but the Ray cluster has "
                                 f"{len(self.machine)} slot(s); lower it or add nodes")
                    elif not self.local:
                        error = (f"resources.{key} is {per_trial} but no node of the Ray "
                                 f"cluster has more than {most} slot(s), and a trial runs "
                                 "within one node; lower it or add a bigger node")
                    self.db.update_trial(trial.id, state=TrialState.ERROR, error=error)
                    self._settle_experiment(experiment.id)
                    continue
                waiting.append(placement.Waiting(trial.id, experiment.id, per_trial,
                                                 resources.priority, trial.id, spans))
        started: list[tuple] = []
        try:
            for trial_id, slots in placement.assign(waiting, free, busy, max_slots, node_of):
                launch = self._launch(self.db.trial(trial_id), slots)
                if launch is not None:
                    started.append(launch)
        finally:  # what started is recorded, even when a later launch raised
            self._record_launches(started)

    def _resources_of(self, experiment: Experiment) -> Resources:
        """The experiment's typed `resources`, built once per version of the section: every
        scheduling pass asks for each active experiment's, and `det e set priority` or
        `max-slots` changes the recorded config (localdet/operations/experiments.py)."""
        section = experiment.config["resources"]
        cached = self._resources.get(experiment.id)
        if cached is None or cached[0] != section:
            cached = self._resources[experiment.id] = (
                section, ExperimentConfig.from_dict(experiment.config).resources)
        return cached[1]

    def _spans_nodes(self, experiment: Experiment) -> bool:
        """Whether the experiment's trials may have their ranks on several nodes of the
        cluster (decided once per experiment: it reads the model folder)."""
        if self.local or experiment.kind == ExperimentKind.JOB:
            return False
        if experiment.id not in self._spanning:
            try:
                engine = engines.choose(experiment.config, Path(experiment.model_dir))[0]
            except engines.EngineRefusal:
                engine = engines.SINGLE  # the launch says why
            self._spanning[experiment.id] = engines.spans_nodes(engine)
        return self._spanning[experiment.id]

    def _experiments_of(self, trial_ids: list[int]) -> dict[int, int]:
        if not trial_ids:
            return {}
        marks = ", ".join("?" for _ in trial_ids)
        return dict(self.db.db.execute(
            f"SELECT id, experiment_id FROM trials WHERE id IN ({marks})", trial_ids))

    def _queued(self, experiment_id: int) -> list[Trial]:
        """Its QUEUED trials, filtered in SQL: every pass reads them, and an experiment may
        have thousands of trials that are not."""
        return [Trial.from_row(row) for row in self.db.db["trials"].rows_where(
            "experiment_id = ? AND state = ?", [experiment_id, TrialState.QUEUED],
            order_by="id")]

    def _usable_slots(self) -> tuple[set[int], dict[int, tuple], int]:
        """The slots trials may start on now, which machine each is on, and the most slots
        a trial within one machine can have."""
        self.machine = self.backend.slots()  # a cluster's nodes come and go
        usable = self.backend.available()
        # Keyed (last launch there, node): trials spread, the least recently used node first.
        node_of = {index: self.backend.node_key(index) for index in usable}
        per_node: dict = {}
        for node in node_of.values():
            per_node[node] = per_node.get(node, 0) + 1
        # A node that is gone for now may come back: its trials wait rather than fail.
        most = max([*per_node.values(), *self.backend.largest_node_seen()])
        if not self.local:
            self.intake.node_slots = most  # submissions are checked against it
        return usable, node_of, most

    def _launch(self, trial: Trial, slots: list[int]) -> tuple | None:
        """Start the trial's process; None if it cannot start (the trial is then ERROR).
        Its launch is recorded by `_record_launches`, with the pass's others."""
        experiment = self.db.experiment(trial.experiment_id)
        try:
            spec = launcher.launch_spec(
                self.layout, experiment, trial, slots,
                visible_devices=cuda_visible_devices([self.machine[i] for i in slots]),
                max_log_bytes=self.max_log_bytes, reserve=self.reserve,
                report_url=self.report_url, report_local=self.local)
            log_offset = launcher.log_size(spec.log_path)  # this launch's part begins here
            launched_at = now()
            process = self.backend.start(
                spec, dataclasses.replace(trial, started_at=launched_at), slots)
        except launcher.LaunchError as error:  # retrying cannot help: end it
            with self.db.atomic():
                self.db.update_trial(trial.id, state=TrialState.ERROR, error=str(error))
                self.log(f"trial {trial.id} of experiment {trial.experiment_id}: {error}")
                self._searching(experiment, self.search.exited_early, experiment, trial)
                self._settle_experiment(experiment.id)
            return None
        if self.local:  # (on a cluster, its node's memory is Ray's to watch)
            self.memory.watch(trial, process.pid, experiment.config)  # at once: before it grows
        self._processes[trial.id] = process
        self._slots_of[trial.id] = slots
        return trial, slots, spec, process, launched_at, log_offset

    def _record_launches(self, started: list[tuple]) -> None:
        """Record the pass's launches `BATCH` to a transaction: a commit and a turn at the
        write lock (shared with the trials' reports) per batch, not one each. A trial's process
        waits for its launch to be recorded before it trains, so a daemon killed before this
        leaves none training unrecorded."""
        for start in range(0, len(started), self.BATCH):
            self._record_some_launches(started[start:start + self.BATCH])
        for trial, slots, spec, process, _, _ in started:
            # Wake the loop the moment it exits, so its slots pass on without a poll's delay.
            self._waiters.watch(process)
            where = f"on Ray node {process.host} " if not self.local else ""
            self.log(f"trial {trial.id} of experiment {trial.experiment_id} started {where}"
                     f"{'in a warm process ' if process.warm else ''}(pid {process.pid}, "
                     f"slots {slots})")
            self.pool.keep(spec)  # the next trial like it finds one ready

    def _record_some_launches(self, started: list[tuple]) -> None:
        with self.db.atomic():
            for trial, slots, spec, process, launched_at, log_offset in started:
                self.db.update_trial(trial.id, state=TrialState.RUNNING, pid=process.pid,
                                     started_at=launched_at,
                                     process_start=process_start(process.pid),
                                     slots=json.dumps(slots))
                self.db.log_event("trial_launched", experiment_id=trial.experiment_id,
                                  trial_id=trial.id, pid=process.pid, slots=slots,
                                  keras_line=spec.keras_line,
                                  keras_line_reason=spec.keras_line_reason, engine=spec.engine,
                                  log_offset=log_offset, warm=process.warm,
                                  **({"node": process.node, "host": process.host,
                                      "nodes": getattr(process, "nodes", [process.node]),
                                      "hosts": getattr(process, "hosts", [process.host])}
                                     if not self.local else {}))

    def _adopt_running_trials(self, experiment_id: int | None = None) -> None:
        """Watch the RUNNING trials a former daemon (or `localdet run`) left behind."""
        mine = {e.id for e in self.db.experiments() if self._mine(e)}
        for trial in self.db.trials(experiment_id, states=(TrialState.RUNNING,)):
            if trial.experiment_id not in mine and experiment_id is None:
                continue
            if not self.local:
                self._adopt_from_cluster(trial)
            elif (trial.pid and alive(trial.pid)
                    and trial.process_start in (None, process_start(trial.pid))):
                self._adopted[trial.id] = trial.pid
                self.memory.watch(trial, trial.pid, self.db.experiment(trial.experiment_id).config)
                self._slots_of[trial.id] = trial.slots or []
                self.log(f"adopted trial {trial.id} (pid {trial.pid})")
            else:
                self._finish(trial.id, returncode=None)

    def _adopt_from_cluster(self, trial: Trial) -> None:
        """Its actor, if it still runs in the cluster (named after the trial's launch)."""
        experiment = self.db.experiment(trial.experiment_id)
        handle = self.backend.adopt(trial, self.layout.trial_log(experiment.id, trial.id),
                                    self.max_log_bytes)
        if handle is None:
            self._finish(trial.id, returncode=None)
            return
        self._processes[trial.id] = handle
        self._slots_of[trial.id] = trial.slots or []
        self.log(f"adopted trial {trial.id} (Ray actor {handle.name})")

    # -- exits --------------------------------------------------------------------------
    def _reap(self) -> None:
        try:
            self._reap_exits()
        finally:
            self._collect_exited()

    def _collect_exited(self) -> None:
        """Retention for the trials that stopped this pass, before it launches anything: it
        reads only their checkpoints, trials and validations (a trial's own retention rules
        depend on nothing else), so a pass costs the same however many trials the
        experiment has finished. What that leaves to a whole collection of the experiment
        (the blobs of the checkpoints it deleted; an experiment that keeps its best
        checkpoints, `save_experiment_best`, which every exit can change; and the final
        collection once nothing is queued or running) waits after each whole collection
        nine times as long as that took, so that it takes at most a tenth of the loop
        however large the experiment; with nothing queued or running it runs at once."""
        for experiment_id, trial_ids in list(self._to_collect.items()):
            del self._to_collect[experiment_id]
            if self._keeps_experiment_best(experiment_id):
                self._to_sweep.add(experiment_id)
                continue
            report = self._collect(experiment_id, trial_ids)
            if report is None or report.deleted or not self._live(experiment_id):
                self._to_sweep.add(experiment_id)
        for experiment_id in list(self._to_sweep):
            if time.monotonic() < self._collect_due.get(experiment_id, 0.0) and \
                    self._live(experiment_id):
                continue
            self._to_sweep.discard(experiment_id)
            begun = time.monotonic()
            self._collect(experiment_id)
            self._collect_due[experiment_id] = time.monotonic() + 9 * (time.monotonic() - begun)

    def _live(self, experiment_id: int) -> bool:
        """Whether the experiment has a trial QUEUED or RUNNING (an index lookup)."""
        return self.db.db.execute(
            "SELECT 1 FROM trials WHERE experiment_id = ? AND state IN (?, ?) LIMIT 1",
            [experiment_id, TrialState.QUEUED, TrialState.RUNNING]).fetchone() is not None

    def _keeps_experiment_best(self, experiment_id: int) -> bool:
        if experiment_id not in self._keeps_best:
            self._keeps_best[experiment_id] = bool(CheckpointStorage.of(
                self.db.experiment(experiment_id).config).save_experiment_best)
        return self._keeps_best[experiment_id]

    def _reap_exits(self) -> None:
        trained = self._trained_to_length(list(self._processes))
        ended: list[tuple[int, int | None, Any, bool]] = []
        for trial_id, process in list(self._processes.items()):
            code = process.poll()
            if getattr(process, "orphaned", False):  # its warm process ended before it
                del self._processes[trial_id]
                self._adopted[trial_id] = process.pid
            elif code is not None:
                del self._processes[trial_id]
                ended.append((trial_id, code, process, False))
            elif trial_id in trained and self._work_done(trial_id):
                # Its final checkpoint and metrics are committed: the slot is free now, and
                # the process's teardown (seconds of TensorFlow's) goes on beside the next.
                del self._processes[trial_id]
                self._tearing_down[trial_id] = process
                ended.append((trial_id, 0, process, True))
        for trial_id, pid in list(self._adopted.items()):
            if not alive(pid):
                del self._adopted[trial_id]
                ended.append((trial_id, None, None, False))
        self._finish_all(ended)
        for trial_id, process in list(self._tearing_down.items()):
            code = process.poll()
            if code is not None:
                del self._tearing_down[trial_id]
                if code != 0:
                    self.log(f"trial {trial_id}'s process ended with {exit_description(code)} "
                             "after its work was recorded; nothing was lost")

    def _trained_to_length(self, trial_ids: list[int]) -> set[int]:
        """Those of the trials RUNNING, checkpointed and trained to their length, from one
        query a pass (the cheap part of _work_done, which read every running trial a pass)."""
        found: set[int] = set()
        for start in range(0, len(trial_ids), 500):
            chunk = trial_ids[start:start + 500]
            found.update(trial_id for (trial_id,) in self.db.db.execute(
                f"SELECT id FROM trials WHERE id IN ({', '.join('?' for _ in chunk)}) "
                "AND state = ? AND latest_checkpoint IS NOT NULL "
                "AND batches_trained >= target_batches", [*chunk, TrialState.RUNNING]))
        return found

    def _work_done(self, trial_id: int) -> bool:
        """Whether a trial class's process has committed all it will: trained to its length,
        checkpointed there and validated there. (A script may go on after `fit`, so only its
        exit tells.)"""
        trial = self.db.trial(trial_id)
        if trial.state != TrialState.RUNNING or not trial.latest_checkpoint \
                or trial.batches_trained < trial.target_batches:
            return False
        experiment = self.db.experiment(trial.experiment_id)
        if experiment.kind == ExperimentKind.JOB \
                or experiment.config.get("entrypoint_kind") != "trial_class":
            return False
        checkpoint = self.db.checkpoint(trial.latest_checkpoint)
        validations = self.db.metrics(trial_id, "validation")
        return (checkpoint.batches_trained >= trial.target_batches and bool(validations)
                and validations[-1].batches_trained >= trial.target_batches
                and experiment.metric in validations[-1].metrics)

    def _finish(self, trial_id: int, returncode: int | None,
                process: subprocess.Popen | None = None, tearing_down: bool = False) -> None:
        """A trial process ended (returncode None: not ours, so judge from its records)."""
        self._finish_all([(trial_id, returncode, process, tearing_down)])

    def _finish_all(self, ended: list[tuple[int, int | None, Any, bool]]) -> None:
        """Record the ends of these trials' processes ((trial id, returncode, process,
        tearing down)), `BATCH` to a transaction, each in a savepoint of its own: a pass's
        exits cost a commit and a turn at the write lock per batch, not one each. A daemon killed
        half-way leaves the trials RUNNING with dead pids, which the next daemon finishes
        the same way. An exit that fails to be recorded is told and leaves the others be."""
        if not ended:
            return
        for trial_id, _, process, tearing_down in ended:
            self._slots_of.pop(trial_id, None)
            if not tearing_down:  # its last lines (a failure's cause) may be in its log's pipe
                experiment_id = self.db.trial(trial_id).experiment_id
                launcher.wait_for_log(process, self.layout.trial_log(experiment_id, trial_id))
        for start in range(0, len(ended), self.BATCH):
            with self.db.atomic():
                for trial_id, returncode, process, _ in ended[start:start + self.BATCH]:
                    try:
                        self._record_exit(trial_id, returncode, process)
                    except Exception:
                        if len(ended) == 1:
                            raise
                        self.log(f"localdet daemon: the end of trial {trial_id} could not be "
                                 "recorded, carrying on:\n" + traceback.format_exc())

    def _record_exit(self, trial_id: int, returncode: int | None, process) -> None:
        with self.db.atomic():
            trial = self.db.trial(trial_id)
            if trial.state != TrialState.RUNNING:
                return  # killed meanwhile: already settled
            experiment = self.db.experiment(trial.experiment_id)
            reached_end = bool(trial.batches_trained >= trial.target_batches
                               and trial.latest_checkpoint)
            if experiment.kind == ExperimentKind.JOB and returncode is None:
                # A job leaves no records to judge by, and its exit status went to no one.
                self.db.update_trial(trial.id, state=TrialState.ERROR, error=(
                    "the job's process ended while no daemon watched it, so whether it "
                    f"succeeded is unknown; see {self.layout.trial_log(experiment.id, trial.id)}"))
            else:
                # A process not ours left no exit status: one asked to pause is taken to
                # have checkpointed and exited as asked (else it keeps its previous checkpoint).
                clean = returncode == 0 or (returncode is None and (
                    reached_end or trial.stop_requested is not None))
                outcome = lifecycle.on_exit(phase_of(trial),
                                            lifecycle.Exit(clean, bool(reached_end)))
                if outcome.judge == "failed" and getattr(process, "lost", False):
                    self._node_lost(trial, experiment, process, outcome.restart_to)
                elif outcome.phase is not None:
                    self.db.update_trial(trial.id, state=outcome.phase.state,
                                         stop_requested=outcome.phase.stop)
                    how = ("paused" if outcome.phase.state == TrialState.PAUSED
                           else "paused, and is queued again as resumed")
                    self.log(f"trial {trial.id} {how} at {trial.batches_trained} batches")
                elif outcome.judge == "complete":
                    self._complete(trial, experiment)
                else:
                    self._failed(trial, experiment, returncode, outcome.restart_to)
            self._settle_experiment(experiment.id)
        # Retention: at the end of this pass's exits.
        self._to_collect.setdefault(experiment.id, set()).add(trial_id)

    def _node_lost(self, trial: Trial, experiment: Experiment, process,
                   restart_to: str) -> None:
        """The machine under a trial went away: not the trial's failure. It starts again
        from its latest checkpoint on another node, its restarts untouched."""
        self.db.update_trial(trial.id, state=restart_to, stop_requested=None)
        node = self.backend.describe_node(process.node)
        self.db.log_event("trial_node_lost", experiment_id=experiment.id, trial_id=trial.id,
                          node=process.node)
        self.log(f"trial {trial.id}: Ray node {node} was lost; the trial starts again from its "
                 "latest checkpoint on another node (not counted against max_restarts)")

    def _collect(self, experiment_id: int,
                 trial_ids: set[int] | None = None) -> gc.GcReport | None:
        """Apply checkpoint retention once a trial has stopped (never inside a transaction:
        gc commits before it lets go of its locks): to these trials' checkpoints only, their
        blobs left to the next whole collection, or to the whole experiment. None: it failed."""
        try:
            report = gc.collect(self.layout, self.db, experiment_id, trial_ids=trial_ids,
                                free_blobs=trial_ids is None)
        except Exception as error:  # retention can wait for the next trial; training cannot
            self.log(f"checkpoint retention for experiment {experiment_id} failed: {error}")
            return None
        if report.deleted or report.blobs_deleted:
            self.log(f"experiment {experiment_id}: {report.summary()}")
        return report

    def _failed(self, trial: Trial, experiment: Experiment, returncode: int | None,
                restart_to: str = TrialState.QUEUED) -> None:
        log_path = self.layout.trial_log(experiment.id, trial.id)
        how = exit_description(returncode)
        self.memory.settle(trial, experiment.config)  # a stop for memory is in the log first
        failure = failures.record(self.db, self.layout, trial)
        if failure and disk_space.out_of_space(failure.signature):
            self._out_of_space(trial, experiment, restart_to)
            return
        if failure and memory_limit.exceeded(failure):  # a restart would reach it again
            self.db.update_trial(trial.id, state=TrialState.ERROR, stop_requested=None, error=(
                f"{failure.told}\na restart would only reach the limit again, so it was not "
                f"restarted; see {log_path}"))
            self._searching(experiment, self.search.exited_early, experiment, trial)
            return
        if failure and experiment.kind != ExperimentKind.JOB and failures.invalid_hparams(failure):
            # Determined closed such a trial at once and let the search go on.
            self.db.update_trial(trial.id, state=TrialState.ERROR, stop_requested=None, error=(
                f"{failure.told}\nthe trial raised InvalidHP: its hyperparameters cannot "
                f"work, so it was not restarted; see {log_path}"))
            self.log(f"trial {trial.id} raised InvalidHP: {failure.signature}")
            self._searching(experiment, self.search.exited_early, experiment, trial)
            return
        # A job trains no batches, so its failures would all look alike: it keeps its restarts.
        if failure and experiment.kind != ExperimentKind.JOB \
                and failures.repeats(self.db, trial, failure):
            self._fail_fast(trial, experiment, failure, how)
            return
        if trial.restarts < experiment.config["max_restarts"]:
            self.db.update_trial(trial.id, state=restart_to, restarts=trial.restarts + 1,
                                 stop_requested=None)
            self.log(f"trial {trial.id} failed ({how}); restarting from its latest checkpoint "
                     f"({trial.restarts + 1} of {experiment.config['max_restarts']})")
            return
        tail = launcher.log_tail(log_path)
        error = f"{how}; the end of its log:\n{tail}" if tail else how
        if failure:  # the exception's own line first: what status shows at a glance
            error = f"{failure.told}\n{error}"
        self.db.update_trial(trial.id, state=TrialState.ERROR, stop_requested=None, error=error)
        self.log(f"trial {trial.id} failed ({how}); see {log_path}")
        self._searching(experiment, self.search.exited_early, experiment, trial)

    # -- failures that will repeat --------------------------------------------------------
    def _fail_fast(self, trial: Trial, experiment: Experiment, failure: launcher.Failure,
                   how: str) -> None:
        """End the trial without its remaining restarts. A failure at import is the model
        folder's, the same for every trial: when no trial has trained, end them all."""
        log_path = self.layout.trial_log(experiment.id, trial.id)
        point = failures.point_of(self.db, trial) if failure.trained else None
        where = "before training a batch"
        if point:
            where = (f"at its {point[0]} after {point[1]} batches" if point[0] != "training"
                     else f"in training after {point[1]} batches")
        self.db.update_trial(trial.id, state=TrialState.ERROR, stop_requested=None, error=(
            f"{failure.told}\nit failed {where}, the same way as before ({how}); a restart "
            f"would only repeat it, so it was not restarted; see {log_path}"))
        self.db.log_event("trial_failed_fast", experiment_id=experiment.id, trial_id=trial.id,
                          signature=failure.signature, stage=failure.stage,
                          phase=point[0] if point else None)
        self.log(f"trial {trial.id} failed the same way again {where}: "
                 f"{failure.signature}; not restarting it")
        self._searching(experiment, self.search.exited_early, experiment, trial)
        if not failures.import_failure_for_all(self.db, experiment.id, failure):
            return
        for _ in range(100_000):  # the searcher may answer an exit with new trials
            live = [t for t in self.db.trials(experiment.id)
                    if t.state not in TERMINAL_STATES]
            if not live or self.db.experiment(experiment.id).state in TERMINAL_STATES:
                break
            for sibling in live:
                if sibling.state == TrialState.RUNNING:
                    self._kill(sibling)
                self.db.update_trial(
                    sibling.id, state=TrialState.ERROR, stop_requested=None, error=(
                        f"{failure.told}\nnot run further: the model folder fails at import, "
                        f"the same way for every trial (trial {trial.id}'s log: {log_path})"))
                self._searching(experiment, self.search.exited_early,
                                self.db.experiment(experiment.id), sibling)
        if self.db.experiment(experiment.id).state not in TERMINAL_STATES:
            self.db.set_experiment_state(experiment.id, ExperimentState.ERROR, error=(
                f"{failures.SAME_WAY}: {failure.signature}"))
            self.log(f"experiment {experiment.id}: {failures.SAME_WAY}: {failure.signature}")

    def _complete(self, trial: Trial, experiment: Experiment) -> None:
        """The trial trained to its searcher length and exited: the searcher decides what
        next (train it further, close it, start others)."""
        if experiment.kind == ExperimentKind.JOB:  # a job reports no metric: exit 0 is success
            self.db.update_trial(trial.id, state=TrialState.COMPLETED, stop_requested=None)
            self.log(f"job {experiment.id} completed")
            return
        validations = self.db.metrics(trial.id, "validation")
        last = validations[-1].metrics if validations else {}
        if experiment.metric not in last:
            reported = ", ".join(sorted(last)) or "none"
            self.db.update_trial(trial.id, state=TrialState.ERROR, stop_requested=None, error=(
                f"the searcher metric '{experiment.metric}' was never reported; validation "
                f"metrics reported: {reported}; fix searcher.metric in the config"))
            self._searching(experiment, self.search.exited_early, experiment, trial)
            return
        metric = last[experiment.metric]
        self.log(f"trial {trial.id} validated at {trial.batches_trained} batches: "
                 f"{experiment.metric}={metric:.4g}")
        self._searching(experiment, self.search.validation_completed, experiment, trial,
                        float(metric))

    def _settle_experiment(self, experiment_id: int) -> None:
        experiment = self.db.experiment(experiment_id)
        if experiment.state in TERMINAL_STATES:
            return
        # An ACTIVE experiment with a trial queued or running has nothing to settle (none
        # is held, and it is not all paused): skip reading all its trials, often under the
        # write lock, after every exit.
        if experiment.state == ExperimentState.ACTIVE and self.db.db.execute(
                "SELECT 1 FROM trials WHERE experiment_id = ? AND state IN (?, ?) LIMIT 1",
                [experiment_id, TrialState.QUEUED, TrialState.RUNNING]).fetchone():
            return
        trials = self.db.trials(experiment_id)
        if experiment.searcher == "custom" and self._custom_settled(experiment, trials):
            return
        if trials and all(t.state in TERMINAL_STATES for t in trials):
            failed = [t for t in trials if t.state == TrialState.ERROR]
            if any(t.state == TrialState.COMPLETED for t in trials):
                self.db.set_experiment_state(experiment_id, ExperimentState.COMPLETED)
            elif all(t.state == TrialState.CANCELED for t in trials):
                self.db.set_experiment_state(experiment_id, ExperimentState.CANCELED)
            else:
                error = failures.experiment_error(self.db, experiment_id, failed)
                self.db.set_experiment_state(experiment_id, ExperimentState.ERROR, error=error)
            settled = self.db.experiment(experiment_id)
            self.log(f"{settled.kind} {experiment_id} {settled.state}")
            return
        for trial in trials:
            if lifecycle.held(experiment.state, trial.state):
                self.db.update_trial(trial.id, state=TrialState.PAUSED)
        state = lifecycle.settle(experiment.state, [t.state for t in trials])
        if state is not None:
            self.db.set_experiment_state(experiment_id, state)
            self.log(f"{experiment.kind} {experiment_id} {state}: none of its trials runs "
                     "or is queued")

    def _custom_settled(self, experiment: Experiment, trials: list[Trial]) -> bool:
        """A custom searcher's experiment with no live trial waits for its runner's next
        operations until the runner posts Shutdown; then cancel or failure end it CANCELED or
        ERROR. True when that decided (nothing more to settle)."""
        if any(t.state not in TERMINAL_STATES for t in trials):
            return False
        flags = self.search.shutdown_flags(experiment.id)
        if flags is None:
            return True  # waiting for the runner
        if flags["failure"]:
            self.db.set_experiment_state(experiment.id, ExperimentState.ERROR, error=(
                "the custom search method shut the search down with Shutdown(failure=True)"))
        elif flags["cancel"] or not trials:
            self.db.set_experiment_state(experiment.id, ExperimentState.CANCELED)
        else:
            return False  # ends as any search does, from its trials' states
        self.log(f"experiment {experiment.id} {self.db.experiment(experiment.id).state}")
        return True

    # -- scripts run on their own (laptop mode) -------------------------------------------
    def _watch_scripts(self) -> None:
        """A script records its own end; one killed outright cannot, so mark it here."""
        for experiment in self.db.experiments(states=(ExperimentState.ACTIVE,)):
            if experiment.runner != Runner.SCRIPT:
                continue
            for trial in self.db.trials(experiment.id, states=(TrialState.RUNNING,)):
                if trial.pid and not alive(trial.pid):
                    self.db.update_trial(trial.id, state=TrialState.ERROR, error=SCRIPT_GONE)
                    self.db.set_experiment_state(experiment.id, ExperimentState.ERROR,
                                                 error=SCRIPT_GONE)
                    self.log(f"experiment {experiment.id}: {SCRIPT_GONE}")
