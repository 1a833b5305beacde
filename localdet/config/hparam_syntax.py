"""Hyperparameters written on the command line, for `localdet run SCRIPT --hp ...` and
`localdet search SCRIPT ...`, as the config's `hyperparameters` section:

    learning_rate=0.01           a constant (a YAML value: 0.01, 32, true, adam)
    units=int(16,128)            type int, minval 16, maxval 128
    dropout=double(0,0.5)        type double
    lr=log(1e-4,1e-1)            type log, base 10: the ends are values, not exponents
    opt=choice(adam,sgd)         type categorical (`categorical(...)` too)

A range may end with a grid's count: `units=int(16,128,count=4)`; a log range with
another base: `lr=log(1e-4,1e-1,base=2)` (the ends are still values).

    parse_hparams(["lr=log(1e-4,1e-1)", "units=32"])
    # {"lr": {"type": "log", "base": 10, "minval": -4.0, "maxval": -1.0}, "units": 32}
"""

from __future__ import annotations

import math
import re
from typing import Any

import yaml

from localdet.config.schema import ConfigError

_CALL = re.compile(r"^(int|double|log|choice|categorical)\((.*)\)$", re.DOTALL)
EXAMPLE = "lr=log(1e-4,1e-1), units=int(16,128), dropout=double(0,0.5), opt=choice(adam,sgd)"


def _scalar(text: str) -> Any:
    """A number as Python reads one (YAML 1.1 reads 1e-4 as a string), else a YAML value."""
    for number in (int, float):
        try:
            value = number(text.strip())
        except ValueError:
            continue
        if math.isfinite(value):  # nan, inf: words
            return value
    try:
        return yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        return text.strip()


def _number(text: str, pair: str, kind: str) -> float:
    value = _scalar(text)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value):
        raise ConfigError(f"'{pair}': {text.strip()!r} is not a number; write a range as "
                          f"e.g. {EXAMPLE}", "hyperparameters")
    if kind == "int" and value != int(value):
        raise ConfigError(f"'{pair}': an int range takes whole numbers, not "
                          f"{text.strip()}", "hyperparameters")
    return value


def parse_hparam(pair: str) -> tuple[str, Any]:
    """One `name=value` or `name=kind(...)` as (name, the config's value for it)."""
    name, equals, text = pair.partition("=")
    name = name.strip()
    if not equals or not name:
        raise ConfigError(f"'{pair}' is not name=value; write e.g. learning_rate=0.01 or "
                          f"{EXAMPLE}", "hyperparameters")
    call = _CALL.match(text.strip())
    if call is None:
        return name, _scalar(text)
    kind, inside = call.groups()
    parts = [part.strip() for part in inside.split(",")] if inside.strip() else []
    if kind in ("choice", "categorical"):
        if not parts:
            raise ConfigError(f"'{pair}': a choice needs at least one value, e.g. "
                              "opt=choice(adam,sgd)", "hyperparameters")
        return name, {"type": "categorical", "vals": [_scalar(p) for p in parts]}
    keywords = dict(p.split("=", 1) for p in parts if "=" in p)
    ends = [p for p in parts if "=" not in p]
    if len(ends) == 3 and "count" not in keywords:
        keywords["count"] = ends.pop()
    unknown = set(keywords) - {"count"} - ({"base"} if kind == "log" else set())
    if len(ends) != 2 or unknown:
        article = "an" if kind == "int" else "a"
        raise ConfigError(f"'{pair}': {article} {kind} range is {kind}(low,high), optionally "
                          f"with count=N{' and base=B' if kind == 'log' else ''}; e.g. {EXAMPLE}",
                          "hyperparameters")
    low, high = (_number(end, pair, kind) for end in ends)
    if low > high:
        raise ConfigError(f"'{pair}': the range's low end {low:g} is above its high end "
                          f"{high:g}; swap them", "hyperparameters")
    spec: dict[str, Any] = {"type": kind}
    if kind == "log":
        base = _number(keywords.get("base", "10"), pair, "double")
        if low <= 0 or base <= 0 or base == 1:
            raise ConfigError(f"'{pair}': a log range takes two values above 0 (and a base "
                              "above 0, not 1), e.g. lr=log(1e-4,1e-1)", "hyperparameters")
        # Determined's log ranges are exponents of the base.
        spec.update(base=base if base != int(base) else int(base),
                    minval=round(math.log(low, base), 12),
                    maxval=round(math.log(high, base), 12))
    else:
        spec.update(minval=int(low) if kind == "int" else float(low),
                    maxval=int(high) if kind == "int" else float(high))
    if "count" in keywords:
        count = _number(keywords["count"], pair, "int")
        if count < 1:
            raise ConfigError(f"'{pair}': count is at least 1", "hyperparameters")
        spec["count"] = int(count)
    return name, spec


def parse_hparams(pairs: list[str] | tuple[str, ...]) -> dict[str, Any]:
    space: dict[str, Any] = {}
    for pair in pairs:
        name, value = parse_hparam(pair)
        if name in space:
            raise ConfigError(f"hyperparameter '{name}' is given twice; give it once",
                              "hyperparameters")
        space[name] = value
    return space
