"""The operations searchers emit, the interface they implement, and what every search
shares: how a metric ranks (NaN the worst: `ranked`, `worst_if_nan`) and how many trials are
in flight (`Pacing`)."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Protocol, Union


@dataclass(frozen=True)
class Create:
    """Create a trial with these hyperparameters and this seed."""
    request_id: int
    hparams: dict
    seed: int


@dataclass(frozen=True)
class ValidateAfter:
    """Train the trial to `length` batches in total, then validate and report the metric."""
    request_id: int
    length: int


@dataclass(frozen=True)
class Close:
    """The trial is done: it trains no further."""
    request_id: int


@dataclass(frozen=True)
class Shutdown:
    """The search is over once running trials finish."""


Operation = Union[Create, ValidateAfter, Close, Shutdown]


class SearchMethod(Protocol):
    """A search is replayed from its recorded events: the daemon makes a fresh method from
    (config, experiment seed), calls `initial_operations()`, then feeds it every recorded
    event in order. So a method must be deterministic, keep all its state in memory, and
    draw randomness only from the experiment seed and request ids (see `derive_seed` and
    `hparams.sample`), never from the clock or a shared random stream.

    Request ids are the method's names for trials: 1, 2, 3... in creation order.
    `metric` is the searcher metric as reported; a method applies `smaller_is_better` itself.
    """

    def initial_operations(self) -> list[Operation]: ...

    def on_validation_completed(self, request_id: int, metric: float,
                                length: int) -> list[Operation]:
        """The trial trained to `length` batches (its last ValidateAfter) and validated."""

    def on_trial_closed(self, request_id: int) -> list[Operation]:
        """The daemon carried out Close(request_id): the trial is COMPLETED."""

    def on_trial_exited_early(self, request_id: int) -> list[Operation]:
        """The trial ended without finishing its ValidateAfter (ERROR after its restarts,
        or killed by the user)."""

    def progress(self, batches_trained: dict[int, int]) -> float:
        """0..1, from batches trained so far by request id."""

    def rungs(self) -> list[dict]:
        """For status: per rung, {"bracket", "rung", "length", "reached", "promoted"}; empty
        for methods without rungs."""


def derive_seed(experiment_seed: int, request_id: int) -> int:
    """A trial's seed: stable for (experiment seed, request), independent across requests."""
    digest = hashlib.sha256(f"{experiment_seed}:{request_id}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % (2**31)


# -- what every search shares ---------------------------------------------------------------

def worst_if_nan(metric: float, smaller_is_better: bool) -> float:
    """A NaN metric (a diverged trial) ranks nowhere: it counts as the worst possible result,
    infinity in the metric's own direction. Anything else is left as it is."""
    if math.isnan(metric):
        return math.inf if smaller_is_better else -math.inf
    return metric


def ranked(metric: float, smaller_is_better: bool) -> float:
    """The metric as searches compare results: smaller wins (negated when larger is better),
    and NaN loses to every number (+inf)."""
    metric = worst_if_nan(metric, smaller_is_better)
    return metric if smaller_is_better else -metric


@dataclass
class Pacing:
    """How many trials a search (or one ASHA bracket) creates: `total` in all, `first()` at
    the start (all of them when `limit` is 0), then one more each time `more()` says so. When
    a trial counts as gone (closed, or no longer training) is the scheduler's to say."""

    total: int
    limit: int   # trials in flight at most (the searcher's max_concurrent_trials); 0: no limit
    created: int = 0

    def first(self) -> int:
        """How many trials to create at the start."""
        return min(self.total, self.limit) if self.limit else self.total

    def more(self) -> bool:
        """Whether a trial may be created in place of one that is gone (never without a
        limit: all were created at the start)."""
        return self.created < self.total

    def count(self) -> None:
        """A trial was created."""
        self.created += 1
