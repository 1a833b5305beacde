"""Experiments a script runs by itself (`python3 train.py`, the laptop mode): they record
their own progress and end, and the daemon only notices one whose process died unrecorded."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from localdet.pids import alive
from localdet.records.db import StateDB
from localdet.records.states import ExperimentState, Runner, TrialState

SCRIPT_GONE = "the script ended without finishing its run (was it killed?)"


@dataclass
class ScriptWatch:
    db: StateDB
    log: Callable[[str], None]

    def watch(self) -> None:
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
