"""The `grid` searcher: one trial per point of the cartesian product of every
hyperparameter's values (see `hparams.grid_points` for the values and their order), each
trained to `max_length`, then closed.

    search = GridSearch(config, experiment_seed)
    len(search.points)            # the grid's size (config validation caps it at 10,000)
    search.initial_operations()   # Create/ValidateAfter pairs, max_concurrent_trials of them

Trial r gets point r-1. Seeds still come from the experiment seed, one per trial.
"""

from __future__ import annotations

from typing import Any

from localdet.search.methods.full_length import FullLengthSearch
from localdet.search.methods.sources import GridPoints, HparamSource


class GridSearch(FullLengthSearch):
    def hparam_source(self) -> HparamSource:
        return GridPoints(self.settings.hyperparameters, self.experiment_seed)

    @property
    def points(self) -> list[dict[str, Any]]:
        if not isinstance(self.source, GridPoints):  # hparam_source() makes one
            raise TypeError(f"a grid search draws its points from GridPoints, not from "
                            f"{type(self.source).__name__}")
        return self.source.points
