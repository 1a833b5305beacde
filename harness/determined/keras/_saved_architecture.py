"""Take out of a saved `.h5`'s architecture what the trial process put there for its own
needs, so that the file reads in the other Keras line as one saved by plain Keras does.

    model.save(h5_path)
    drop_generator_choice(h5_path)   # under Keras 2
    keep_native_architecture(model, h5_path)   # under Keras 3

Under Keras 2 the trial process calls `enable_tf_random_generator()` (random layers then
keep their generator's state in variables, which a checkpoint holds), and every random
layer (Dropout, GaussianNoise, the Random* preprocessing layers, RNNs with dropout, ...)
records that choice as `rng_type: "stateful"`, an argument Keras 3's layers refuse.

Under Keras 3 the `.h5` architecture names every node of the graph as a layer, and so
cannot describe the operations Keras 3 records where `keras.ops` or arithmetic meets
symbolic tensors (`inputs / 255.0` is a `TrueDivide`, `x + y` an `Add` that the reader
takes for the `Add` layer): plain Keras 3 cannot load such an `.h5` either. For those models
the file also keeps Keras 3's own serialisation (`model.to_json()`), which
`native_architecture` gives the loader.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, List, Optional

import h5py
import numpy as np

from determined.keras._architecture_translation import without_generator_choice


def rewrite_architecture(h5_path: Path, change: Callable[[Any], bool]) -> None:
    """Let `change` edit, in place, the architecture (`model_config`) a saved `.h5` holds;
    written back only when it returns True."""
    with h5py.File(h5_path, "r+") as h5:
        raw = h5.attrs.get("model_config")
        if raw is None:
            return
        config = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
        if change(config):
            h5.attrs["model_config"] = json.dumps(config)


def drop_generator_choice(h5_path: Path) -> None:
    """Leave the trial process's generator choice out of the architecture `h5_path` holds."""
    rewrite_architecture(h5_path, without_generator_choice)


# A dataset, not an attribute: HDF5 attributes hold 64 KB at most.
NATIVE_ARCHITECTURE = "localdet_keras3_architecture"


def operations_not_layers(model: Any) -> List[str]:
    """The class names of the graph's operations that are not layers (`TrueDivide`, ...),
    nested Functional models included; empty for a model of layers alone."""
    import keras

    found: List[str] = []
    for operation in getattr(model, "operations", None) or []:
        if not isinstance(operation, keras.layers.Layer):
            found.append(type(operation).__name__)
        elif operation is not model and getattr(operation, "operations", None):
            found += operations_not_layers(operation)
    return found


def keep_native_architecture(model: Any, h5_path: Path) -> None:
    """Under Keras 3, keep the model's own serialisation in the `.h5` where its graph holds
    operations that the `.h5` architecture cannot (see the module docstring)."""
    if not operations_not_layers(model):
        return
    text = model.to_json()
    with h5py.File(h5_path, "r+") as h5:
        if NATIVE_ARCHITECTURE in h5:
            del h5[NATIVE_ARCHITECTURE]
        h5.create_dataset(NATIVE_ARCHITECTURE, data=np.frombuffer(text.encode(), np.uint8))


def native_architecture(h5_path: Path) -> Optional[str]:
    """The Keras 3 serialisation `keep_native_architecture` kept in `h5_path`, if any."""
    with h5py.File(h5_path, "r") as h5:
        if NATIVE_ARCHITECTURE not in h5:
            return None
        return bytes(h5[NATIVE_ARCHITECTURE][()]).decode()


def operation_names(native: str) -> List[str]:
    """The class names of the operations (not layers) in a `native_architecture`."""
    layers = json.loads(native).get("config", {}).get("layers", [])
    return [layer.get("class_name", "?") for layer in layers
            if ".ops." in str(layer.get("module", ""))]
