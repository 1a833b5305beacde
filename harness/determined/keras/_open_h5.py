"""Load a whole model's `.h5` weights from an open `h5py.File`, as `model.load_weights(path)`
does from a path: for a checkpoint's `.h5` read where its chunks lie in the store, never
written out whole (the reporter's `open_restored`).

    if loads_open_h5():
        with h5py.File(reporter.open_restored(MODEL_FILENAME), "r") as h5:
            load_model_weights(model, h5)

Keras's `load_weights` takes only a path, so this calls the loader it runs on the opened
file: Keras 3's `legacy_h5_format`, Keras 2's `hdf5_format` (tf_keras, or the `keras` package
of TensorFlow 2.11 to 2.15). Where this Keras keeps it elsewhere, `loads_open_h5()` is False
and the caller loads from a path.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any, Callable, Optional

import h5py
import tensorflow as tf

from determined.keras._line import keras_line


@functools.lru_cache(maxsize=1)
def _group_loader() -> Optional[Callable[[Any, Any], None]]:
    if keras_line() == "keras3":
        # keras.src: checked against keras 3.15 (pyproject's bound <3.16)
        candidates = ["keras.src.legacy.saving.legacy_h5_format"]
    else:
        # "tf_keras.src", "keras.src" or "keras": where this Keras 2's engine lives.
        root = tf.keras.Model.__module__.split(".engine.")[0]
        candidates = [f"{root}.saving.legacy.hdf5_format", f"{root}.saving.hdf5_format"]
    for name in candidates:
        try:
            loader = importlib.import_module(name).load_weights_from_hdf5_group
        except (ImportError, AttributeError):
            continue
        return loader  # type: ignore[no-any-return]
    return None


def loads_open_h5() -> bool:
    """Whether this Keras's `.h5` weights loader was found."""
    return _group_loader() is not None


def load_model_weights(model: Any, h5: h5py.File) -> None:
    """Assign the weights of a whole model's `.h5` (Keras's `model_weights` group) to
    `model`, matched by layer order as `model.load_weights` matches them."""
    loader = _group_loader()
    if loader is None:
        raise RuntimeError("load_model_weights without a loader; check loads_open_h5() first")
    group = h5["model_weights"] if "layer_names" not in h5.attrs and "model_weights" in h5 \
        else h5
    loader(group, model)
    if keras_line() == "keras2":  # as Keras 2's load_weights ends
        for layer in model.layers:
            layer.finalize_state()
