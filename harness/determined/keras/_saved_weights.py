"""Put saved weights into a model of this process's Keras line, whichever line saved them,
and compile a model read from an `.h5` the way it was compiled.

    load_weights(model, Path("determined-keras-model-weights"))  # Keras 2's TF format
    compile_as_saved(model, Path("determined-keras-model.h5"))

Keras 3 reads Keras 2's `.h5` itself, but not the TensorFlow checkpoint format that
Determined 0.13.8 and later wrote weights in (`model.save_weights(prefix)`): those are
matched here to the model's layers the way Keras 2 named them (`layer_with_weights-N/kernel`).
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any, Dict, List, Optional, cast

import h5py
import tensorflow as tf

from determined.keras._line import keras_line
from determined.keras._quiet import quiet_keras_warnings

_VALUE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"


class WeightsMismatch(ValueError):
    """The saved weights do not fit the model built from the checkpoint's code."""


def load_weights(model: Any, weights: Path) -> None:
    """Load an `.h5` or a TensorFlow-checkpoint prefix into `model`."""
    with quiet_keras_warnings():
        if weights.suffix == ".h5":
            model.load_weights(str(weights))
        elif keras_line() == "keras3":
            _load_keras2_tf_checkpoint(model, weights)
        else:
            # The optimizer's slots in the checkpoint are for training on, not for loading.
            model.load_weights(str(weights)).expect_partial()


def _layers_with_weights(model: Any) -> List[Any]:
    return [layer for layer in getattr(model, "layers", []) if layer.weights]


def _load_keras2_tf_checkpoint(model: Any, prefix: Path) -> None:
    """Keras 2 saved layer N that has weights under `layer_with_weights-N/`, and each
    variable under its attribute name, which is the variable's own name in Keras 3."""
    reader = tf.train.load_checkpoint(str(prefix))
    shapes = reader.get_variable_to_shape_map()
    saved = {key[:-len(_VALUE_SUFFIX)]: key for key in shapes
             if key.endswith(_VALUE_SUFFIX) and "/.OPTIMIZER_SLOT/" not in key
             and key.startswith("layer")}
    assignments = []
    for index, layer in enumerate(_layers_with_weights(model)):
        prefix_n = f"layer_with_weights-{index}/"
        keys = [k for k in saved if k.startswith(prefix_n)]
        for variable in layer.weights:
            name = variable.path.split("/")[-1] if hasattr(variable, "path") \
                else variable.name.split("/")[-1].split(":")[0]
            candidates = [k for k in keys if k.split("/")[-1] == name
                          and tuple(shapes[saved[k]]) == tuple(variable.shape)]
            if len(candidates) != 1:
                raise WeightsMismatch(
                    f"layer '{layer.name}' of the rebuilt model has a variable '{name}' "
                    f"{tuple(variable.shape)} that the checkpoint holds "
                    f"{'ambiguously' if candidates else 'nowhere'}")
            keys.remove(candidates[0])
            assignments.append((variable, reader.get_tensor(saved[candidates[0]])))
    used = {id(v) for v, _ in assignments}
    missing = [v for v in model.weights if id(v) not in used]
    if missing or not assignments:
        raise WeightsMismatch(f"{len(missing)} of the rebuilt model's weights are not in the "
                              "checkpoint")
    for variable, value in assignments:
        variable.assign(value)


def _plain(entry: Any, custom: Dict[str, Any], kind: Any) -> Any:
    """A loss or metric as the `.h5` recorded it, in a form `compile` takes under either
    line: a custom object from the trial's code or the caller's `custom_object_scope`, the
    name of a built-in function, or the object a class entry describes (`kind`:
    `tf.keras.losses` or `tf.keras.metrics`, where a class name is looked up first)."""
    if entry is None:
        return None
    if isinstance(entry, str):
        found = tf.keras.utils.get_registered_object(entry, custom)
        return (found() if inspect.isclass(found) else found) if found is not None else entry
    if isinstance(entry, list):
        return [_plain(e, custom, kind) for e in entry]
    if isinstance(entry, dict) and "class_name" in entry:
        config = entry.get("config")
        if entry["class_name"] == "function":  # Keras 3: a built-in by name
            return _plain(config if isinstance(config, str) else entry.get("registered_name"),
                          custom, kind)
        if entry["class_name"] == "MeanMetricWrapper" and isinstance(config, dict):
            return _plain(config.get("fn") or config.get("name"), custom, kind)  # Keras 2
        name = entry["class_name"]
        other = tf.keras.metrics if kind is tf.keras.losses else tf.keras.losses
        cls = tf.keras.utils.get_registered_object(name, custom) or \
            getattr(kind, name, None) or getattr(other, name, None)
        if not inspect.isclass(cls):
            raise ValueError(f"Unknown object '{name}' among the compiled losses and metrics")
        keras_class = cast(Any, cls)  # a Keras loss or metric class (untyped)
        return keras_class.from_config(config) if isinstance(config, dict) else keras_class()
    if isinstance(entry, dict):  # per-output, by output name
        return {name: _plain(value, custom, kind) for name, value in entry.items()}
    return entry


def _optimizer(config: Optional[Dict[str, Any]]) -> Any:
    """The optimizer the `.h5` names, with the settings this line's class takes (Keras 2's
    legacy `lr`, `decay` and Keras 3's extras are dropped or renamed)."""
    if not config:
        return "rmsprop"
    name = config["class_name"].split(">")[-1]
    settings = dict(config.get("config") or {})
    if "lr" in settings:
        settings.setdefault("learning_rate", settings.pop("lr"))
    try:
        cls = tf.keras.optimizers.get(name).__class__
    except ValueError:
        return name.lower()
    # Named by the class or the bases it passes its keyword arguments on to.
    accepted = {name for base in cls.__mro__ if "__init__" in vars(base)
                for name in inspect.signature(base.__init__).parameters}
    return cls(**{k: v for k, v in settings.items() if k in accepted})


def compile_as_saved(model: Any, h5_path: Path, custom: Dict[str, Any]) -> bool:
    """Compile `model` with the loss, metrics and optimizer its `.h5` records (`custom`:
    the objects a name may mean beyond Keras's own); False when the file records no
    compilation (the model was saved uncompiled)."""
    with h5py.File(h5_path, "r") as h5:
        raw = h5.attrs.get("training_config")
    if raw is None:
        return False
    config = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
    metrics = _plain(config.get("metrics"), custom, tf.keras.metrics)
    # Keras 2 records one list of metrics per output.
    if isinstance(metrics, list) and len(metrics) == 1 and isinstance(metrics[0], list) \
            and len(model.outputs) == 1:
        metrics = metrics[0]
    weighted = _plain(config.get("weighted_metrics"), custom, tf.keras.metrics)
    model.compile(optimizer=_optimizer(config.get("optimizer_config")),
                  loss=_plain(config.get("loss"), custom, tf.keras.losses), metrics=metrics,
                  weighted_metrics=weighted, loss_weights=config.get("loss_weights"))
    return True
