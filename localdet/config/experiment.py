"""Determined experiment configs: parse, validate against state/expconf.schema.json, fill defaults.

Usage::

    from localdet.config.experiment import ConfigError, length_to_batches, load_config_file

    try:
        parsed = load_config_file("const.yaml")
    except ConfigError as e:
        raise SystemExit(f"error: {e}")          # e.path is the dotted key path
    for warning in parsed.warnings:
        print("warning:", warning)
    cfg = parsed.config                  # the dict stored in SQLite
    total = length_to_batches(cfg["searcher"]["max_length"], cfg, "searcher.max_length")
    # (max_length is None for a script that leaves its length to its own epochs)
    parsed.settings.searcher.max_trials  # the same config as frozen dataclasses (typed.py)
    job = load_job_config_file("job.yaml").config   # a batch job, in the same canonical form

The schema holds the structure and every default (plus the extension keywords ``x-ignored``,
``x-kept``, ``x-messages``, ``x-supported`` and ``x-defaults-by-name``); this module turns
schema errors into one-sentence messages and does the checks a schema cannot express.
schema.py reads the schema and fills its defaults, here and into stored configs
(`typed.ExperimentConfig.from_dict`).
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from localdet.config import releases

# The schema and its defaults, ConfigError and lengths live in schema.py (typed.py builds on
# them too); imported here under the names this module has always used and exported.
from localdet.config.schema import ConfigError as ConfigError
from localdet.config.schema import fill_defaults as _fill_defaults
from localdet.config.schema import fill_searcher_defaults as _fill_searcher_defaults
from localdet.config.schema import global_batch_size as global_batch_size
from localdet.config.schema import join_path as _join
from localdet.config.schema import length_to_batches as length_to_batches
from localdet.config.schema import schema as _schema
from localdet.config.schema import schema_path as schema_path
from localdet.config.schema import shown as _shown
from localdet.config.schema import strict_int as _strict_int
from localdet.config.sizes import parse_memory_limit
from localdet.config.typed import ExperimentConfig

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError

MAX_CONFIG_BYTES = 1_000_000  # a config is a page of settings; data belongs in files
MAX_CONFIG_VALUES = 50_000    # values once YAML aliases are expanded ("billion laughs")
MAX_INT = 2**53 - 1           # what JSON readers (the web page's JavaScript) hold exactly


@dataclass
class ParsedConfig:
    config: dict[str, Any]  # validated, every default filled in, ignored keys removed: stored as is
    settings: ExperimentConfig  # the same, typed (localdet/config/typed.py)
    warnings: list[str] = field(default_factory=list)  # one sentence each


@functools.lru_cache(maxsize=None)
def _schema_checks() -> tuple[Any, Any]:
    """The validator class and the relevance key for best_match. jsonschema is imported
    here, when a config is parsed: commands that only read records do without it (~40 ms)."""
    import jsonschema
    from jsonschema.exceptions import by_relevance

    # Plain JSON Schema counts 2.0 as an integer; Determined does not, and neither do we.
    validator = jsonschema.validators.extend(
        jsonschema.Draft202012Validator,
        type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("integer",
                                                                           _strict_int),
    )
    # An unknown key explains a "missing" key (a typo) better than the other way round.
    return validator, by_relevance(strong=frozenset({"additionalProperties"}))
_TYPE_WORDS = {"integer": "an integer", "number": "a number", "string": "a string",
               "boolean": "true or false", "object": "a mapping", "array": "a list",
               "null": "null"}
_TRIAL_CLASS = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")


def _dotted(parts: Any) -> str:
    path = ""
    for part in parts:
        path = _join(path, part)
    return path


def _did_you_mean(word: Any, choices: list[Any]) -> str:
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1)
    # 'slots_per_trial' where a job has 'slots': a longer name for the same thing
    close = close or [str(c) for c in choices if str(word).startswith(f"{c}_")]
    return f"; did you mean '{close[0]}'?" if close else ""


def _translate(error: ValidationError) -> ConfigError:
    """Turn the most relevant schema error into one sentence."""
    node: ValidationError | None = error
    while node is not None:  # x-messages may sit on an enclosing node best_match descended from
        message = node.schema.get("x-messages", {}).get(node.validator) \
            if isinstance(node.schema, dict) else None
        if message:
            path = _dotted(node.absolute_path)
            return ConfigError(f"{path or 'top level'}: {message} (got {_shown(node.instance)})",
                               path)
        node = node.parent
    if error.parent is not None and error.parent.validator == "oneOf":
        error = error.parent  # report "missing entrypoint", not one branch of the oneOf
    path, kind = _dotted(error.absolute_path), error.validator
    value, instance = error.validator_value, error.instance
    where = path or "top level"
    if kind == "additionalProperties":
        known = list(error.schema.get("properties", {}))
        key = next(k for k in instance if k not in known)
        return ConfigError(f"unknown key {_shown(key, 60)} at {where}{_did_you_mean(key, known)}",
                           _join(path, key))
    if kind == "required":
        missing = _join(path, next(k for k in value if k not in instance))
        return ConfigError(f"missing required key '{missing}'", missing)
    if kind == "oneOf" and all(set(branch) == {"required"} for branch in value):
        keys = [branch["required"][0] for branch in value]
        if not any(k in instance for k in keys):
            missing = _join(path, keys[0])
            return ConfigError(f"missing required key '{missing}'", missing)
        names = " and ".join(f"'{_join(path, k)}'" for k in keys)
        return ConfigError(f"{where}: give only one of {names}, not both", path)
    if kind == "type":
        wanted = " or ".join(_TYPE_WORDS[t] for t in ([value] if isinstance(value, str) else value))
        return ConfigError(f"{where}: expected {wanted}, got {_shown(instance)}", path)
    if kind == "enum":
        hint = _did_you_mean(instance, [v for v in value if isinstance(v, str)]) \
            if isinstance(instance, str) else ""
        options = ", ".join(repr(v) for v in value)
        return ConfigError(f"{where}: expected one of {options} (got {_shown(instance)}){hint}",
                           path)
    if kind in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        op = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=",
              "exclusiveMaximum": "<"}[kind]
        return ConfigError(f"{where}: expected a value {op} {value}, got {_shown(instance)}", path)
    if kind in ("minItems", "minLength"):
        return ConfigError(f"{where}: must not be empty", path)
    return ConfigError(f"{where}: {_one_line(error.message)}", path)


def _normalize_hyperparameters(group: dict[str, Any], path: str) -> dict[str, Any]:
    """Every leaf becomes {"type": ...}; a mapping without "type" is a nested group."""
    out: dict[str, Any] = {}
    for name, hp in group.items():
        here = _join(path, name)
        if isinstance(hp, dict) and "type" not in hp:
            out[name] = _normalize_hyperparameters(hp, here)
            continue
        leaf = dict(hp) if isinstance(hp, dict) else {"type": "const", "val": hp}
        if leaf["type"] == "log":  # the one leaf default: the schema's base
            leaf.setdefault("base", _schema()["$defs"]["hp_log"]["properties"]["base"]["default"])
        if leaf["type"] in ("int", "double", "log") and leaf["minval"] > leaf["maxval"]:
            raise ConfigError(f"{here}.minval: must be <= maxval ({_shown(leaf['maxval'])}), "
                              f"got {_shown(leaf['minval'])}", f"{here}.minval")
        _check_range(leaf, here)
        out[name] = leaf
    return out


def _check_range(leaf: dict[str, Any], here: str) -> None:
    """A range whose draws would overflow to infinity fails here, not in the searcher."""
    try:
        if leaf["type"] == "double":
            finite = math.isfinite(float(leaf["maxval"]) - float(leaf["minval"]))
        elif leaf["type"] == "log":
            finite = all(math.isfinite(float(leaf["base"]) ** float(leaf[end]))
                         for end in ("minval", "maxval"))
        else:
            return
    except OverflowError:
        finite = False
    if not finite:
        raise ConfigError(f"{here}: the range {leaf['minval']}..{leaf['maxval']} gives values "
                          f"beyond what a float holds; narrow it", here)


def _environment_variables(value: list[str] | dict[str, list[str]],
                           warnings: list[str]) -> dict[str, str]:
    if isinstance(value, dict):
        # Determined picks the list for the slot type it schedules on; here one process may see
        # a GPU or not, so take the cpu settings as the base and let cuda's (the GPU-specific
        # ones) override.
        if value.get("rocm"):
            warnings.append("ignoring 'environment.environment_variables.rocm': localdet does "
                            "not run on ROCm")
        # 'gpu' is what Determined called cuda before 0.17.6 (an alias after).
        value = [*value.get("cpu", []), *value.get("gpu", []), *value.get("cuda", [])]
    return dict(entry.split("=", 1) for entry in value)


def _entrypoint(config: dict[str, Any]) -> None:
    """Add entrypoint_kind plus trial_class / script_command (the unused one is None)."""
    config.setdefault("entrypoint", None)
    config.setdefault("entrypoint_script", None)
    trial_class: str | None = None
    script: str | None = None
    launcher: str | None = None
    if config["entrypoint_script"] is not None:
        script = config["entrypoint_script"].strip()
        if script.endswith(".py") and not any(c.isspace() for c in script):
            # A bare script path, run the way Determined's examples do.
            script = f"python3 {shlex.quote(script)}"
    else:
        if isinstance(config["entrypoint"], list):
            config["entrypoint"] = shlex.join(config["entrypoint"])
        text = config["entrypoint"].strip()
        if _TRIAL_CLASS.match(text):
            trial_class = text
        elif ":" in text and not any(c.isspace() for c in text):
            raise ConfigError(f"entrypoint: expected 'module:ClassName' (a dotted module, a colon, "
                              f"a class name) or a command such as 'python3 train.py', got "
                              f"{_shown(text)}", "entrypoint")
        else:
            try:
                tokens = shlex.split(text)
            except ValueError as e:
                raise ConfigError(f"entrypoint: cannot split the command ({e}): {_shown(text)}",
                                  "entrypoint") from None
            is_launcher = len(tokens) >= 3 and tokens[1] == "-m" \
                and tokens[2].startswith("determined.launch.")
            trial_class, script = _launcher(tokens) if is_launcher else (None, text)
            # Which of Determined's launchers: "tensorflow" gives each rank a TF_CONFIG.
            launcher = tokens[2].removeprefix("determined.launch.") if is_launcher else None
    config["entrypoint_kind"] = "trial_class" if trial_class else "script"
    config["launcher"] = launcher
    config["trial_class"] = trial_class
    config["script_command"] = script


def _launcher(tokens: list[str]) -> tuple[str | None, str | None]:
    """Split ``python3 -m determined.launch.X [[OVERRIDES...] --] (--trial T | SCRIPT...)``."""
    rest = tokens[3:]
    if "--" in rest:
        # What precedes "--" is for the launcher (horovodrun etc.).
        rest = rest[rest.index("--") + 1:]
    else:
        while rest and rest[0].startswith("-") and not rest[0].startswith("--trial"):
            rest = rest[1:]  # launcher flags such as --autohorovod
    if rest and (rest[0] == "--trial" or rest[0].startswith("--trial=")):
        trial = rest[0].partition("=")[2] or (rest[1] if len(rest) > 1 else "")
        if not _TRIAL_CLASS.match(trial):
            raise ConfigError(f"entrypoint: --trial expects 'module:ClassName', got "
                              f"{_shown(trial)}", "entrypoint")
        return trial, None
    if not rest:
        raise ConfigError(f"entrypoint: {tokens[2]} needs '--trial module:ClassName' or a "
                          f"script to run", "entrypoint")
    return None, shlex.join(rest)


def _validated(raw: Any, schema: dict[str, Any], needs: str) -> tuple[dict[str, Any], list[str]]:
    """Validate `raw` against `schema`; returns a copy with defaults filled and the warnings."""
    if raw is None:
        raise ConfigError(f"the config is empty; it needs at least {needs}")
    if not isinstance(raw, dict):
        raise ConfigError(f"top level: expected a mapping of config keys, got "
                          f"{type(raw).__name__} {_shown(raw)}")
    from jsonschema.exceptions import best_match

    config = releases.without_nulls(raw, schema)
    validator, relevance = _schema_checks()
    error = best_match(validator(schema).iter_errors(config), key=relevance)
    if error is not None:
        raise _translate(error)
    warnings: list[str] = []
    _fill_defaults(config, schema, "", warnings)
    return config, warnings


def parse_config(raw: dict[str, Any]) -> ParsedConfig:
    """Validate a Determined experiment config (already loaded from YAML) and return its
    canonical form.

    >>> cfg = parse_config({"entrypoint": "model_def:Trial",
    ...     "hyperparameters": {"global_batch_size": 32},
    ...     "searcher": {"name": "single", "metric": "val_loss", "max_length": 100}}).config
    >>> (cfg["searcher"]["max_length"], cfg["hyperparameters"]["global_batch_size"],
    ...  cfg["trial_class"])
    ({'batches': 100}, {'type': 'const', 'val': 32}, 'model_def:Trial')

    A script entrypoint ('python3 train.py') may leave out the searcher (single, val_loss) and
    its max_length (None: the script's own epochs decide).
    ``cfg["reproducibility"]["experiment_seed"]`` is None when the config sets none: the caller
    picks a seed and records it. Raises ConfigError on the first problem found.
    """
    config, warnings = _validated(raw, _schema(), "'entrypoint'")
    searcher = config["searcher"]
    supported = _schema()["$defs"]["searcher"]["properties"]["name"]["x-supported"]
    if searcher["name"] not in supported:
        raise ConfigError(f"searcher.name: {_shown(searcher['name'])} is not supported yet; "
                          f"supported: {', '.join(supported)}", "searcher.name")
    config["hyperparameters"] = _normalize_hyperparameters(config["hyperparameters"],
                                                           "hyperparameters")
    env = config["environment"]
    env["environment_variables"] = _environment_variables(env["environment_variables"], warnings)
    releases.time_length(searcher, warnings)
    warnings.extend(releases.bind_mount_notes(raw.get("bind_mounts")))
    _entrypoint(config)
    if config["entrypoint_kind"] == "trial_class":
        # A trial class has no epochs of its own: the searcher alone says how long it trains.
        if "searcher" not in raw:
            raise ConfigError("missing required key 'searcher'; a trial class entrypoint needs a "
                              "searcher with a metric and a max_length", "searcher")
        if searcher["max_length"] is None and searcher["name"] != "custom":
            raise ConfigError("missing required key 'searcher.max_length'; a trial class "
                              "entrypoint trains for as long as the searcher says (max_length, "
                              "or time_metric with max_time)", "searcher.max_length")
    for holder, key, what in ((searcher, "max_length", "searcher.max_length"),
                              (config, "min_validation_period", "min_validation_period"),
                              (config, "min_checkpoint_period", "min_checkpoint_period")):
        if holder[key] is None:
            continue  # max_length of a script's run: its epochs decide
        if isinstance(holder[key], int):
            holder[key] = {"batches": holder[key]}  # Determined's legacy bare-int form
        # Fail now, not hours into training. A searched batch size counts the searcher's
        # records and epochs per trial (search/methods): the smallest gives the most batches.
        sized = releases.with_smallest_batch_size(config) if key == "max_length" else config
        batches = length_to_batches(holder[key], sized, what)
        if batches > MAX_INT:
            raise ConfigError(f"{what}: comes to {batches:,} batches, more than localdet counts; "
                              f"lower it", what)
    if _is_const(config["hyperparameters"].get("global_batch_size")):
        global_batch_size(config)  # a constant that is no batch size fails now
    _check_searcher(config, warnings)
    releases.storage_of_other_kinds(config["checkpoint_storage"], warnings)
    _check_checkpoint_storage(config["checkpoint_storage"])
    resources = config["resources"]
    if resources["max_memory"] is not None:  # bytes from here on
        try:
            resources["max_memory"] = parse_memory_limit(resources["max_memory"])
        except ValueError as e:
            raise ConfigError(f"resources.max_memory: {e}", "resources.max_memory") from None
    return ParsedConfig(config=config, settings=ExperimentConfig.from_dict(config),
                        warnings=warnings)


# What a `searcher.name: custom` experiment submitted on its own is told (Determined's, too,
# waited for the operations of a search runner). The runner itself leaves it unsaid.
CUSTOM_WAITS = ("searcher.name custom waits for a search method: run the script that calls "
                "determined.searcher.LocalSearchRunner(method).run(config, model_dir=...), "
                "which creates its own experiment (kill this one with `localdet kill`)")


def _check_searcher(config: dict[str, Any], warnings: list[str]) -> None:
    """Fill the named searcher's own defaults and check what it needs beyond the schema."""
    searcher = config["searcher"]
    name = searcher["name"]
    _fill_searcher_defaults(searcher)
    if name in ("random", "adaptive_asha", "async_halving", "tpe", "bayesian") \
            and searcher.get("max_trials") is None:
        raise ConfigError(f"missing required key 'searcher.max_trials'; the {name} searcher needs "
                          f"it to know how many trials to run", "searcher.max_trials")
    if name == "custom":
        warnings.append(CUSTOM_WAITS)
    if name == "async_halving":
        # One bracket of num_rungs rungs: adaptive_asha with bracket_rungs [num_rungs].
        searcher["bracket_rungs"] = [searcher["num_rungs"]]
        for key, value in _schema()["$defs"]["searcher"]["x-defaults-by-name"][
                "adaptive_asha"].items():
            searcher.setdefault(key, value)
    early_stopping = any(searcher.get(key) is not None for key in ("mode", "max_rungs", "divisor"))
    concurrent = searcher["max_concurrent_trials"]
    if name in ("tpe", "bayesian") and not early_stopping \
            and (concurrent == 0 or concurrent >= searcher["max_trials"]):
        warnings.append(f"searcher.max_concurrent_trials: the {name} searcher learns from "
                        f"finished trials, but {concurrent or 'no limit'} lets all "
                        f"{searcher['max_trials']} start at once, drawn at random: lower it "
                        f"(to the slots you have, say)")
    if name in ("tpe", "bayesian") and early_stopping:
        # Early stopping asked for: adaptive_asha's rungs, its defaults for what is unset.
        for key, value in _schema()["$defs"]["searcher"]["x-defaults-by-name"][
                "adaptive_asha"].items():
            if searcher.get(key) is None:
                searcher[key] = value
        if searcher["max_length"] is None:
            raise ConfigError(f"missing required key 'searcher.max_length'; the {name} searcher "
                              f"with early stopping (mode, max_rungs or divisor) needs it to "
                              f"size its rungs", "searcher.max_length")
    if name in ("adaptive_asha", "async_halving"):
        if searcher["max_length"] is None:
            raise ConfigError(f"missing required key 'searcher.max_length'; the {name} searcher "
                              f"needs it to size its rungs (or time_metric with max_time)",
                              "searcher.max_length")
        if searcher["stop_once"]:
            warnings.append(f"ignoring 'searcher.stop_once': localdet's {name} always "
                            f"promotes trials, continuing them from their checkpoints")
            searcher["stop_once"] = False
    if name == "grid":
        # Imported here: the searcher package imports this module.
        from localdet.config.hparams import MAX_GRID_POINTS, MissingCount, grid_size
        try:
            size = grid_size(config["hyperparameters"])
        except MissingCount as missing:
            raise ConfigError(str(missing), missing.path) from None
        if size > MAX_GRID_POINTS:
            raise ConfigError(f"hyperparameters: the grid has {size:,} points; at most "
                              f"{MAX_GRID_POINTS:,} are allowed: lower some counts",
                              "hyperparameters")


_STORAGE_KEYS = {"shared_fs": ("host_path", "storage_path"),
                 "s3": ("bucket", "prefix", "endpoint_url", "access_key", "secret_key")}


def _check_checkpoint_storage(storage: dict[str, Any]) -> None:
    """What the schema cannot say about where checkpoints go (localdet/checkpoints/storage.py)."""
    kind = storage.get("type")
    for other, keys in _STORAGE_KEYS.items():
        for key in keys:
            if key in storage and kind != other:
                path = f"checkpoint_storage.{key}"
                raise ConfigError(f"{path}: only used with checkpoint_storage.type {other!r}; "
                                  f"set that type or remove the key", path)
    if kind == "shared_fs" and storage.get("storage_path"):
        host, storage_path = Path(storage["host_path"]), Path(storage["storage_path"])
        inside = (host / storage_path) if not storage_path.is_absolute() else storage_path
        if ".." in storage_path.parts or not inside.is_relative_to(host):
            path = "checkpoint_storage.storage_path"
            raise ConfigError(f"{path}: expected a folder inside host_path {str(host)!r}, got "
                              f"{_shown(storage['storage_path'])}", path)
    if kind == "s3" and importlib.util.find_spec("boto3") is None:
        raise ConfigError("checkpoint_storage.type: 's3' needs boto3, which is not installed; "
                          "run `pip install localdet[s3]`", "checkpoint_storage.type")
    if kind == "s3" and bool(storage.get("access_key")) != bool(storage.get("secret_key")):
        given = "access_key" if storage.get("access_key") else "secret_key"
        missing = "secret_key" if given == "access_key" else "access_key"
        raise ConfigError(f"checkpoint_storage.{missing}: needed with {given}; give both, or "
                          f"neither to use the usual AWS credentials",
                          f"checkpoint_storage.{missing}")


def _job_schema() -> dict[str, Any]:
    return {"$ref": "#/$defs/job", "$defs": _schema()["$defs"]}


def parse_job_config(raw: dict[str, Any]) -> ParsedConfig:
    """Validate a Determined-style job config and return it in the canonical experiment form.

    >>> cfg = parse_job_config({"entrypoint_script": "python3 infer.py", "data": {"trial_id": 7},
    ...     "resources": {"slots": 2}}).config
    >>> cfg["script_command"], cfg["resources"]["slots_per_trial"], cfg["max_restarts"], cfg["data"]
    ('python3 infer.py', 2, 0, {'trial_id': 7})

    ``searcher`` and ``hyperparameters`` are ignored with a warning; a 'module:Class'
    entrypoint is a ConfigError, since a job runs a script.
    """
    job, warnings = _validated(raw, _job_schema(), "'entrypoint_script' (the command the job runs)")
    probe: dict[str, Any] = {key: job[key] for key in ("entrypoint", "entrypoint_script")
                             if key in job}
    _entrypoint(probe)
    if probe["entrypoint_kind"] != "script":
        raise ConfigError(f"entrypoint: a job runs a script such as 'python3 batch_inference.py', "
                          f"not a trial class ({_shown(probe['trial_class'])})", "entrypoint")
    resources = job.pop("resources")
    # The scheduler gives a job its slots exactly as it gives a trial its slots_per_trial.
    job["resources"] = {"slots_per_trial": resources["slots"], "priority": resources["priority"],
                        "max_memory": resources["max_memory"]}
    parsed = parse_config(job)
    return ParsedConfig(config=parsed.config, settings=parsed.settings,
                        warnings=warnings + parsed.warnings)


class _Loader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys and reads 1e-4 as a float (YAML 1.2, as
    Determined's CLI does)."""

    composed = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        # Stop early in a huge document: no config needs this many values.
        self.composed += 1
        if self.composed > MAX_CONFIG_VALUES:
            raise _too_many_values()
        return super().compose_node(parent, index)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key = self.construct_object(key_node)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {_shown(key)}", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep)


_Loader.add_implicit_resolver("tag:yaml.org,2002:float",
                              re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
                              list("-+0123456789"))


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _too_many_values() -> ConfigError:
    return ConfigError(f"the config holds more than {MAX_CONFIG_VALUES:,} values (counting what "
                       f"its aliases repeat); keep data out of the config, in files the model "
                       f"reads")


def _expanded_size(node: yaml.Node, sizes: dict[int, int], open_: set[int]) -> int:
    """How many values `node` stands for once aliases are expanded (shared nodes counted
    once per use, computed once each)."""
    if id(node) in sizes:
        return sizes[id(node)]
    if id(node) in open_:
        raise ConfigError("an alias (*name) refers to the mapping or list that holds it, an "
                          "endless loop; remove that alias")
    open_.add(id(node))
    size = 1
    if isinstance(node, yaml.MappingNode):
        size += sum(_expanded_size(k, sizes, open_) + _expanded_size(v, sizes, open_)
                    for k, v in node.value)
    elif isinstance(node, yaml.SequenceNode):
        size += sum(_expanded_size(item, sizes, open_) for item in node.value)
    open_.discard(id(node))
    sizes[id(node)] = size
    if size > MAX_CONFIG_VALUES:
        raise _too_many_values()
    return size


def _plain(value: Any, path: str = "") -> None:
    """Raise ConfigError unless `value` is what JSON holds and SQLite stores: text keys,
    finite numbers in JSON's exact range, valid Unicode text without NUL."""
    where = path or "top level"
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ConfigError(f"{where}: the key {_shown(key)} is not text; quote it", path)
            _plain(key, _join(path, key))
            _plain(item, _join(path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _plain(item, _join(path, index))
    elif isinstance(value, str):
        if "\0" in value:
            raise ConfigError(f"{where}: {_shown(value)} holds a NUL character; remove it", path)
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigError(f"{where}: {_shown(value)} holds an unpaired surrogate, which is "
                              f"not a character; remove it", path) from None
    elif isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where}: expected a finite number, got {value}", path)
    elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
        raise ConfigError(f"{where}: {_shown(value)} is too large; a config's numbers must lie "
                          f"within plus or minus {MAX_INT:,} (2**53 - 1)", path)
    elif value is not None and not isinstance(value, (bool, int, float)):
        read = value.isoformat() if hasattr(value, "isoformat") else _shown(value)  # dates
        raise ConfigError(f"{where}: YAML read {read} as a {type(value).__name__}, "
                          f"which a config cannot hold; quote it to make it text", path)


def _yaml_error(error: yaml.YAMLError, text: str) -> ConfigError:
    if isinstance(error, yaml.reader.ReaderError):  # its own str() spans two lines
        line = text.count("\n", 0, error.position) + 1
        column = error.position - text.rfind("\n", 0, error.position)
        return ConfigError(f"invalid YAML at line {line}, column {column}: the character "
                           f"#x{error.character:04x} is not allowed in YAML; remove it")
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    parts = [getattr(error, "context", None), getattr(error, "problem", None)]
    problem = ", ".join(part for part in parts if part) or str(error)
    return ConfigError(f"invalid YAML{where}: {_one_line(problem)}")


def _load_yaml(text: str) -> Any:
    """Parse safely, at a bounded cost: size, values after alias expansion, nesting."""
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(f"the config is {len(text) / 1e6:.1f} MB, more than the "
                          f"{MAX_CONFIG_BYTES / 1e6:g} MB a config may be; keep data out of the "
                          f"config, in files the model reads")
    loader = None
    try:
        loader = _Loader(text)  # checks the characters
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node, {}, set())
        value = loader.construct_document(node)
    except yaml.YAMLError as e:
        raise _yaml_error(e, text) from None
    except ConfigError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError):  # e.g. `!!int nope`
        raise ConfigError("invalid YAML: a value does not fit its explicit tag (such as !!int "
                          "or !!map); fix the value or remove the tag") from None
    except RecursionError:
        raise ConfigError("the config's YAML is nested too deeply (lists or mappings within "
                          "each other hundreds of levels down); flatten it") from None
    finally:
        if loader is not None:
            loader.dispose()
    _plain(value)
    return value


def _read(path: str | Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read config file {_shown(str(path))}: {e}") from None


def load_config_text(text: str) -> ParsedConfig:
    """Parse YAML text and validate it: ``load_config_text(Path("const.yaml").read_text())``."""
    return parse_config(_load_yaml(text))


def load_config_file(path: str | Path) -> ParsedConfig:
    """Read and validate a config file; an unreadable file is a ConfigError too."""
    return load_config_text(_read(path))


def load_job_config_text(text: str) -> ParsedConfig:
    """Parse a job config's YAML text and validate it (see `parse_job_config`)."""
    return parse_job_config(_load_yaml(text))


def load_job_config_file(path: str | Path) -> ParsedConfig:
    """Read and validate a job config file; an unreadable file is a ConfigError too."""
    return load_job_config_text(_read(path))


def _is_const(hp: Any) -> bool:
    return hp is not None and (not isinstance(hp, dict) or hp.get("type") == "const")
