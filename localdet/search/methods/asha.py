"""The `adaptive_asha` searcher: Determined's adaptive ASHA. Several brackets run side by
side, each an asynchronous successive halving (ASHA) with its own number of rungs; a
bracket with more rungs stops more trials early. A trial validates at the end of each rung
it reaches; the best 1/divisor of a rung go on training (from their checkpoints) to the
next rung, the rest wait and are closed once the bracket can promote nothing more.

    search = AdaptiveASHASearch(config, experiment_seed)
    search.initial_operations()          # Create/ValidateAfter pairs, bracket by bracket
    search.on_validation_completed(3, 0.41, 25)  # e.g. [ValidateAfter(3, 100)] (promoted)
    search.rungs()    # [{"bracket": 0, "rung": 0, "length": 25, "reached": 4, "promoted": 1}, ...]

    bracket_rung_counts(max_rungs=5, max_length_units=1000, max_trials=64, divisor=4,
                        mode="standard")                    # [4, 3, 2]
    bracket_max_trials(64, 4, [4, 3, 2])                    # [45, 14, 5]
    bracket_max_concurrent_trials(16, 4, [45, 14, 5])       # [6, 5, 5]

Request ids are shared by all brackets: 1, 2, 3... in creation order. Rung lengths are
computed in max_length's own unit (batches, records or epochs), then converted to batches:
for each trial with its own global_batch_size when that is searched, as Determined did.
A trial that exits early counts as the worst possible result at the rung it was training
for; the daemon has already ended it, so it is never promoted into training or closed (one
that exits while waiting keeps its result; should it be promoted later, it counts as the
worst result at the next rung). Only promotion-based ASHA is implemented (Determined's
`stop_once: false`). Which trials are promoted depends on the order results arrive in, as
in any asynchronous successive halving.

This is the scheduler half (how long each trial trains); which hyperparameters a trial gets
is sources.RandomDraws', as for `random`. Results reach a bracket already `base.ranked`
(smaller wins, NaN the worst), and a bracket paces its trials with `base.Pacing`.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from localdet.config.experiment import ConfigError
from localdet.config.typed import ExperimentConfig, Length
from localdet.search.methods.base import (
    Close,
    Operation,
    Pacing,
    Shutdown,
    ValidateAfter,
    ranked,
)
from localdet.search.methods.sources import HparamSource, RandomDraws

# Ranks below every real result (metrics are negated when larger is better, so smaller wins).
WORST = math.inf

MODES = ("aggressive", "standard", "conservative")


# -- how the search is split into brackets (Determined's formulas) ------------------------

def bracket_rung_counts(max_rungs: int, max_length_units: int, max_trials: int,
                        divisor: float, mode: str) -> list[int]:
    """Rungs per bracket, most rungs (most early stopping) first. max_rungs is first
    clamped so that the shortest rung is at least one unit long and the bottom rung has at
    least one trial per divisor**(rungs-1) to promote."""
    max_rungs = min(max_rungs,
                    int(math.log(max_length_units) / math.log(divisor)) + 1,
                    int(math.log(max_trials) / math.log(divisor)) + 1)
    if mode == "aggressive":
        counts = [max_rungs]
    elif mode == "standard":
        counts = list(range((max_rungs - 1) // 2 + 1, max_rungs + 1))
    elif mode == "conservative":
        counts = list(range(1, max_rungs + 1))
    else:
        raise ValueError(f"unknown adaptive_asha mode {mode!r}; expected one of {MODES}")
    return sorted(counts, reverse=True)


def bracket_max_trials(max_trials: int, divisor: float, rung_counts: list[int]) -> list[int]:
    """Trials per bracket, so that each bracket gets roughly the same total training: a
    bracket with R rungs weighs divisor**(R-1)/R; what rounding leaves goes to bracket 0."""
    weights = [divisor ** (rungs - 1) / rungs for rungs in rung_counts]
    total = sum(weights)
    trials = [max(int(weight / total * max_trials), 1) for weight in weights]
    trials[0] += max(max_trials - sum(trials), 0)
    return trials


def bracket_max_concurrent_trials(max_concurrent_trials: int, divisor: float,
                                  trials: list[int]) -> list[int]:
    """Trials each bracket runs at once: max_concurrent_trials split evenly (the remainder
    to the first brackets, every bracket at least one); 0 means max(the last bracket's
    trials, int(divisor)) each."""
    brackets = len(trials)
    if max_concurrent_trials == 0:
        return [max(trials[-1], int(divisor))] * brackets
    max_concurrent_trials = max(max_concurrent_trials, brackets)
    each, remainder = divmod(max_concurrent_trials, brackets)
    return [each + (1 if b < remainder else 0) for b in range(brackets)]


def rung_units(max_length_units: int, rungs: int, divisor: float) -> list[int]:
    """Each rung's length in max_length's unit: the top rung is max_length, each lower one
    divisor times shorter (rounded down, at least 1)."""
    return [max(int(max_length_units / divisor ** (rungs - 1 - i)), 1) for i in range(rungs)]


# -- one bracket: asynchronous successive halving ---------------------------------------

@dataclass
class Rung:
    length: int                                   # batches, in total (units if batch size varies)
    units: int = 0                                # in max_length's unit
    results: list[tuple[float, int]] = field(default_factory=list)  # (metric, request), best first
    promoted: set[int] = field(default_factory=set)  # promoted out of this rung


class Bracket:
    """One ASHA. `create(bracket)` makes a new trial (with the next request id) for it.
    Metrics come in ranked (`base.ranked`): smaller wins, NaN is already +inf."""

    def __init__(self, index: int, rung_lengths: list[int], max_trials: int,
                 max_concurrent_trials: int, divisor: float,
                 create: Callable[[Bracket], list[Operation]],
                 batches: Callable[[int, Rung], int] | None = None):
        """`batches(request, rung)`: the rung's length in batches for that trial (default:
        the rung's length, the same for all)."""
        self.index = index
        self.rungs = [Rung(length) for length in rung_lengths]
        self.batches = batches or (lambda _request, rung: rung.length)
        self.max_trials = max_trials
        self.max_concurrent_trials = max_concurrent_trials
        self.pacing = Pacing(max_trials, max_concurrent_trials)
        self.divisor = divisor
        self._create = create
        self.trials: list[int] = []      # request ids, in creation order
        self.rung_of: dict[int, int] = {}  # the rung a trial reached or is training for
        self.training: set[int] = set()  # training for rung_of[r], no result yet
        self.closed: set[int] = set()    # Close issued
        self.exited: set[int] = set()    # exited early
        self.confirmed_closed: set[int] = set()  # Closes the daemon carried out

    @property
    def top(self) -> int:
        return len(self.rungs) - 1

    def initial_operations(self) -> list[Operation]:
        ops: list[Operation] = []
        for _ in range(self.pacing.first()):
            ops += self._create(self)
        return ops

    def trial_created(self, request_id: int) -> None:
        self.pacing.count()
        self.trials.append(request_id)
        self.rung_of[request_id] = 0
        self.training.add(request_id)

    def on_validation_completed(self, request_id: int, metric: float,
                                length: int) -> list[Operation]:
        rung = self.rungs[self.rung_of[request_id]] if request_id in self.training else None
        if rung is None or length < self.batches(request_id, rung):
            return []  # not the validation its rung waits for (or a duplicate)
        return self._report(request_id, metric)

    def on_trial_exited_early(self, request_id: int) -> list[Operation]:
        if request_id in self.exited or request_id in self.closed:
            return []
        self.exited.add(request_id)
        if request_id in self.training:
            return self._report(request_id, WORST)
        return []  # it was waiting: its result stands; if promoted later it counts as WORST

    def on_trial_closed(self, request_id: int) -> None:
        if request_id in self.closed:
            self.confirmed_closed.add(request_id)

    @property
    def finished(self) -> bool:
        return (len(self.trials) == self.max_trials
                and all(r in self.closed or r in self.exited for r in self.trials))

    def progress(self) -> float:
        """As Determined: trials through the bottom rung over 1.2 x max_trials, then at least
        the share of trials completed."""
        reported = len(self.rungs[0].results)
        progress = reported / (1.2 * self.max_trials)
        if reported == self.max_trials:
            done = len(self.confirmed_closed) + len(self.exited)
            progress = max(done / self.max_trials, progress)
        return progress

    def _report(self, request_id: int, metric: float) -> list[Operation]:
        """Record the trial's result at its rung; promote, create or close as ASHA says."""
        ops: list[Operation] = []
        training_added = False
        while True:
            index = self.rung_of[request_id]
            rung = self.rungs[index]
            self.training.discard(request_id)
            if index == self.top:
                self._insert(rung, request_id, metric)
                if request_id not in self.exited:
                    ops.append(Close(request_id))
                    self.closed.add(request_id)
                break
            promoted = self._promotion(rung, request_id, metric)
            if promoted is None:
                break
            self.rung_of[promoted] = index + 1
            self.training.add(promoted)
            if promoted in self.exited:
                # It cannot train on: count it as the worst result in the next rung instead.
                request_id, metric = promoted, WORST
                continue
            ops.append(ValidateAfter(promoted, self.batches(promoted, self.rungs[index + 1])))
            training_added = True
            break
        # Keep the bracket busy: what did not go on training is replaced by a new trial.
        if not training_added and self.pacing.more():
            ops += self._create(self)
        if len(self.rungs[0].results) == self.max_trials:
            ops += self._close_out()
        return ops

    @staticmethod
    def _insert(rung: Rung, request_id: int, metric: float) -> int:
        # After equal metrics: the earlier result keeps its place.
        index = bisect.bisect_right(rung.results, metric, key=lambda result: result[0])
        rung.results.insert(index, (metric, request_id))
        return index

    def _promotion(self, rung: Rung, request_id: int, metric: float) -> int | None:
        """Which trial, if any, this result promotes out of the rung. With n results, the
        best int(n / divisor) deserve promotion; one more result raises that by at most one."""
        before = int(len(rung.results) / self.divisor)
        after = int((len(rung.results) + 1) / self.divisor)
        index = self._insert(rung, request_id, metric)
        if index < after:
            candidate = request_id
        elif after != before and rung.results[before][1] not in rung.promoted:
            candidate = rung.results[before][1]
        else:
            return None
        rung.promoted.add(candidate)
        return candidate

    def _close_out(self) -> list[Operation]:
        """Every trial has a bottom-rung result: close the waiting trials of each rung that
        nothing is training for any more, from the bottom up."""
        ops: list[Operation] = []
        for index, rung in enumerate(self.rungs):
            if any(self.rung_of[r] == index for r in self.training):
                break
            for _, request_id in rung.results:
                if (request_id not in rung.promoted and request_id not in self.closed
                        and request_id not in self.exited):
                    ops.append(Close(request_id))
                    self.closed.add(request_id)
        return ops


