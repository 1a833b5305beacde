"""Pause, resume, kill and process exits: the one state machine every timing question goes
through. The daemon (and `localdet run`) apply what it answers; nothing else decides.

    after = on_request("resume", TrialPhase(TrialState.RUNNING, PAUSING))
    after.phase            # TrialPhase(RUNNING, REQUEUE): launched again once it exits
    on_exit(TrialPhase(TrialState.RUNNING, REQUEUE), Exit(clean=True, reached_end=False)).phase
                           # TrialPhase(QUEUED, None)

A trial's phase is its state and, while RUNNING, what it has been asked (`stop_requested`):

    None      training, nothing asked
    PAUSE     asked to checkpoint and stop at its next workload boundary; not seen yet
    PAUSING   the trial saw the request (`TrialReporter.should_pause` answered True once):
              it is checkpointing and will exit
    REQUEUE   it is pausing, but a resume came since (or the daemon holds it while the disk
              is short of space): it is queued again once it has exited

Requests arrive at any moment of a trial's life (queued, launching, training, pausing,
checkpointing, exiting, restarting) and in any order; each transition depends only on the
phase, so the end state is the one the last request implies. The trial's own acknowledgement
(PAUSE -> PAUSING, one SQLite transaction) is what makes a resume in the pausing window
safe: a resume before it cancels the pause, a resume after it relaunches the trial.

Every state change answered here is one that `states.TRIAL_TRANSITIONS` and
`states.EXPERIMENT_TRANSITIONS` list, the table StateDB enforces on every write
(tests/test_states.py walks every phase, request and exit through both).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from localdet.records.states import TERMINAL_STATES, ExperimentState, StopRequest, TrialState

ACTIONS = ("pause", "resume", "kill")

PAUSE = StopRequest.PAUSE
PAUSING = StopRequest.PAUSING
REQUEUE = StopRequest.REQUEUE
STOPS = (None, *StopRequest)
# What status shows for a running trial stopping at its next boundary to be launched again
# (describe()); a phase, never stored.
REQUEUING = "REQUEUING"


@dataclass(frozen=True)
class TrialPhase:
    state: str
    stop: str | None = None

    @property
    def live(self) -> bool:
        return self.state not in TERMINAL_STATES

    @property
    def pausing(self) -> bool:
        """Running, but a pause is under way (asked or acknowledged) and not undone."""
        return self.state == TrialState.RUNNING and self.stop in (PAUSE, PAUSING)

    def describe(self) -> str:
        """What status shows: the state, or where a request has taken it meanwhile."""
        if self.pausing:
            return PAUSING
        if self.state == TrialState.RUNNING and self.stop == REQUEUE:
            return REQUEUING
        return self.state


@dataclass(frozen=True)
class RequestOutcome:
    phase: TrialPhase
    kill_process: bool = False   # end the trial's process group now


def on_request(action: str, phase: TrialPhase) -> RequestOutcome:
    """A request reaching one trial (a request for the experiment reaches each of its
    trials)."""
    state, stop = phase.state, phase.stop
    if state in TERMINAL_STATES:
        return RequestOutcome(phase)
    if action == "kill":
        return RequestOutcome(TrialPhase(TrialState.CANCELED),
                              kill_process=state == TrialState.RUNNING)
    if action == "pause":
        if state == TrialState.QUEUED:
            return RequestOutcome(TrialPhase(TrialState.PAUSED))
        if state == TrialState.RUNNING:
            pausing: dict[str | None, str | None] = {None: PAUSE, REQUEUE: PAUSING}
            return RequestOutcome(TrialPhase(TrialState.RUNNING, pausing.get(stop, stop)))
        return RequestOutcome(phase)  # PAUSED stays; WAITING runs nothing to pause
    if action == "resume":
        if state == TrialState.PAUSED:
            return RequestOutcome(TrialPhase(TrialState.QUEUED))
        if state == TrialState.RUNNING:
            resuming: dict[str | None, str | None] = {PAUSE: None, PAUSING: REQUEUE}
            return RequestOutcome(TrialPhase(TrialState.RUNNING, resuming.get(stop, stop)))
        return RequestOutcome(phase)
    raise ValueError(f"unknown action {action!r}; it is one of {', '.join(ACTIONS)}")


def hold(phase: TrialPhase) -> TrialPhase:
    """The daemon stops a running trial for a while (the disk is short of space): it
    checkpoints at its next boundary, exits and is queued again, launched once the daemon
    launches again. A pause under way stays a pause."""
    if phase.state == TrialState.RUNNING and phase.stop is None:
        return TrialPhase(TrialState.RUNNING, REQUEUE)
    return phase


def applies(action: str, phase: TrialPhase) -> bool:
    """Whether the request would change this trial: what `localdet ACTION` checks before
    recording one (a request that changes nothing is refused with the reason)."""
    return on_request(action, phase) != RequestOutcome(phase)


def acknowledge(stop: str | None) -> str | None:
    """What the trial's own `should_pause` leaves: a pause it has now seen is PAUSING."""
    return PAUSING if stop == PAUSE else stop


