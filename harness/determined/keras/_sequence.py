"""Keras Sequences (Keras 3: PyDatasets) as tf.data streams, with an ordered prefetcher.

A Sequence is indexed by batch: `sequence[i]` returns `(inputs, targets[, sample_weights])`.
Training reads it as an endless stream of passes; batch k of the stream is

    pass p = k // len(sequence), position j = k % len(sequence)
    sequence[order_p[j]], where order_p = range(len) or, when shuffling, a permutation of
    range(len) that depends only on (seed, p)

so a stream started at batch k reads exactly the batches an uninterrupted stream reads from
k on, without reading the earlier ones. Around every pass the sequence's own hooks run as
Keras runs them: `on_epoch_begin()` (Keras 3 PyDataset) before it, `on_epoch_end()` after
its last batch was read and before any batch of the next pass is. A stream that starts in
pass p first calls `on_epoch_begin`/`on_epoch_end` p times, so a sequence that reshuffles
itself in those hooks is in the same state as in an uninterrupted run. Exact resumption
needs `sequence[i]` to depend only on i and on the state those hooks set (not on how many
batches were read before, nor on a global random generator drawn inside `__getitem__`).

Batches are read by one of three loaders, as Keras and Determined offered them
(`SequenceAdapter`/`KerasDataAdapter` arguments, `configure_fit`, or a PyDataset's own):

    workers=0                         in the calling thread, one batch at a time
    workers=N, use_multiprocessing=0  N threads reading up to max_queue_size batches ahead
    workers=N, use_multiprocessing=1  N processes ('spawn': never a fork of a process that
                                      runs TensorFlow), each with a pickled copy of the
                                      sequence; after on_epoch_end the main process's copy
                                      is sent to them again (as Keras 2 restarts its pool
                                      every epoch), so hooks that draw from a global random
                                      generator stay consistent and reproducible

Batches always come out in order; the hooks run in the main process, between passes, when
no worker is reading.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from determined.keras._sequence_batches import (
    _PASS_BEGIN,
    _PASS_END,
    DEFAULT_MAX_QUEUE_SIZE,
    DEFAULT_WORKERS,
    DataLoaderError,
    _hook,
    is_keras_sequence,
    normalise_batch,
    sequence_length,
    signature,
    training_plan,
)
from determined.keras._sequence_loaders import _Loader, _register, make_loader, pickled


class SequenceAdapter:
    """Load batches of a `tf.keras.utils.Sequence` (Keras 3: `keras.utils.PyDataset`) in the
    main process, in threads, or in background processes.

    Return it from `build_training_data_loader` or `build_validation_data_loader`:

        SequenceAdapter(sequence, workers=0)                            # main process
        SequenceAdapter(sequence, workers=2, use_multiprocessing=False)  # two threads
        SequenceAdapter(sequence, workers=1, use_multiprocessing=True)   # one process

    Args:
        sequence: the Sequence; with `use_multiprocessing=True` it must be picklable.
        use_multiprocessing: read batches in processes instead of threads.
        workers: how many threads or processes read batches; 0 reads them in the main
            process, one at a time.
        max_queue_size: how many batches may be read ahead of training.
    """

    def __init__(self, sequence: Any, use_multiprocessing: bool = False, workers: int = 1,
                 max_queue_size: int = 10):
        if isinstance(sequence, SequenceAdapter):
            sequence = sequence.sequence
        if not (is_keras_sequence(sequence)
                or (hasattr(sequence, "__getitem__") and hasattr(sequence, "__len__")
                    and not isinstance(sequence, (tuple, list, dict, str, bytes, np.ndarray)))):
            raise DataLoaderError(f"{type(self).__name__} wraps a tf.keras.utils.Sequence "
                                  f"(keras.utils.PyDataset), not a {type(sequence).__name__}")
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
            raise DataLoaderError(f"{type(self).__name__}(workers={workers!r}): workers must "
                                  "be an integer, 0 or more")
        if isinstance(max_queue_size, bool) or not isinstance(max_queue_size, int) \
                or max_queue_size < 1:
            raise DataLoaderError(f"{type(self).__name__}(max_queue_size={max_queue_size!r}): "
                                  "max_queue_size must be an integer, 1 or more")
        self.sequence: Any = sequence
        self.use_multiprocessing = bool(use_multiprocessing)
        self.workers = workers
        self.max_queue_size = max_queue_size

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({type(self.sequence).__name__}, "
                f"use_multiprocessing={self.use_multiprocessing}, workers={self.workers}, "
                f"max_queue_size={self.max_queue_size})")


class KerasDataAdapter(SequenceAdapter):
    """The name Determined's reference gives `SequenceAdapter`; the two are the same:

        KerasDataAdapter(sequence, workers=0, use_multiprocessing=False)  # main process
        KerasDataAdapter(sequence, workers=1, use_multiprocessing=True)   # one process
        KerasDataAdapter(sequence, workers=2, use_multiprocessing=False)  # two threads
    """


def adapt(loader: Any, workers: int | None = None, use_multiprocessing: bool | None = None,
          max_queue_size: int | None = None) -> SequenceAdapter | None:
    """The loader as a SequenceAdapter, or None if it is no Sequence.

    An adapter's own settings win; for a bare Sequence, the given settings (configure_fit's),
    else a Keras 3 PyDataset's own `workers`/`use_multiprocessing`/`max_queue_size`, else
    Determined's defaults: one thread, ten batches ahead.
    """
    if isinstance(loader, SequenceAdapter):
        return loader
    if not is_keras_sequence(loader):
        return None
    own = vars(loader) if hasattr(loader, "__dict__") else {}

    def pick(given: Any, attribute: str, default: Any) -> Any:
        return given if given is not None else own.get(attribute, default)

    return SequenceAdapter(loader,
                           use_multiprocessing=pick(use_multiprocessing, "_use_multiprocessing",
                                                    False),
                           workers=pick(workers, "_workers", DEFAULT_WORKERS),
                           max_queue_size=pick(max_queue_size, "_max_queue_size",
                                               DEFAULT_MAX_QUEUE_SIZE))


# -- batches --------------------------------------------------------------------------------
# -- the tf.data streams ---------------------------------------------------------------------
def _as_dataset(generator: Any, spec: Any) -> tf.data.Dataset:
    """Batches from a generator, read ahead exactly as the loader's mode says (as Keras 3
    turns off tf.data's own read-ahead for an enqueuer): no injected prefetch."""
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    return tf.data.Dataset.from_generator(generator, output_signature=spec).with_options(options)


