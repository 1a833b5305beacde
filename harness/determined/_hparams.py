"""Hyperparameter values for a trial built outside localdet (`from_config` in a notebook),
and Determined's hyperparameter classes.

A config's `hyperparameters` section is searched by the daemon; a notebook context has no
searcher, so it draws one value per hyperparameter as Determined's `from_config` did: the
constant's value, or a random draw from the range or the categories (seeded by
`reproducibility.experiment_seed`, 0 if unset, so the same config gives the same values).
"""

from __future__ import annotations

import random
from typing import Any, Dict, List


def sample_hparams(config: Dict[str, Any]) -> Dict[str, Any]:
    seed = int(config.get("reproducibility", {}).get("experiment_seed", 0) or 0)
    return _sample(config.get("hyperparameters", {}) or {}, random.Random(seed))


def _sample(spec: Dict[str, Any], rng: random.Random) -> Dict[str, Any]:
    return {name: _one(name, value, rng) for name, value in spec.items()}


def _one(name: str, value: Any, rng: random.Random) -> Any:
    if not isinstance(value, dict):
        return value  # a bare value is a constant
    kind = value.get("type")
    if kind is None:
        return _sample(value, rng)  # a nested group of hyperparameters
    if kind == "const":
        return value["val"]
    if kind == "int":
        return rng.randint(int(value["minval"]), int(value["maxval"]))
    if kind == "double":
        return rng.uniform(float(value["minval"]), float(value["maxval"]))
    if kind == "log":
        return float(value["base"]) ** rng.uniform(float(value["minval"]),
                                                   float(value["maxval"]))
    if kind == "categorical":
        return rng.choice(list(value["vals"]))
    raise ValueError(f"hyperparameter '{name}' has type {kind!r}; the types are const, int, "
                     "double, log and categorical")


class _Hparam(dict):
    """A hyperparameter's config entry, built in Python (Determined's `det.Constant` and
    friends); it is the dict the config file would hold."""


class Constant(_Hparam):
    def __init__(self, value: Any) -> None:
        super().__init__(type="const", val=value)


class Integer(_Hparam):
    def __init__(self, minval: int, maxval: int, count: Any = None) -> None:
        super().__init__(type="int", minval=minval, maxval=maxval,
                         **({"count": count} if count is not None else {}))


class Double(_Hparam):
    def __init__(self, minval: float, maxval: float, count: Any = None) -> None:
        super().__init__(type="double", minval=minval, maxval=maxval,
                         **({"count": count} if count is not None else {}))


class Log(_Hparam):
    def __init__(self, minval: float, maxval: float, base: float, count: Any = None) -> None:
        super().__init__(type="log", minval=minval, maxval=maxval, base=base,
                         **({"count": count} if count is not None else {}))


class Categorical(_Hparam):
    def __init__(self, vals: List[Any]) -> None:
        super().__init__(type="categorical", vals=list(vals))