@dataclass(frozen=True)
class Exit:
    """How a trial's process ended."""
    clean: bool          # exit status 0 (or, for a process not ours, its records say so)
    reached_end: bool    # trained to its length and checkpointed


@dataclass(frozen=True)
class ExitOutcome:
    """`phase` is final unless `judge` says the daemon must judge the exit further:
    "complete" (the searcher decides) or "failed" (restart or error; `restart_to` is the
    state a restart goes back to)."""
    phase: TrialPhase | None = None
    judge: str | None = None
    restart_to: str = TrialState.QUEUED


def on_exit(phase: TrialPhase, exit: Exit) -> ExitOutcome:
    """The process of a RUNNING trial ended (a trial no longer RUNNING was settled when it
    was killed)."""
    stop = phase.stop
    if exit.clean and not exit.reached_end and stop in (PAUSE, PAUSING):
        return ExitOutcome(TrialPhase(TrialState.PAUSED))  # checkpointed at a boundary, as asked
    if exit.clean and not exit.reached_end and stop == REQUEUE:
        return ExitOutcome(TrialPhase(TrialState.QUEUED))  # paused, then resumed meanwhile
    if exit.clean:
        return ExitOutcome(judge="complete")
    # A failure while a pause was under way restarts it paused: it was asked to stop.
    return ExitOutcome(judge="failed", restart_to=(TrialState.PAUSED if stop in (PAUSE, PAUSING)
                                                   else TrialState.QUEUED))


def settle(experiment_state: str, trial_states: Iterable[str]) -> str | None:
    """The experiment state its trials now imply (None: leave it). Ending it when every
    trial has ended is the daemon's (it needs the errors); this is the timing rule: an ACTIVE
    experiment whose live trials are all PAUSED (or waiting on them) is PAUSED, never left
    with nothing running and nothing to run."""
    if experiment_state == ExperimentState.ACTIVE and all_paused(trial_states):
        return ExperimentState.PAUSED
    return None


def all_paused(trial_states: Iterable[str]) -> bool:
    """Some trial is PAUSED, and every other live one is too or waits on the searcher:
    nothing runs and nothing is queued to run."""
    live = [s for s in trial_states if s not in TERMINAL_STATES]
    return TrialState.PAUSED in live \
        and all(s in (TrialState.PAUSED, TrialState.WAITING) for s in live)


def held(experiment_state: str, trial_state: str) -> bool:
    """A trial queued under a PAUSED experiment (a restart after a failure, a trial the
    searcher made) waits PAUSED: only an ACTIVE experiment's trials are launched."""
    return experiment_state == ExperimentState.PAUSED and trial_state == TrialState.QUEUED


def experiment_after(action: str, experiment_state: str, whole_experiment: bool) -> str:
    """The experiment's state once a request is carried out (before `settle`)."""
    if experiment_state in TERMINAL_STATES:
        return experiment_state
    if action == "kill":
        return ExperimentState.CANCELED if whole_experiment else experiment_state
    if action == "pause":
        return ExperimentState.PAUSED if whole_experiment else experiment_state
    # A resumed trial can only run under an ACTIVE experiment.
    return ExperimentState.ACTIVE
