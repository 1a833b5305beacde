"""Searchers decide which trials to create and how long each trains.

Each is a pure function of (config, experiment seed, recorded events) that returns
operations; the daemon carries them out and records what happened. As in Ray Tune, which
hyperparameters a trial gets (sources.py: random draws, grid points) is kept apart from how
long it trains (full_length.py for single, random and grid; asha.py's rungs); what every
search shares (a metric's ranking with NaN the worst, the pacing of max_concurrent_trials) is
in base.py.

    method = make_search_method(config, experiment_seed)
    for op in method.initial_operations(): ...
    method.on_validation_completed(request_id, metric, length)   # and the other events
    method.progress(batches_trained_by_request)   # 0..1
    method.rungs()                                # ASHA's rungs, for status ([] otherwise)
"""

from collections.abc import Callable, Mapping
from typing import Any

from localdet.config.typed import ExperimentConfig
from localdet.search.methods.asha import AdaptiveASHASearch
from localdet.search.methods.base import (
    Close,
    Create,
    Operation,
    SearchMethod,
    Shutdown,
    ValidateAfter,
    ranked,
    worst_if_nan,
)
from localdet.search.methods.custom import CustomSearch
from localdet.search.methods.grid import GridSearch
from localdet.search.methods.random import RandomSearch
from localdet.search.methods.single import SingleSearch
from localdet.search.methods.tpe import make_tpe_search

SEARCH_METHODS: dict[str, Callable[[ExperimentConfig, int], SearchMethod]] = {
    "single": SingleSearch,
    "grid": GridSearch,
    "random": RandomSearch,
    "adaptive_asha": AdaptiveASHASearch,
    # Determined's async_halving is one ASHA bracket (parse_config sets bracket_rungs).
    "async_halving": AdaptiveASHASearch,
    # Optuna's TPE proposes the hyperparameters (tpe.py); bayesian is its other name.
    "tpe": make_tpe_search,
    "bayesian": make_tpe_search,
    # A runner script's SearchMethod decides (localdet/operations/custom_search.py).
    "custom": CustomSearch,
}


def make_search_method(config: ExperimentConfig | Mapping[str, Any],
                       experiment_seed: int) -> SearchMethod:
    """The method the config's searcher names, from a typed config or a (stored) dict."""
    settings = ExperimentConfig.of(config)
    return SEARCH_METHODS[settings.searcher.name](settings, experiment_seed)


__all__ = [
    "SEARCH_METHODS",
    "AdaptiveASHASearch",
    "Close",
    "Create",
    "CustomSearch",
    "GridSearch",
    "Operation",
    "RandomSearch",
    "SearchMethod",
    "Shutdown",
    "SingleSearch",
    "ValidateAfter",
    "make_search_method",
    "make_tpe_search",
    "ranked",
    "worst_if_nan",
]
