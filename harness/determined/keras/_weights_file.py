"""The weights of a model that Keras cannot save whole (a subclassed `keras.Model`, such as a
GAN with its own `train_step`), in one `.h5` file that either Keras line reads back.

    write_weights(model, folder / WEIGHTS_FILENAME)
    read_weights(model, folder / WEIGHTS_FILENAME)

Keras's own weight files do not serve here: Keras 3 refuses to save or load the weights of a
subclassed model whose `call` never ran (as in a GAN, where `train_step` calls the
sub-models), and the two lines list a model's weights in different orders (tf_keras puts all
trainable weights first, and counts the metric states of a model's `Mean` trackers among
them). So the weights are written in an order both lines agree on: the layers depth first,
children in the order they were assigned, and each layer's own trainable then non-trainable
weights, each with its short name ("kernel") and shape, which reading checks. Weights that
walk does not reach (tf_keras's metric states) follow in a section of their own, read back
only by the line that wrote it. A model whose layers make their weights when it is first
called is built from the input shapes Keras recorded then (`get_build_config`) before its
weights are read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Tuple

import h5py
import numpy as np

from determined.keras._line import keras_line

WEIGHTS_FILENAME = "localdet-keras-weights.h5"
FORM = "localdet-keras-weights/1"
_LAYERS, _REST = "layers", "rest"


class WeightsMismatch(ValueError):
    """The weights file does not fit the model it is read into."""


def _own_weights(layer: Any) -> List[Any]:
    if keras_line() == "keras3":
        return list(layer._trainable_variables) + list(layer._non_trainable_variables)
    return list(layer._trainable_weights) + list(layer._non_trainable_weights)


def _children(layer: Any) -> List[Any]:
    flatten = getattr(layer, "_flatten_layers", None)
    return list(flatten(include_self=False, recursive=False)) if flatten else []


def ordered_weights(model: Any) -> Tuple[List[Any], List[Any]]:
    """(the weights in the walk's order, the model's other weights in its own order)."""
    weights = {id(w): w for w in model.weights}
    walked: List[Any] = []
    seen_layers, seen_weights = set(), set()

    def walk(layer: Any) -> None:
        if id(layer) in seen_layers:  # a layer shared by two sub-models
            return
        seen_layers.add(id(layer))
        for variable in _own_weights(layer):
            if id(variable) in weights and id(variable) not in seen_weights:
                seen_weights.add(id(variable))
                walked.append(variable)
        for child in _children(layer):
            walk(child)

    walk(model)
    rest = [w for w in model.weights if id(w) not in seen_weights]
    return walked, rest


def short_name(variable: Any) -> str:
    """"kernel" for Keras 3's `kernel` and tf_keras's `dense/kernel:0` alike."""
    return str(variable.name).split("/")[-1].split(":")[0]


def _full_name(variable: Any) -> str:
    return str(getattr(variable, "path", None) or variable.name)


def _build_config(model: Any) -> str:
    """The shapes the model was first called with (Keras's own record, in either line), as
    JSON: a model whose layers make their weights on that first call is built from it."""
    get = getattr(model, "get_build_config", None)
    config = get() if callable(get) else None
    return json.dumps(config, default=lambda shape: list(shape.as_list()))


def _build_from(model: Any, config_json: str) -> None:
    config = json.loads(config_json)
    if config and not getattr(model, "built", True) and hasattr(model, "build_from_config"):
        model.build_from_config(config)


def write_weights(model: Any, path: Path) -> None:
    walked, rest = ordered_weights(model)
    with h5py.File(path, "w") as h5:
        h5.attrs["form"] = FORM
        h5.attrs["keras_line"] = keras_line()
        h5.attrs["build_config"] = _build_config(model)
        for section, variables in ((_LAYERS, walked), (_REST, rest)):
            group = h5.create_group(section)
            group.attrs["count"] = len(variables)
            for index, variable in enumerate(variables):
                data = group.create_dataset(str(index), data=np.asarray(variable.numpy()))
                data.attrs["name"] = short_name(variable)
                data.attrs["path"] = _full_name(variable)


def _section(h5: Any, section: str) -> List[Tuple[str, np.ndarray]]:
    group = h5[section]
    return [(str(group[str(i)].attrs["name"]), np.asarray(group[str(i)]))
            for i in range(int(group.attrs["count"]))]


def _check(variables: List[Any], saved: List[Tuple[str, np.ndarray]], what: str) -> None:
    if len(variables) != len(saved):
        raise WeightsMismatch(
            f"the checkpoint holds {len(saved)} {what} but the model has {len(variables)}; "
            "build_model() must return the trained model with all its layers built")
    for position, (variable, (name, value)) in enumerate(zip(variables, saved, strict=True)):
        if short_name(variable) != name or tuple(variable.shape) != value.shape:
            raise WeightsMismatch(
                f"{what} number {position} is '{name}' {value.shape} in the checkpoint but "
                f"'{_full_name(variable)}' {tuple(variable.shape)} in the model; "
                "build_model() must build the model that was trained")


def read_weights(model: Any, path: Path) -> None:
    """Assign the file's weights to `model`; its other weights (tf_keras's metric states)
    only in the line that wrote them."""
    with h5py.File(path, "r") as h5:
        if str(h5.attrs.get("form", "")) != FORM:
            raise WeightsMismatch(f"'{path}' is not a {FORM} weights file")
        written_by = str(h5.attrs["keras_line"])
        build_config = str(h5.attrs.get("build_config", "null"))
        walked_values = _section(h5, _LAYERS)
        rest_values = _section(h5, _REST)
    walked, rest = ordered_weights(model)
    if len(walked) < len(walked_values):  # layers that make their weights on first call
        _build_from(model, build_config)
        walked, rest = ordered_weights(model)
    _check(walked, walked_values, "layer weights")
    assignments: List[Tuple[Any, np.ndarray]] = list(
        zip(walked, (v for _, v in walked_values), strict=True))
    if written_by == keras_line():
        _check(rest, rest_values, "other weights")
        assignments += list(zip(rest, (v for _, v in rest_values), strict=True))
    for variable, value in assignments:
        variable.assign(value)


def describe() -> Dict[str, str]:
    """What a checkpoint's metadata says about this form."""
    return {"weights_file": WEIGHTS_FILENAME, "weights_form": FORM}
