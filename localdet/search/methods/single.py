"""The `single` searcher: one trial, trained to `max_length`, then closed.

Hyperparameters given as ranges are drawn once, from the experiment seed, as Determined's
single searcher does. A script's run may leave max_length out: its target is then 0
batches, meaning the script's own epochs decide (the harness records the real target).

    search = SingleSearch(config, experiment_seed)
    search.initial_operations()        # [Create(1, hparams, seed), ValidateAfter(1, max_length)]
    search.on_validation_completed(1, 0.12, max_length)   # [Close(1), Shutdown()]
"""

from __future__ import annotations

from localdet.search.methods.full_length import FullLengthSearch
from localdet.search.methods.sources import HparamSource, RandomDraws

REQUEST_ID = 1


class SingleSearch(FullLengthSearch):
    def hparam_source(self) -> HparamSource:
        return RandomDraws(self.settings.hyperparameters, self.experiment_seed, count=1)
