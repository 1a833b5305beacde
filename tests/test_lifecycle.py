"""The lifecycle state machine on its own: its transitions, and 5,000 random interleavings of
requests with a simulated trial process (launch, workload boundaries where it may see a
pause, checkpoint-and-exit, crash, end of training). `test_request_races.py` drives the same
machine through a real daemon."""

from __future__ import annotations

import random

import pytest

from localdet.records.lifecycle import (
    PAUSE,
    PAUSING,
    REQUEUE,
    Exit,
    TrialPhase,
    acknowledge,
    applies,
    experiment_after,
    held,
    on_exit,
    on_request,
    settle,
)


@pytest.mark.parametrize("action, before, after", [
    ("pause", TrialPhase("QUEUED"), TrialPhase("PAUSED")),
    ("pause", TrialPhase("RUNNING"), TrialPhase("RUNNING", PAUSE)),
    ("pause", TrialPhase("RUNNING", REQUEUE), TrialPhase("RUNNING", PAUSING)),
    ("resume", TrialPhase("PAUSED"), TrialPhase("QUEUED")),
    ("resume", TrialPhase("RUNNING", PAUSE), TrialPhase("RUNNING")),         # not seen: cancelled
    ("resume", TrialPhase("RUNNING", PAUSING), TrialPhase("RUNNING", REQUEUE)),  # seen: relaunch
    ("kill", TrialPhase("RUNNING", PAUSING), TrialPhase("CANCELED")),
    ("kill", TrialPhase("COMPLETED"), TrialPhase("COMPLETED")),
])
def test_a_request_moves_a_trial_by_its_phase_alone(action, before, after):
    assert on_request(action, before).phase == after
    assert on_request(action, before).kill_process == (action == "kill"
                                                       and before.state == "RUNNING")


def test_the_exit_of_a_trial_that_paused_then_was_resumed_queues_it_again():
    phase = TrialPhase("RUNNING", acknowledge(PAUSE))
    phase = on_request("resume", phase).phase
    assert phase.describe() == "REQUEUING"
    assert on_exit(phase, Exit(clean=True, reached_end=False)).phase == TrialPhase("QUEUED")
    # Trained to the end before it could pause: the searcher judges it as any other.
    assert on_exit(TrialPhase("RUNNING", PAUSE), Exit(True, True)).judge == "complete"
    # A crash while pausing restarts it paused; otherwise queued.
    assert on_exit(TrialPhase("RUNNING", PAUSING), Exit(False, False)).restart_to == "PAUSED"
    assert on_exit(TrialPhase("RUNNING", REQUEUE), Exit(False, False)).restart_to == "QUEUED"


def test_an_experiment_with_only_paused_trials_left_is_paused():
    assert settle("ACTIVE", ["PAUSED", "COMPLETED"]) == "PAUSED"
    assert settle("ACTIVE", ["PAUSED", "WAITING"]) == "PAUSED"
    assert settle("ACTIVE", ["PAUSED", "RUNNING"]) is None
    assert settle("ACTIVE", ["PAUSED", "QUEUED"]) is None
    assert held("PAUSED", "QUEUED") and not held("ACTIVE", "QUEUED")
    assert experiment_after("resume", "PAUSED", whole_experiment=False) == "ACTIVE"
    assert experiment_after("kill", "ACTIVE", whole_experiment=False) == "ACTIVE"
    assert not applies("resume", TrialPhase("RUNNING")) and applies("resume", TrialPhase(
        "RUNNING", PAUSING))


class SimulatedTrial:
    """A trial's process as the machine sees it: launched from QUEUED, it trains workloads,
    asks at each boundary whether to pause, and exits after pausing, at its end, or by a
    crash (restarted once)."""

    def __init__(self, rng: random.Random, workloads: int = 4):
        self.rng, self.phase, self.left, self.exiting, self.restarts = (
            rng, TrialPhase("QUEUED"), workloads, None, 0)

    def request(self, action: str) -> None:
        self.phase = on_request(action, self.phase).phase
        if self.phase.state != "RUNNING":
            self.exiting = None  # killed, or never running

    def process_step(self) -> None:
        if self.phase.state == "QUEUED":
            self.phase, self.exiting = TrialPhase("RUNNING"), None
        elif self.phase.state == "RUNNING" and self.exiting is not None:
            outcome = on_exit(self.phase, self.exiting)
            if outcome.phase is not None:
                self.phase = outcome.phase
            elif outcome.judge == "complete":
                self.phase = TrialPhase("COMPLETED")
            else:
                self.restarts += 1
                self.phase = TrialPhase(outcome.restart_to if self.restarts <= 1 else "ERROR")
            self.exiting = None
        elif self.phase.state == "RUNNING":
            if self.rng.random() < 0.1:
                self.exiting = Exit(clean=False, reached_end=False)
                return
            self.left -= 1
            if self.left <= 0:
                self.exiting = Exit(clean=True, reached_end=True)
            elif self.phase.stop == PAUSE:  # it sees the request at this boundary
                self.phase = TrialPhase("RUNNING", acknowledge(self.phase.stop))
                self.exiting = Exit(clean=True, reached_end=False)

    def run_out(self) -> None:
        for _ in range(100):
            self.process_step()


def test_random_interleavings_end_where_the_last_request_says():
    for seed in range(5000):
        rng = random.Random(seed)
        trial, words = SimulatedTrial(rng), []
        for _ in range(rng.randint(1, 8)):
            if rng.random() < 0.5:
                words.append(rng.choice(["pause", "resume", "pause", "resume", "kill"]))
                trial.request(words[-1])
            else:
                trial.process_step()
        trial.run_out()
        state = trial.phase.state
        assert state not in ("RUNNING", "QUEUED") and trial.phase.stop is None, (seed, words)
        if state == "ERROR":
            continue  # crashed twice: out of restarts whatever was asked
        last = "kill" if "kill" in words else (words[-1] if words else "resume")
        expected = {"kill": "CANCELED", "pause": "PAUSED", "resume": "COMPLETED"}[last]
        # A pause or kill that came after the last workload found nothing left to stop.
        assert state == expected or (state == "COMPLETED" and trial.left <= 0), (
            seed, words, state)
