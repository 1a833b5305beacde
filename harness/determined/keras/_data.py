"""Turn what `build_*_data_loader` returns into the batched streams the trial trains on.

Training data becomes an endless stream of batches whose batch k is a pure function of
(loader, batch_size, seed, k), so a trial resumed at batch k reads exactly the batches an
uninterrupted trial reads from k on, mid-pass included, without reading the earlier ones:

NumPy `(x, y[, sample_weights])` (x: an array, a list or a dict of arrays)
    The records flow endlessly, pass after pass: pass p is a permutation of range(n) that
    depends only on (seed, p) (tf.random.experimental.stateless_shuffle; the natural order
    with shuffle=False), and batch k is records [k*bs, (k+1)*bs) of that endless order, so
    every batch is full and batches cross pass boundaries. The index stream is cut into
    batches one pass at a time and the rows gathered with tf.gather, so starting at batch k
    costs one pass of indices, never a read of earlier rows.
`tf.keras.utils.Sequence` / `keras.utils.PyDataset`, bare or in a `SequenceAdapter`
    Batch k = sequence[order_p[k % len]], pass p = k // len, order_p a permutation of the
    batches by (seed, p) when shuffling (the default, as Keras `fit` and Determined shuffle a
    Sequence's batch order), with the sequence's epoch hooks replayed on resume; see
    `_sequence`.
A user's `tf.data.Dataset` (already batched)
    Repeated endlessly; its position, shuffle buffers included, lives in the tf iterator,
    which the controller checkpoints with `tf.train.Checkpoint(iterator=...)`. TensorFlow
    cannot save an iterator whose pipeline holds a stateful op (a random augmentation
    layer, `tf.random.*` in a `map`, `tf.py_function`, `from_generator`): such a stream
    resumes by position, rebuilt and read up to batch k ("skip"), as Determined resumed
    every dataset. `context.fit` over data of unknown length reads it one pass an epoch.

Validation data is one finite pass, re-iterable (evaluate runs it many times).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from determined.keras._sequence import (
    KerasDataAdapter,
    SequenceAdapter,
    SequenceTraining,
    adapt,
    sequence_validation,
)
from determined.keras._sequence_batches import DataLoaderError, is_keras_sequence
from determined.keras._sequence_loaders import close_all

__all__ = ["ACCEPTED_FORMS", "DataLoaderError", "KerasDataAdapter", "SequenceAdapter",
           "TrainingStream", "cardinality", "close_workers", "has_unknown_length",
           "is_sequence", "resumes_by_position", "stateful_op", "training_stream",
           "validation_stream", "with_class_weight"]

ACCEPTED_FORMS = ("(x, y) or (x, y, sample_weights) NumPy arrays, where x may be a list or "
                  "dict of arrays, a tf.data.Dataset wrapped with context.wrap_dataset, a "
                  "tf.keras.utils.Sequence (keras.utils.PyDataset), or a Sequence wrapped in "
                  "determined.keras.SequenceAdapter (KerasDataAdapter)")


@dataclasses.dataclass
class TrainingStream:
    """The endless training batches, and how to find one's place in them again.

    dataset: endless batches starting at batch `start_batch` (NumPy and Sequence), or the
        user's tf.data.Dataset repeated (position_in_iterator).
    position_in_iterator: True only for a user's tf.data.Dataset: its position (shuffle
        state included) lives in the iterator, which the caller saves and restores with
        `tf.train.Checkpoint(iterator=...)`; start_batch was ignored. False: the stream
        starts at start_batch by construction.
    batches_per_pass: batches in one pass over the data when known: len(sequence), the full
        batches in the NumPy records (n // batch_size; NumPy batches cross pass boundaries),
        a finite dataset's cardinality; None for an infinite PyDataset or a dataset of
        unknown cardinality.
    """

    dataset: tf.data.Dataset
    position_in_iterator: bool
    batches_per_pass: int | None
    # Read one pass at a time (repeat=False): every pass after the first, whole.
    each_pass: tf.data.Dataset | None = None
    _closers: list[Callable[[], None]] = dataclasses.field(default_factory=list, repr=False)

    def close(self) -> None:
        """Stops the stream's worker threads and processes; idempotent."""
        while self._closers:
            self._closers.pop()()

    def __iter__(self):
        return iter(self.dataset)


def is_sequence(loader: Any) -> bool:
    """True for a Keras Sequence/PyDataset or a SequenceAdapter (KerasDataAdapter)."""
    return isinstance(loader, SequenceAdapter) or is_keras_sequence(loader)


# -- NumPy ---------------------------------------------------------------------------------
def _is_array_like(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return len(value) > 0 and all(_is_array_like(v) for v in value)
    if isinstance(value, dict):
        return len(value) > 0 and all(_is_array_like(v) for v in value.values())
    return isinstance(value, np.ndarray) or hasattr(value, "__array__")


def _as_arrays(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: np.asarray(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return tuple(np.asarray(v) for v in value)
    return np.asarray(value)


def _array_tuple(loader: Any, which: str) -> tuple | None:
    if isinstance(loader, tuple) and len(loader) in (2, 3) and all(
            _is_array_like(part) for part in loader):
        arrays = tuple(_as_arrays(part) for part in loader)
        lengths = {len(leaf) if np.ndim(leaf) else 0 for leaf in tf.nest.flatten(arrays)}
        if len(lengths) != 1:
            raise DataLoaderError(f"build_{which}_data_loader returned arrays of different "
                                  f"lengths {sorted(lengths)}; x, y (and sample weights) must "
                                  "have one row per example")
        return arrays
    return None


def _records(arrays: tuple) -> int:
    return len(tf.nest.flatten(arrays)[0])


def _numpy_training(arrays: tuple, batch_size: int, seed: int, start_batch: int,
                    shuffle: bool, part: tuple[int, int] = (0, 1)) -> tf.data.Dataset:
    n = _records(arrays)
    bs = batch_size
    rank, size = part
    tensors = tf.nest.map_structure(tf.constant, arrays)
    seed_t = tf.constant(seed & 0x7FFFFFFFFFFFFFFF, tf.int64)
    start = tf.constant(start_batch, tf.int64)

    def order(pass_index):
        indices = tf.range(n, dtype=tf.int64)
        if not shuffle:
            return indices
        return tf.random.experimental.stateless_shuffle(
            indices, seed=tf.stack([seed_t, pass_index]))

    # Plain TensorFlow ops, nothing for autograph to convert (converting: ~0.2 s a trial).
    @tf.autograph.experimental.do_not_convert
    def batches_starting_in(pass_index):
        # Batches whose first record lies in this pass; with batch_size <= n, a batch ends
        # at the latest in the next pass, so two passes of indices hold all of them.
        first = tf.maximum((pass_index * n + bs - 1) // bs, start)
        end = ((pass_index + 1) * n + bs - 1) // bs
        indices = tf.concat([order(pass_index), order(pass_index + 1)], axis=0)
        offsets = tf.range(first, end) * bs - pass_index * n
        rows = offsets[:, None] + tf.range(bs, dtype=tf.int64)[None, :]
        return tf.data.Dataset.from_tensor_slices(tf.gather(indices, rows))

    @tf.autograph.experimental.do_not_convert
    def gather(rows):
        rows = rows[rank::size]  # this rank's rows of the global batch
        return tf.nest.map_structure(lambda tensor: tf.gather(tensor, rows), tensors)

    first_pass = start_batch * bs // n
    return (tf.data.Dataset.range(first_pass, 2 ** 62)
            .flat_map(batches_starting_in)
            .map(gather, num_parallel_calls=tf.data.AUTOTUNE)
            .prefetch(tf.data.AUTOTUNE))


# -- a user's tf.data.Dataset ---------------------------------------------------------------
def _repeated(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """The user's dataset, repeated, in a shape whose iterator checkpoints restore well.

    Nothing reads ahead of the consumer after the repeat: tf.data's injected prefetch (on by
    default) runs the repeat's iterator ahead in a background thread, and an iterator saved
    while it had crossed into the next pass restored that pass reshuffled differently
    (TensorFlow 2.21: about half of the mid-pass restores of `shuffle(...).batch(...)`
    differed). Callers must not add a prefetch or a parallel map after it either.

    Measured with it (restores into a fresh pipeline, in-process and in new processes):
    exact at every position for pipelines whose passes end in a full batch (n % b == 0, or
    `batch(b, drop_remainder=True)`) and for shuffle -> parallel map -> batch -> prefetch.
    Not exact, a TensorFlow limitation: a pipeline that reshuffles each pass and ends a
    pass in a partial batch (`shuffle(n).batch(b)` with n % b != 0, optionally followed by
    `.prefetch`), saved at a pass boundary (or within its prefetch distance before one),
    restores the following passes in another order: once `batch` has seen the end of its
    input, the shuffle's state, seed generator included, is not saved
    (tensorflow/tensorflow#48178). `tf_data_resume="skip"` is exact there.
    """
    return _without_read_ahead(dataset.repeat())


def _without_read_ahead(dataset: tf.data.Dataset) -> tf.data.Dataset:
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    return dataset.with_options(options)


def stateful_op(error: BaseException) -> str:
    """The op TensorFlow names when it refuses to save an iterator ("ReadVariableOp is
    stateful"): a random augmentation layer, `tf.random.*`, `tf.py_function` or
    `from_generator` in the pipeline. Empty when the error names none."""
    found = re.search(r"(\w+) is stateful", str(error))
    return found.group(1) if found else ""


# Where the stateful ops TensorFlow names come from in users' pipelines.
_STATEFUL_SOURCES = {
    "ReadVariableOp": "a variable read, such as a Keras random augmentation layer's seed",
    "RngReadAndSkip": "a random op drawing from a tf.random.Generator",
    "EagerPyFunc": "tf.py_function",
    "PyFunc": "Dataset.from_generator or tf.numpy_function",
}


def resumes_by_position(op: str) -> str:
    """What the trial log says, once, when the training pipeline's iterator cannot be saved."""
    source = _STATEFUL_SOURCES.get(op, "a tf.random op" if op.startswith("Random") else "")
    named = f"{op}: {source}" if op and source else op
    held = f" holds a stateful op ({named})" if named else " holds a stateful op"
    return ("the training data's tf.data pipeline" + held + ", so its iterator cannot be "
            "saved in a checkpoint: a resume rebuilds the pipeline and skips the batches "
            "already trained (the same batches, unless its random ops draw differently)")


# -- the streams ---------------------------------------------------------------------------
def _reject(loader: Any, which: str) -> DataLoaderError:
    return DataLoaderError(f"build_{which}_data_loader returned {type(loader).__name__}; "
                           f"return one of: {ACCEPTED_FORMS}")


def training_stream(loader: Any, batch_size: int, seed: int, start_batch: int = 0, *,
                    shuffle: bool = True, workers: int | None = None,
                    use_multiprocessing: bool | None = None,
                    max_queue_size: int | None = None,
                    tf_data_resume: str = "iterator",
                    part: tuple[int, int] = (0, 1), repeat: bool = True) -> TrainingStream:
    """The endless training batches of `loader`, starting at batch `start_batch`.

    part: (rank, size) of a process among the trial's several: NumPy batches are then the
        global batches of `batch_size * size` records that one process would train on, of
        which this rank takes rows rank, rank+size, ... (`batch_size` of them). Other
        loaders are this rank's already (wrapped, or sharded by the caller).

    shuffle: reshuffle the NumPy records, or a Sequence's batch order, every pass (by seed
        and pass); ignored for a tf.data.Dataset, which shuffles itself.
    workers, use_multiprocessing, max_queue_size: configure_fit's settings for a bare
        Sequence (None: not configured); a SequenceAdapter's own settings win.
    tf_data_resume: how a user's tf.data.Dataset finds its place: "iterator" (the caller
        checkpoints the iterator; start_batch is ignored; see _repeated for what TensorFlow
        restores exactly) or "skip" (the stream starts at start_batch by reading and
        dropping the batches before it: exact for any deterministic pipeline, at the cost
        of one read of the data up to there; position_in_iterator is then False).
    repeat: False for a tf.data.Dataset read one pass at a time (the caller starts a new
        iterator over `dataset` for each pass); start_batch then counts from the start of
        the first pass.
    """
    if start_batch < 0:
        raise ValueError(f"start_batch must be 0 or more, not {start_batch}")
    arrays = _array_tuple(loader, "training")
    if arrays is not None:
        count = _records(arrays)
        batch_size *= part[1]
        if batch_size < 1:
            raise DataLoaderError(f"NumPy training data needs a batch size of 1 or more, not "
                                  f"{batch_size}; set the global_batch_size hyperparameter")
        if count < batch_size:
            raise DataLoaderError(f"the training data has {count} examples, fewer than one "
                                  f"batch of {batch_size}; lower global_batch_size")
        return TrainingStream(_numpy_training(arrays, batch_size, seed, start_batch, shuffle,
                                              part),
                              position_in_iterator=False, batches_per_pass=count // batch_size)
    if isinstance(loader, tf.data.Dataset):
        per_pass = cardinality(loader)
        # One pass, iterated anew each epoch: data whose epochs end where the data does.
        stream = _repeated(loader) if repeat else _without_read_ahead(loader)
        each_pass = None if repeat else stream
        if tf_data_resume == "iterator":
            return TrainingStream(stream, position_in_iterator=True,
                                  batches_per_pass=per_pass, each_pass=each_pass)
        if tf_data_resume == "skip":
            return TrainingStream(stream.skip(start_batch), position_in_iterator=False,
                                  batches_per_pass=per_pass, each_pass=each_pass)
        raise ValueError(f"tf_data_resume must be 'iterator' or 'skip', not {tf_data_resume!r}")
    adapter = adapt(loader, workers, use_multiprocessing, max_queue_size)
    if adapter is not None:
        stream = SequenceTraining(adapter, seed, start_batch, shuffle)
        return TrainingStream(stream.dataset, position_in_iterator=False,
                              batches_per_pass=stream.length, _closers=[stream.close])
    raise _reject(loader, "training")


def cardinality(dataset: tf.data.Dataset) -> int | None:
    """Batches in one pass of a finite dataset; None for an infinite one or one of unknown
    length (a generator, a filter)."""
    count = int(dataset.cardinality() if tf.executing_eagerly()
                else tf.keras.backend.get_value(dataset.cardinality()))  # graph mode
    return count if count > 0 else None


def has_unknown_length(dataset: Any) -> bool:
    """A tf.data.Dataset whose passes end where its data does, at a length it cannot say
    (`from_generator`, `filter`); not an infinite (repeated) one."""
    return (isinstance(dataset, tf.data.Dataset) and tf.executing_eagerly()
            and int(dataset.cardinality()) == int(tf.data.UNKNOWN_CARDINALITY))


def validation_stream(loader: Any, batch_size: int, *, workers: int | None = None,
                      use_multiprocessing: bool | None = None,
                      max_queue_size: int | None = None) -> tf.data.Dataset:
    """One pass over the validation data, in batches (the last one may be short), in order;
    each iteration is a new pass. Worker processes of a Sequence read with
    use_multiprocessing=True stay up between passes until close_workers()."""
    arrays = _array_tuple(loader, "validation")
    if arrays is not None:
        if batch_size < 1:
            raise DataLoaderError(f"validation batch size must be 1 or more, not {batch_size}")
        return tf.data.Dataset.from_tensor_slices(arrays).batch(batch_size).prefetch(
            tf.data.AUTOTUNE)
    if isinstance(loader, tf.data.Dataset):
        return loader
    adapter = adapt(loader, workers, use_multiprocessing, max_queue_size)
    if adapter is not None:
        return sequence_validation(adapter)
    raise _reject(loader, "validation")


def close_workers() -> None:
    """Stops every worker thread and process any stream started that is still running
    (validation's worker processes, training streams not closed). A validation stream keeps
    working (its next pass starts new workers); a training stream ends."""
    close_all()


def with_class_weight(dataset: Any, class_weight: dict) -> Any:
    """Weigh each example by its class, as `fit(class_weight=...)` does: batches of
    `(x, y)` gain sample weights, and existing sample weights are multiplied. Given a
    TrainingStream, returns the same stream with its dataset weighed."""
    if isinstance(dataset, TrainingStream):
        return dataclasses.replace(dataset, dataset=with_class_weight(dataset.dataset,
                                                                      class_weight))
    table = np.ones(max(int(label) for label in class_weight) + 1, dtype="float32")
    for label, weight in class_weight.items():
        table[int(label)] = weight
    table = tf.constant(table)

    def weigh(x, y, sample_weight=None):
        labels = tf.cast(tf.squeeze(y, axis=-1) if y.shape.rank == 2 and y.shape[-1] == 1
                         else (tf.argmax(y, axis=-1) if y.shape.rank == 2 else y), tf.int32)
        weights = tf.gather(table, labels)
        if sample_weight is not None:
            weights = weights * tf.cast(sample_weight, weights.dtype)
        return x, y, weights

    # Sequential: a parallel map reads ahead, which a checkpointed iterator must not.
    return dataset.map(weigh)

