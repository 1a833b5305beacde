"""What every search method shares (localdet/search/methods/base.py and sources.py): a NaN
metric ranks as the worst result, max_concurrent_trials pacing, and the hyperparameter
sources that say which trial gets which values, apart from how long it trains."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

from localdet.config.experiment import parse_config
from localdet.config.hparams import sample
from localdet.search.methods import Create, ValidateAfter, make_search_method
from localdet.search.methods.base import Pacing, derive_seed, ranked, worst_if_nan
from localdet.search.methods.sources import GridPoints, RandomDraws

NAN = float("nan")


# -- NaN ranks as the worst result -------------------------------------------------------------

@pytest.mark.parametrize("smaller_is_better, worst", [(True, math.inf), (False, -math.inf)])
def test_nan_becomes_the_worst_value_in_the_metrics_direction(smaller_is_better, worst):
    assert worst_if_nan(NAN, smaller_is_better) == worst
    assert worst_if_nan(0.25, smaller_is_better) == 0.25
    assert ranked(NAN, smaller_is_better) == math.inf  # loses to every number either way


def test_ranked_puts_the_better_metric_first_in_both_directions():
    assert ranked(0.1, True) < ranked(0.2, True)
    assert ranked(0.9, False) < ranked(0.2, False)
    assert ranked(-1e300, False) < ranked(NAN, False)


def asha(smaller_is_better: bool):
    # One bracket, 2 rungs (4 and 8 batches), 2 trials both at once: the better result of
    # the two is promoted.
    return make_search_method(parse_config({
        "entrypoint": "model_def:Trial",
        "hyperparameters": {"global_batch_size": 8, "x": {"type": "double", "minval": 0,
                                                          "maxval": 1}},
        "searcher": {"name": "adaptive_asha", "metric": "m", "max_length": 8, "max_trials": 2,
                     "divisor": 2, "max_rungs": 2, "mode": "aggressive",
                     "max_concurrent_trials": 2, "smaller_is_better": smaller_is_better},
    }).config, 0)


@pytest.mark.parametrize("smaller_is_better", [True, False])
@pytest.mark.parametrize("nan_first", [True, False])
def test_asha_never_promotes_a_nan_over_a_number(smaller_is_better, nan_first):
    search = asha(smaller_is_better)
    search.initial_operations()
    results = [(1, NAN), (2, 5.0)] if nan_first else [(2, 5.0), (1, NAN)]
    answers = [op for request_id, metric in results
               for op in search.on_validation_completed(request_id, metric, 4)]
    assert ValidateAfter(2, 8) in answers and ValidateAfter(1, 8) not in answers


# -- pacing -------------------------------------------------------------------------------

@pytest.mark.parametrize("total, limit, first", [(5, 0, 5), (5, 2, 2), (5, 9, 5), (1, 1, 1)])
def test_pacing_creates_up_to_the_limit_at_first(total, limit, first):
    assert Pacing(total, limit).first() == first


def test_pacing_allows_more_until_the_total_is_created():
    pacing = Pacing(total=3, limit=1)
    for _ in range(pacing.first()):
        pacing.count()
    assert pacing.more()
    pacing.count()
    pacing.count()
    assert not pacing.more()


@pytest.mark.parametrize("name, extra", [
    ("random", {"max_trials": 7}), ("grid", {}),
    ("adaptive_asha", {"max_trials": 7, "mode": "aggressive"})])  # one bracket
def test_every_method_starts_max_concurrent_trials_trials(name, extra):
    config = parse_config({
        "entrypoint": "model_def:Trial",
        "hyperparameters": {"global_batch_size": 8,
                            "x": {"type": "int", "minval": 0, "maxval": 6, "count": 7}},
        "searcher": {"name": name, "metric": "m", "max_length": 16,
                     "max_concurrent_trials": 3, **extra}}).config
    creates = [op for op in make_search_method(config, 0).initial_operations()
               if isinstance(op, Create)]
    assert [c.request_id for c in creates] == [1, 2, 3]


# -- which hyperparameters: the sources -----------------------------------------------------

SPACE = parse_config({
    "entrypoint": "model_def:Trial",
    "hyperparameters": {"global_batch_size": 8, "lr": {"type": "log", "minval": -4, "maxval": -1,
                                                       "count": 2},
                        "opt": {"name": {"type": "categorical", "vals": ["adam", "sgd"]}}},
    "searcher": {"name": "single", "metric": "m", "max_length": 1}}).config["hyperparameters"]


def test_random_draws_depend_on_the_seed_and_request_only():
    source = RandomDraws(SPACE, 42, count=5)
    late = source.create(4)
    for request_id in (1, 2, 3):
        source.create(request_id)
    assert source.create(4) == late
    assert late == Create(4, sample(SPACE, np.random.default_rng([42, 4])), derive_seed(42, 4))
    assert RandomDraws(SPACE, 43, count=5).create(4) != late


def test_grid_points_are_handed_out_as_copies():
    source = GridPoints(SPACE, 0)
    assert source.count == 4
    first = source.hparams(1)
    first["opt"]["name"] = "changed"
    assert source.hparams(1) == source.points[0] and source.points[0]["opt"]["name"] == "adam"
    assert source.create(2).seed == derive_seed(0, 2)


def test_asha_draws_its_hyperparameters_as_random_does():
    base = {"entrypoint": "model_def:Trial", "hyperparameters": copy.deepcopy(SPACE)}
    random = parse_config({**base, "searcher": {"name": "random", "metric": "m", "max_length": 16,
                                                "max_trials": 4}}).config
    asha_config = parse_config({**base, "searcher": {"name": "adaptive_asha", "metric": "m",
                                                     "max_length": 16, "max_trials": 4}}).config

    def creates(config):
        return {op.request_id: op for op in make_search_method(config, 9).initial_operations()
                if isinstance(op, Create)}
    from_asha, from_random = creates(asha_config), creates(random)
    assert from_asha and all(from_asha[r] == from_random[r] for r in from_asha)
