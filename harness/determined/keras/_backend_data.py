"""Training batches by position, for `context.fit` on Keras's JAX and PyTorch backends (no
TensorFlow): batch k of the endless stream is a pure function of (data, batch size, seed, k),
so a trial resumed at batch k reads exactly what an uninterrupted one reads from there.

NumPy `(x, y[, sample_weight])` (x: an array, a list or a dict of arrays)
    Pass p is a permutation of the records drawn from (seed, p) by NumPy (the natural order
    with shuffle=False); batch k is records [k*bs, (k+1)*bs) of the passes laid end to end,
    so every batch is full and batches cross pass boundaries, as on TensorFlow.
`keras.utils.PyDataset` (Sequence)
    Batch k = dataset[order_p[k % len]], pass p = k // len, order_p a permutation of the
    batches by (seed, p) when shuffling; `on_epoch_end` is called at each pass's end (and
    replayed on resume, once per pass already read).
Anything else iterable whose iterator yields batches (a torch DataLoader, a tf.data.Dataset)
    Read pass after pass; a resume reads and drops the batches already trained (exact where
    the iteration is deterministic).
"""

from __future__ import annotations

from typing import Any, Iterator, Optional, Tuple

import numpy as np

SEED_MASK = 0x7FFFFFFFFFFFFFFF


class BackendDataError(ValueError):
    """The data given to context.fit cannot be read this way; the message says what to do."""


def _leaves(value: Any) -> list:
    if isinstance(value, dict):
        return [leaf for key in sorted(value) for leaf in _leaves(value[key])]
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]


