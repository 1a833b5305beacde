"""Compile a model read from an `.h5` the way it was compiled, in whichever Keras line
reads it: the recorded loss, metrics and optimizer are translated for this line
(`_compile_translation`) and built from this line's classes.

    compile_as_saved(model, Path("determined-keras-model.h5"), custom_objects)

What has no equivalent here is named in one warning on the `determined.keras` logger: a
metric is left out; a loss leaves the model uncompiled (its weights are what was loaded).
"""

from __future__ import annotations

import inspect
import json
import logging
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple, cast

import h5py
import tensorflow as tf

from determined.keras._compile_translation import (
    IGNORE_CLASS_CROSSENTROPY,
    CompileArguments,
    translate_training_config,
)
from determined.keras._line import keras_line

log = logging.getLogger("determined.keras")


def read_training_config(h5_path: Path) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """The compile arguments an `.h5` records, as the line that wrote it serialised them
    (None when the model was saved uncompiled), and that line."""
    with h5py.File(h5_path, "r") as h5:
        raw = h5.attrs.get("training_config")
        version = h5.attrs.get("keras_version")
    version = version.decode() if isinstance(version, bytes) else str(version or "")
    writer = "keras3" if version.startswith("3.") else "keras2" if version else None
    if raw is None:
        return None, writer
    return json.loads(raw.decode() if isinstance(raw, bytes) else raw), writer


def crossentropy_by_shape(y_true: Any, y_pred: Any) -> Any:
    """Keras 2's metric "crossentropy" ("ce"): binary, sparse or categorical as the
    shapes say, the rule Keras 2's `compile` applied."""
    y_true_rank, y_pred_rank = len(y_true.shape), len(y_pred.shape)
    last_true, last_pred = y_true.shape[-1], y_pred.shape[-1]
    if last_pred == 1:
        return tf.keras.losses.binary_crossentropy(y_true, y_pred)
    if y_true_rank == y_pred_rank - 1 or (last_true == 1 and last_pred not in (None, 1)):
        return tf.keras.losses.sparse_categorical_crossentropy(y_true, y_pred)
    return tf.keras.losses.categorical_crossentropy(y_true, y_pred)


class _NoEquivalent(ValueError):
    pass


def _ignore_class_crossentropy(name: str, over: str, from_logits: bool = False,
                               ignore_class: int = 0, axis: int = -1, dtype: Any = None,
                               **_: Any) -> Any:
    """A sparse cross-entropy metric with `ignore_class` averaged as the line that recorded
    it averaged it: over the entries kept (Keras 2) or over all of them (Keras 3)."""

    class IgnoreClassCrossentropy(tf.keras.metrics.Mean):
        def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> Any:
            y_pred = tf.convert_to_tensor(y_pred)
            labels = tf.reshape(tf.cast(y_true, "int64"), tf.shape(y_pred)[:-1])
            kept = tf.not_equal(labels, ignore_class)
            values = tf.keras.losses.sparse_categorical_crossentropy(
                tf.where(kept, labels, tf.zeros_like(labels)), y_pred,
                from_logits=from_logits, axis=axis)
            weights = tf.cast(kept, values.dtype)
            if over == "kept":
                return super().update_state(values, sample_weight=weights)
            return super().update_state(values * weights, sample_weight=sample_weight)

    return IgnoreClassCrossentropy(name=name, dtype=dtype)


def _function(name: Any, custom: Dict[str, Any], kind: str) -> Callable[..., Any]:
    """A built-in or custom function by the name an entry records, looked up among `kind`
    ("losses" or "metrics") first: `cosine_similarity` is the negative cosine as a loss,
    the cosine as a metric."""
    if callable(name):
        return cast(Callable[..., Any], name)
    if not isinstance(name, str):
        raise _NoEquivalent(f"function {name!r}")
    if name in custom:
        return cast(Callable[..., Any], custom[name])
    if name == "crossentropy":
        return crossentropy_by_shape
    modules = (tf.keras.losses, tf.keras.metrics) if kind == "losses" else \
        (tf.keras.metrics, tf.keras.losses)
    for module in modules:
        found = getattr(module, name, None)
        if inspect.isfunction(found):
            return cast(Callable[..., Any], found)
    for module in modules:
        try:
            found = module.get(name)
        except (ValueError, TypeError):
            continue
        if inspect.isfunction(found):
            return cast(Callable[..., Any], found)
    found = tf.keras.utils.get_registered_object(name, custom)
    if callable(found) and not inspect.isclass(found):
        return cast(Callable[..., Any], found)
    raise _NoEquivalent(f"function '{name}'")


