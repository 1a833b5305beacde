"""Tests of the adaptive_asha searcher: bracket allocation against Determined's formulas,
promotions worked out by hand, replay, and simulated searches that must terminate."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from localdet.config.experiment import parse_config
from localdet.config.hparams import sample
from localdet.search.methods import (
    AdaptiveASHASearch,
    Close,
    Create,
    Shutdown,
    ValidateAfter,
    make_search_method,
)
from localdet.search.methods.asha import (
    bracket_max_concurrent_trials,
    bracket_max_trials,
    bracket_rung_counts,
    rung_units,
)
from localdet.search.methods.base import derive_seed

SPACE = {"global_batch_size": 32, "x": {"type": "double", "minval": 0.0, "maxval": 1.0}}


def asha_config(hyperparameters=SPACE, top: dict | None = None, **searcher) -> dict:
    raw = {"entrypoint": "model_def:Trial", "hyperparameters": copy.deepcopy(hyperparameters),
           "searcher": {"name": "adaptive_asha", "metric": "val_loss", **searcher}, **(top or {})}
    return parse_config(raw).config


class Simulation:
    """A fake daemon: carries out the operations (a Close is followed at once by
    on_trial_closed, as the daemon does), trains one pending trial at a time (the oldest
    first, or the newest with lifo=True) and reports `metric(request_id, hparams, length)`.
    A trial in `exits` exits early while training for its rung `exits[r]` (0 = its first),
    if it gets there; a negative rung -k: it exits while waiting, right after its k-th result
    if that leaves it waiting (neither promoted nor closed)."""

    def __init__(self, method, metric, exits: dict[int, int] | None = None, lifo: bool = False):
        self.method, self.metric, self.exits, self.lifo = method, metric, exits or {}, lifo
        self.events: list[tuple] = []     # replayable, in order
        self.answers: list[list] = []     # the operations answering each event
        self.creates: dict[int, Create] = {}
        self.targets: dict[int, list[int]] = {}  # each trial's ValidateAfter lengths
        self.pending: list[ValidateAfter] = []
        self.closed: list[int] = []
        self.exited: list[int] = []
        self.shutdowns = 0
        self.progress: list[float] = []

    def feed(self, event: tuple) -> None:
        self.events.append(event)
        kind, *args = event
        ops = getattr(self.method, kind)(*args)
        self.answers.append(ops)
        for op in ops:
            assert self.shutdowns == 0, f"{op} after Shutdown"
            if isinstance(op, Create):
                assert op.request_id == len(self.creates) + 1
                self.creates[op.request_id] = op
            elif isinstance(op, ValidateAfter):
                assert op.request_id not in self.closed and op.request_id not in self.exited
                self.targets.setdefault(op.request_id, []).append(op.length)
                self.pending.append(op)
            elif isinstance(op, Close):
                assert op.request_id not in self.closed and op.request_id not in self.exited
                assert not any(p.request_id == op.request_id for p in self.pending)
                self.closed.append(op.request_id)
                self.feed(("on_trial_closed", op.request_id))
            elif isinstance(op, Shutdown):
                self.shutdowns += 1

    def run(self) -> Simulation:
        self.feed(("initial_operations",))
        while self.pending:
            op = self.pending.pop(-1 if self.lifo else 0)
            self.progress.append(self.method.progress({}))
            rung = self.targets[op.request_id].index(op.length)
            if self.exits.get(op.request_id) == rung:
                self.exit(op.request_id)
                continue
            hparams = self.creates[op.request_id].hparams
            self.feed(("on_validation_completed", op.request_id,
                       self.metric(op.request_id, hparams, op.length), op.length))
            waiting = (op.request_id not in self.closed
                       and all(p.request_id != op.request_id for p in self.pending))
            if self.exits.get(op.request_id) == -(rung + 1) and waiting:
                self.exit(op.request_id)
        self.progress.append(self.method.progress({}))
        return self

    def exit(self, request_id: int) -> None:
        self.exited.append(request_id)
        self.feed(("on_trial_exited_early", request_id))

    def promoted(self) -> dict[int, list[int]]:
        """Request ids promoted into each rung > 0, in order (ValidateAfter after the first)."""
        by_rung: dict[int, list[int]] = {}
        for ops in self.answers:
            for op in ops:
                if isinstance(op, ValidateAfter):
                    rung = self.targets[op.request_id].index(op.length)
                    if rung:
                        by_rung.setdefault(rung, []).append(op.request_id)
        return by_rung


def quadratic(request_id, hparams, length):
    return (hparams["x"] - 0.3) ** 2 + 1 / length


# -- bracket allocation (Determined's formulas, worked by hand) ----------------------------------

def test_max_rungs_is_clamped_by_max_length_and_max_trials():
    # log(1000)/log(4) = 4.98 -> 5 rungs; log(100)/log(4) = 3.32 -> 4 rungs; max_rungs 5.
    assert bracket_rung_counts(5, 1000, 100, 4, "aggressive") == [4]
    assert bracket_rung_counts(5, 1000, 100, 4, "standard") == [4, 3, 2]       # from (4-1)//2+1
    assert bracket_rung_counts(5, 1000, 100, 4, "conservative") == [4, 3, 2, 1]
    assert bracket_rung_counts(3, 1000, 100, 4, "standard") == [3, 2]          # max_rungs wins
    assert bracket_rung_counts(5, 10, 100, 4, "aggressive") == [2]             # 10 units: 1.66 -> 2
    assert bracket_rung_counts(5, 1, 1, 4, "conservative") == [1]


def test_trials_per_bracket_follow_determineds_weights():
    # weights 4**3/4 = 16, 4**2/3 = 5.33, 4/2 = 2 (sum 23.33): 68.57, 22.86, 8.57 -> 68, 22, 8,
    # and the 2 left over go to bracket 0.
    assert bracket_max_trials(100, 4, [4, 3, 2]) == [70, 22, 8]
    # with 4**0/1 = 1 too (sum 24.33): 65.75, 21.92, 8.22, 4.11 -> 65, 21, 8, 4, plus 2.
    assert bracket_max_trials(100, 4, [4, 3, 2, 1]) == [67, 21, 8, 4]
    assert bracket_max_trials(100, 4, [4]) == [100]
    # every bracket gets at least one trial, even when its share rounds to 0
    assert bracket_max_trials(3, 4, [4, 3, 2, 1]) == [1, 1, 1, 1]


def test_concurrent_trials_per_bracket():
    assert bracket_max_concurrent_trials(16, 4, [70, 22, 8]) == [6, 5, 5]   # 16 = 5*3 + 1
    assert bracket_max_concurrent_trials(2, 4, [70, 22, 8]) == [1, 1, 1]    # at least 1 each
    assert bracket_max_concurrent_trials(0, 4, [70, 22, 8]) == [8, 8, 8]    # max(8, int(4))
    assert bracket_max_concurrent_trials(0, 4.5, [70, 2]) == [4, 4]         # max(2, int(4.5))


def test_rung_lengths_shrink_by_the_divisor():
    assert rung_units(1000, 4, 4) == [15, 62, 250, 1000]
    assert rung_units(10, 3, 4) == [1, 2, 10]   # 0.625 -> at least 1


def test_rungs_are_sized_in_max_lengths_unit_then_converted_to_batches():
    # 320 records per epoch at 32 per batch: 10 batches an epoch; rungs of 1, 4, 16 epochs.
    cfg = asha_config(top={"records_per_epoch": 320}, max_trials=16, max_length={"epochs": 16},
                      max_rungs=3, mode="aggressive")
    search = AdaptiveASHASearch(cfg, 0)
    assert [(r["bracket"], r["rung"], r["length"]) for r in search.rungs()] == [
        (0, 0, 10), (0, 1, 40), (0, 2, 160)]
    assert all(r["reached"] == 0 and r["promoted"] == 0 for r in search.rungs())


def test_search_from_config_splits_into_brackets():
    search = AdaptiveASHASearch(asha_config(max_trials=100, max_length=1000), 0)  # standard, /4
    assert [len(b.rungs) for b in search.brackets] == [4, 3, 2]
    assert [b.max_trials for b in search.brackets] == [70, 22, 8]
    assert [b.max_concurrent_trials for b in search.brackets] == [6, 5, 5]
    ops = search.initial_operations()
    creates = [op for op in ops if isinstance(op, Create)]
    assert [c.request_id for c in creates] == list(range(1, 17))  # one counter for all brackets
    assert [op.length for op in ops if isinstance(op, ValidateAfter)] == \
        [15] * 6 + [62] * 5 + [250] * 5
    for c in creates:
        assert c.hparams == sample(search.settings.hyperparameters,
                                   np.random.default_rng([0, c.request_id]))
        assert c.seed == derive_seed(0, c.request_id)
    explicit = AdaptiveASHASearch(
        asha_config(max_trials=10, max_length=64, bracket_rungs=[1, 3]), 0)
    assert [len(b.rungs) for b in explicit.brackets] == [3, 1]


# -- a worked case --------------------------------------------------------------------------------

# One bracket (aggressive) of 3 rungs (log2(8) + 1 = 4, clamped by max_rungs 3): 2, 4 and 8
# batches; 8 trials, 2 at a time. Each trial's result is fixed here (plus 1/length, the same
# for everyone in a rung) so the promotions can be worked out on paper:
WORKED_METRIC = {1: 5, 2: 3, 3: 4, 4: 1, 5: 6, 6: 2, 7: 8, 8: 7}
# Oldest pending first. Rung 0 (n results so far, promote if the new one ranks below
# int((n+1)/2), else the one at int(n/2) if that number grew and it is not promoted yet):
#   1: 5, n=0 -> none; create 3.           2: 3, n=1 -> rank 0 < 1: promote 2.
#   3: 4, n=2 -> rank 1, 1 -> none; create 4.
#   2 at rung 1: 3, n=0 -> none; create 5. 4: 1, n=3 -> rank 0 < 2: promote 4.
#   5: 6, n=4 -> rank 4, none; create 6.   4 at rung 1: 1, n=1 -> rank 0 < 1: promote 4 to 2.
#   6: 2, n=5 -> rank 1 < 3: promote 6.    4 at rung 2: top, Close 4; create 7.
#   6 at rung 1: 2, n=2 -> rank 1, 1 -> none; create 8.
#   7: 8, n=6 -> rank 6, 3 -> none.        8: 7, n=7 -> rank 6, 4 != 3: promote #3 = trial 3;
#     rung 0 is full and nobody trains for it: close 1, 5, 8, 7 (best first).
#   3 at rung 1: 4, n=3 -> rank 3, 2 != 1: promote #1 = trial 6; rung 1 now has nobody
#     training for it: close 2, 3.         6 at rung 2: top, Close 6; all done: Shutdown.
WORKED_ANSWERS = [
    [Create(1, ..., ...), ValidateAfter(1, 2), Create(2, ..., ...), ValidateAfter(2, 2)],
    [Create(3, ..., ...), ValidateAfter(3, 2)],
    [ValidateAfter(2, 4)],
    [Create(4, ..., ...), ValidateAfter(4, 2)],
    [Create(5, ..., ...), ValidateAfter(5, 2)],
    [ValidateAfter(4, 4)],
    [Create(6, ..., ...), ValidateAfter(6, 2)],
    [ValidateAfter(4, 8)],
    [ValidateAfter(6, 4)],
    [Close(4), Create(7, ..., ...), ValidateAfter(7, 2)],
    [],  # trial 4 closed
    [Create(8, ..., ...), ValidateAfter(8, 2)],
    [],
    [ValidateAfter(3, 4), Close(1), Close(5), Close(8), Close(7)],
    [], [], [], [],  # trials 1, 5, 8, 7 closed
    [ValidateAfter(6, 8), Close(2), Close(3)],
    [], [],
    [Close(6), Shutdown()],
    [],
]


def worked_config(**searcher) -> dict:
    return asha_config(**{"max_trials": 8, "max_length": {"batches": 8}, "divisor": 2,
                          "max_rungs": 3, "mode": "aggressive", "max_concurrent_trials": 2,
                          **searcher})


def shape(ops: list) -> list:
    """Creates compared by request id only: their hparams and seeds are tested elsewhere."""
    return [Create(op.request_id, ..., ...) if isinstance(op, Create) else op for op in ops]


@pytest.mark.parametrize("smaller_is_better", [True, False])
def test_worked_case_promotes_exactly_as_worked_out_by_hand(smaller_is_better):
    sign = 1 if smaller_is_better else -1  # larger is better: the same order, negated

    def metric(request_id, hparams, length):
        return sign * (WORKED_METRIC[request_id] + 1 / length)

    sim = Simulation(make_search_method(worked_config(smaller_is_better=smaller_is_better), 3),
                     metric).run()
    assert [shape(ops) for ops in sim.answers] == WORKED_ANSWERS
    assert sim.promoted() == {1: [2, 4, 6, 3], 2: [4, 6]}
    assert [(r["rung"], r["length"], r["reached"], r["promoted"]) for r in sim.method.rungs()] == [
        (0, 2, 8, 4), (1, 4, 4, 2), (2, 8, 2, 0)]
    assert sim.method.progress({}) == 1.0


def test_a_trial_exiting_early_counts_as_the_worst_result():
    # Divisor 2, 2 rungs (4 and 8 batches), 4 trials, 1 at a time. Trial 1 validates (1.0)
    # and then exits while waiting. Trial 2 (2.0) makes one promotion due (int(2/2) = 1) but
    # ranks 1, so it falls to rank 0, trial 1, which cannot train: it counts as the worst
    # result at rung 1 (and is never closed by the searcher) and a new trial is made instead.
    # Trial 3 (3.0, int(3/2) = 1 still) promotes nobody; trial 4 (0.5) ranks 0 < int(4/2):
    # promoted at once; rung 0 is then full with nobody training for it: close 2 and 3.
    search = make_search_method(asha_config(max_trials=4, max_length=8, divisor=2, max_rungs=2,
                                            mode="aggressive", max_concurrent_trials=1), 0)
    assert shape(search.initial_operations()) == [Create(1, ..., ...), ValidateAfter(1, 4)]
    assert shape(search.on_validation_completed(1, 1.0, 4)) == [Create(2, ..., ...),
                                                                  ValidateAfter(2, 4)]
    assert search.on_trial_exited_early(1) == []
    assert shape(search.on_validation_completed(2, 2.0, 4)) == [Create(3, ..., ...),
                                                                  ValidateAfter(3, 4)]
    assert shape(search.on_validation_completed(3, 3.0, 4)) == [Create(4, ..., ...),
                                                                  ValidateAfter(4, 4)]
    assert search.on_validation_completed(4, 0.5, 4) == [ValidateAfter(4, 8), Close(2), Close(3)]
    assert search.on_trial_closed(2) == [] and search.on_trial_closed(3) == []
    assert search.on_validation_completed(4, 0.7, 8) == [Close(4), Shutdown()]
    assert search.on_trial_closed(4) == []
    assert [(r["reached"], r["promoted"]) for r in search.rungs()] == [(4, 2), (2, 0)]
    assert search.progress({}) == 1.0


def test_a_trial_exiting_while_training_is_replaced_and_never_closed():
    search = make_search_method(asha_config(max_trials=2, max_length=8, divisor=2, max_rungs=2,
                                            mode="aggressive", max_concurrent_trials=2), 0)
    search.initial_operations()
    assert search.on_trial_exited_early(1) == []  # the worst at rung 0; both trials exist
    assert search.on_validation_completed(2, 5.0, 4) == [ValidateAfter(2, 8)]  # 1 of 2: promoted
    assert search.on_validation_completed(2, 4.0, 8) == [Close(2), Shutdown()]


def test_validations_short_of_the_rung_and_unknown_trials_are_ignored():
    search = make_search_method(worked_config(), 0)
    search.initial_operations()
    assert search.on_validation_completed(1, 1.0, 1) == []    # rung 0 is 2 batches
    assert search.on_validation_completed(99, 1.0, 2) == []
    assert search.on_trial_exited_early(99) == []
    assert search.rungs()[0]["reached"] == 0


def test_adaptive_asha_needs_max_length():
    cfg = asha_config(max_trials=4, max_length=8)
    cfg["searcher"]["max_length"] = None
    with pytest.raises(ValueError, match="searcher.max_length"):
        AdaptiveASHASearch(cfg, 0)


# -- replay and termination -----------------------------------------------------------------------

SIMULATIONS = [
    # (searcher fields, trials that exit early: see Simulation)
    ({"max_trials": 20, "max_length": 64, "mode": "standard"}, {}),
    ({"max_trials": 30, "max_length": 256, "mode": "conservative", "divisor": 3},
     {5: 1, 7: 0, 2: -1, 3: -1, 4: -1}),
    ({"max_trials": 16, "max_length": 100, "mode": "aggressive", "max_concurrent_trials": 0},
     {2: 0, 9: -1, 10: -1, 11: -1}),
    ({"max_trials": 40, "max_length": {"batches": 81}, "divisor": 3, "max_concurrent_trials": 3,
      "smaller_is_better": False}, {1: 1, 12: 0, 20: -1, 21: -1}),
    ({"max_trials": 9, "max_length": 50, "bracket_rungs": [3, 1], "divisor": 2.5}, {}),
]


@pytest.mark.parametrize("lifo", [False, True])
@pytest.mark.parametrize("searcher, exits", SIMULATIONS)
def test_a_simulated_search_terminates_with_every_trial_closed_or_exited(searcher, exits, lifo):
    cfg = asha_config(**searcher)
    sim = Simulation(make_search_method(cfg, 7), quadratic, exits, lifo).run()
    created = set(sim.creates)
    assert created == set(range(1, searcher["max_trials"] + 1))
    assert sorted(sim.closed + sim.exited) == sorted(created)  # each exactly once
    assert bool(sim.exited) == bool(exits)
    assert sim.shutdowns == 1  # and nothing after it (Simulation.feed checks)
    assert [op for ops in sim.answers for op in ops][-1] == Shutdown()
    for lengths in sim.targets.values():
        assert lengths == sorted(lengths)  # promotions only ever train further
    brackets = sim.method.brackets
    for bracket in brackets:
        # ASHA's promise: the best int(n / divisor) of each rung's n results went on.
        for rung in bracket.rungs[:-1]:
            best = [r for _, r in rung.results[:int(len(rung.results) / bracket.divisor)]]
            assert set(best) <= rung.promoted
        for r in bracket.trials:  # a trial trained to its rung's length, or exited
            assert r in sim.exited or sim.targets[r][-1] == bracket.rungs[bracket.rung_of[r]].length
    assert sim.progress == sorted(sim.progress) and sim.progress[-1] == 1.0
    reached = {(r["bracket"], r["rung"]): r for r in sim.method.rungs()}
    for (b, i), rung in reached.items():  # what was promoted out of a rung reached the next
        if i + 1 < len(brackets[b].rungs):
            assert reached[(b, i + 1)]["reached"] == rung["promoted"]


@pytest.mark.parametrize("searcher, exits", SIMULATIONS)
def test_replaying_the_same_events_gives_the_same_operations(searcher, exits):
    cfg = asha_config(**searcher)
    sim = Simulation(make_search_method(cfg, 11), quadratic, exits).run()
    fresh = make_search_method(copy.deepcopy(cfg), 11)
    replayed = [getattr(fresh, kind)(*args) for kind, *args in sim.events]
    assert replayed == sim.answers
    assert fresh.rungs() == sim.method.rungs()
    # Another experiment seed draws other hparams, so makes other decisions.
    other = Simulation(make_search_method(cfg, 12), quadratic, exits).run()
    assert [c.hparams for c in other.creates.values()] != [c.hparams for c in sim.creates.values()]


def test_the_best_trial_gets_to_the_top_rung():
    # A bracket with rungs promotes the best at each rung: the trial nearest x = 0.3 of those
    # made before the bracket filled its bottom rung reaches the top.
    cfg = asha_config(max_trials=16, max_length=64, mode="aggressive", max_concurrent_trials=16)
    sim = Simulation(make_search_method(cfg, 5), quadratic).run()
    best = min(sim.creates, key=lambda r: abs(sim.creates[r].hparams["x"] - 0.3))
    assert sim.targets[best][-1] == 64
