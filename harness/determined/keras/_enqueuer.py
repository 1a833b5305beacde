"""Which batches of a Keras Sequence one process reads, in which order, and who reads them:
`keras._Sampler`, `keras._Enqueuer` and `keras._build_enqueuer`, the names Determined
exported from `determined.keras` (0.17 to 0.38) with the arguments its tests call them with.
localdet's own trial runner orders Sequences in `_sequence_batches`; these serve code that
drives the enqueuer itself.

The order is Determined's, a fact its checkpoints' data positions depend on: the indices
`0..length-1`, shuffled once per epoch by one `numpy.random.RandomState(shuffle_seed)`
(epoch after epoch from the same generator), form one endless stream; shard `r` of `n`
reads every `n`-th index of the stream from position `r`; `prior_batches_trained` batches
of the shard are skipped."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from determined.common.check import CheckFailedError
from determined.keras._sequence_batches import _overrides_hooks
from determined.keras._sequence_loaders import make_loader


class _Sampler:
    """The indices shard `shard_rank` of `num_shards` reads, one epoch per `yield_epoch()`.

    Args:
        length: the Sequence's number of batches; at least `num_shards`.
        shard_rank: this process's shard.
        num_shards: the number of processes reading.
        shuffle: shuffle the order every epoch.
        shuffle_seed: the seed of the shuffling generator.
        prior_batches_trained: batches of this shard already read (a resumed run).
    """

    def __init__(self, length: int, shard_rank: int, num_shards: int, shuffle: bool,
                 shuffle_seed: int, prior_batches_trained: int) -> None:
        if length < num_shards:
            raise CheckFailedError(f"the Sequence has {length} batches for {num_shards} processes: "
                             "give it at least one batch per process")
        self.indices = list(range(length))
        self.num_shards = num_shards
        self.shuffle = shuffle
        # Where this shard's next index sits in the current epoch; it moves between epochs
        # when the length is not a multiple of the number of shards.
        self.offset = shard_rank
        self.rng: Optional[np.random.RandomState] = None
        if shuffle:
            self.rng = np.random.RandomState(shuffle_seed)
            self.rng.shuffle(self.indices)
        skip = prior_batches_trained
        while skip >= len(self._positions()):
            skip -= len(self._positions())
            self._next_epoch()
        self.offset += num_shards * skip

    def _positions(self) -> range:
        return range(self.offset, len(self.indices), self.num_shards)

    def _next_epoch(self) -> None:
        self.offset = (self.offset - len(self.indices)) % self.num_shards
        if self.rng is not None:
            self.rng.shuffle(self.indices)

    def yield_epoch(self) -> Iterator[int]:
        """The rest of this epoch's indices for this shard; the next call starts the next
        epoch."""
        for position in self._positions():
            yield self.indices[position]
        self._next_epoch()


@dataclass
class _ReadSettings:
    sequence: Any
    use_multiprocessing: bool
    workers: int
    max_queue_size: int


class _Enqueuer:
    """Reads a Sequence's batches in a sampler's order, in the calling thread (`workers`
    0), in worker threads, or in worker processes (`use_multiprocessing`), up to
    `max_queue_size` batches ahead. Use it as a context manager:

        with keras._build_enqueuer(sequence=seq, workers=2, ...) as enqueuer:
            for batch in enqueuer.data():
                ...

    `data()` yields one epoch (every epoch, endlessly, when `repeat`), and calls the
    Sequence's `on_epoch_end()` after each."""

    def __init__(self, sequence: Any, sampler: _Sampler, repeat: bool, workers: int = 0,
                 use_multiprocessing: bool = False, max_queue_size: int = 10) -> None:
        if max_queue_size < 1:
            raise CheckFailedError(f"max_queue_size is {max_queue_size}: give at least 1")
        self.sequence = sequence
        self.sampler = sampler
        self.repeat = repeat
        self._settings = _ReadSettings(sequence, use_multiprocessing, max(0, workers),
                                       max_queue_size)
        self._loader: Any = None

    def start(self) -> None:
        if self._loader is None:
            self._loader = make_loader(self._settings)

    def stop(self) -> None:
        if self._loader is not None:
            self._loader.close()

    close = stop

    def __enter__(self) -> "_Enqueuer":
        self.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.stop()

    def data(self) -> Iterator[Any]:
        self.start()
        while True:
            yield from self._one_epoch()
            if not self.repeat:
                return

    def _one_epoch(self) -> Iterator[Any]:
        loader = self._loader
        ahead = loader.ahead if self._settings.workers else 1
        pending: deque = deque()
        try:
            for index in self.sampler.yield_epoch():
                pending.append(loader.submit(index))
                if len(pending) >= ahead:
                    yield loader.result(pending.popleft())
            while pending:
                yield loader.result(pending.popleft())
        finally:
            if pending:  # the reader stopped early: nobody collects these
                loader.abandon(list(pending))
        self.sequence.on_epoch_end()
        if _overrides_hooks(self.sequence):
            loader.sequence_changed()  # worker processes hold copies: they must see it


def _build_enqueuer(sequence: Any, workers: int, use_multiprocessing: bool,
                    max_queue_size: int, shard_rank: int, num_shards: int, repeat: bool,
                    shuffle: bool, shuffle_seed: int, prior_batches_trained: int) -> _Enqueuer:
    """An `_Enqueuer` over `sequence` for shard `shard_rank` of `num_shards`, with Determined's
    arguments (see `_Sampler` and `_Enqueuer`)."""
    sampler = _Sampler(len(sequence), shard_rank, num_shards, shuffle, shuffle_seed,
                       prior_batches_trained)
    return _Enqueuer(sequence, sampler, repeat, workers, use_multiprocessing, max_queue_size)
