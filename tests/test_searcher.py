"""Tests of the searchers: hyperparameter sampling, seeds, and the single searcher's operations."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

from localdet.config import parse_config
from localdet.searcher import (Close, Create, Shutdown, ValidateAfter, make_search_method)
from localdet.searcher.base import derive_seed
from localdet.searcher.hparams import sample
from localdet.searcher.single import SingleSearch

HYPERPARAMETERS = {
    "global_batch_size": 32,
    "optimizer": "adam",
    "units": {"type": "int", "minval": 3, "maxval": 5},
    "dropout": {"type": "double", "minval": 0.2, "maxval": 0.5},
    "lr": {"type": "log", "minval": -4.0, "maxval": -2.0},
    "width": {"type": "log", "minval": 4, "maxval": 6, "base": 2},
    "activation": {"type": "categorical", "vals": ["relu", "tanh", "elu"]},
    "fixed": {"type": "const", "val": [1, 2]},
    "block": {
        "depth": {"type": "int", "minval": 1, "maxval": 2},
        "norm": {"type": "categorical", "vals": [True, False]},
        "inner": {"kernel": {"type": "const", "val": 3}, "scale": {"type": "double",
                                                                  "minval": -1, "maxval": 1}},
    },
}


def config(hyperparameters: dict | None = None, max_length=None, **top) -> dict:
    raw = {
        "entrypoint": "model_def:Trial",
        "hyperparameters": copy.deepcopy(HYPERPARAMETERS if hyperparameters is None
                                         else hyperparameters),
        "searcher": {"name": "single", "metric": "val_loss",
                     "max_length": max_length if max_length is not None else {"batches": 100}},
        **top,
    }
    return parse_config(raw).config


def draws(space: dict, seed: int, n: int = 1) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [sample(space, rng) for _ in range(n)]


# -- sampling -------------------------------------------------------------------------------

def test_every_form_is_sampled_within_its_range():
    space = config()["hyperparameters"]
    for hp in draws(space, seed=0, n=300):
        assert hp["global_batch_size"] == 32 and hp["optimizer"] == "adam"
        assert hp["fixed"] == [1, 2]
        assert type(hp["units"]) is int and 3 <= hp["units"] <= 5
        assert type(hp["dropout"]) is float and 0.2 <= hp["dropout"] <= 0.5
        assert 1e-4 <= hp["lr"] <= 1e-2  # base 10 by default
        assert 2**4 <= hp["width"] <= 2**6  # base 2
        assert hp["activation"] in ("relu", "tanh", "elu")
        assert set(hp["block"]) == {"depth", "norm", "inner"}
        assert hp["block"]["depth"] in (1, 2) and hp["block"]["norm"] in (True, False)
        assert hp["block"]["inner"]["kernel"] == 3
        assert -1 <= hp["block"]["inner"]["scale"] <= 1


def test_int_bounds_are_inclusive_and_every_choice_is_drawn():
    space = config()["hyperparameters"]
    values = draws(space, seed=1, n=300)
    assert {hp["units"] for hp in values} == {3, 4, 5}
    assert {hp["activation"] for hp in values} == {"relu", "tanh", "elu"}
    assert {hp["block"]["depth"] for hp in values} == {1, 2}
    assert {hp["block"]["norm"] for hp in values} == {True, False}


def test_log_is_uniform_in_the_exponent():
    space = config({"lr": {"type": "log", "minval": -4, "maxval": -2},
                    "width": {"type": "log", "minval": 1, "maxval": 3, "base": 2}})["hyperparameters"]
    values = draws(space, seed=2, n=2000)
    exponents = [math.log10(hp["lr"]) for hp in values]
    # Uniform on [-4, -2]: about half the draws fall below the midpoint exponent -3.
    assert 0.4 < sum(e < -3 for e in exponents) / len(exponents) < 0.6
    assert 0.4 < sum(math.log2(hp["width"]) < 2 for hp in values) / len(values) < 0.6
    assert min(hp["width"] for hp in values) >= 2 and max(hp["width"] for hp in values) <= 8


def test_degenerate_ranges_give_their_only_value():
    space = config({"n": {"type": "int", "minval": 4, "maxval": 4},
                    "x": {"type": "double", "minval": 0.5, "maxval": 0.5},
                    "c": {"type": "categorical", "vals": ["only"]}})["hyperparameters"]
    assert draws(space, seed=3) == [{"n": 4, "x": 0.5, "c": "only"}]


def test_unknown_type_names_the_hyperparameter():
    with pytest.raises(ValueError, match="'nope'.*'bad'"):
        sample({"bad": {"type": "nope"}}, np.random.default_rng(0))


def test_draws_do_not_depend_on_key_order():
    space = config()["hyperparameters"]

    def reversed_order(group: dict) -> dict:
        return {k: (reversed_order(v) if isinstance(v, dict) and "type" not in v else v)
                for k, v in reversed(list(group.items()))}

    shuffled = reversed_order(space)
    assert list(shuffled) != list(space)
    assert list(shuffled["block"]) != list(space["block"])
    assert draws(shuffled, seed=4, n=5) == draws(space, seed=4, n=5)


# -- seeds ----------------------------------------------------------------------------------

def test_same_experiment_seed_gives_same_hparams_and_trial_seed():
    cfg = config()
    first = SingleSearch(cfg, 1234).initial_operations()
    second = SingleSearch(copy.deepcopy(cfg), 1234).initial_operations()
    assert first == second
    create = first[0]
    assert isinstance(create, Create)
    assert create.seed == derive_seed(1234, create.request_id)
    assert 0 <= create.seed < 2**31


def test_different_experiment_seed_gives_different_hparams_and_trial_seed():
    cfg = config()
    creates = [SingleSearch(cfg, seed).initial_operations()[0] for seed in (1, 2, 3)]
    assert len({c.seed for c in creates}) == 3
    assert len({(c.hparams["dropout"], c.hparams["lr"]) for c in creates}) == 3


def test_single_search_draws_do_not_depend_on_yaml_key_order():
    cfg = config()
    reordered = copy.deepcopy(cfg)
    reordered["hyperparameters"] = dict(reversed(list(cfg["hyperparameters"].items())))
    assert (SingleSearch(cfg, 99).initial_operations()
            == SingleSearch(reordered, 99).initial_operations())


def test_derive_seed_is_stable_and_varies_with_both_inputs():
    assert derive_seed(5, 1) == derive_seed(5, 1)
    assert len({derive_seed(5, 1), derive_seed(5, 2), derive_seed(6, 1)}) == 3
    assert all(0 <= derive_seed(s, r) < 2**31 for s in (0, 2**32 - 1) for r in (1, 10**6))


# -- the single searcher --------------------------------------------------------------------

def test_initial_operations_create_then_validate_after_max_length():
    cfg = config(max_length={"batches": 250})
    ops = make_search_method(cfg, 7).initial_operations()
    assert [type(op) for op in ops] == [Create, ValidateAfter]
    create, validate = ops
    assert validate.request_id == create.request_id
    assert validate.length == 250
    assert create.hparams["global_batch_size"] == 32


@pytest.mark.parametrize("max_length, top, batches", [
    ({"epochs": 2}, {"records_per_epoch": 1000}, 63),   # 2000 records / 32 per batch, rounded up
    ({"epochs": 1}, {"records_per_epoch": 64}, 2),
    ({"records": 100}, {}, 4),                          # 100 / 32, rounded up
    ({"batches": 5}, {}, 5),
    (17, {}, 17),                                       # Determined's bare-int legacy form
])
def test_max_length_is_converted_to_batches(max_length, top, batches):
    cfg = config(max_length=max_length, **top)
    search = SingleSearch(cfg, 0)
    assert search.max_length == batches
    assert search.initial_operations()[1] == ValidateAfter(1, batches)


def test_validation_at_max_length_shuts_down():
    search = SingleSearch(config(max_length={"batches": 100}), 0)
    assert search.on_validation_completed(1, 0.5, 50) == []
    assert search.on_validation_completed(1, 0.5, 100) == [Shutdown()]
    assert search.on_validation_completed(1, 0.5, 120) == [Shutdown()]
    assert search.on_trial_exited_early(1) == [Shutdown()]


def test_progress_is_batches_over_max_length_capped_at_one():
    search = SingleSearch(config(max_length={"epochs": 1}, records_per_epoch=320), 0)  # 10 batches
    assert search.progress({}) == 0.0
    assert search.progress({1: 4}) == pytest.approx(0.4)
    assert search.progress({1: 15}) == 1.0


def test_operations_are_plain_frozen_values():
    op = Close(3)
    with pytest.raises(Exception):
        op.request_id = 4  # type: ignore[misc]
    assert Close(3) == op and hash(Close(3)) == hash(op)


def test_a_script_without_max_length_gets_target_zero_so_it_decides():
    cfg = parse_config({"entrypoint_script": "python3 train.py",
                        "hyperparameters": {"lr": {"type": "double", "minval": 0, "maxval": 1}}}).config
    search = make_search_method(cfg, 3)
    create, validate = search.initial_operations()
    assert validate == ValidateAfter(create.request_id, 0)
    assert 0 <= create.hparams["lr"] <= 1
    assert search.progress({1: 50}) == 0.0  # unknown until the script records its length
    assert search.on_validation_completed(1, 0.1, 50) == [Shutdown()]