class SequenceTraining:
    """The training stream over a Sequence: built eagerly (hooks replayed, first batch read
    for the signature, workers started), iterated once."""

    def __init__(self, adapter: SequenceAdapter, seed: int, start_batch: int, shuffle: bool):
        sequence = adapter.sequence
        self.length = sequence_length(sequence)
        if self.length == 0:
            raise DataLoaderError(f"the training {type(sequence).__name__} has no batches "
                                  "(len() is 0)")
        self.plan = training_plan(self.length, seed, start_batch, shuffle)
        if self.length is not None:
            for _ in range(start_batch // self.length):  # the passes before start_batch
                _hook(sequence, _PASS_BEGIN)
                _hook(sequence, _PASS_END)
        # The first batch the stream yields, read now for tf.data's signature.
        _hook(sequence, next(self.plan))
        first_index = next(self.plan)
        # The batch (a tuple) until the stream has yielded it, then None.
        self.first: Any = normalise_batch(sequence[first_index], first_index)
        self.loader = _register(make_loader(adapter))
        self.iterated = False
        self.dataset = _as_dataset(self._batches, signature(self.first))

    def _batches(self) -> Iterator[tuple]:
        if self.iterated:
            raise RuntimeError("a training stream over a Sequence can be iterated only once; "
                               "build a new one with training_stream(...)")
        self.iterated = True
        yield self.first
        self.first = None
        yield from self.loader.read(self.plan)

    def close(self) -> None:
        self.loader.close()


def sequence_validation(adapter: SequenceAdapter) -> tf.data.Dataset:
    """One pass in order per iteration; on_epoch_begin/on_epoch_end around each full pass.
    Threads live for one pass; worker processes are started on the first pass and kept for
    the next ones (each `evaluate` would otherwise pay their start-up), until close_all()
    or the end of the process."""
    sequence = adapter.sequence
    length = sequence_length(sequence)
    if length is None:
        raise DataLoaderError(f"the validation {type(sequence).__name__} is infinite "
                              "(num_batches is None); validation needs one finite pass")
    if length == 0:
        raise DataLoaderError(f"the validation {type(sequence).__name__} has no batches "
                              "(len() is 0)")
    spec = signature(normalise_batch(sequence[0], 0))
    if adapter.workers and adapter.use_multiprocessing:
        pickled(sequence)  # fail now, clearly, rather than inside evaluate()
    persistent: list[_Loader] = []

    def one_pass() -> Iterator[tuple]:
        plan = [_PASS_BEGIN, *range(length), _PASS_END]
        if adapter.workers and adapter.use_multiprocessing:
            if not persistent or persistent[0].closed:
                persistent[:] = [_register(make_loader(adapter))]
            yield from persistent[0].read(plan)
            return
        loader = make_loader(adapter)
        try:
            yield from loader.read(plan)
        finally:
            loader.close()

    return _as_dataset(one_pass, spec)