def _metric_by_name(name: Any, custom: Dict[str, Any]) -> Any:
    """The metric object this line's `metrics.get` makes of a built-in function's name
    (Keras 3 keeps some metric functions, as `cosine_similarity`, only as classes);
    None where it gives a function (Keras 2) or nothing."""
    if not isinstance(name, str) or name in custom:
        return None
    try:
        found = tf.keras.metrics.get(name)
    except (ValueError, TypeError):
        return None
    return found if isinstance(found, tf.keras.metrics.Metric) else None


def _with_arguments(fn: Callable[..., Any], name: str, kwargs: Dict[str, Any]) -> Any:
    if not kwargs:
        return fn

    def loss(y_true: Any, y_pred: Any) -> Any:
        return fn(y_true, y_pred, **kwargs)

    loss.__name__ = name
    return loss


def _build(spec: Any, custom: Dict[str, Any], kind: str) -> Any:
    """A translated entry as this line's object (`kind`: "losses" or "metrics")."""
    if spec is None:
        return None
    if isinstance(spec, list):
        return [_build(item, custom, kind) for item in spec]
    if isinstance(spec, str):
        found = custom.get(spec) or tf.keras.utils.get_registered_object(spec, custom)
        if found is not None:
            return found() if inspect.isclass(found) else found
        return spec  # a built-in name: `compile` resolves it ("acc" by the shapes)
    if not isinstance(spec, dict):
        return spec
    if "class_name" not in spec:  # per output, by output name
        return {name: _build(value, custom, kind) for name, value in spec.items()}
    class_name, config = spec["class_name"], dict(spec.get("config") or {})
    if class_name in custom and inspect.isclass(custom[class_name]):
        return custom[class_name].from_config(config)
    if class_name in ("MeanMetricWrapper", "LossFunctionWrapper"):
        fn_name = config.pop("fn", None) or config.get("name")
        name = config.pop("name", None) or str(fn_name)
        config.pop("reduction", None)
        dtype = config.pop("dtype", None)
        metric = _metric_by_name(fn_name, custom) if kind == "metrics" and not config \
            else None
        if metric is not None:
            # Named as `compile` names a metric given by a string (Keras 2's name is
            # read-only).
            try:
                metric.name = name
            except AttributeError:
                metric._name = name
            return metric
        fn = _function(fn_name, custom, kind)
        if kind == "losses":
            return _with_arguments(fn, name, config)
        return tf.keras.metrics.MeanMetricWrapper(fn, name=name, dtype=dtype, **config)
    if class_name == IGNORE_CLASS_CROSSENTROPY:
        return _ignore_class_crossentropy(**config)
    module = tf.keras.losses if kind == "losses" else tf.keras.metrics
    other = tf.keras.metrics if kind == "losses" else tf.keras.losses
    cls = tf.keras.utils.get_registered_object(class_name, custom) or \
        getattr(module, class_name, None) or getattr(other, class_name, None)
    if not inspect.isclass(cls):
        raise _NoEquivalent(f"class '{class_name}'")
    return cast(Any, cls).from_config(config)


def _build_metrics(specs: Any, custom: Dict[str, Any], notes: List[str]) -> Any:
    """Each metric on its own: one that this line cannot build is left out, and named."""
    if isinstance(specs, list):
        built = []
        for spec in specs:
            try:
                built.append(_build_metrics(spec, custom, notes))
            except (_NoEquivalent, ValueError, TypeError) as error:
                notes.append(f"the metric {_described(spec)} cannot be built under "
                             f"{_spoken()} ({_first_line(error)}) and is left out")
        return built
    if isinstance(specs, dict) and "class_name" not in specs:
        return {name: _build_metrics(value, custom, notes) for name, value in specs.items()}
    return _build(specs, custom, "metrics")


def _described(spec: Any) -> str:
    if isinstance(spec, dict):
        config = spec.get("config")
        named = config.get("name") if isinstance(config, dict) else None
        return f"'{named or spec.get('class_name')}'"
    return repr(spec)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def _spoken() -> str:
    return "Keras 2" if keras_line() == "keras2" else "Keras 3"


def _optimizer(spec: Optional[Dict[str, Any]], notes: List[str]) -> Any:
    """This line's optimizer of the recorded class, with the settings its class takes."""
    if not spec:
        return "rmsprop"
    name, settings = spec["class_name"], dict(spec.get("config") or {})
    if isinstance(settings.get("inner_optimizer"), dict):  # mixed precision's loss scaling
        inner = _optimizer(settings.pop("inner_optimizer"), notes)
        cls = tf.keras.mixed_precision.LossScaleOptimizer
        return cls(tf.keras.optimizers.get(inner), **_accepted(cls, settings))
    try:
        cls = tf.keras.optimizers.get(name).__class__
    except ValueError:
        notes.append(f"the optimizer '{name}' has no {_spoken()} equivalent; Keras's "
                     "default 'rmsprop' is used")
        return "rmsprop"
    schedule = settings.get("learning_rate")
    if isinstance(schedule, dict):
        try:
            settings["learning_rate"] = tf.keras.optimizers.schedules.deserialize(schedule)
        except (ValueError, TypeError):
            notes.append(f"the learning-rate schedule '{schedule.get('class_name')}' has no "
                         f"{_spoken()} equivalent; the optimizer's default rate is used")
            settings.pop("learning_rate")
    return cls(**_accepted(cls, settings))


