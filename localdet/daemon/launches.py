"""Starting trials' processes, recording their launches, and taking over (adopting) the
RUNNING trials a former daemon or `localdet run` left behind."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from determined.core._reporting import STAGED_VAR
from localdet.checkpoints import disk_space
from localdet.config import engines
from localdet.daemon.ahead import Ahead, Staged
from localdet.daemon.exits import Exits
from localdet.daemon.experiments import Experiments
from localdet.daemon.waking import Waiters
from localdet.daemon.watched import Watched
from localdet.paths import Layout
from localdet.pids import alive, process_start
from localdet.processes import launcher, memory_limit, warm_pool
from localdet.processes.warm_pool import WarmPool
from localdet.records import phases
from localdet.records.db import Experiment, StateDB, Trial, now
from localdet.records.states import ExperimentKind, TrialState
from localdet.scheduling.slots import CPU, Slot, cuda_visible_devices
from localdet.search.driver import Search

# A launch the cluster defers (its slots still held there) is tried again on later passes, at
# most this many times in a row (each waits up to ray_cluster.SLOTS_READY_SECONDS).
MAX_DEFERRALS = 5


@dataclass
class Launches:
    layout: Layout
    db: StateDB
    search: Search
    memory: memory_limit.Guard
    pool: WarmPool
    backend: Any  # where trials run (localdet/scheduling/local_machine.py, or a cluster)
    local: bool   # trials run on this machine: their pids are watched and adopted
    watched: Watched
    experiments: Experiments
    exits: Exits
    waiters: Waiters
    mine: Callable[[Experiment], bool]  # whether this daemon drives the experiment
    log: Callable[[str], None]
    batch: int  # launches recorded in one transaction at most (Daemon.BATCH)
    max_log_bytes: int
    reserve: disk_space.Reserve
    report_url: str | None  # set while the report server runs
    allow_system_hooks: bool = False  # startup hooks' machine-changing lines run
    decided_at: float = 0.0  # when this pass began choosing trials (the timeline's launch)
    _started: dict = field(default_factory=dict, init=False)  # trial id -> process started
    _deferrals: dict = field(default_factory=dict, init=False)  # trial id -> tries in a row
    ahead: Ahead = field(default_factory=Ahead, init=False)  # the next trial, started ahead

    def launch(self, trial: Trial, slots: list[int], machine: list[Slot]) -> tuple | None:
        """Start the trial's process (or launch the one started ahead for it); None if it
        cannot start (the trial is then ERROR). Its launch is recorded by `record`, with the
        pass's others."""
        experiment = self.db.experiment(trial.experiment_id)
        staged = self.ahead.take(trial, slots)
        try:
            launched_at = now()
            if staged is not None:
                spec, process, log_offset = staged.spec, staged.process, staged.log_offset
                self._started[trial.id] = staged.started
            else:
                spec = self._spec(experiment, trial, slots, machine)
                process, log_offset = self._start(spec, trial, slots, launched_at)
                self._started[trial.id] = time.time()
            self._deferrals.pop(trial.id, None)
        except launcher.LaunchDeferred as error:
            self._deferred(trial, experiment, error)
            return None
        except launcher.LaunchError as error:  # retrying cannot help: end it
            self._ended(trial, experiment, error, str(error))
            return None
        if self.local:  # (on a cluster, its node's memory is Ray's to watch)
            self.memory.watch(trial, process.pid, experiment.config)  # at once: before it grows
        self.watched.processes[trial.id] = process
        self.watched.slots_of[trial.id] = slots
        return trial, slots, spec, process, launched_at, log_offset

    def _spec(self, experiment: Experiment, trial: Trial, slots: list[int],
              machine: list[Slot]) -> launcher.LaunchSpec:
        return launcher.launch_spec(
            self.layout, experiment, trial, slots,
            visible_devices=cuda_visible_devices([machine[i] for i in slots]),
            max_log_bytes=self.max_log_bytes, reserve=self.reserve,
            report_url=self.report_url, report_local=self.local,
            allow_system_hooks=self.allow_system_hooks)

    def _start(self, spec: launcher.LaunchSpec, trial: Trial, slots: list[int],
               launched_at: str) -> tuple:
        """The launch's process (`launched_at` names the launch), and where its part of the
        log begins."""
        log_offset = launcher.log_size(spec.log_path)  # this launch's part begins here
        process = self.backend.start(spec, dataclasses.replace(trial, started_at=launched_at),
                                     slots)
        return process, log_offset

    def may_start_ahead(self) -> bool:
        """Whether a trial may be started ahead of its slot now (localdet/daemon/ahead.py):
        none is, trials run on this machine, report into its files, and run warm with a
        core to spare (a trial started ahead runs its start-up beside the running ones)."""
        return (self.ahead.staged is None and self.local and self.report_url is None
                and self.pool.size > 0 and self.pool.beside_trials)

    def start_ahead(self, trial: Trial, slots: list[int], machine: list[Slot]) -> None:
        """Start `trial` for `slots` while they are busy, if it is a trial class that runs
        warm on CPU slots from its start; its launch comes when they are free."""
        if trial.id in self.ahead.refused:
            return
        experiment = self.db.experiment(trial.experiment_id)
        if (trial.latest_checkpoint is not None or experiment.kind == ExperimentKind.JOB
                or experiment.config.get("entrypoint_kind") == "script"
                or any(machine[i].kind != CPU for i in slots)):
            self.ahead.refused.add(trial.id)  # asked again each pass otherwise
            return
        try:
            spec = self._spec(experiment, trial, slots, machine)
            if spec.engine != engines.SINGLE or warm_pool.kind_of(spec) is None:
                self.ahead.refused.add(trial.id)
                return
            if not self.pool.ready_for(spec):  # its warm process may be ready next pass
                return
            first, _, rest = spec.header.partition("\n")
            spec = dataclasses.replace(
                spec, env={**spec.env, STAGED_VAR: "1"},
                header="\n".join(filter(None, [f"{first}; started ahead of its slot", rest])))
            started = time.time()
            process, log_offset = self._start(spec, trial, slots, now())
        except launcher.LaunchError:  # its launch says why
            return
        self.ahead.hold(Staged(trial, slots, spec, process, log_offset, started))
        self.log(f"trial {trial.id} of experiment {trial.experiment_id} started ahead of its "
                 f"slot{'s' if len(slots) > 1 else ''} {slots} (pid {process.pid}): it "
                 "launches there when the trial before it ends")

    def _deferred(self, trial: Trial, experiment: Experiment,
                  error: launcher.LaunchError) -> None:
        """Leave the trial queued for a later pass, its restarts untouched (the cluster's
        doing, not the trial's), up to MAX_DEFERRALS tries in a row; then end it."""
        tries = self._deferrals[trial.id] = self._deferrals.get(trial.id, 0) + 1
        if tries >= MAX_DEFERRALS:
            del self._deferrals[trial.id]
            self._ended(trial, experiment, error, f"{error}; it could not start in {tries} "
                        "tries (see `ray status` for what holds the cluster's slots)")
            return
        self.db.log_event("trial_launch_deferred", experiment_id=experiment.id,
                          trial_id=trial.id, reason=str(error))
        self.log(f"trial {trial.id} of experiment {trial.experiment_id} could not start yet "
                 f"({error}); it stays queued (try {tries} of {MAX_DEFERRALS})")

    def _ended(self, trial: Trial, experiment: Experiment, error: launcher.LaunchError,
               recorded: str) -> None:
        """End a trial that could not start: ERROR with `recorded`, and its search told."""
        with self.db.atomic():
            self.db.update_trial(trial.id, state=TrialState.ERROR, error=recorded)
            self.log(f"trial {trial.id} of experiment {trial.experiment_id}: {error}")
            self.experiments.searching(experiment, self.search.exited_early, experiment, trial)
            self.experiments.settle(experiment.id)

    def record(self, started: list[tuple]) -> None:
        """Record the pass's launches `BATCH` to a transaction: a commit and a turn at the
        write lock (shared with the trials' reports) per batch, not one each. A trial's process
        waits for its launch to be recorded before it trains, so a daemon killed before this
        leaves none training unrecorded."""
        for start in range(0, len(started), self.batch):
            self._record_some(started[start:start + self.batch])
        expected = bool(started) and self._more_launches_expected(started)
        for trial, slots, spec, process, _, _ in started:
            # Wake the loop the moment it exits, so its slots pass on without a poll's delay.
            self.waiters.watch(process)
            where = f"on Ray node {process.host} " if not self.local else ""
            ahead = "ahead of its slot " if spec.env.get(STAGED_VAR) else ""
            self.log(f"trial {trial.id} of experiment {trial.experiment_id} started {where}"
                     f"{'in a warm process ' if process.warm else ''}{ahead}(pid {process.pid}, "
                     f"slots {slots})")
            self.pool.keep(spec, expected)  # the next trial like it finds one ready

    def _more_launches_expected(self, started: list[tuple]) -> bool:
        """Whether a trial waits to be launched, or a launched one's search may make more:
        what a warm process kept now would serve."""
        if self.db.db.execute("SELECT 1 FROM trials WHERE state = ? LIMIT 1",
                              [TrialState.QUEUED]).fetchone():
            return True
        experiments = {trial.experiment_id for trial, *_ in started}
        return any(self.db.experiment(e).searcher != "single" for e in experiments)

    def _record_some(self, started: list[tuple]) -> None:
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
                phases.record_launch(self.db, trial.experiment_id, trial.id, launched_at,
                                     self.decided_at or phases.seconds(launched_at), {
                                         "warm": process.warm, "slots": slots,
                                         "ahead": bool(spec.env.get(STAGED_VAR)),
                                         "process_started": self._started.pop(trial.id, None)})

    def adopt_running_trials(self, experiment_id: int | None = None) -> None:
        """Watch the RUNNING trials a former daemon (or `localdet run`) left behind."""
        mine = {e.id for e in self.db.experiments() if self.mine(e)}
        for trial in self.db.trials(experiment_id, states=(TrialState.RUNNING,)):
            if trial.experiment_id not in mine and experiment_id is None:
                continue
            if not self.local:
                self._adopt_from_cluster(trial)
            elif (trial.pid and alive(trial.pid)
                    and trial.process_start in (None, process_start(trial.pid))):
                self.watched.adopted[trial.id] = trial.pid
                self.memory.watch(trial, trial.pid, self.db.experiment(trial.experiment_id).config)
                self.watched.slots_of[trial.id] = trial.slots or []
                self.log(f"adopted trial {trial.id} (pid {trial.pid})")
            else:
                self.exits.finish(trial.id, returncode=None)

    def _adopt_from_cluster(self, trial: Trial) -> None:
        """Its actor, if it still runs in the cluster (named after the trial's launch)."""
        experiment = self.db.experiment(trial.experiment_id)
        handle = self.backend.adopt(trial, self.layout.trial_log(experiment.id, trial.id),
                                    self.max_log_bytes)
        if handle is None:
            self.exits.finish(trial.id, returncode=None)
            return
        self.watched.processes[trial.id] = handle
        self.watched.slots_of[trial.id] = trial.slots or []
        self.log(f"adopted trial {trial.id} (Ray actor {handle.name})")