def _map(function: Any, value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, dict):
        return {key: _map(function, item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_map(function, item) for item in value)
    return function(value)


def is_array_like(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return len(value) > 0 and all(is_array_like(v) for v in value)
    if isinstance(value, dict):
        return len(value) > 0 and all(is_array_like(v) for v in value.values())
    return isinstance(value, np.ndarray) or hasattr(value, "__array__")


def as_arrays(value: Any) -> Any:
    return _map(np.asarray, value)


def records(arrays: Any) -> int:
    return len(_leaves(arrays)[0])


def is_py_dataset(loader: Any) -> bool:
    """A keras.utils.PyDataset (Sequence): indexed batches with a length."""
    import keras

    return isinstance(loader, keras.utils.PyDataset)


def _order(seed: int, pass_index: int, count: int, shuffle: bool) -> np.ndarray:
    if not shuffle:
        return np.arange(count)
    return np.random.default_rng([seed & SEED_MASK, pass_index]).permutation(count)


def _as_batch(item: Any) -> Tuple[Any, Any, Any]:
    """(x, y, sample_weight) from what a PyDataset or an iterable yields."""
    if isinstance(item, (tuple, list)) and 1 <= len(item) <= 3:
        parts = list(item) + [None] * (3 - len(item))
        return parts[0], parts[1], parts[2]
    return item, None, None


class Batches:
    """The endless training batches, from batch `start` on; `per_pass`: batches in one pass
    (None where the data cannot say)."""

    per_pass: Optional[int]

    def __iter__(self) -> Iterator[Tuple[Any, Any, Any]]:
        raise NotImplementedError


class NumpyBatches(Batches):
    def __init__(self, arrays: Tuple[Any, ...], batch_size: int, seed: int, start: int,
                 shuffle: bool):
        self.arrays = tuple(as_arrays(part) for part in arrays) + (None,) * (3 - len(arrays))
        self.count = records(self.arrays[0])
        lengths = {len(leaf) for part in arrays for leaf in _leaves(as_arrays(part))}
        if len(lengths) != 1:
            raise BackendDataError(f"context.fit() got arrays of different lengths "
                                   f"{sorted(lengths)}; x, y (and sample_weight) need one row "
                                   "per example")
        if self.count < batch_size:
            raise BackendDataError(f"the training data has {self.count} examples, fewer than "
                                   f"one batch of {batch_size}; lower batch_size")
        self.batch_size, self.seed, self.start, self.shuffle = batch_size, seed, start, shuffle
        self.per_pass = self.count // batch_size

    def __iter__(self) -> Iterator[Tuple[Any, Any, Any]]:
        n, bs = self.count, self.batch_size
        orders: dict = {}

        def order(pass_index: int) -> np.ndarray:
            if pass_index not in orders:
                orders.pop(pass_index - 2, None)
                orders[pass_index] = _order(self.seed, pass_index, n, self.shuffle)
            return orders[pass_index]

        def take(rows: np.ndarray) -> tuple:
            return tuple(_map(lambda a: a[rows], part) for part in self.arrays)

        if all(part is None or isinstance(part, np.ndarray) for part in self.arrays):
            x, y, weight = self.arrays  # the usual arrays: no walk over a structure a batch

            def take(rows: np.ndarray) -> tuple:
                return (x[rows], None if y is None else y[rows],
                        None if weight is None else weight[rows])

        k = self.start
        while True:
            first, last = k * bs, (k + 1) * bs  # positions in the passes laid end to end
            pass_index = first // n
            rows = order(pass_index)[first - pass_index * n:last - pass_index * n]
            if len(rows) < bs:  # the batch ends in the next pass
                rows = np.concatenate([rows, order(pass_index + 1)[:last - (pass_index + 1) * n]])
            yield take(rows)
            k += 1


class PyDatasetBatches(Batches):
    def __init__(self, dataset: Any, seed: int, start: int, shuffle: bool):
        self.dataset, self.seed, self.start, self.shuffle = dataset, seed, start, shuffle
        length = getattr(dataset, "num_batches", None)
        if length is None:
            try:
                length = len(dataset)
            except TypeError:
                length = None
        if not length:
            raise BackendDataError("context.fit() needs a PyDataset with a length (__len__) "
                                   "on this Keras backend")
        self.per_pass = int(length)

    def __iter__(self) -> Iterator[Tuple[Any, Any, Any]]:
        per_pass = self.per_pass or 1
        k = self.start
        # The dataset's own epoch hooks, as an uninterrupted run called them.
        for _ in range(k // per_pass):
            self.dataset.on_epoch_end()
        while True:
            pass_index, index = divmod(k, per_pass)
            order = _order(self.seed, pass_index, per_pass, self.shuffle)
            yield _as_batch(self.dataset[int(order[index])])
            k += 1
            if k % per_pass == 0:
                self.dataset.on_epoch_end()


class IterableBatches(Batches):
    def __init__(self, loader: Any, start: int):
        self.loader, self.start = loader, start
        try:
            self.per_pass = len(loader) or None
        except TypeError:
            self.per_pass = None

    def __iter__(self) -> Iterator[Tuple[Any, Any, Any]]:
        skip = self.start
        while True:
            empty = True
            for item in self.loader:
                empty = False
                if skip:
                    skip -= 1
                    continue
                yield _as_batch(item)
            if empty:
                raise BackendDataError("the training data yielded no batch in a pass; give "
                                       "context.fit() data it can read again each epoch")


def training_batches(loader: Any, batch_size: Optional[int], seed: int, start: int,
                     shuffle: bool) -> Batches:
    if isinstance(loader, tuple):
        return NumpyBatches(loader, batch_size or 32, seed, start, shuffle)
    if is_py_dataset(loader):
        return PyDatasetBatches(loader, seed, start, shuffle)
    if hasattr(loader, "__iter__"):
        return IterableBatches(loader, start)
    raise BackendDataError(f"context.fit() cannot read {type(loader).__name__}; pass NumPy "
                           "arrays, a keras.utils.PyDataset, or an iterable of batches")


# Keras's evaluation iterator of each backend this runner serves (keras.src: checked against
# keras 3.15, pyproject's bound <3.16).
_EPOCH_ITERATORS = {"jax": ("keras.src.backend.jax.trainer", "JAXEpochIterator"),
                    "torch": ("keras.src.backend.torch.trainer", "TorchEpochIterator")}


def evaluation_batches(model: Any, loader: Any, batch_size: Optional[int],
                       steps: Optional[int]) -> Any:
    """Keras's own iterator over NumPy validation data, made once for every validation of a
    fit as Keras's `fit` keeps one, not an adapter and iterator anew each epoch; None for
    other data, which `evaluate` reads as given."""
    import importlib

    import keras

    where = _EPOCH_ITERATORS.get(keras.backend.backend())
    if where is None or not isinstance(loader, tuple):
        return None
    x, y, weight = (list(loader) + [None, None])[:3]
    return getattr(importlib.import_module(where[0]), where[1])(
        x=x, y=y, sample_weight=weight, batch_size=batch_size or 32, steps_per_epoch=steps,
        shuffle=False, steps_per_execution=model.steps_per_execution)


def evaluate(model: Any, loader: Any, batch_size: Optional[int], steps: Optional[int],
             callbacks: Any, batches: Any = None) -> dict:
    """`model.evaluate` over the validation data, as a dict of floats; over `batches`
    (`evaluation_batches`) where given."""
    if batches is not None:
        model._eval_epoch_iterator = batches  # what Keras's fit sets, for the same call
        try:
            results = model.evaluate(verbose=0, return_dict=True, callbacks=callbacks,
                                     _use_cached_eval_dataset=True)
        finally:
            model._eval_epoch_iterator = None
    elif isinstance(loader, tuple):
        x, y, weight = (list(loader) + [None, None])[:3]
        results = model.evaluate(x, y, sample_weight=weight, batch_size=batch_size or 32,
                                 steps=steps, verbose=0, return_dict=True, callbacks=callbacks)
    else:
        results = model.evaluate(loader, steps=steps, verbose=0, return_dict=True,
                                 callbacks=callbacks)
    return {k: float(v) for k, v in results.items() if np.ndim(v) == 0}
