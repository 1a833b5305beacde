"""The experiment-config schema (state/expconf.schema.json) and its defaults, the one place
they are read; with what both the parser (experiment.py) and the typed config (typed.py)
build on: ConfigError and lengths in batches.

    fill_defaults(config, schema(), "", warnings)   # in place, as parse_config does
    with_defaults(stored)            # a copy of a stored config, whatever it lacks filled in
    section_with_defaults({"save_trial_best": 3}, "checkpoint_storage")   # one section
    length_to_batches({"epochs": 2}, config, "searcher.max_length")

experiment.py exports these under the names it always had (ConfigError, length_to_batches,
global_batch_size, schema_path), so callers import them from there as before.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from localdet.paths import state_formats_dir

LENGTH_UNITS = ("batches", "records", "epochs")


class ConfigError(ValueError):
    """A config problem, as one sentence naming the key path and what to fix, e.g.
    ``"searcher.max_length: expected one of 'batches', 'records', 'epochs' (got {'steps': 10})"``.

    ``path`` is the dotted key path ("" for the top level), list indexes as ``[i]``.
    """

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message)
        self.path = path


def shown(value: Any, limit: int = 80) -> str:
    """`repr(value)`, cut short: messages quote what the user wrote, on one line."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def join_path(path: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    key = str(key)
    if not key.isprintable() or len(key) > 60:
        key = shown(key, 60)  # a key holding a newline or a page of text, as one short line
    return f"{path}.{key}" if path else key


def strict_int(_checker: Any, instance: Any) -> bool:
    return isinstance(instance, int) and not isinstance(instance, bool)


# -- the schema and its defaults ------------------------------------------------------------

def schema_path() -> Path:
    return state_formats_dir() / "expconf.schema.json"


@functools.cache
def schema() -> dict[str, Any]:
    return json.loads(schema_path().read_text(encoding="utf-8"))


def resolve(node: Any) -> Any:
    while isinstance(node, dict) and "$ref" in node:
        node = schema()["$defs"][node["$ref"].removeprefix("#/$defs/")]
    return node


def fill_defaults(instance: dict[str, Any], node: dict[str, Any], path: str,
                  warnings: list[str]) -> None:
    """Fill schema defaults in place, recursively; drop x-ignored keys with one warning per
    reason (those also marked x-kept stay in the config, read for a part of their meaning)."""
    ignored: dict[str, list[str]] = {}
    for key, sub in resolve(node).get("properties", {}).items():
        if key in instance and isinstance(sub, dict) and "x-ignored" in sub:
            ignored.setdefault(sub["x-ignored"], []).append(f"'{join_path(path, key)}'")
            if not sub.get("x-kept"):
                del instance[key]
            continue
        if key not in instance and isinstance(sub, dict) and "default" in sub:
            instance[key] = copy.deepcopy(sub["default"])
        if isinstance(instance.get(key), dict):
            fill_defaults(instance[key], sub, join_path(path, key), warnings)
    warnings.extend(f"ignoring {', '.join(keys)}: {reason}" for reason, keys in ignored.items())


def fill_searcher_defaults(searcher: dict[str, Any]) -> None:
    """The defaults that depend on the searcher's name (x-defaults-by-name), in place."""
    defaults = schema()["$defs"]["searcher"]["x-defaults-by-name"].get(searcher["name"], {})
    for key, value in defaults.items():
        searcher.setdefault(key, copy.deepcopy(value))


def with_defaults(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of an experiment config, already validated (a stored one included), with
    every default of the schema that it lacks filled in: a config stored before a key had
    a default reads as if filled today. `config` itself is left unchanged."""
    filled = copy.deepcopy(dict(config))
    fill_defaults(filled, schema(), "", [])
    fill_searcher_defaults(filled["searcher"])
    return filled


def section_with_defaults(section: Mapping[str, Any], definition: str) -> dict[str, Any]:
    """A copy of one section (such as "checkpoint_storage") with its schema defaults filled."""
    filled = copy.deepcopy(dict(section))
    fill_defaults(filled, {"$ref": f"#/$defs/{definition}"}, definition, [])
    return filled


# -- lengths ----------------------------------------------------------------------------------

def global_batch_size(config: Mapping[str, Any]) -> int:
    """The constant ``hyperparameters.global_batch_size`` (bare or ``{type: const, val: N}``)."""
    path = "hyperparameters.global_batch_size"
    hp = (config.get("hyperparameters") or {}).get("global_batch_size")
    if hp is None:
        raise ConfigError(f"missing required key '{path}'", path)
    value: Any = hp.get("val") if isinstance(hp, dict) and hp.get("type") == "const" else hp
    if not strict_int(None, value) or value < 1:
        raise ConfigError(f"{path}: expected a constant positive integer, got {shown(hp)}", path)
    return value


def length_to_batches(length: dict[str, int] | int, config: Mapping[str, Any], what: str) -> int:
    """Convert ``{"batches"|"records"|"epochs": N}`` (or a bare int of batches) to batches,
    rounding up.

    >>> cfg = {"records_per_epoch": 1000, "hyperparameters": {"global_batch_size": 64}}
    >>> length_to_batches({"epochs": 2}, cfg, "searcher.max_length")
    32
    """
    if strict_int(None, length):
        return length  # type: ignore[return-value]
    if not (isinstance(length, dict) and len(length) == 1 and next(iter(length)) in LENGTH_UNITS):
        raise ConfigError(f"{what}: expected one of 'batches', 'records', 'epochs' "
                          f"(got {shown(length)})", what)
    ((unit, n),) = length.items()
    if unit == "batches":
        return n
    records = n
    if unit == "epochs":
        per_epoch = config.get("records_per_epoch") or 0
        if per_epoch <= 0:
            raise ConfigError(f"{what}: is given in epochs, so set records_per_epoch (training "
                              f"records in one epoch) at the top level of the config", what)
        records = n * per_epoch
    try:
        batch = global_batch_size(config)
    except ConfigError as e:
        raise ConfigError(f"{e}; {what} is given in {unit}, which needs it to count batches",
                          e.path) from None
    return -(-records // batch)
