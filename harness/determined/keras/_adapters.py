"""Arrays as a Keras Sequence: `keras._ArrayLikeAdapter` and the two functions that turn what a
data loader or `fit(x, y, ...)` was given into something to iterate over. Determined
exported them from `determined.keras` (0.17 to 0.38) and its own test trials build their
data with them, so they keep Determined's names and arguments, and raise its
`determined.common.check.CheckFailedError` (a `ValueError`) for arguments that cannot work."""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np
import tensorflow as tf

from determined import errors
from determined.common.check import CheckFailedError
from determined.keras._sequence import SequenceAdapter
from determined.keras._types import ArrayLike


def _is_arrays(value: Any) -> bool:
    if isinstance(value, np.ndarray):
        return True
    if isinstance(value, (list, tuple)):
        return bool(value) and all(isinstance(v, np.ndarray) for v in value)
    if isinstance(value, dict):
        return bool(value) and all(isinstance(v, np.ndarray) for v in value.values())
    return False


def _rows(value: Any) -> int:
    if isinstance(value, np.ndarray):
        return len(value)
    first = value[0] if isinstance(value, (list, tuple)) else next(iter(value.values()))
    return len(first)


def _slice(value: Any, start: int, end: int) -> Any:
    if isinstance(value, np.ndarray):
        return value[start:end]
    if isinstance(value, dict):
        return {name: array[start:end] for name, array in value.items()}
    return [array[start:end] for array in value]


def _not_arrays(name: str, value: Any) -> errors.InvalidDataTypeException:
    return errors.InvalidDataTypeException(
        f"{name} is a {type(value).__name__}: data that is not a tf.data.Dataset or a Keras "
        "Sequence must be a NumPy array or a list or dict of NumPy arrays")


class _ArrayLikeAdapter(tf.keras.utils.Sequence):  # type: ignore[misc,name-defined]
    """`x`, `y` (and optional per-row `sample_weights`) as a Sequence of batches of
    `batch_size` rows, in order.

    Args:
        x: a NumPy array, a list of arrays (one per model input) or a dict of arrays (one
            per named input).
        y: the targets, in the same forms as `x`.
        batch_size: rows per batch; at most the number of rows.
        sample_weights: optional array with one weight per row; batches then have three
            parts.
        drop_leftovers: when True the last, short batch is left out (default False).

    Example:
        seq = _ArrayLikeAdapter(np.arange(100), np.arange(100), batch_size=16)
        len(seq)  # 7; seq[6] holds rows 96..99
    """

    def __init__(self, x: ArrayLike, y: ArrayLike, batch_size: int,
                 sample_weights: Optional[np.ndarray] = None, drop_leftovers: bool = False):
        super().__init__()
        for name, value in (("x", x), ("y", y)):
            if not _is_arrays(value):
                raise _not_arrays(name, value)
        rows = _rows(x)
        if _rows(y) != rows:
            raise CheckFailedError(f"x has {rows} rows but y has {_rows(y)}: give both the same "
                             "number of rows")
        if batch_size > rows:
            raise CheckFailedError(f"batch_size {batch_size} is larger than the {rows} rows of "
                             "data: use a smaller batch size or more data")
        if sample_weights is not None and len(sample_weights) != rows:
            raise CheckFailedError(f"sample_weights has {len(sample_weights)} entries for {rows} "
                             "rows: give one weight per row")
        self.x, self.y, self.sample_weight = x, y, sample_weights
        self.batch_size = batch_size
        self.drop_leftovers = drop_leftovers
        self._rows = rows

    def __len__(self) -> int:
        whole = self._rows / self.batch_size
        return math.floor(whole) if self.drop_leftovers else math.ceil(whole)

    def __getitem__(self, index: int) -> tuple:
        start = index * self.batch_size
        end = min(start + self.batch_size, self._rows)
        batch = (_slice(self.x, start, end), _slice(self.y, start, end))
        if self.sample_weight is None:
            return batch
        return (*batch, self.sample_weight[start:end])


def _is_iterable_data(value: Any) -> bool:
    from determined.keras._sequence_batches import is_keras_sequence

    return (isinstance(value, (tf.data.Dataset, SequenceAdapter))
            or is_keras_sequence(value))


def _adapt_data_from_data_loader(input_data: Any, batch_size: int) -> Any:
    """What a `build_*_data_loader` returned, ready to iterate: a Dataset, Sequence or
    SequenceAdapter as it is; a tuple `(x, y)` or `(x, y, sample_weights)` of arrays as an
    `_ArrayLikeAdapter` of `batch_size` rows."""
    if _is_iterable_data(input_data):
        return input_data
    if not isinstance(input_data, tuple) or len(input_data) not in (2, 3):
        raise errors.InvalidDataTypeException(
            f"a data loader returned a {type(input_data).__name__}: return a "
            "tf.data.Dataset, a Keras Sequence or a tuple (x, y[, sample_weights]) of arrays")
    weights = input_data[2] if len(input_data) == 3 else None
    return _ArrayLikeAdapter(input_data[0], input_data[1], batch_size, weights)


def _adapt_data_from_fit_args(x: Any, y: Any, sample_weight: Any, batch_size: int) -> Any:
    """`fit(x, y, sample_weight=...)`'s data, ready to iterate: a Dataset, Sequence or
    SequenceAdapter `x` as it is (then `y` must be None); arrays as an
    `_ArrayLikeAdapter`."""
    if _is_iterable_data(x):
        if y is not None:
            raise errors.InvalidDataTypeException(
                "x is a Dataset or Sequence, which carries its own targets: leave y out")
        return x
    return _ArrayLikeAdapter(x, y, batch_size, sample_weight)
