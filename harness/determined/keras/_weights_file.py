"""The weights of a model that Keras cannot save whole in an `.h5` (a subclassed `keras.Model`,
such as a GAN with its own `train_step`; a model with an adapted lookup layer, or with two
weights of one name in a layer: see `whole_h5_refusal`), in one `.h5` file that either Keras
line reads back.

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
weights are read. Weights are kept by position, so two of one name are no trouble.

The vocabularies of lookup layers (`StringLookup`, `IntegerLookup`, and the one inside each
`TextVectorization`), which `adapt` or `set_vocabulary` filled, are no variables: tf_keras
lists each as a handler its `.h5` writer refuses, and Keras 3's `.h5` leaves it out. They
follow in a section of their own (the layers in the walk's order), with the inverse document
frequencies of a `tf_idf` layer, and both lines read them back with `set_vocabulary`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import h5py
import numpy as np

from determined.keras._line import keras_line

WEIGHTS_FILENAME = "localdet-keras-weights.h5"
FORM = "localdet-keras-weights/1"
_LAYERS, _REST, _VOCABULARIES = "layers", "rest", "vocabularies"


class WeightsMismatch(ValueError):
    """The weights file does not fit the model it is read into."""


def _own_weights(layer: Any) -> List[Any]:
    if keras_line() == "keras3":
        return list(layer._trainable_variables) + list(layer._non_trainable_variables)
    return list(layer._trainable_weights) + list(layer._non_trainable_weights)


def _children(layer: Any) -> List[Any]:
    flatten = getattr(layer, "_flatten_layers", None)
    return list(flatten(include_self=False, recursive=False)) if flatten else []


def _walk(model: Any) -> Iterator[Tuple[Any, Any]]:
    """(layer, the layer that holds it) for `model` and every layer in it, depth first,
    children in the order they were assigned, each layer once."""
    seen = set()

    def walk(layer: Any, parent: Any) -> Iterator[Tuple[Any, Any]]:
        if id(layer) in seen:  # a layer shared by two sub-models
            return
        seen.add(id(layer))
        yield layer, parent
        for child in _children(layer):
            yield from walk(child, layer)

    yield from walk(model, None)


def _is_variable(weight: Any) -> bool:
    # Not tf_keras's vocabulary handler (a "weight" with no value of its own).
    return hasattr(weight, "assign")


def ordered_weights(model: Any) -> Tuple[List[Any], List[Any]]:
    """(the weights in the walk's order, the model's other weights in its own order)."""
    weights = {id(w): w for w in model.weights if _is_variable(w)}
    walked: List[Any] = []
    seen_weights = set()
    for layer, _ in _walk(model):
        for variable in _own_weights(layer):
            if id(variable) in weights and id(variable) not in seen_weights:
                seen_weights.add(id(variable))
                walked.append(variable)
    rest = [w for w in model.weights if id(w) in weights and id(w) not in seen_weights]
    return walked, rest


def _is_lookup(layer: Any) -> bool:
    """A StringLookup or IntegerLookup (of either line), TextVectorization's included."""
    return all(hasattr(layer, name)
               for name in ("lookup_table", "get_vocabulary", "set_vocabulary"))


def lookup_layers(model: Any) -> List[Tuple[Any, Any]]:
    """(lookup layer, the layer that holds it) for each of the model's, in the walk's order."""
    return [(layer, parent) for layer, parent in _walk(model) if _is_lookup(layer)]


def whole_h5_refusal(model: Any) -> Optional[str]:
    """Why Keras's `.h5` cannot hold `model` whole (the end of a sentence), or None: a
    vocabulary that `adapt` or `set_vocabulary` gave a lookup layer is not in the layer's
    config, and tf_keras refuses to write it while Keras 3 writes the file without it."""
    for layer, parent in lookup_layers(model):
        if not getattr(layer, "_has_input_vocabulary", True):
            owner = parent if parent is not None and hasattr(parent, "get_vocabulary") \
                else layer
            return (f"Keras's .h5 format does not hold the vocabulary of the "
                    f"{type(owner).__name__} layer '{owner.name}', which adapt() made")
    return None


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
        _write_vocabularies(h5.create_group(_VOCABULARIES), model)


def _is_string(layer: Any) -> bool:
    return "string" in str(layer.vocabulary_dtype)  # tf.string in tf_keras, "string" in Keras 3


