"""Tests of the searchers: hyperparameter sampling, seeds, the single, grid and random
searchers' operations, and their config validation (adaptive_asha's own: test_asha.py)."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math

import numpy as np
import pytest

from localdet.config.experiment import ConfigError, parse_config
from localdet.config.hparams import sample
from localdet.search.methods import (
    Close,
    Create,
    GridSearch,
    Shutdown,
    ValidateAfter,
    make_search_method,
)
from localdet.search.methods.base import derive_seed
from localdet.search.methods.single import SingleSearch

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
                    "width": {"type": "log", "minval": 1, "maxval": 3, "base": 2}}
                   )["hyperparameters"]
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


def test_validation_at_max_length_closes_and_shuts_down():
    search = SingleSearch(config(max_length={"batches": 100}), 0)
    search.initial_operations()
    assert search.on_validation_completed(1, 0.5, 50) == []  # short of max_length
    assert search.on_validation_completed(1, 0.5, 100) == [Close(1), Shutdown()]
    assert search.on_trial_closed(1) == []
    assert search.on_validation_completed(1, 0.5, 120) == []  # it is closed already
    assert search.rungs() == []


def test_single_trial_exiting_early_shuts_down():
    search = SingleSearch(config(max_length={"batches": 100}), 0)
    search.initial_operations()
    assert search.on_trial_exited_early(1) == [Shutdown()]


def test_progress_is_batches_over_max_length_capped_at_one():
    search = SingleSearch(config(max_length={"epochs": 1}, records_per_epoch=320), 0)  # 10 batches
    assert search.progress({}) == 0.0
    assert search.progress({1: 4}) == pytest.approx(0.4)
    assert search.progress({1: 15}) == 1.0


def test_operations_are_plain_frozen_values():
    op = Close(3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        op.request_id = 4  # type: ignore[misc]
    assert Close(3) == op and hash(Close(3)) == hash(op)


def test_a_script_without_max_length_gets_target_zero_so_it_decides():
    cfg = parse_config({"entrypoint_script": "python3 train.py",
                        "hyperparameters": {"lr": {"type": "double", "minval": 0,
                                                   "maxval": 1}}}).config
    search = make_search_method(cfg, 3)
    create, validate = search.initial_operations()
    assert validate == ValidateAfter(create.request_id, 0)
    assert 0 <= create.hparams["lr"] <= 1
    assert search.progress({1: 50}) == 0.0  # unknown until the script records its length
    assert search.on_validation_completed(1, 0.1, 50) == [Close(1), Shutdown()]


# -- driving a search: a fake daemon that carries out the operations ---------------------------

class Drive:
    """Carries out a method's operations as the daemon does (a Close is followed at once by
    on_trial_closed) and trains the oldest pending trial first. Records what happened."""

    def __init__(self, method, exits: frozenset[int] = frozenset()):
        self.method = method
        self.exits = exits          # request ids that exit early instead of validating
        self.creates: dict[int, Create] = {}
        self.pending: list[ValidateAfter] = []
        self.live: set[int] = set()  # created, not yet closed or exited
        self.closed: list[int] = []
        self.exited: list[int] = []
        self.shutdowns = 0
        self.most_live = 0
        self.ops: list = []

    def apply(self, ops: list) -> None:
        for op in ops:
            self.ops.append(op)
            assert self.shutdowns == 0, f"{op} after Shutdown"
            if isinstance(op, Create):
                assert op.request_id == len(self.creates) + 1  # 1, 2, 3... in creation order
                self.creates[op.request_id] = op
                self.live.add(op.request_id)
                self.most_live = max(self.most_live, len(self.live))
            elif isinstance(op, ValidateAfter):
                self.pending.append(op)
            elif isinstance(op, Close):
                self.closed.append(op.request_id)
                self.live.discard(op.request_id)
                self.apply(self.method.on_trial_closed(op.request_id))
            elif isinstance(op, Shutdown):
                self.shutdowns += 1

    def run(self, metric=lambda hparams, length: 1.0) -> Drive:
        self.apply(self.method.initial_operations())
        while self.pending:
            op = self.pending.pop(0)
            if op.request_id in self.exits:
                self.exited.append(op.request_id)
                self.live.discard(op.request_id)
                self.apply(self.method.on_trial_exited_early(op.request_id))
            else:
                hparams = self.creates[op.request_id].hparams
                self.apply(self.method.on_validation_completed(
                    op.request_id, metric(hparams, op.length), op.length))
        return self


def searcher_config(name: str, hyperparameters: dict, **searcher) -> dict:
    raw = {"entrypoint": "model_def:Trial", "hyperparameters": copy.deepcopy(hyperparameters),
           "searcher": {"name": name, "metric": "val_loss", "max_length": {"batches": 10},
                        **searcher}}
    return parse_config(raw).config


# -- grid -----------------------------------------------------------------------------------

GRID_SPACE = {
    "global_batch_size": 32,
    "units": {"type": "int", "minval": 1, "maxval": 5, "count": 3},
    "dropout": {"type": "double", "minval": 0.0, "maxval": 0.5, "count": 2},
    "lr": {"type": "log", "minval": -3, "maxval": -1, "count": 3},
    "activation": {"type": "categorical", "vals": ["relu", "tanh"]},
    "block": {"depth": {"type": "int", "minval": 2, "maxval": 3, "count": 1},
              "width": {"type": "log", "minval": 2, "maxval": 4, "base": 2, "count": 2},
              "kernel": {"type": "const", "val": [3, 3]}},
}
# The values each hyperparameter takes, worked out by hand from the rules.
GRID_VALUES = {
    "units": [1, 3, 5],                 # 1 + i * (5 - 1) / 2
    "dropout": [0.0, 0.5],              # both ends
    "lr": [0.001, 0.01, 0.1],           # 10 ** (-3, -2, -1)
    "activation": ["relu", "tanh"],
    "depth": [3],                       # count 1: round((2 + 3) / 2), halves away from zero
    "width": [4.0, 16.0],               # 2 ** (2, 4)
}


def test_grid_makes_exactly_the_cartesian_product():
    drive = Drive(make_search_method(searcher_config("grid", GRID_SPACE, max_concurrent_trials=0),
                                     11)).run()
    points = [drive.creates[r].hparams for r in sorted(drive.creates)]

    def key(units, dropout, lr, activation, depth, width):
        return units, dropout, round(lr, 12), activation, depth, round(width, 12)

    made = [key(p["units"], p["dropout"], p["lr"], p["activation"], p["block"]["depth"],
                p["block"]["width"]) for p in points]
    expected = [key(*values) for values in itertools.product(*GRID_VALUES.values())]
    assert len(made) == len(expected) == 3 * 2 * 3 * 2 * 1 * 2
    assert sorted(made, key=repr) == sorted(expected, key=repr)  # each point exactly once
    for point in points:
        assert set(point) == {"global_batch_size", "units", "dropout", "lr", "activation", "block"}
        assert point["global_batch_size"] == 32 and point["block"]["kernel"] == [3, 3]
        assert type(point["units"]) is int and type(point["block"]["depth"]) is int
        assert type(point["dropout"]) is float
    # Order: names sorted at each level (activation, block.depth, block.kernel, block.width,
    # dropout, global_batch_size, lr, units), the first varying slowest.
    assert [p["activation"] for p in points[:36]] == ["relu"] * 36
    assert [p["units"] for p in points[:4]] == [1, 3, 5, 1]
    assert [p["block"]["width"] for p in (points[0], points[18])] == [4.0, 16.0]
    # Seeds still come from the experiment seed, one per trial.
    assert [drive.creates[r].seed for r in (1, 2)] == [derive_seed(11, 1), derive_seed(11, 2)]


@pytest.mark.parametrize("spec, values", [
    ({"type": "int", "minval": 1, "maxval": 3, "count": 10}, [1, 2, 3]),   # clamped to 3 ints
    ({"type": "int", "minval": 0, "maxval": 10, "count": 4}, [0, 3, 7, 10]),
    ({"type": "int", "minval": -3, "maxval": -2, "count": 1}, [-3]),       # -2.5 rounds to -3
    ({"type": "int", "minval": 4, "maxval": 4, "count": 5}, [4]),
    ({"type": "double", "minval": 1, "maxval": 2, "count": 1}, [1.5]),
    ({"type": "double", "minval": -1, "maxval": 1, "count": 5}, [-1.0, -0.5, 0.0, 0.5, 1.0]),
    ({"type": "log", "minval": 0, "maxval": 2, "count": 1}, [10.0]),
    ({"type": "categorical", "vals": [1, "a", None]}, [1, "a", None]),
    ({"type": "const", "val": {"k": 1}}, [{"k": 1}]),
])
def test_grid_values_per_hyperparameter(spec, values):
    cfg = searcher_config("grid", {"h": spec}, max_concurrent_trials=0)
    made = [c.hparams["h"] for c in Drive(make_search_method(cfg, 0)).run().creates.values()]
    assert made == (pytest.approx(values) if spec["type"] in ("double", "log") else values)


def test_grid_needs_a_count_for_every_range():
    with pytest.raises(ConfigError) as info:
        searcher_config("grid", {"opt": {"lr": {"type": "log", "minval": -3, "maxval": -1}}})
    assert info.value.path == "hyperparameters.opt.lr.count"
    assert str(info.value) == ("hyperparameters.opt.lr.count: a grid search needs a count for "
                               "every int, double and log hyperparameter")


def test_a_grid_over_10000_points_is_refused_with_its_size():
    space = {"a": {"type": "double", "minval": 0, "maxval": 1, "count": 100},
             "b": {"type": "int", "minval": 0, "maxval": 1000, "count": 120}}
    with pytest.raises(ConfigError) as info:
        searcher_config("grid", space)
    assert str(info.value) == ("hyperparameters: the grid has 12,000 points; at most 10,000 are "
                               "allowed: lower some counts")
    space["b"]["count"] = 100
    assert len(GridSearch(searcher_config("grid", space), 0).points) == 10_000


def test_grid_honours_max_concurrent_trials():
    space = {"x": {"type": "int", "minval": 1, "maxval": 5, "count": 5}}
    drive = Drive(make_search_method(searcher_config("grid", space, max_concurrent_trials=2), 0))
    initial = drive.method.initial_operations()
    assert initial == [Create(1, {"x": 1}, derive_seed(0, 1)), ValidateAfter(1, 10),
                       Create(2, {"x": 2}, derive_seed(0, 2)), ValidateAfter(2, 10)]
    drive = Drive(make_search_method(searcher_config("grid", space, max_concurrent_trials=2), 0),
                  exits=frozenset({2})).run()
    assert drive.most_live == 2
    assert [c.hparams["x"] for c in drive.creates.values()] == [1, 2, 3, 4, 5]
    assert sorted(drive.closed) == [1, 3, 4, 5] and drive.exited == [2]
    assert drive.shutdowns == 1 and isinstance(drive.ops[-1], Shutdown)


# -- random ---------------------------------------------------------------------------------

def random_config(**searcher) -> dict:
    return searcher_config("random", HYPERPARAMETERS, **{"max_trials": 5, **searcher})


def test_random_with_one_seed_makes_the_same_trials_twice_and_another_seed_others():
    first = Drive(make_search_method(random_config(), 42)).run().creates
    again = Drive(make_search_method(random_config(), 42)).run().creates
    other = Drive(make_search_method(random_config(), 43)).run().creates
    assert first == again
    assert [c.hparams["dropout"] for c in first.values()] != \
        [c.hparams["dropout"] for c in other.values()]
    assert {c.seed for c in first.values()}.isdisjoint({c.seed for c in other.values()})
    space = random_config()["hyperparameters"]
    for r, create in first.items():  # request r's draws depend on (seed, r) only
        assert create.hparams == sample(space, np.random.default_rng([42, r]))
        assert create.seed == derive_seed(42, r)
    assert len({c.hparams["dropout"] for c in first.values()}) == 5


@pytest.mark.parametrize("limit, most_live", [(2, 2), (0, 7), (16, 7)])
def test_random_honours_max_trials_and_max_concurrent_trials(limit, most_live):
    drive = Drive(make_search_method(random_config(max_trials=7, max_concurrent_trials=limit), 5),
                  exits=frozenset({3})).run()
    assert sorted(drive.creates) == list(range(1, 8))
    assert drive.most_live == most_live
    assert sorted(drive.closed) == [1, 2, 4, 5, 6, 7] and drive.exited == [3]
    assert drive.shutdowns == 1 and isinstance(drive.ops[-1], Shutdown)
    assert all(op.length == 10 for op in drive.ops if isinstance(op, ValidateAfter))


def test_random_needs_max_trials():
    with pytest.raises(ConfigError) as info:
        searcher_config("random", HYPERPARAMETERS)
    assert info.value.path == "searcher.max_trials"
    assert "missing required key 'searcher.max_trials'" in str(info.value)


def test_random_progress_counts_batches_capped_at_max_length():
    search = make_search_method(random_config(max_trials=4), 0)
    search.initial_operations()
    assert search.progress({}) == 0.0
    assert search.progress({1: 10, 2: 5, 3: 50}) == pytest.approx((10 + 5 + 10) / 40)
    search.on_trial_exited_early(4)  # trains no further: counts as done
    assert search.progress({1: 10, 2: 5, 3: 50}) == pytest.approx((10 + 5 + 10 + 10) / 40)


@pytest.mark.parametrize("name, extra", [("grid", {}), ("random", {"max_trials": 3})])
def test_a_script_without_max_length_trains_each_trial_as_its_script_says(name, extra):
    cfg = parse_config({"entrypoint_script": "python3 train.py",
                        "hyperparameters": {"n": {"type": "int", "minval": 1, "maxval": 3,
                                                  "count": 3}},
                        "searcher": {"name": name, "metric": "loss", **extra}}).config
    drive = Drive(make_search_method(cfg, 1)).run()
    assert [op.length for op in drive.ops if isinstance(op, ValidateAfter)] == [0, 0, 0]
    assert sorted(drive.closed) == [1, 2, 3] and drive.shutdowns == 1
    assert drive.method.progress({1: 5}) == 0.0


# -- searcher config validation -------------------------------------------------------------

def test_adaptive_asha_defaults_are_filled_and_others_get_none_of_them():
    asha = searcher_config("adaptive_asha", HYPERPARAMETERS, max_trials=16)["searcher"]
    assert asha == {"name": "adaptive_asha", "metric": "val_loss", "max_length": {"batches": 10},
                    "max_trials": 16, "smaller_is_better": True, "max_concurrent_trials": 16,
                    "max_rungs": 5, "divisor": 4, "mode": "standard", "stop_once": False}
    grid = searcher_config("grid", {"a": 1})["searcher"]
    assert set(grid) == {"name", "metric", "max_length", "smaller_is_better",
                         "max_concurrent_trials"}


def test_stop_once_is_ignored_with_a_warning():
    parsed = parse_config({"entrypoint": "model_def:Trial", "hyperparameters": {"a": 1},
                           "searcher": {"name": "adaptive_asha", "metric": "m", "max_trials": 4,
                                        "max_length": 10, "stop_once": True}})
    assert parsed.config["searcher"]["stop_once"] is False
    assert any("'searcher.stop_once'" in w for w in parsed.warnings)


@pytest.mark.parametrize("searcher, path, message", [
    ({"name": "adaptive_asha", "max_length": 10}, "searcher.max_trials",
     "missing required key 'searcher.max_trials'; the adaptive_asha searcher needs it"),
    ({"name": "adaptive_asha", "max_trials": 4}, "searcher.max_length",
     "missing required key 'searcher.max_length'; the adaptive_asha searcher needs it to size"),
    ({"name": "adaptive_asha", "max_trials": 4, "max_length": 10, "divisor": 1}, "searcher.divisor",
     "searcher.divisor: expected a value > 1, got 1"),
    ({"name": "adaptive_asha", "max_trials": 4, "max_length": 10, "mode": "fast"}, "searcher.mode",
     "searcher.mode: expected one of 'aggressive', 'standard', 'conservative' (got 'fast')"),
    ({"name": "random", "max_trials": 0}, "searcher.max_trials",
     "searcher.max_trials: expected a value >= 1, got 0"),
])
def test_searcher_config_errors_name_the_field(searcher, path, message):
    # A script, so that only the searcher itself can need max_length.
    with pytest.raises(ConfigError) as info:
        parse_config({"entrypoint_script": "python3 train.py",
                      "searcher": {"metric": "val_loss", **searcher}})
    assert info.value.path == path
    assert message in str(info.value)
