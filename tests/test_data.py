"""Data loaders as training and validation streams: every documented form, exact resumption
by position (batch k of a stream started at k is batch k of an uninterrupted stream), the
Sequence hooks, the three Sequence loaders, clear errors, and no workers left behind."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
import tensorflow as tf

from determined import keras
from determined.keras import _data
from determined.keras._data import DataLoaderError

SEED = 1234
N, BS = 10, 4  # NumPy: 10 records in batches of 4, so batches cross pass boundaries


def take(source, count: int, start: int = 0) -> list:
    """`count` batches as flat lists of NumPy arrays, after skipping `start`."""
    dataset = source.dataset if isinstance(source, _data.TrainingStream) else source
    iterator = iter(dataset)
    for _ in range(start):
        next(iterator)
    return [[t.numpy() for t in tf.nest.flatten(next(iterator))] for _ in range(count)]


def assert_same_batches(left: list, right: list) -> None:
    assert len(left) == len(right)
    for k, (a, b) in enumerate(zip(left, right, strict=True)):
        assert len(a) == len(b), f"batch {k}: structures differ"
        for x, y in zip(a, b, strict=True):
            assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y), \
                f"batch {k} differs"


def no_sequence_threads() -> bool:
    return not [t for t in threading.enumerate() if t.name.startswith("localdet-sequence")]


def no_worker_processes() -> bool:
    return not [p for p in multiprocessing.active_children()
                if p.name.startswith("localdet-sequence")]


# -- NumPy -------------------------------------------------------------------------------
def numpy_loader(form: str):
    """Record i: x = i (and 100 + i), y = 10 i, sample weight i / 100."""
    x = np.arange(N, dtype="float32").reshape(N, 1)
    y = np.arange(N, dtype="int64") * 10
    if form == "xy":
        return x, y
    if form == "weights":
        return x, y, np.arange(N, dtype="float32") / 100
    if form == "list":
        return [x, x + 100], y
    if form == "dict":
        return {"a": x, "b": x + 100}, y
    raise AssertionError(form)


@pytest.mark.parametrize("form", ["xy", "weights", "list", "dict"])
@pytest.mark.parametrize("shuffle", [True, False])
def test_numpy_stream_started_at_k_is_the_uninterrupted_stream_from_k(form, shuffle):
    loader = numpy_loader(form)
    whole = _data.training_stream(loader, BS, SEED, shuffle=shuffle)
    assert not whole.position_in_iterator and whole.batches_per_pass == N // BS
    reference = take(whole, 12)
    # k=2: its batch crosses from pass 0 into pass 1; k=3: inside pass 1; k=5: records 20..,
    # exactly the start of pass 2; k=9: several passes on.
    for k in (2, 3, 5, 9):
        resumed = _data.training_stream(loader, BS, SEED, start_batch=k, shuffle=shuffle)
        assert_same_batches(take(resumed, 12 - k), reference[k:])


@pytest.mark.parametrize("form", ["weights", "list", "dict"])
def test_numpy_batches_hold_whole_records_each_pass_a_permutation(form):
    loader = numpy_loader(form)
    batches = take(_data.training_stream(loader, BS, SEED), 5)  # 20 records: two passes
    # Flattening sorts dict keys: [a, b, y] for dict, [x0, x1, y] for list, [x, y, w].
    columns = [np.concatenate([b[i] for b in batches]).reshape(20, -1)[:, 0]
               for i in range(len(batches[0]))]
    records = columns[0].astype(int)
    assert all(len(b[0]) == BS for b in batches)  # every batch full
    assert sorted(records[:N]) == list(range(N)) == sorted(records[N:])
    assert list(records[:N]) != list(records[N:])  # each pass reshuffled
    assert list(records[:N]) != list(range(N))
    if form == "weights":
        assert np.array_equal(columns[1], records * 10)
        assert np.allclose(columns[2], records / 100)
    else:
        assert np.array_equal(columns[1], records + 100)
        assert np.array_equal(columns[2], records * 10)
    natural = take(_data.training_stream(loader, BS, SEED, shuffle=False), 3)
    assert [list(b[0].ravel().astype(int)) for b in natural] == [[0, 1, 2, 3], [4, 5, 6, 7],
                                                                  [8, 9, 0, 1]]
    other_seed = take(_data.training_stream(loader, BS, SEED + 1), 5)
    assert not all(np.array_equal(a[0], b[0])
                   for a, b in zip(batches, other_seed, strict=True))


@pytest.mark.parametrize("shuffle", [True, False])
def test_ranks_read_their_rows_of_the_global_batches_one_process_reads(shuffle):
    """Two ranks with 2-record batches together read exactly the 4-record batches of one
    process, shuffled passes and resumption at k included; wrap_data's shards are put back
    together first (sharding.whole)."""
    from determined.keras import _sharding

    loader = numpy_loader("weights")
    one = take(_data.training_stream(loader, BS, SEED, shuffle=shuffle), 8)
    shards = [_sharding.shard_data(list(loader), rank, 2) for rank in (0, 1)]
    assert len(shards[1][0]) == N // 2
    for k in (0, 3):
        parts = [take(_data.training_stream(tuple(_sharding.whole(shards[rank])), BS // 2, SEED,
                                            start_batch=k, shuffle=shuffle, part=(rank, 2)),
                      8 - k) for rank in (0, 1)]
        for batch, rank0, rank1 in zip(one[k:], *parts, strict=True):
            for column, a, b in zip(batch, rank0, rank1, strict=True):
                assert len(a) == len(b) == BS // 2
                assert np.array_equal(column[0::2], a) and np.array_equal(column[1::2], b)
    plain = np.arange(3)
    assert _sharding.whole(plain) is plain  # what no shard was cut from comes back as is


def test_numpy_validation_is_one_ordered_pass_and_reiterable():
    dataset = _data.validation_stream(numpy_loader("weights"), BS)
    for _ in range(2):
        sizes = [len(x) for x, _, _ in dataset]
        assert sizes == [4, 4, 2]
    assert [int(v) for x, _, _ in dataset for v in x.numpy().ravel()] == list(range(N))


def test_numpy_errors_name_the_problem():
    x, y = numpy_loader("xy")
    with pytest.raises(DataLoaderError, match="fewer than one batch of 32"):
        _data.training_stream((x, y), 32, SEED)
    with pytest.raises(DataLoaderError, match=r"arrays of different lengths \[9, 10\]"):
        _data.training_stream((x, y[:9]), BS, SEED)


# -- Sequences ---------------------------------------------------------------------------
class CountingSequence(tf.keras.utils.Sequence):
    """Three batches of two; batch i's x says i and how often the hooks ran before it was
    read, so a batch shows whether its pass saw the right hook calls."""

    def __init__(self, length: int = 3, weights: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.length = length
        self.weights = weights
        self.ends = 0
        self.begins = 0

    def __len__(self):
        return self.length

    def __getitem__(self, index):
        if not 0 <= index < self.length:
            raise IndexError(index)
        stamp = index + 100 * self.ends + 10_000 * self.begins
        x = np.full((2, 1), stamp, "float32")
        y = np.full((2,), index, "int64")
        return (x, y, np.full((2,), 0.5 + index, "float32")) if self.weights else (x, y)

    def on_epoch_begin(self):
        self.begins += 1

    def on_epoch_end(self):
        self.ends += 1


class UnpicklableSequence(CountingSequence):
    def __init__(self):
        super().__init__()
        self.lock = threading.Lock()


def stamps(batches: list) -> list:
    return [int(b[0][0, 0]) for b in batches]


MODES = {"main": {"workers": 0}, "threads": {"workers": 2, "max_queue_size": 4}}


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("shuffle", [True, False])
def test_sequence_stream_started_at_k_replays_the_hooks_and_matches(mode, shuffle):
    def stream(start_batch=0):
        adapter = keras.SequenceAdapter(CountingSequence(weights=True), **MODES[mode])
        return _data.training_stream(adapter, 0, SEED, start_batch, shuffle=shuffle)

    whole = stream()
    assert not whole.position_in_iterator and whole.batches_per_pass == 3
    reference = take(whole, 9)
    whole.close()
    indices = [int(b[1][0]) for b in reference]
    for p in range(3):  # each pass reads every batch once; hooks once per pass
        assert sorted(indices[3 * p:3 * p + 3]) == [0, 1, 2]
        assert {s - i for s, i in zip(stamps(reference[3 * p:3 * p + 3]),
                                      indices[3 * p:3 * p + 3], strict=True)} \
            == {100 * p + 10_000 * (p + 1)}
    if shuffle:
        assert indices != [0, 1, 2] * 3
    else:
        assert indices == [0, 1, 2] * 3
    assert all(np.array_equal(b[2], np.full(2, 0.5 + i, "float32"))
               for b, i in zip(reference, indices, strict=True))
    for k in (4, 6):  # inside pass 1; the start of pass 2
        resumed = stream(k)
        assert_same_batches(take(resumed, 9 - k), reference[k:])
        resumed.close()
    assert no_sequence_threads()


def test_a_bare_sequence_reads_in_threads_by_default_and_close_stops_them():
    stream = _data.training_stream(CountingSequence(), 0, SEED)
    take(stream, 5)
    assert not no_sequence_threads()
    stream.close()
    stream.close()  # idempotent
    assert no_sequence_threads()
    validation = _data.validation_stream(CountingSequence(), 0, workers=2)
    assert stamps(take(validation, 3)) == [10_000, 10_001, 10_002]
    assert no_sequence_threads()  # validation threads live for one pass


@pytest.mark.parametrize("mode", sorted(MODES))
def test_sequence_validation_is_one_ordered_pass_per_iteration(mode):
    sequence = CountingSequence(length=4)
    dataset = _data.validation_stream(keras.KerasDataAdapter(sequence, **MODES[mode]), 0)
    first = [int(x[0, 0]) for x, _ in dataset]
    second = [int(x[0, 0]) for x, _ in dataset]
    assert first == [10_000, 10_001, 10_002, 10_003]
    assert second == [20_100, 20_101, 20_102, 20_103]  # hooks ran around the first pass
    assert sequence.ends == 2
    assert no_sequence_threads()


def test_sequence_in_worker_processes_resumes_exactly_and_stops_on_close():
    reference_stream = _data.training_stream(
        keras.SequenceAdapter(CountingSequence(weights=True), workers=0), 0, SEED)
    reference = take(reference_stream, 9)
    # Start every worker first, so they boot side by side. k=4 is inside pass 1 (one pass
    # of hooks replayed before the workers start; new copies sent at the next pass).
    streams = {k: _data.training_stream(
        keras.KerasDataAdapter(CountingSequence(weights=True), workers=2,
                               use_multiprocessing=True), 0, SEED, start_batch=k)
        for k in (4,)}
    validation = _data.validation_stream(
        keras.SequenceAdapter(CountingSequence(), workers=1, use_multiprocessing=True), 0)
    assert not no_worker_processes()
    for k, stream in streams.items():
        assert_same_batches(take(stream, 9 - k), reference[k:])
        stream.close()
        stream.close()
    assert stamps(take(validation, 3)) == [10_000, 10_001, 10_002]
    assert stamps(take(validation, 3)) == [20_100, 20_101, 20_102]  # same workers, new state
    # evaluate(steps=1) stops a pass early; its reads (all three, queued ahead) were done, so
    # its on_epoch_end ran, as in Keras's enqueuer; the next pass reads in order all the same.
    assert stamps(take(validation, 1)) == [30_200]
    assert stamps(take(validation, 3)) == [40_300, 40_301, 40_302]
    _data.close_workers()
    assert no_worker_processes()


def test_an_unpicklable_sequence_with_multiprocessing_is_a_clear_error():
    adapter = keras.SequenceAdapter(UnpicklableSequence(), workers=1, use_multiprocessing=True)
    for build in (lambda: _data.training_stream(adapter, 0, SEED),
                  lambda: _data.validation_stream(adapter, 0)):
        with pytest.raises(DataLoaderError, match=r"UnpicklableSequence cannot be pickled .*"
                                                  r"use_multiprocessing=False"):
            build()
    assert no_worker_processes()
    # Threads need no pickling.
    stream = _data.training_stream(keras.SequenceAdapter(UnpicklableSequence()), 0, SEED)
    assert len(take(stream, 4)) == 4
    stream.close()


class FailingSequence(CountingSequence):
    def __getitem__(self, index):
        if index == 2:
            raise ValueError("no batch 2 today")
        return super().__getitem__(index)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_an_error_in_getitem_reaches_the_trainer_with_its_message(mode):
    stream = _data.training_stream(keras.SequenceAdapter(FailingSequence(), **MODES[mode]), 0,
                                   SEED, shuffle=False)
    with pytest.raises(tf.errors.OpError, match="no batch 2 today"):
        take(stream, 3)
    stream.close()


class BadBatchSequence(CountingSequence):
    def __getitem__(self, index):
        return (np.zeros((2, 1)),) * 4


class InputsOnlySequence(CountingSequence):
    """Batches of inputs alone, as Keras takes them (a custom train_step reads them)."""

    def __getitem__(self, index):
        return np.full((2, 3), float(index), "float32")


def test_a_sequence_of_inputs_alone_streams_them_as_they_are():
    stream = _data.training_stream(InputsOnlySequence(length=3), 0, SEED, shuffle=False)
    batches = [b.numpy() for b, _ in zip(stream, range(4), strict=False)]
    np.testing.assert_array_equal(np.stack(batches)[:, 0, 0], [0.0, 1.0, 2.0, 0.0])
    assert batches[0].shape == (2, 3)
    stream.close()


def test_wrong_loaders_get_one_sentence_naming_the_accepted_forms():
    for which, build in (("training", lambda loader: _data.training_stream(loader, 4, SEED)),
                         ("validation", lambda loader: _data.validation_stream(loader, 4))):
        with pytest.raises(DataLoaderError, match=rf"build_{which}_data_loader returned list; "
                                                  r"return one of: \(x, y\) .*Sequence"):
            build([1, 2, 3])
    with pytest.raises(DataLoaderError, match="wraps a tf.keras.utils.Sequence"):
        keras.SequenceAdapter([1, 2, 3])
    with pytest.raises(DataLoaderError, match="workers must be an integer"):
        keras.SequenceAdapter(CountingSequence(), workers=-1)
    with pytest.raises(DataLoaderError, match=r"sequence\[\d\] returned a tuple of 4; a "
                                              r"Sequence must return its inputs alone, "
                                              r"\(inputs, targets\)"):
        _data.training_stream(BadBatchSequence(), 0, SEED)
    with pytest.raises(DataLoaderError, match="has no batches"):
        _data.training_stream(CountingSequence(length=0), 0, SEED)


def test_a_training_stream_trains_a_model_step_by_step():
    model = tf.keras.Sequential([tf.keras.Input(shape=(1,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    model.make_train_function()
    for loader in (numpy_loader("weights"), keras.SequenceAdapter(CountingSequence(), workers=1)):
        weights = {label: 1.0 for label in range(100)}
        stream = _data.with_class_weight(_data.training_stream(loader, BS, SEED), weights)
        assert isinstance(stream, _data.TrainingStream)
        iterator = iter(stream.dataset)
        for _ in range(4):
            model.train_function(iterator)
        stream.close()
    assert int(model.optimizer.iterations.numpy()) == 8


# -- tf.data -----------------------------------------------------------------------------
def user_pipeline(records: int = 20, drop_remainder: bool = False) -> tf.data.Dataset:
    """Already batched, reshuffled every pass by a seeded shuffle, as users write it."""
    data = (np.arange(records, dtype="float32").reshape(records, 1),
            np.arange(records, dtype="int64"))
    return (tf.data.Dataset.from_tensor_slices(data)
            .shuffle(records, seed=SEED, reshuffle_each_iteration=True)
            .batch(4, drop_remainder=drop_remainder))


def test_a_user_dataset_repeats_and_keeps_its_position_in_the_iterator():
    stream = _data.training_stream(user_pipeline(), 0, SEED, start_batch=99)
    assert stream.position_in_iterator and stream.batches_per_pass == 5
    batches = take(stream, 10)
    first, second = ([int(v) for b in batches[p:p + 5] for v in b[1]] for p in (0, 5))
    assert sorted(first) == sorted(second) == list(range(20)) and first != second
    assert _data.validation_stream(user_pipeline(), 0) is not None
    skipped = _data.training_stream(user_pipeline(), 0, SEED, start_batch=3,
                                       tf_data_resume="skip")
    assert not skipped.position_in_iterator
    assert_same_batches(take(skipped, 7), batches[3:])


@pytest.mark.parametrize("records, drop_remainder, k", [
    (20, False, 2), (20, False, 5), (20, False, 7),  # full batches: mid-pass, boundary, pass 1
    (10, True, 2), (10, True, 4)])  # partial batches dropped: boundary, mid pass 1
def test_a_user_dataset_resumes_from_its_checkpointed_iterator(records, drop_remainder, k,
                                                               tmp_path):
    def stream():
        return _data.training_stream(user_pipeline(records, drop_remainder), 0, SEED)

    reference = take(stream(), k + 8)
    iterator = iter(stream().dataset)
    for _ in range(k):
        next(iterator)
    path = tf.train.Checkpoint(iterator=iterator).write(str(tmp_path / "iterator"))
    del iterator
    fresh = iter(stream().dataset)  # a freshly built identical pipeline
    tf.train.Checkpoint(iterator=fresh).read(path).assert_consumed()
    resumed = [[t.numpy() for t in next(fresh)] for _ in range(8)]
    assert_same_batches(resumed, reference[k:])


@pytest.mark.parametrize("k", [2, 3, 6])  # inside pass 0; the end of passes 0 and 1
def test_skip_resumes_any_user_dataset_exactly(k):
    # 10 records in batches of 4: passes end in a partial batch, which TensorFlow's
    # iterator checkpoints do not restore exactly at pass boundaries; skipping does.
    reference = take(_data.training_stream(user_pipeline(10), 0, SEED, tf_data_resume="skip"),
                     k + 6)
    resumed = _data.training_stream(user_pipeline(10), 0, SEED, start_batch=k,
                                    tf_data_resume="skip")
    assert_same_batches(take(resumed, 6), reference[k:])


# -- Keras 2 -----------------------------------------------------------------------------
KERAS2_SCRIPT = textwrap.dedent('''
    import os
    import numpy as np
    import tensorflow as tf
    from determined import keras
    from determined.keras import _data

    class Seq(tf.keras.utils.Sequence):
        def __init__(self):
            self.ends = 0
        def __len__(self):
            return 3
        def __getitem__(self, index):
            return (np.full((2, 1), index + 100 * self.ends, "float32"),
                    np.full((2,), index, "int64"), np.full((2,), 1.0, "float32"))
        def on_epoch_end(self):
            self.ends += 1

    def take(stream, count):
        iterator = iter(stream.dataset)
        return [[t.numpy().tolist() for t in next(iterator)] for _ in range(count)]

    if __name__ == "__main__":
        assert tf.keras.__name__.startswith("tf_keras"), tf.keras.__name__
        assert _data.is_sequence(Seq()) and not _data.is_sequence((1, 2))
        reference = take(_data.training_stream(keras.SequenceAdapter(Seq(), workers=0), 0, 7), 8)
        assert sorted(b[1][0] for b in reference[:3]) == [0, 1, 2]
        assert {b[0][0][0] - b[1][0] for b in reference[3:6]} == {100}
        for options in (dict(workers=0), dict(workers=2),
                        dict(workers=1, use_multiprocessing=True)):
            for k in (4, 6):
                stream = _data.training_stream(keras.SequenceAdapter(Seq(), **options), 0, 7, k)
                assert take(stream, 8 - k) == reference[k:], (options, k)
                stream.close()
        validation = _data.validation_stream(Seq(), 0)
        assert [int(x[0, 0]) for x, _, _ in validation] == [0, 1, 2]
        model = tf.keras.Sequential([tf.keras.Input(shape=(1,)), tf.keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        model.make_train_function()
        for loader in (Seq(), (np.zeros((8, 1)), np.ones(8))):
            stream = _data.training_stream(loader, 4, 7)
            iterator = iter(stream.dataset)
            for _ in range(4):
                model.train_function(iterator)
            stream.close()
        model.evaluate(_data.validation_stream(Seq(), 0), verbose=0)
        print("keras2 ok")
''')


def test_sequences_under_keras_2(tmp_path):
    script = tmp_path / "keras2_sequences.py"
    script.write_text(KERAS2_SCRIPT)
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0 and "keras2 ok" in result.stdout, result.stderr[-3000:]
