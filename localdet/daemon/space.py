"""Free space where the state and the checkpoints are written: below the reserve the daemon
launches nothing and holds the running trials, and carries on by itself once space returns."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from localdet.checkpoints import disk_space
from localdet.daemon.watched import Watched, phase_of
from localdet.paths import Layout
from localdet.records import lifecycle
from localdet.records.db import Experiment, StateDB, Trial


@dataclass
class SpaceWatch:
    layout: Layout
    db: StateDB
    reserve: disk_space.Reserve
    watched: Watched
    log: Callable[[str], None]
    short: disk_space.Shortage | None = None  # launches held until space returns
    extra: int = 0  # after a trial ran out of space: room for its checkpoint too

    def watch(self) -> None:
        """Below the reserve where state and checkpoints are written: launch nothing, and
        hold running trials (they checkpoint if they can, exit, and wait queued); resume
        on our own once space returns."""
        shortage = self.reserve.shortage([self.layout.home, self.layout.store],
                                         extra=self.extra)
        if shortage is not None and self.short is None:
            self.db.log_event("disk_low", path=str(shortage.path), free=shortage.free,
                              needed=shortage.needed)
            self.log(f"{shortage.describe()}: launching nothing, and running trials stop at "
                     "their next boundary, until space returns")
            with self.db.atomic():
                for trial_id in self.watched.ids():
                    trial = self.db.trial(trial_id)
                    held = lifecycle.hold(phase_of(trial))
                    if held != phase_of(trial):
                        self.db.update_trial(trial_id, stop_requested=held.stop)
        elif shortage is None and self.short is not None:
            self.db.log_event("disk_ok")
            self.log("free space is back above the reserve: launching again")
            self.extra = 0
        self.short = shortage

    def out_of_space(self, trial: Trial, experiment: Experiment, restart_to: str) -> None:
        """A trial stopped because the disk filled: not its failure. It waits (restarts
        untouched) and carries on from its latest checkpoint once there is room for another."""
        latest = self.db.checkpoint(trial.latest_checkpoint) if trial.latest_checkpoint \
            else None
        self.extra = max(self.extra, 2 * (latest.size_bytes if latest else 0))
        with self.db.atomic():
            self.db.update_trial(trial.id, state=restart_to, stop_requested=None)
            self.db.log_event("trial_out_of_space", experiment_id=experiment.id,
                              trial_id=trial.id)
        self.log(f"trial {trial.id} stopped: the disk is full; it carries on from its latest "
                 "checkpoint once space returns")
        # Measured now, with room for the checkpoint: the disk may have filled after this
        # pass's watch, and the scheduler, later in the same pass, must not launch it again.
        self.watch()
