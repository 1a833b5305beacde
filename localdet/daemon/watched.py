"""The trial processes a daemon watches: those it launched, those it adopted from a former
daemon (or `localdet run`), those whose work is all recorded and that are only tearing
down, and the slots each trial holds. Every part of the daemon reads and changes this one
table; ending a trial's process goes through it, so its slots are freed with it."""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass, field

from localdet.records import lifecycle
from localdet.records.db import Trial


def phase_of(trial: Trial) -> lifecycle.TrialPhase:
    """The trial's recorded state and stop request, as the lifecycle rules take them."""
    return lifecycle.TrialPhase(trial.state, trial.stop_requested)


@dataclass
class Watched:
    processes: dict = field(default_factory=dict)     # trial id -> Popen (ours)
    adopted: dict = field(default_factory=dict)       # trial id -> pid (a former daemon's)
    tearing_down: dict = field(default_factory=dict)  # trial id -> Popen, its work recorded
    slots_of: dict = field(default_factory=dict)      # trial id -> slots

    def ids(self) -> set[int]:
        """The trials whose processes are watched (not those only tearing down)."""
        return set(self.processes) | set(self.adopted)

    def end(self, trial_id: int) -> None:
        """Kill the trial's process group, if one runs, and free its slots."""
        process = self.processes.pop(trial_id, None)
        if hasattr(process, "end"):  # a launch on a cluster
            process.end()
            self.slots_of.pop(trial_id, None)
            return
        pid = process.pid if process else self.adopted.pop(trial_id, None)
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
        self.slots_of.pop(trial_id, None)
