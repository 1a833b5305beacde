"""The states, kinds and runners of what the database records, and the one table of which
state changes are legal.

A module of its own, importing nothing of localdet's, so that the pure deciders (the
lifecycle, retention, the searchers' drivers) can test a state without importing the
database layer, which imports this in turn.

The members are `StrEnum`s: each is the very string the database stores ("ACTIVE",
"experiment"), so they compare equal to what a row holds, and go into SQL, JSON and
messages unchanged. `state/migrations/0005_state_checks.py` makes SQLite refuse any other
value; `StateDB` refuses a change the table below does not list:

    check_trial_change(3, TrialState.PAUSED, TrialState.QUEUED)    # resumed: fine
    check_trial_change(3, TrialState.PAUSED, TrialState.RUNNING)   # raises IllegalTransition
"""

from __future__ import annotations

from enum import StrEnum
from typing import Mapping, TypeVar


class ExperimentState(StrEnum):
    ACTIVE = "ACTIVE"
    PAUSED = "PAUSED"
    COMPLETED = "COMPLETED"
    CANCELED = "CANCELED"
    ERROR = "ERROR"


class TrialState(StrEnum):
    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    PAUSED = "PAUSED"
    # Trained to its searcher length and validated; the searcher may still promote it
    # (ASHA), or close it.
    WAITING = "WAITING"
    COMPLETED = "COMPLETED"
    CANCELED = "CANCELED"
    ERROR = "ERROR"


class StopRequest(StrEnum):
    """What a RUNNING trial has been asked (trials.stop_requested; NULL: nothing). See
    localdet/records/lifecycle.py."""
    PAUSE = "PAUSE"        # checkpoint and stop at the next workload boundary; not seen yet
    PAUSING = "PAUSING"    # the trial saw the pause and is checkpointing
    REQUEUE = "REQUEUE"    # pausing, but resumed (or held for disk space) since: queue again


class CheckpointState(StrEnum):
    COMPLETED = "COMPLETED"
    DELETED = "DELETED"    # by retention: the row stays, its files are gone


class ExperimentKind(StrEnum):
    EXPERIMENT = "experiment"  # trials made by a searcher
    JOB = "job"                # one process (`localdet job run`), kept with one trial row


class Runner(StrEnum):
    """Who runs an experiment: the daemon schedules only its own."""
    DAEMON = "daemon"
    FOREGROUND = "foreground"  # a `localdet run` process
    SCRIPT = "script"          # a `python3 train.py` that recorded itself (laptop mode)


# -- groupings ----------------------------------------------------------------------------

EXPERIMENT_STATES = tuple(ExperimentState)
TRIAL_STATES = tuple(TrialState)
# An experiment's and a trial's final states are the same three strings.
TERMINAL_STATES = frozenset({TrialState.COMPLETED, TrialState.CANCELED, TrialState.ERROR})
# A searcher makes a trial queued, or paused when its experiment is paused.
TRIAL_INITIAL_STATES = frozenset({TrialState.QUEUED, TrialState.PAUSED})
EXPERIMENT_INITIAL_STATE = ExperimentState.ACTIVE

# -- the transition table -----------------------------------------------------------------

_T = TrialState
_ENDS = (_T.COMPLETED, _T.CANCELED, _T.ERROR)
# Every state change a trial may make; a live state may also be written again unchanged
# (a running trial's stop request, a promotion's new length change with it). Killed
# (CANCELED) or failed (ERROR) from any live state; a searcher's Close completes a live
# trial whatever it is doing (localdet/search/driver.py).
TRIAL_TRANSITIONS: Mapping[TrialState, frozenset[TrialState]] = {
    # launched; paused before it ran (or held: its experiment is paused)
    _T.QUEUED: frozenset({_T.QUEUED, _T.RUNNING, _T.PAUSED, *_ENDS}),
    # exited: paused as asked, queued again (resumed meanwhile, restarted after a failure,
    # stopped for disk space or a lost node), validated at its length (WAITING), done (a job)
    _T.RUNNING: frozenset({_T.RUNNING, _T.QUEUED, _T.PAUSED, _T.WAITING, *_ENDS}),
    _T.PAUSED: frozenset({_T.PAUSED, _T.QUEUED, *_ENDS}),                # resumed
    # promoted by the searcher: queued, or paused under a paused experiment
    _T.WAITING: frozenset({_T.WAITING, _T.QUEUED, _T.PAUSED, *_ENDS}),
    **{end: frozenset() for end in _ENDS},  # final: history is not rewritten
}

