"""Give each of a trial's processes its own share of the data (`context.wrap_data`).

Rank r of n takes every n-th record starting at r: NumPy rows `x[r::n]`, a Sequence's
batches `r, r+n, ...`, a tf.data.Dataset's elements through `Dataset.shard(n, r)`. With one
process the data comes back unchanged.

    x_train, y_train = shard_data([x_train, y_train], rank=0, size=2)
    whole(x_train)   # the arrays x_train was cut from

NumPy shards remember the arrays they were cut from: for NumPy training data the trainer
builds the same global batches as one process would, from the whole arrays, and gives each
rank its rows of every batch, so that a shuffled pass is the same on 1 and N slots.
"""

from __future__ import annotations

import math
import weakref
from typing import Any, Dict, List, Tuple

import numpy as np
import tensorflow as tf

from determined.keras._sequence_batches import is_keras_sequence

# id(shard) -> (a weak reference to the shard, the whole array it was cut from)
_wholes: Dict[int, Tuple[Any, np.ndarray]] = {}


class ShardedSequence(tf.keras.utils.Sequence):
    """Batches r, r+n, r+2n, ... of a Sequence (Keras 3: PyDataset)."""

    def __init__(self, sequence: Any, rank: int, size: int):
        super().__init__()
        self.sequence, self.rank, self.size = sequence, rank, size

    def __len__(self) -> int:
        return max(0, math.ceil((len(self.sequence) - self.rank) / self.size))

    def __getitem__(self, index: int) -> Any:
        return self.sequence[index * self.size + self.rank]

    def on_epoch_end(self) -> None:
        if hasattr(self.sequence, "on_epoch_end"):
            self.sequence.on_epoch_end()


def _shard_arrays(value: Any, rank: int, size: int) -> Any:
    if isinstance(value, dict):
        return {key: _shard_arrays(item, rank, size) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_shard_arrays(item, rank, size) for item in value)
    whole = np.asarray(value)
    shard = whole[rank::size]
    key = id(shard)

    def forget(_: Any) -> None:  # the shard is gone: so is its entry
        _wholes.pop(key, None)

    _wholes[key] = (weakref.ref(shard, forget), whole)
    return shard


def whole(value: Any) -> Any:
    """The arrays a NumPy shard (or a list, tuple or dict of them) was cut from; anything
    else unchanged."""
    if isinstance(value, dict):
        return {key: whole(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(whole(item) for item in value)
    entry = _wholes.get(id(value))
    return entry[1] if entry is not None and entry[0]() is value else value


def shard_one(data: Any, rank: int, size: int) -> Any:
    if size == 1 or data is None:
        return data
    if isinstance(data, tf.data.Dataset):
        return data.shard(size, rank)
    if is_keras_sequence(data):
        return ShardedSequence(data, rank, size)
    if isinstance(data, (np.ndarray, list, tuple, dict)) or hasattr(data, "__array__"):
        return _shard_arrays(data, rank, size)
    raise TypeError(f"context.wrap_data() cannot shard a {type(data).__name__}; pass NumPy "
                    "arrays, a keras.utils.Sequence (PyDataset) or a tf.data.Dataset")


def shard_data(data: List[Any], rank: int, size: int) -> List[Any]:
    return [shard_one(item, rank, size) for item in data]
