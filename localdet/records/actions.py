"""Pause, resume and kill requests, from the CLI and the dashboard alike:

    message = request(layout, db, "pause", experiment_id=3)   # "pause requested for ..."

A request is recorded in the database and carried out by whoever runs the experiment (the
daemon, or its `localdet run`); ActionError says, in one sentence, why one cannot be made.
"""

from __future__ import annotations

from localdet.paths import Layout
from localdet.records import lifecycle
from localdet.records.db import NotFound, StateDB
from localdet.records.states import ExperimentKind, Runner


class ActionError(ValueError):
    """The request cannot be made; the message says why."""


def request(layout: Layout, db: StateDB, action: str, experiment_id: int | None = None,
            trial_id: int | None = None, said_as: str | None = None) -> str:
    """Record the request; returns what was requested, with a note when nothing runs to
    carry it out yet. `said_as`: the user's word for the action (`det e cancel` is a kill),
    used in what is said back."""
    from localdet.pids import DaemonLock

    if action not in lifecycle.ACTIONS:
        raise ActionError(f"unknown action {action!r}; it is one of "
                          f"{', '.join(lifecycle.ACTIONS)}")
    if (experiment_id is None) == (trial_id is None):
        raise ActionError(f"name an experiment (`localdet {action} EXP`) or a trial "
                          f"(`localdet {action} --trial ID`), not both or neither")
    try:
        if trial_id is not None:
            trials, what = [db.trial(trial_id)], f"trial {trial_id}"
            experiment = db.experiment(trials[0].experiment_id)
        elif experiment_id is not None:  # one of the two, as checked above
            experiment = db.experiment(experiment_id)
            what, trials = f"{experiment.kind} {experiment_id}", db.trials(experiment_id)
    except NotFound as error:
        raise ActionError(str(error)) from None
    if experiment.runner == Runner.SCRIPT:
        raise ActionError(f"experiment {experiment.id} is a script running outside the "
                          "daemon; stop it with Ctrl-C in its terminal")
    if experiment.kind == ExperimentKind.JOB and action != "kill":
        raise ActionError(f"job {experiment.id} cannot be {action}d, since jobs keep no "
                          f"checkpoints to resume from; `localdet kill {experiment.id}` "
                          "stops it")
    phases = [lifecycle.TrialPhase(t.state, t.stop_requested) for t in trials]
    changes_experiment = trial_id is None and lifecycle.experiment_after(
        action, experiment.state, True) != experiment.state
    if not changes_experiment and not any(lifecycle.applies(action, p) for p in phases):
        state = phases[0].describe() if trial_id is not None else experiment.state
        raise ActionError(f"{what} is {state}; there is nothing to {said_as or action}")
    db.add_request(action, experiment_id=experiment_id, trial_id=trial_id)
    message = f"{said_as or action} requested for {what}"
    if (experiment.runner == Runner.FOREGROUND
            and DaemonLock.holder(layout.run_lock(experiment.id)) is not None):
        return message  # its `localdet run` carries it out
    if DaemonLock.holder(layout.daemon_lock) is None:
        message += "; the daemon is not running; it will carry this out when it starts " \
            "(`localdet daemon start`)"
    return message
