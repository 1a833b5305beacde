"""The `random` searcher: `max_trials` trials, each with hyperparameters drawn at random
from their ranges, each trained to `max_length`, then closed.

    search = RandomSearch(config, experiment_seed)   # config["searcher"]["max_trials"] == 8
    search.initial_operations()   # Create/ValidateAfter pairs, max_concurrent_trials of them

Trial r's hyperparameters come from `np.random.default_rng([experiment_seed, r])`, so the
same seed always makes the same trials, whatever order they are created or replayed in.
"""

from __future__ import annotations

import numpy as np

from localdet.search.methods.full_length import FullLengthSearch
from localdet.search.methods.hparams import sample


class RandomSearch(FullLengthSearch):
    def trial_count(self) -> int:
        return self.config["searcher"]["max_trials"]

    def hparams(self, request_id: int) -> dict:
        rng = np.random.default_rng([self.experiment_seed, request_id])
        return sample(self.config["hyperparameters"], rng)