def _write_vocabularies(group: Any, model: Any) -> None:
    lookups = lookup_layers(model)
    group.attrs["count"] = len(lookups)
    for index, (layer, _) in enumerate(lookups):
        vocabulary = layer.get_vocabulary(include_special_tokens=True)
        if _is_string(layer):
            data = np.array([str(token) for token in vocabulary], dtype=h5py.string_dtype())
        else:
            data = np.array(vocabulary, dtype="int64")
        entry = group.create_dataset(str(index), data=data)
        entry.attrs["name"] = str(layer.name)
        if layer.output_mode == "tf_idf":
            store: Dict[str, Any] = {}
            layer.save_own_variables(store)  # the weights its tf_idf output multiplies by
            group.create_dataset(f"{index}_idf", data=np.asarray(store["idf_weights"]))


def _section(h5: Any, section: str) -> List[Tuple[str, np.ndarray]]:
    group = h5[section]
    return [(str(group[str(i)].attrs["name"]), np.asarray(group[str(i)]))
            for i in range(int(group.attrs["count"]))]


def _vocabularies(h5: Any) -> Optional[List[Tuple[str, List[Any], Any]]]:
    """(layer name, vocabulary, idf weights or None) for each saved lookup layer; None for
    a file written before vocabularies were kept."""
    if _VOCABULARIES not in h5:
        return None
    group = h5[_VOCABULARIES]
    saved = []
    for i in range(int(group.attrs["count"])):
        entry = group[str(i)]
        strings = h5py.check_string_dtype(entry.dtype) is not None
        vocabulary = list(entry.asstr()[()]) if strings else [int(v) for v in entry[()]]
        idf = np.asarray(group[f"{i}_idf"]) if f"{i}_idf" in group else None
        saved.append((str(entry.attrs["name"]), vocabulary, idf))
    return saved


def _shapes_fit(variable: Any, value: np.ndarray) -> bool:
    # A dimension the variable leaves open (a tf_idf layer's weights) fits any length.
    shape = tuple(variable.shape)
    return len(shape) == value.ndim and all(
        dim is None or dim == size for dim, size in zip(shape, value.shape, strict=True))


def _check(variables: List[Any], saved: List[Tuple[str, np.ndarray]], what: str) -> None:
    if len(variables) != len(saved):
        raise WeightsMismatch(
            f"the checkpoint holds {len(saved)} {what} but the model has {len(variables)}; "
            "build_model() must return the trained model with all its layers built")
    for position, (variable, (name, value)) in enumerate(zip(variables, saved, strict=True)):
        if short_name(variable) != name or not _shapes_fit(variable, value):
            raise WeightsMismatch(
                f"{what} number {position} is '{name}' {value.shape} in the checkpoint but "
                f"'{_full_name(variable)}' {tuple(variable.shape)} in the model; "
                "build_model() must build the model that was trained")


def _read_vocabularies(model: Any, saved: List[Tuple[str, List[Any], Any]]) -> None:
    lookups = [layer for layer, _ in lookup_layers(model)]
    if len(lookups) != len(saved):
        raise WeightsMismatch(
            f"the checkpoint holds the vocabularies of {len(saved)} lookup layers but the "
            f"model has {len(lookups)}; build_model() must build the model that was trained")
    for layer, (_, vocabulary, idf) in zip(lookups, saved, strict=True):
        if idf is not None:
            # The frequencies set_vocabulary wants (one a token), then the exact ones.
            layer.set_vocabulary(vocabulary, idf_weights=idf[:len(vocabulary)])
            layer.load_own_variables({"idf_weights": idf})
        elif [str(t) for t in layer.get_vocabulary()] != [str(t) for t in vocabulary]:
            layer.set_vocabulary(vocabulary)


def read_weights(model: Any, path: Path) -> None:
    """Assign the file's weights and vocabularies to `model`; its other weights (tf_keras's
    metric states) only in the line that wrote them."""
    with h5py.File(path, "r") as h5:
        if str(h5.attrs.get("form", "")) != FORM:
            raise WeightsMismatch(f"'{path}' is not a {FORM} weights file")
        written_by = str(h5.attrs["keras_line"])
        build_config = str(h5.attrs.get("build_config", "null"))
        walked_values = _section(h5, _LAYERS)
        rest_values = _section(h5, _REST)
        vocabularies = _vocabularies(h5)
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
    if vocabularies is not None:
        _read_vocabularies(model, vocabularies)


def describe() -> Dict[str, str]:
    """What a checkpoint's metadata says about this form."""
    return {"weights_file": WEIGHTS_FILENAME, "weights_form": FORM}