def _accepted(cls: Any, settings: Dict[str, Any]) -> Dict[str, Any]:
    """The settings named by the class or the bases it passes its keyword arguments on to."""
    accepted = {key for base in cls.__mro__ if "__init__" in vars(base)
                for key in inspect.signature(base.__init__).parameters}
    return {k: v for k, v in settings.items() if k in accepted and k != "self"}


def build_compile_arguments(config: Dict[str, Any], custom: Dict[str, Any],
                            n_outputs: int = 1,
                            writer: Optional[str] = None) -> CompileArguments:
    """`compile`'s arguments in this line, built from a parsed `training_config` that the
    line `writer` recorded (where known); its `notes` name what has no equivalent here."""
    custom_names = frozenset(custom) | frozenset(tf.keras.utils.get_custom_objects())
    args = translate_training_config(config, keras_line(), custom_names, writer)
    if not args.compile:
        return args
    try:
        args.loss = _build(args.loss, custom, "losses")
    except (_NoEquivalent, ValueError, TypeError) as error:
        args.notes.append(f"the loss {_described(args.loss)} cannot be built under "
                          f"{_spoken()} ({_first_line(error)}), so the model is returned "
                          "uncompiled: compile it with a loss of your choice")
        args.compile = False
        return args
    metrics = _build_metrics(args.metrics, custom, args.notes)
    # Keras 2 records one list of metrics per output.
    if isinstance(metrics, list) and len(metrics) == 1 and isinstance(metrics[0], list) \
            and n_outputs == 1:
        metrics = metrics[0]
    weighted = _build_metrics(args.weighted_metrics, custom, args.notes)
    if isinstance(weighted, list) and len(weighted) == 1 and isinstance(weighted[0], list) \
            and n_outputs == 1:
        weighted = weighted[0]
    args.metrics, args.weighted_metrics = metrics, weighted
    args.optimizer = _optimizer(args.optimizer, args.notes)
    return args


def complete_entry(given: Any, entry: Any) -> bool:
    """Add to `entry` (a recorded loss or metric, or a structure of them) the arguments its
    object `given` keeps only as its function's keyword arguments, which Keras 3's
    `get_config` leaves out (Huber's `delta`, CosineSimilarity's `axis`,
    SparseCategoricalCrossentropy's `axis`); True where any was added."""
    if isinstance(given, (list, tuple)) and isinstance(entry, list):
        return any([complete_entry(g, e) for g, e in zip(given, entry, strict=False)])
    if isinstance(given, dict) and isinstance(entry, dict) and "class_name" not in entry:
        return any([complete_entry(g, entry.get(k)) for k, g in given.items()])
    arguments = getattr(given, "_fn_kwargs", None)
    config = entry.get("config") if isinstance(entry, dict) else None
    if not isinstance(arguments, dict) or not isinstance(config, dict):
        return False
    added = {key: value for key, value in arguments.items() if key not in config
             and isinstance(value, (bool, int, float, str, type(None)))}
    config.update(added)
    return bool(added)


def record_missing_arguments(model: Any, h5_path: Path) -> None:
    """Complete the compile arguments a Keras 3 `.h5` records (see `complete_entry`), so
    that either line compiles the model as it was; Keras 2 records them all itself."""
    given = getattr(getattr(model, "_compile_config", None), "config", None)
    if not isinstance(given, dict):
        return
    with h5py.File(h5_path, "r+") as h5:
        raw = h5.attrs.get("training_config")
        if raw is None:
            return
        config = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
        changed = [complete_entry(given.get(key), config.get(key))
                   for key in ("loss", "metrics", "weighted_metrics")]
        if any(changed):
            h5.attrs["training_config"] = json.dumps(config)


def compile_as_saved(model: Any, h5_path: Path, custom: Dict[str, Any]) -> bool:
    """Compile `model` with the loss, metrics and optimizer its `.h5` records (`custom`:
    the objects a name may mean beyond Keras's own); False when it is left uncompiled (the
    file records no compilation, or its loss has no equivalent in this line)."""
    config, writer = read_training_config(h5_path)
    if config is None:
        return False
    args = build_compile_arguments(config, custom, len(getattr(model, "outputs", None) or [1]),
                                   writer)
    if args.notes:
        log.warning("Loading '%s' under %s: %s.", h5_path, _spoken(), "; ".join(args.notes))
    if not args.compile:
        return False
    model.compile(optimizer=args.optimizer, loss=args.loss, metrics=args.metrics,
                  weighted_metrics=args.weighted_metrics, loss_weights=args.loss_weights)
    return True
