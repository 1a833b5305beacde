"""The `grid` searcher: one trial per point of the cartesian product of every
hyperparameter's values (see `hparams.grid_points` for the values and their order), each
trained to `max_length`, then closed.

    search = GridSearch(config, experiment_seed)
    len(search.points)            # the grid's size (config validation caps it at 10,000)
    search.initial_operations()   # Create/ValidateAfter pairs, max_concurrent_trials of them

Trial r gets point r-1. Seeds still come from the experiment seed, one per trial.
"""

from __future__ import annotations

import copy

from localdet.search.methods.full_length import FullLengthSearch
from localdet.search.methods.hparams import grid_points


class GridSearch(FullLengthSearch):
    def __init__(self, config: dict, experiment_seed: int):
        self.points = grid_points(config["hyperparameters"])
        super().__init__(config, experiment_seed)

    def trial_count(self) -> int:
        return len(self.points)

    def hparams(self, request_id: int) -> dict:
        return copy.deepcopy(self.points[request_id - 1])  # each trial its own values
