"""The next trial, started ahead of its slot: while every slot is busy, the trial that will
take the slot freed first is forked from its warm process at once. It imports its code, makes
its model and data, and waits before its first batch (`determined.core.await_launch`) until
the daemon launches it there, so that a search of short trials does not pay each trial's
start-up between one trial's end and the next one's training.

    ahead = Ahead()
    ahead.hold(Staged(trial, slots, spec, process, log_offset, time.time()))
    staged = ahead.take(trial, slots)  # launching it there: the process, if it still fits
    ahead.drop_stale(db)               # each pass: its trial no longer queued, or it ended
    ahead.end()                        # the daemon stops

One at a time, on this machine (its process waits on the daemon's SQLite records), for trial
classes on CPU slots (a GPU's memory would be the running trial's) with no checkpoint to
restore (what it restores is read before it waits). Nothing of it is recorded until it is
launched: the trial stays QUEUED, and a daemon that goes ends it (its parent goes with it).
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass
from typing import Any

from localdet.processes import launcher
from localdet.records.db import StateDB, Trial
from localdet.records.states import ExperimentState, TrialState


@dataclass
class Staged:
    trial: Trial           # as it was when started: launched only if still the same
    slots: list[int]       # the slots it was started for (its environment names them)
    spec: launcher.LaunchSpec
    process: Any           # what the backend started (a Popen, or a fork of a warm process)
    log_offset: int        # where its part of the trial's log begins
    started: float         # when (seconds since the epoch)


def _same_launch(staged: Trial, now: Trial) -> bool:
    """What the started process read of its trial is still so."""
    return all(getattr(staged, name) == getattr(now, name) for name in (
        "hparams", "seed", "restarts", "latest_checkpoint", "target_batches"))


class Ahead:
    def __init__(self) -> None:
        self.staged: Staged | None = None
        self.refused: set[int] = set()  # trials that cannot be started ahead (a script, ...)

    def hold(self, staged: Staged) -> None:
        self.staged = staged

    def take(self, trial: Trial, slots: list[int]) -> Staged | None:
        """The process started ahead for this launch of `trial` on `slots`, still waiting;
        None if there is none. One started for the trial that no longer fits is ended, and
        so is one started for another trial on these slots (placed after it, by priority
        say): the next pass starts the one the slot now waits for."""
        staged = self.staged
        if staged is None:
            return None
        if staged.trial.id != trial.id:
            if set(slots) & set(staged.slots):
                self.end()
            return None
        self.staged = None
        if staged.slots == slots and staged.process.poll() is None \
                and _same_launch(staged.trial, trial):
            return staged
        _end(staged)
        return None

    def drop_stale(self, db: StateDB) -> None:
        """End the one started ahead if its trial is no longer queued in an active
        experiment (paused, killed, ended), or its process has ended (it is started again
        as any trial then, and says why)."""
        staged = self.staged
        if staged is None:
            return
        trial = db.trial(staged.trial.id)
        if trial.state != TrialState.QUEUED or staged.process.poll() is not None \
                or db.experiment(trial.experiment_id).state != ExperimentState.ACTIVE \
                or not _same_launch(staged.trial, trial):
            self.end()

    def end(self) -> None:
        if self.staged is not None:
            staged, self.staged = self.staged, None
            _end(staged)


def _end(staged: Staged) -> None:
    """Kill its process group and reap it and its log's writer."""
    process = staged.process
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    launcher.wait_for_log(process, staged.spec.log_path)
