"""What Determined's experiment configs of releases 0.17 to 0.38 wrote that localdet's
canonical form says another way, turned into it as parse_config validates (experiment.py):

    without_nulls(raw, schema())     # null means the default, as in Determined's schemas
    time_length(searcher, warnings)  # 0.38's time_metric/max_time -> max_length
    storage_of_other_kinds(storage, warnings)   # directory, gcs, azure, hdfs
    bind_mount_notes(raw.get("bind_mounts"))    # what a trial reads instead
    with_smallest_batch_size(config) # a searched batch size, for checking a length

Every function takes the config as the user wrote it (or its validated copy) and either
changes it in place, returns a copy, or adds one-sentence warnings; errors are ConfigError.
"""

from __future__ import annotations

import copy
import difflib
from typing import Any

from localdet.config.schema import LENGTH_UNITS, ConfigError, resolve, shown, strict_int


def _did_you_mean(word: str) -> str:
    close = difflib.get_close_matches(word, LENGTH_UNITS, n=1)
    return f"; did you mean '{close[0]}'?" if close else ""


def _is_const(hp: Any) -> bool:
    return hp is not None and (not isinstance(hp, dict) or hp.get("type") == "const")


def without_nulls(raw: dict[str, Any], node: Any) -> dict[str, Any]:
    """A copy of `raw` without the keys set to null where the schema takes no null: in
    Determined's configs (its schemas allow null nearly everywhere) null means the default.
    Only the schema's own sections: hyperparameters and data are the user's."""
    node = _resolve_all(node)
    properties = node.get("properties", {}) if isinstance(node, dict) else {}
    out: dict[str, Any] = {}
    for key, value in raw.items():
        sub = _resolve_all(properties.get(key))
        if value is None and isinstance(sub, dict) and "null" not in _types(sub):
            continue
        if isinstance(value, dict) and isinstance(sub, dict) and sub.get("properties"):
            value = without_nulls(value, sub)
        out[key] = copy.deepcopy(value)
    return out


def _resolve_all(node: Any) -> Any:
    """A schema node with its $ref and allOf parts merged (enough to see its properties)."""
    node = resolve(node)
    if isinstance(node, dict) and "allOf" in node:
        merged = {k: v for k, v in node.items() if k != "allOf"}
        for part in node["allOf"]:
            part = _resolve_all(part)
            if isinstance(part, dict):
                merged.setdefault("properties", {})
                merged["properties"] = {**part.get("properties", {}), **merged["properties"]}
        return merged
    return node


def _types(node: dict[str, Any]) -> list[str]:
    if "enum" in node:
        return ["null"] if None in node["enum"] else []
    kind = node.get("type", [])
    return [kind] if isinstance(kind, str) else list(kind)


def bind_mount_notes(mounts: Any) -> list[str]:
    """A trial here reads the machine's own paths: say so for each mount whose path inside
    Determined's container differs from the host's (the code's paths may need changing)."""
    notes = []
    for mount in mounts if isinstance(mounts, list) else []:
        if isinstance(mount, dict) and mount.get("host_path") and mount.get("container_path") \
                and mount["host_path"] != mount["container_path"]:
            notes.append(f"bind_mounts: a trial here sees {mount['host_path']!r} at its own "
                         f"path, not at {mount['container_path']!r} as in Determined's container")
    return notes


def with_smallest_batch_size(config: dict[str, Any]) -> dict[str, Any]:
    """`config` as length_to_batches reads it, with a searched global_batch_size (an int
    range or a choice of integers) replaced by the smallest it can take; `config` itself
    when the batch size is constant or absent."""
    path = "hyperparameters.global_batch_size"
    hp = config["hyperparameters"].get("global_batch_size")
    if hp is None or _is_const(hp):
        return config
    if hp["type"] == "int":
        smallest = hp["minval"]
    elif hp["type"] == "categorical" and all(strict_int(None, v) for v in hp["vals"]):
        smallest = min(hp["vals"])
    else:
        raise ConfigError(f"{path}: a searched batch size must be an int range or a choice of "
                          f"integers, got {shown(hp)}", path)
    if smallest < 1:
        raise ConfigError(f"{path}: every batch size it can take must be at least 1, got "
                          f"{shown(hp)}", path)
    return {**config, "hyperparameters": {**config["hyperparameters"],
                                          "global_batch_size": smallest}}


def time_length(searcher: dict[str, Any], warnings: list[str]) -> None:
    """Determined 0.38's `time_metric`/`max_time` become `max_length: {time_metric: max_time}`,
    the one length localdet's searchers read; both keys are removed. Determined's searcher
    read `time_metric` from each validation's metrics (any name the script reports); here a
    trial's length is counted in batches, so only the three units that convert to batches
    are taken."""
    metric, max_time = searcher.pop("time_metric", None), searcher.pop("max_time", None)
    if metric is None and max_time is None:
        return
    if metric is None or max_time is None:
        given, missing = ("time_metric", "max_time") if max_time is None \
            else ("max_time", "time_metric")
        raise ConfigError(f"missing required key 'searcher.{missing}'; searcher.{given} needs "
                          f"it to say how long a trial trains", f"searcher.{missing}")
    if metric not in LENGTH_UNITS:
        raise ConfigError(f"searcher.time_metric: localdet counts a trial's length in batches, "
                          f"records or epochs, not in a metric the script reports "
                          f"(got {shown(metric)}){_did_you_mean(metric)}",
                          "searcher.time_metric")
    length = {metric: max_time}
    old = searcher["max_length"]
    if old is not None and (old if isinstance(old, dict) else {"batches": old}) != length:
        warnings.append(f"ignoring 'searcher.max_length' ({shown(old)}): time_metric and "
                        f"max_time set the length ({metric}: {max_time}), as in Determined 0.38")
    searcher["max_length"] = length


_ELSEWHERE_KEYS = ("type", "bucket", "prefix", "container_path")


def storage_of_other_kinds(storage: dict[str, Any], warnings: list[str]) -> None:
    """Determined's storage types other than shared_fs and s3, in place: 'directory' is a
    folder at container_path (with no container, a folder of this machine: shared_fs
    there); gcs, azure and hdfs cannot be reached, so their checkpoints go to localdet's own
    store, and the config says so. container_path of a shared_fs is a path inside
    Determined's container, which has none here."""
    kind = storage.get("type")
    if kind == "directory":
        if not storage.get("container_path"):
            raise ConfigError("missing required key 'checkpoint_storage.container_path'; a "
                              "'directory' storage writes checkpoints there",
                              "checkpoint_storage.container_path")
        storage.update(type="shared_fs", host_path=storage.pop("container_path"))
        storage.setdefault("storage_path", None)
    elif kind in ("gcs", "azure", "hdfs"):
        for key in _ELSEWHERE_KEYS:
            storage.pop(key, None)
        warnings.append(f"ignoring 'checkpoint_storage.type' ({kind!r}): localdet cannot reach "
                        f"{kind}; checkpoints go to its own store, kept as save_trial_best, "
                        f"save_trial_latest and save_experiment_best say")
    if storage.pop("container_path", None) is not None:
        reason = ": localdet runs trials outside containers"  # the schema's, for its siblings
        key = "'checkpoint_storage.container_path'"
        same = [i for i, w in enumerate(warnings) if w.startswith("ignoring ") and
                w.endswith(reason) and "'checkpoint_storage." in w]
        if same:  # one warning for the container keys, as the schema gives the others
            head = warnings[same[0]].removesuffix(reason)
            warnings[same[0]] = f"{head}, {key}{reason}"
        else:
            warnings.append(f"ignoring {key}{reason}")
