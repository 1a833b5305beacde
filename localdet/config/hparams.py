"""Hyperparameter values from their configured ranges (nested groups included): drawn at
random for `single`, `random` and `adaptive_asha`, enumerated for `grid`.

    sample({"lr": {"type": "log", "minval": -4, "maxval": -1, "base": 10}}, rng)
    # {"lr": 0.0023...}
    grid_points({"n": {"type": "int", "minval": 1, "maxval": 3, "count": 2},
                 "opt": {"name": {"type": "categorical", "vals": ["adam", "sgd"]}}})
    # [{"n": 1, "opt": {"name": "adam"}}, {"n": 1, "opt": {"name": "sgd"}},
    #  {"n": 3, "opt": {"name": "adam"}}, {"n": 3, "opt": {"name": "sgd"}}]
    grid_size(space)   # the number of points, without making them (MissingCount without counts)

Names are visited in sorted order at every level, so neither draws nor grid order depend
on the YAML's key order.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

MAX_GRID_POINTS = 10_000


class MissingCount(ValueError):
    """A grid over a range that has no `count`; `path` names the missing key. The config
    check turns it into a ConfigError (this module stays below the config layer)."""

    def __init__(self, path: str) -> None:
        super().__init__(f"{path}: a grid search needs a count for every int, double and log "
                         "hyperparameter")
        self.path = path


def sample(space: Mapping[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """One value per hyperparameter of a validated config's `hyperparameters` section."""
    values: dict[str, Any] = {}
    for name in sorted(space):  # sorted: the draws must not depend on YAML key order
        spec = space[name]
        if "type" not in spec:
            values[name] = sample(spec, rng)
            continue
        kind = spec["type"]
        if kind == "const":
            values[name] = spec["val"]
        elif kind == "int":
            values[name] = int(rng.integers(spec["minval"], spec["maxval"] + 1))
        elif kind == "double":
            values[name] = float(rng.uniform(spec["minval"], spec["maxval"]))
        elif kind == "log":
            # base: always there, the config fills the schema's default
            values[name] = float(spec["base"] ** rng.uniform(spec["minval"], spec["maxval"]))
        elif kind == "categorical":
            values[name] = spec["vals"][int(rng.integers(len(spec["vals"])))]
        else:
            raise ValueError(f"unknown hyperparameter type {kind!r} for {name!r}")
    return values


def _round_half_away(x: float) -> int:
    # Determined (Go's math.Round) rounds halves away from zero; Python's round() would not.
    return int(math.copysign(math.floor(abs(x) + 0.5), x))


def grid_axis(spec: dict, path: str) -> list[Any]:
    """The values a grid takes for one hyperparameter, as Determined's grid searcher does:
    `count` evenly spaced values including both ends (one value: the midpoint); an int's
    count is clamped to the integers in its range; log spaces the exponent evenly."""
    kind, count = spec["type"], _axis_size(spec, path)
    if kind == "const":
        return [spec["val"]]
    if kind == "categorical":
        return list(spec["vals"])
    low, high = spec["minval"], spec["maxval"]
    if count == 1:
        points = [(low + high) / 2]
    else:
        points = [low + i * (high - low) / (count - 1) for i in range(count)]
    if kind == "int":
        return [_round_half_away(x) for x in points]
    if kind == "double":
        return [float(x) for x in points]
    return [float(spec["base"] ** x) for x in points]


def _axis_size(spec: dict, path: str) -> int:
    kind = spec["type"]
    if kind == "const":
        return 1
    if kind == "categorical":
        return len(spec["vals"])
    if kind not in ("int", "double", "log"):
        raise ValueError(f"unknown hyperparameter type {kind!r} for {path!r}")
    if spec.get("count") is None:
        raise MissingCount(f"{path}.count")
    if kind == "int":  # no more values than there are integers in the range
        return min(spec["count"], spec["maxval"] - spec["minval"] + 1)
    return spec["count"]


def _leaves(space: Mapping[str, Any], path: str) -> Iterator[tuple[dict, str]]:
    """(spec, dotted path) per hyperparameter, depth first in sorted-name order."""
    for name in sorted(space):
        spec, here = space[name], f"{path}.{name}"
        if "type" in spec:
            yield spec, here
        else:
            yield from _leaves(spec, here)


def grid_size(space: Mapping[str, Any], path: str = "hyperparameters") -> int:
    """How many points `grid_points(space)` makes."""
    return math.prod(_axis_size(spec, here) for spec, here in _leaves(space, path))


def grid_points(space: Mapping[str, Any], path: str = "hyperparameters") -> list[dict[str, Any]]:
    """The cartesian product of every hyperparameter's grid values, each point nested like
    the space. Order: leaves in sorted-name order (depth first), the first varying slowest.
    A space with no hyperparameters is one empty point."""
    axes = [grid_axis(spec, here) for spec, here in _leaves(space, path)]
    return [_nest(space, iter(combination)) for combination in itertools.product(*axes)]


def _nest(space: Mapping[str, Any], values: Iterator[Any]) -> dict[str, Any]:
    # Walks the space in the order `_leaves` does, so the values come in the same order.
    point: dict[str, Any] = {}
    for name in sorted(space):
        spec = space[name]
        point[name] = copy.deepcopy(next(values)) if "type" in spec else _nest(spec, values)
    return point  # deepcopy above: points must not share mutable values