# -- the search ---------------------------------------------------------------------------

class AdaptiveASHASearch:
    def __init__(self, config: ExperimentConfig | Mapping[str, Any], experiment_seed: int):
        self.settings = settings = ExperimentConfig.of(config)
        self.experiment_seed = experiment_seed
        searcher = settings.searcher
        if searcher.max_length is None:
            raise ConfigError("missing required key 'searcher.max_length'; adaptive_asha needs "
                              "it to size its rungs", "searcher.max_length")
        if searcher.max_trials is None:  # parse_config refuses this: only a hand-made dict
            raise ConfigError("missing required key 'searcher.max_trials'; the adaptive_asha "
                              "searcher needs it to know how many trials to run",
                              "searcher.max_trials")
        # adaptive_asha's own settings are always filled (x-defaults-by-name in the schema)
        if searcher.divisor is None or searcher.max_rungs is None or searcher.mode is None:
            raise ConfigError("searcher.divisor, max_rungs and mode are unset; adaptive_asha "
                              "needs the config with the schema's defaults filled in",
                              "searcher")
        unit, units = searcher.max_length.unit, searcher.max_length.count
        divisor = searcher.divisor
        max_trials = searcher.max_trials
        counts = list(searcher.bracket_rungs or bracket_rung_counts(
            searcher.max_rungs, units, max_trials, divisor, searcher.mode))
        counts = sorted(counts, reverse=True)  # most early stopping first
        trials = bracket_max_trials(max_trials, divisor, counts)
        concurrency = bracket_max_concurrent_trials(searcher.max_concurrent_trials, divisor,
                                                    trials)
        # Which hyperparameters: drawn as `random` draws them, one counter for all brackets.
        self.source: HparamSource = RandomDraws(settings.hyperparameters, experiment_seed,
                                                max_trials)
        self.unit = unit
        self.per_trial = settings.batch_size_searched and unit != "batches"
        self.brackets = []
        for index, rungs in enumerate(counts):
            per_rung = rung_units(units, rungs, divisor)
            lengths = per_rung if self.per_trial else [
                settings.batches(Length(unit, n), "searcher.max_length") for n in per_rung]
            bracket = Bracket(index, lengths, trials[index], concurrency[index], divisor,
                              self._create, self._trial_batches if self.per_trial else None)
            for rung, n in zip(bracket.rungs, per_rung, strict=True):
                rung.units = n
            self.brackets.append(bracket)
        self.bracket_of: dict[int, Bracket] = {}
        self.smaller_is_better = searcher.smaller_is_better
        self.shut_down = False

    def initial_operations(self) -> list[Operation]:
        ops: list[Operation] = []
        for bracket in self.brackets:
            ops += bracket.initial_operations()
        return ops + self._shutdown_if_done()

    def on_validation_completed(self, request_id: int, metric: float,
                                length: int) -> list[Operation]:
        bracket = self.bracket_of.get(request_id)
        if bracket is None:
            return []
        return (bracket.on_validation_completed(request_id, ranked(metric, self.smaller_is_better),
                                                length)
                + self._shutdown_if_done())

    def on_trial_closed(self, request_id: int) -> list[Operation]:
        bracket = self.bracket_of.get(request_id)
        if bracket is not None:
            bracket.on_trial_closed(request_id)
        return self._shutdown_if_done()

    def on_trial_exited_early(self, request_id: int) -> list[Operation]:
        bracket = self.bracket_of.get(request_id)
        if bracket is None:
            return []
        return bracket.on_trial_exited_early(request_id) + self._shutdown_if_done()

    def progress(self, batches_trained: dict[int, int]) -> float:
        """The brackets' mean progress (Determined's; it ignores batches trained)."""
        return min(1.0, sum(b.progress() for b in self.brackets) / len(self.brackets))

    def rungs(self) -> list[dict]:
        """"length" in batches, or in max_length's unit ("unit") when each trial's batch size
        makes it a different number of batches."""
        unit = self.unit if self.per_trial else "batches"
        return [{"bracket": bracket.index, "rung": index, "length": rung.length, "unit": unit,
                 "reached": len(rung.results), "promoted": len(rung.promoted)}
                for bracket in self.brackets for index, rung in enumerate(bracket.rungs)]

    def _trial_batches(self, request_id: int, rung: Rung) -> int:
        return self.settings.batches(Length(self.unit, rung.units), "searcher.max_length",
                                     self.source.hparams(request_id))

    def _create(self, bracket: Bracket) -> list[Operation]:
        request_id = len(self.bracket_of) + 1  # one counter for all brackets
        self.bracket_of[request_id] = bracket
        bracket.trial_created(request_id)
        return [self.source.create(request_id),
                ValidateAfter(request_id, bracket.batches(request_id, bracket.rungs[0]))]

    def _shutdown_if_done(self) -> list[Operation]:
        if self.shut_down or not all(b.finished for b in self.brackets):
            return []
        self.shut_down = True
        return [Shutdown()]
