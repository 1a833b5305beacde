"""Which hyperparameters each trial gets: the "searcher" half of a search, kept apart from
the "scheduler" half that decides how long trials train (full_length.py: each to max_length;
asha.py: rungs and promotions), as Ray Tune keeps searchers apart from schedulers.

    source = RandomDraws(settings.hyperparameters, experiment_seed, count=8)
    source.create(3)      # Create(3, hparams drawn for request 3, derive_seed(seed, 3))
    GridPoints(space, experiment_seed).count   # the grid's size

A source answers for any request id in any order, the same every time: a search is replayed
from its recorded events (see base.SearchMethod), so request r's trial must come out the
same whichever trials were created before it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np

from localdet.config.hparams import grid_points, sample
from localdet.search.methods.base import Create, derive_seed


class HparamSource:
    """`count` trials' hyperparameters; `hparams(r)` for request r (1..count)."""

    count: int

    def __init__(self, experiment_seed: int):
        self.experiment_seed = experiment_seed

    def hparams(self, request_id: int) -> dict[str, Any]:
        raise NotImplementedError

    def create(self, request_id: int) -> Create:
        """The trial for request r: its hyperparameters and its seed."""
        return Create(request_id, self.hparams(request_id),
                      derive_seed(self.experiment_seed, request_id))


class RandomDraws(HparamSource):
    """Drawn at random from the ranges (constants as they are), request r's from
    `np.random.default_rng([experiment_seed, r])`: `single`, `random` and `adaptive_asha`."""

    def __init__(self, space: Mapping[str, Any], experiment_seed: int, count: int):
        super().__init__(experiment_seed)
        self.space = space
        self.count = count

    def hparams(self, request_id: int) -> dict[str, Any]:
        return sample(self.space, np.random.default_rng([self.experiment_seed, request_id]))


class GridPoints(HparamSource):
    """Every point of the grid (`hparams.grid_points`), request r getting point r-1: `grid`."""

    def __init__(self, space: Mapping[str, Any], experiment_seed: int):
        super().__init__(experiment_seed)
        self.points = grid_points(space)
        self.count = len(self.points)

    def hparams(self, request_id: int) -> dict[str, Any]:
        return copy.deepcopy(self.points[request_id - 1])  # each trial its own values
