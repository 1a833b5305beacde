"""An experiment's course as the daemon drives it: its search started and told of its
trials, a trial canceled, and the experiment's state settled from its trials' once none is
live (or its custom search's runner shut it down). A searcher that fails ends its
experiment, never the daemon."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from localdet.daemon.watched import Watched
from localdet.processes import failures
from localdet.records import lifecycle
from localdet.records.db import Experiment, StateDB, Trial
from localdet.records.states import TERMINAL_STATES, ExperimentKind, ExperimentState, TrialState
from localdet.search.driver import Search, SearchError


@dataclass
class Experiments:
    db: StateDB
    search: Search
    watched: Watched
    mine: Callable[[Experiment], bool]  # whether this daemon drives the experiment
    log: Callable[[str], None]

    def start_searches(self) -> None:
        """Start the searches of the active experiments that have none yet; settle a custom
        search whose runner shut it down."""
        for experiment in self.db.experiments(states=(ExperimentState.ACTIVE,)):
            # A job's one trial is made with it; it has no searcher.
            if not self.mine(experiment) or experiment.kind == ExperimentKind.JOB:
                continue
            if not self.search.started(experiment):
                self.searching(experiment, self.search.start, experiment)
            elif experiment.searcher == "custom" and self.search.shut_down(experiment.id):
                # Its runner posted Shutdown from another process: end it once its trials are.
                self.settle(experiment.id)

    def searching(self, experiment: Experiment, action, *args) -> None:
        """Tell the search something; a searcher that fails ends its experiment, not us."""
        try:
            action(*args)
        except SearchError as error:
            for trial in self.db.trials(experiment.id):
                if trial.state not in TERMINAL_STATES:
                    self.kill(trial)
            self.db.set_experiment_state(experiment.id, ExperimentState.ERROR, error=str(error))
            self.log(f"experiment {experiment.id}: {error}")

    def kill(self, trial: Trial) -> None:
        """End the trial's process, if one runs, and record the trial CANCELED."""
        self.watched.end(trial.id)
        self.db.update_trial(trial.id, state=TrialState.CANCELED, stop_requested=None)

    def settle(self, experiment_id: int) -> None:
        """Record the experiment's state as its trials' states make it."""
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