_E = ExperimentState
EXPERIMENT_TRANSITIONS: Mapping[ExperimentState, frozenset[ExperimentState]] = {
    _E.ACTIVE: frozenset({_E.PAUSED, _E.COMPLETED, _E.CANCELED, _E.ERROR}),
    _E.PAUSED: frozenset({_E.ACTIVE, _E.COMPLETED, _E.CANCELED, _E.ERROR}),  # resumed
    **{end: frozenset() for end in (_E.COMPLETED, _E.CANCELED, _E.ERROR)},
}


# `det e continue` (localdet.operations.lineage) of a single-trial experiment: the one way
# out of a final state. The experiment is ACTIVE again and its trial queued to train on from
# its latest checkpoint; what happened before stays in the event log. Not in the tables
# above: no other write may reopen what has ended.
EXPERIMENT_CONTINUATIONS: Mapping[ExperimentState, frozenset[ExperimentState]] = {
    before: frozenset({_E.ACTIVE}) for before in (_E.PAUSED, _E.COMPLETED, _E.CANCELED, _E.ERROR)
}
# A RUNNING trial is not among them: it is still pausing, and continues once PAUSED.
TRIAL_CONTINUATIONS: Mapping[TrialState, frozenset[TrialState]] = {
    before: frozenset({_T.QUEUED}) for before in TrialState if before != _T.RUNNING
}


class UnknownValue(ValueError):
    """A state, kind or runner that is none of its enum's values."""


class IllegalTransition(ValueError):
    """A state change the transition table does not allow."""


_Enum = TypeVar("_Enum", bound=StrEnum)


def member(enum: type[_Enum], value: str, what: str) -> _Enum:
    """`value` as a member of `enum`, or UnknownValue naming the values it may be."""
    try:
        return enum(value)
    except ValueError:
        raise UnknownValue(f"{value!r} is not {what}; it is one of "
                           f"{', '.join(enum)}") from None


def _check(table: Mapping, what: str, before: str, after: str) -> None:
    allowed = table[before]
    if after in allowed:
        return
    if not allowed:
        raise IllegalTransition(f"{what} cannot go from {before} to {after}: {before} is final")
    order = [state for state in table if state in allowed]  # the enum's order, not a set's
    raise IllegalTransition(f"{what} cannot go from {before} to {after}; from {before} it "
                            f"can go to {', '.join(order)}")


def check_trial_change(trial_id: int, before: str, after: str) -> TrialState:
    """The new state as a TrialState, or UnknownValue / IllegalTransition."""
    state = member(TrialState, after, "a trial state")
    _check(TRIAL_TRANSITIONS, f"trial {trial_id}", member(TrialState, before, "a trial state"),
           state)
    return state


def check_experiment_change(experiment_id: int, before: str, after: str) -> ExperimentState:
    """The new state as an ExperimentState, or UnknownValue / IllegalTransition."""
    state = member(ExperimentState, after, "an experiment state")
    _check(EXPERIMENT_TRANSITIONS, f"experiment {experiment_id}",
           member(ExperimentState, before, "an experiment state"), state)
    return state


def check_experiment_continuation(experiment_id: int, before: str) -> ExperimentState:
    """ACTIVE, the state a continued experiment takes; IllegalTransition from a state
    EXPERIMENT_CONTINUATIONS does not list (ACTIVE: it is not ended)."""
    if member(ExperimentState, before, "an experiment state") not in EXPERIMENT_CONTINUATIONS:
        raise IllegalTransition(f"experiment {experiment_id} is {before}, and only an ended or "
                                "paused experiment can be continued")
    return _E.ACTIVE


def check_trial_continuation(trial_id: int, before: str) -> TrialState:
    """QUEUED, the state a continued trial takes; IllegalTransition from RUNNING."""
    if member(TrialState, before, "a trial state") not in TRIAL_CONTINUATIONS:
        raise IllegalTransition(f"trial {trial_id} is {before}, and can be continued once it "
                                "has stopped")
    return _T.QUEUED
