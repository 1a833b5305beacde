"""Which queued trials start now, on which slots: the machine's (or the cluster's) usable
slots, each experiment's typed `resources`, and placement's choice, launched through
`Launches`. A trial that asks for more slots than any node has fails at once, with why."""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from localdet.config import engines
from localdet.config.typed import ExperimentConfig, Resources
from localdet.daemon.experiments import Experiments
from localdet.daemon.launches import Launches
from localdet.daemon.space import SpaceWatch
from localdet.daemon.submissions import Intake
from localdet.daemon.watched import Watched
from localdet.records.db import Experiment, StateDB, Trial
from localdet.records.states import ExperimentKind, ExperimentState, TrialState
from localdet.scheduling import placement
from localdet.scheduling.slots import Slot, slot_table


@dataclass
class Scheduler:
    db: StateDB
    backend: Any  # where trials run (localdet/scheduling/local_machine.py, or a cluster)
    local: bool   # trials run on this machine (else on a Ray cluster)
    machine: list[Slot]  # the slots, refreshed each pass: a cluster's nodes come and go
    intake: Intake
    watched: Watched
    experiments: Experiments
    space: SpaceWatch
    launches: Launches
    only: int | None  # the one experiment `localdet run` drives (its messages say so)
    mine: Callable[[Experiment], bool]  # whether this daemon drives the experiment
    # experiment id -> (its resources section, typed), and -> whether ranks may span nodes
    _resources: dict = field(default_factory=dict, init=False)
    _spanning: dict = field(default_factory=dict, init=False)

    def slot_table(self) -> str:
        busy = {}
        for trial_id, slots in self.watched.slots_of.items():
            trial = self.db.trial(trial_id)
            busy.update({slot: f"trial {trial_id} (experiment {trial.experiment_id})"
                         for slot in slots})
        console = Console(record=True, width=100, file=io.StringIO())
        console.print(slot_table(self.machine, busy))
        return console.export_text().rstrip()

    def schedule(self) -> None:
        if self.space.short is not None:
            return  # held until free space returns (SpaceWatch.watch)
        self.launches.decided_at = time.time()  # a launch's timeline begins here
        busy_slots = {slot for slots in self.watched.slots_of.values() for slot in slots}
        usable, node_of, most = self.usable_slots()
        free = [slot.index for slot in self.machine
                if slot.index not in busy_slots and slot.index in usable]
        if not free and not self.launches.may_start_ahead():
            return
        waiting: list[placement.Waiting] = []
        busy: dict[int, int] = {}            # experiment id -> slots its trials hold
        max_slots: dict[int, int | None] = {}  # experiment id -> resources.max_slots
        # One query for the running trials' experiments, not one read per trial a pass.
        experiment_of = self._experiments_of(list(self.watched.slots_of))
        for trial_id, slots in self.watched.slots_of.items():
            experiment_id = experiment_of[trial_id]
            busy[experiment_id] = busy.get(experiment_id, 0) + len(slots)
        for experiment in self.db.experiments(states=(ExperimentState.ACTIVE,)):
            if not self.mine(experiment):
                continue
            resources = self.resources_of(experiment)
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
                    self.experiments.settle(experiment.id)
                    continue
                waiting.append(placement.Waiting(trial.id, experiment.id, per_trial,
                                                 resources.priority, trial.id, spans))
        started: list[tuple] = []
        try:
            for trial_id, slots in placement.assign(waiting, free, busy, max_slots, node_of):
                launch = self.launches.launch(self.db.trial(trial_id), slots, self.machine)
                if launch is not None:
                    started.append(launch)
        finally:  # what started is recorded, even when a later launch raised
            self.launches.record(started)
        # With a slot still free, there is nothing to get ahead of.
        if self.launches.may_start_ahead() and sum(len(s) for _, s, *_ in started) == len(free):
            launched = {trial.id for trial, *_ in started}
            self._start_ahead([w for w in waiting if w.trial_id not in launched], busy,
                              max_slots, node_of)

    def _start_ahead(self, waiting: list[placement.Waiting], busy: dict[int, int],
                     max_slots: dict[int, int | None], node_of: dict[int, tuple]) -> None:
        """Every slot busy: start the trial that placement would give the slot freed first
        (the one-slot trial nearest its length) ahead of it (localdet/daemon/ahead.py)."""
        if not waiting:
            return
        nearest: tuple | None = None
        for trial_id, slots in self.watched.slots_of.items():
            if len(slots) != 1 or trial_id not in self.watched.processes:
                continue
            trial = self.db.trial(trial_id)
            left = trial.target_batches - trial.batches_trained \
                if trial.target_batches > 0 else float("inf")
            if nearest is None or left < nearest[0]:
                nearest = (left, trial.experiment_id, slots)
        if nearest is None:
            return
        _, experiment_id, slots = nearest
        freed = dict(busy)
        freed[experiment_id] = freed.get(experiment_id, 1) - 1
        for trial_id, its_slots in placement.assign(waiting, slots, freed, max_slots, node_of):
            self.launches.start_ahead(self.db.trial(trial_id), its_slots, self.machine)
            return

    def resources_of(self, experiment: Experiment) -> Resources:
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

    def usable_slots(self) -> tuple[set[int], dict[int, tuple], int]:
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

