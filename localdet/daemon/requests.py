"""Users' pause, resume and kill requests (recorded by the CLI, the dashboard and the SDK),
carried out through the lifecycle; a request for an experiment whose `localdet run` has
ended makes the daemon take that experiment over."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from localdet.daemon.experiments import Experiments
from localdet.daemon.launches import Launches
from localdet.daemon.retention import Retention
from localdet.daemon.watched import Watched, phase_of
from localdet.paths import Layout
from localdet.pids import DaemonLock
from localdet.records import lifecycle
from localdet.records.db import Experiment, NotFound, StateDB
from localdet.records.states import TERMINAL_STATES, ExperimentKind, Runner
from localdet.search.driver import Search


@dataclass
class Requests:
    layout: Layout
    db: StateDB
    search: Search
    watched: Watched
    experiments: Experiments
    launches: Launches
    retention: Retention
    only: int | None  # the one experiment `localdet run` drives: it takes over no other
    mine: Callable[[Experiment], bool]  # whether this daemon drives the experiment
    log: Callable[[str], None]

    def handle(self) -> None:
        for request in self.db.pending_requests():
            try:
                experiment = self._experiment_of(request)
            except NotFound as error:
                self.db.mark_request_handled(request["id"], str(error))
                continue
            if not self.mine(experiment):
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
        self.launches.adopt_running_trials(experiment.id)
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
                    self.watched.end(trial.id)
                if outcome.phase != before:
                    self.db.update_trial(trial.id, state=outcome.phase.state,
                                         stop_requested=outcome.phase.stop)
                if action == "kill" and not whole_experiment:  # the search goes on without it
                    self.experiments.searching(experiment, self.search.exited_early,
                                    self.db.experiment(experiment.id), trial)
            self.experiments.settle(experiment.id)
        if action == "kill":
            self.retention.collect(experiment.id)
        return f"{action} {target}: {len(live)} live trial(s)"

