"""Checkpoint retention after trials stop: at once for the trials that stopped this pass (a
trial's own retention rules read only its checkpoints, trials and validations), and a whole
collection of the experiment, throttled, for what depends on more than one trial."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from localdet.checkpoints import gc
from localdet.config.typed import CheckpointStorage
from localdet.paths import Layout
from localdet.records.db import StateDB
from localdet.records.states import TrialState


@dataclass
class Retention:
    layout: Layout
    db: StateDB
    log: Callable[[str], None]
    to_collect: dict = field(default_factory=dict)   # experiment id -> trials exited: retain
    to_sweep: set = field(default_factory=set)       # experiments due a whole collection
    collect_due: dict = field(default_factory=dict)  # experiment id -> next whole one from
    keeps_best: dict = field(default_factory=dict)   # experiment id -> save_experiment_best

    def exited(self, experiment_id: int, trial_id: int) -> None:
        """The trial's process ended and its end is recorded: retain at the end of the pass."""
        self.to_collect.setdefault(experiment_id, set()).add(trial_id)

    def collect_exited(self) -> None:
        """Retention for the trials that stopped this pass, before it launches anything: it
        reads only their checkpoints, trials and validations (a trial's own retention rules
        depend on nothing else), so a pass costs the same however many trials the
        experiment has finished. What that leaves to a whole collection of the experiment
        (the blobs of the checkpoints it deleted; an experiment that keeps its best
        checkpoints, `save_experiment_best`, which every exit can change; and the final
        collection once nothing is queued or running) waits after each whole collection
        nine times as long as that took, so that it takes at most a tenth of the loop
        however large the experiment; with nothing queued or running it runs at once."""
        for experiment_id, trial_ids in list(self.to_collect.items()):
            del self.to_collect[experiment_id]
            if self._keeps_experiment_best(experiment_id):
                self.to_sweep.add(experiment_id)
                continue
            report = self.collect(experiment_id, trial_ids)
            if report is None or report.deleted or not self._live(experiment_id):
                self.to_sweep.add(experiment_id)
        for experiment_id in list(self.to_sweep):
            if time.monotonic() < self.collect_due.get(experiment_id, 0.0) and \
                    self._live(experiment_id):
                continue
            self.to_sweep.discard(experiment_id)
            begun = time.monotonic()
            self.collect(experiment_id)
            self.collect_due[experiment_id] = time.monotonic() + 9 * (time.monotonic() - begun)

    def collect(self, experiment_id: int,
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

    def _live(self, experiment_id: int) -> bool:
        """Whether the experiment has a trial QUEUED or RUNNING (an index lookup)."""
        return self.db.db.execute(
            "SELECT 1 FROM trials WHERE experiment_id = ? AND state IN (?, ?) LIMIT 1",
            [experiment_id, TrialState.QUEUED, TrialState.RUNNING]).fetchone() is not None

    def _keeps_experiment_best(self, experiment_id: int) -> bool:
        if experiment_id not in self.keeps_best:
            self.keeps_best[experiment_id] = bool(CheckpointStorage.of(
                self.db.experiment(experiment_id).config).save_experiment_best)
        return self.keeps_best[experiment_id]
