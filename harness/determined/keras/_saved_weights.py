"""Put saved weights into a model of this process's Keras line, whichever line saved them
(`_saved_compile` compiles a model read from an `.h5` the way it was compiled).

    load_weights(model, Path("determined-keras-model-weights"))  # Keras 2's TF format

Keras 3 reads Keras 2's `.h5` itself, but not the TensorFlow checkpoint format that
Determined 0.13.8 and later wrote weights in (`model.save_weights(prefix)`): those are
matched here to the model's layers the way Keras 2 named them (`layer_with_weights-N/kernel`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, List

import tensorflow as tf

from determined.keras._line import keras_line
from determined.keras._quiet import quiet_keras_warnings

_VALUE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"


class WeightsMismatch(ValueError):
    """The saved weights do not fit the model built from the checkpoint's code."""


def load_weights(model: Any, weights: Path) -> None:
    """Load an `.h5` or a TensorFlow-checkpoint prefix into `model`."""
    from determined.keras import _weights_file  # localdet's form for subclassed models

    with quiet_keras_warnings():
        if weights.name == _weights_file.WEIGHTS_FILENAME:
            _weights_file.read_weights(model, weights)
        elif weights.suffix == ".h5":
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
