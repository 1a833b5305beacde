"""Searchers decide which trials to create and how long each trains.

Each is a pure function of (config, experiment seed, recorded events) that returns
operations; the daemon carries them out and records what happened.

    method = make_search_method(config, experiment_seed)
    for op in method.initial_operations(): ...
    method.on_validation_completed(request_id, metric, length)   # and the other events
    method.progress(batches_trained_by_request)   # 0..1
    method.rungs()                                # ASHA's rungs, for status ([] otherwise)
"""

from localdet.search.methods.asha import AdaptiveASHASearch
from localdet.search.methods.base import (
    Close,
    Create,
    Operation,
    SearchMethod,
    Shutdown,
    ValidateAfter,
)
from localdet.search.methods.grid import GridSearch
from localdet.search.methods.random import RandomSearch
from localdet.search.methods.single import SingleSearch

SEARCH_METHODS = {
    "single": SingleSearch,
    "grid": GridSearch,
    "random": RandomSearch,
    "adaptive_asha": AdaptiveASHASearch,
}


def make_search_method(config: dict, experiment_seed: int) -> SearchMethod:
    return SEARCH_METHODS[config["searcher"]["name"]](config, experiment_seed)


__all__ = [
    "SEARCH_METHODS",
    "AdaptiveASHASearch",
    "Close",
    "Create",
    "GridSearch",
    "Operation",
    "RandomSearch",
    "SearchMethod",
    "Shutdown",
    "SingleSearch",
    "ValidateAfter",
    "make_search_method",
]
