"""The `random` searcher: `max_trials` trials, each with hyperparameters drawn at random
from their ranges, each trained to `max_length`, then closed.

    search = RandomSearch(config, experiment_seed)   # config["searcher"]["max_trials"] == 8
    search.initial_operations()   # Create/ValidateAfter pairs, max_concurrent_trials of them

Trial r's hyperparameters come from `np.random.default_rng([experiment_seed, r])`
(sources.RandomDraws), so the same seed always makes the same trials, whatever order they
are created or replayed in.
"""

from __future__ import annotations

from localdet.config.experiment import ConfigError
from localdet.search.methods.full_length import FullLengthSearch
from localdet.search.methods.sources import HparamSource, RandomDraws


class RandomSearch(FullLengthSearch):
    def hparam_source(self) -> HparamSource:
        max_trials = self.settings.searcher.max_trials
        if max_trials is None:  # parse_config refuses this: only a hand-made dict gets here
            raise ConfigError("missing required key 'searcher.max_trials'; the random searcher "
                              "needs it to know how many trials to run", "searcher.max_trials")
        return RandomDraws(self.settings.hyperparameters, self.experiment_seed, max_trials)
