"""What a Keras Sequence's batches are: their accepted forms, tf.data signature, the order of
passes, and the pass hooks. The bottom of the Sequence support (see `_sequence`)."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import tensorflow as tf

THREAD_NAME = "localdet-sequence"
DEFAULT_WORKERS = 1  # Determined's configure_fit defaults, which are also PyDataset's
DEFAULT_MAX_QUEUE_SIZE = 10
_PASS_BEGIN = "pass-begin"
_PASS_END = "pass-end"


class DataLoaderError(TypeError):
    """A data loader returned something localdet cannot train on."""


# -- what counts as a Sequence -------------------------------------------------------------
def sequence_types() -> tuple[type, ...]:
    """The Sequence classes of the Keras lines loaded in this process."""
    types = [tf.keras.utils.Sequence]
    keras3 = sys.modules.get("keras")
    if keras3 is not None and hasattr(getattr(keras3, "utils", None), "PyDataset"):
        types.append(keras3.utils.PyDataset)
    tf_keras = sys.modules.get("tf_keras")
    if tf_keras is not None and hasattr(getattr(tf_keras, "utils", None), "Sequence"):
        types.append(tf_keras.utils.Sequence)
    return tuple(dict.fromkeys(types))


def is_keras_sequence(value: Any) -> bool:
    return isinstance(value, sequence_types())


def _leaf(value: Any, where: str) -> np.ndarray:
    array = np.asarray(value)
    if array.dtype == object:
        raise DataLoaderError(f"{where}: the Sequence returned a {type(value).__name__} that "
                              "is not a NumPy array of numbers or strings")
    return array


def _structure(value: Any, where: str) -> Any:
    if isinstance(value, dict):
        return {key: _structure(v, where) for key, v in value.items()}
    if isinstance(value, (list, tuple)):
        return tuple(_structure(v, where) for v in value)
    return _leaf(value, where)


def normalise_batch(batch: Any, index: int) -> Any:
    """A batch as Keras reads a Sequence's item, in NumPy arrays: `(inputs, targets[,
    sample_weights])`, or the inputs alone (an array, a dict or a 1-tuple), which a custom
    `train_step` takes as they are. Lists become tuples, as Keras reads them."""
    if isinstance(batch, list):
        batch = tuple(batch)
    if isinstance(batch, tuple) and len(batch) not in (1, 2, 3):
        raise DataLoaderError(f"sequence[{index}] returned a tuple of {len(batch)}; a Sequence "
                              "must return its inputs alone, (inputs, targets) or (inputs, "
                              "targets, sample_weights)")
    return _structure(batch, f"sequence[{index}]")


def _spec(array: np.ndarray, ranks_only: bool) -> tf.TensorSpec:
    dtype = tf.string if array.dtype.kind in "SU" else tf.as_dtype(array.dtype)
    if array.ndim == 0:
        return tf.TensorSpec(shape=(), dtype=dtype)
    shape = [None] * array.ndim if ranks_only else [None, *array.shape[1:]]
    return tf.TensorSpec(shape=shape, dtype=dtype)


def signature(batch: tuple) -> Any:
    """tf.data's output signature for batches like this one: any batch size; the other
    dimensions as in this batch under Keras 3 (as its PyDataset adapter infers them), any
    size under Keras 2 (as its generator adapter does, for per-batch padding)."""
    ranks_only = tf.keras.__name__.startswith("tf_keras")
    return tf.nest.map_structure(lambda a: _spec(a, ranks_only), batch)


# -- plans: which batches, in what order, with the hooks between passes --------------------
def pass_order(length: int, seed: int, pass_index: int, shuffle: bool) -> np.ndarray:
    if not shuffle:
        return np.arange(length)
    rng = np.random.default_rng([seed & 0xFFFFFFFFFFFFFFFF, pass_index])
    return rng.permutation(length)


def training_plan(length: int | None, seed: int, start_batch: int,
                  shuffle: bool) -> Iterator[Any]:
    """Batch indices from `start_batch` on, endless, with pass markers; an infinite
    PyDataset (`length` None) is read as sequence[start_batch], sequence[start_batch + 1]..."""
    if length is None:
        yield _PASS_BEGIN
        yield from itertools.count(start_batch)
        return
    pass_index, position = divmod(start_batch, length)
    while True:
        yield _PASS_BEGIN
        for index in pass_order(length, seed, pass_index, shuffle)[position:]:
            yield int(index)
        yield _PASS_END
        pass_index, position = pass_index + 1, 0


def _hook(sequence: Any, marker: str) -> None:
    name = "on_epoch_begin" if marker == _PASS_BEGIN else "on_epoch_end"
    method = getattr(sequence, name, None)
    if callable(method):
        method()


def _overrides_hooks(sequence: Any) -> bool:
    base = [t for t in sequence_types() if isinstance(sequence, t)]
    for name in ("on_epoch_begin", "on_epoch_end"):
        mine = getattr(type(sequence), name, None)
        if mine is not None and not any(mine is getattr(t, name, None) for t in base):
            return True
    return False


def sequence_length(sequence: Any) -> int | None:
    """Batches per pass; None for an infinite Keras 3 PyDataset (num_batches None)."""
    if "num_batches" in dir(type(sequence)):
        try:
            length = sequence.num_batches
        except NotImplementedError:
            length = None
        return None if length is None else int(length)
    return len(sequence)

