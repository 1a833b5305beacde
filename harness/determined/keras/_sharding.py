"""Give each of a trial's processes its own share of the data (`context.wrap_data`).

Rank r of n takes every n-th record starting at r: NumPy rows `x[r::n]`, a Sequence's
batches `r, r+n, ...`, a tf.data.Dataset's elements through `Dataset.shard(n, r)`. With one
process the data comes back unchanged.

    x_train, y_train = shard_data([x_train, y_train], rank=0, size=2)
"""

from __future__ import annotations

import math
from typing import Any, List

import numpy as np
import tensorflow as tf

from determined.keras._sequence_batches import is_keras_sequence


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
    return np.asarray(value)[rank::size]


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
