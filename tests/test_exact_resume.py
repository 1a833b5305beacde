"""Pause and resume, in process: a trial paused several times (mid-epoch included) ends
with the same weights and metrics, bit for bit, as the same trial run without a pause."""

from __future__ import annotations

import random

import numpy as np
import pytest
import tensorflow as tf
from conftest import start_trial

from determined import keras
from determined.keras._trial_controller import TrialController


@pytest.fixture(autouse=True)
def op_determinism():
    tf.config.experimental.enable_op_determinism()
    yield
    # Not in the public API; other test modules must not run deterministic.
    from tensorflow.python.framework import config as tf_config
    tf_config.disable_op_determinism()


class PausingReporter:
    """The real reporter, except that it asks the trial to pause at the given batches, the
    way `localdet pause` would."""

    def __init__(self, inner, pause_at: set[int]):
        self._inner = inner
        self._pending = set(pause_at)

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def should_pause(self) -> bool:
        batches = self._inner.db.trial(self._inner.trial_id).batches_trained
        if batches in self._pending:
            self._pending.discard(batches)
            return True
        return False


def run(trial_class, tmp_path, target, pause_at=(), **config):
    """Run a trial to the end, pausing (and resuming in a fresh controller) as asked."""
    db, trial_id, reporter, _ = start_trial(tmp_path, target, **config)
    pausing = PausingReporter(reporter, set(pause_at))
    segments = 0
    while True:
        segments += 1
        controller = TrialController.for_trial_class(trial_class, reporter.trial_info(), pausing)
        controller.run()
        if not controller.paused:
            break
    assert segments == len(pause_at) + 1, "every requested pause happened"
    metrics = [(m.kind, m.batches_trained, m.metrics) for m in db.metrics(trial_id)]
    return controller, [w.numpy() for w in controller.model.weights], metrics


# -- a closed-form model: w after every batch is known exactly --------------------------------
X = np.linspace(-1.0, 1.0, 24, dtype="float32").reshape(-1, 1)
Y = 3.0 * X
LEARNING_RATE = 0.1
BATCH = 4
WEIGHT_TRACE: list = []


class LinearTrial(keras.TFKerasTrial):
    """y = w * x, w starts at 0, plain SGD on MSE, data in natural order."""

    def __init__(self, context):
        self.context = context
        context.configure_fit(shuffle=False)

    def build_model(self):
        model = self.context.wrap_model(tf.keras.Sequential([
            tf.keras.Input(shape=(1,)),
            tf.keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")]))
        model.compile(optimizer=self.context.wrap_optimizer(
            tf.keras.optimizers.SGD(LEARNING_RATE)), loss="mse")
        return model

    def build_training_data_loader(self):
        return X, Y

    def build_validation_data_loader(self):
        return X, Y

    def keras_callbacks(self):
        class Trace(tf.keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                WEIGHT_TRACE.append(float(self.model.weights[0].numpy()[0, 0]))
        return [Trace()]


def closed_form_trace(batches: int) -> list[float]:
    w, trace = 0.0, []
    for k in range(batches):
        rows = [(k * BATCH + i) % len(X) for i in range(BATCH)]  # passes flow into each other
        x, y = X[rows, 0].astype("float64"), Y[rows, 0].astype("float64")
        w -= LEARNING_RATE * np.mean(2 * (w * x - y) * x)
        trace.append(w)
    return trace


@pytest.mark.keras2
def test_linear_model_follows_the_closed_form_through_three_pauses(tmp_path):
    WEIGHT_TRACE.clear()
    # 6 batches per pass; pauses at 5 (mid-pass), 10 and 20 (mid-pass again).
    run(LinearTrial, tmp_path, target=27, pause_at=(5, 10, 20), scheduling_unit=5,
        hyperparameters={"global_batch_size": BATCH})
    assert len(WEIGHT_TRACE) == 27, "no batch skipped or repeated across the pauses"
    np.testing.assert_allclose(WEIGHT_TRACE, closed_form_trace(27), rtol=1e-5, atol=1e-6)


# -- bit-for-bit equality, with dropout and Adam, for each data form ---------------------------
def _digits():
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    return (x[:400] / 16.0).astype("float32"), y[:400].astype("int32")


class DropoutTrial(keras.TFKerasTrial):
    """A model whose every step draws random numbers (dropout) and keeps optimizer slots."""

    UNITS = 32

    def build_model(self):
        model = self.context.wrap_model(tf.keras.Sequential([
            tf.keras.Input(shape=(64,)), tf.keras.layers.Dense(self.UNITS, activation="relu"),
            tf.keras.layers.Dropout(0.3), tf.keras.layers.Dense(10, activation="softmax")]))
        model.compile(optimizer=self.context.wrap_optimizer(tf.keras.optimizers.Adam(0.01)),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        return model

    def build_training_data_loader(self):
        return _digits()

    def build_validation_data_loader(self):
        x, y = _digits()
        return x[:100], y[:100]


class DigitsSequence(tf.keras.utils.Sequence):
    def __init__(self, batch_size=16):
        super().__init__()
        self.x, self.y = _digits()
        self.batch_size = batch_size

    def __len__(self):
        return len(self.x) // self.batch_size

    def __getitem__(self, index):
        part = slice(index * self.batch_size, (index + 1) * self.batch_size)
        return self.x[part], self.y[part]


class SequenceTrial(DropoutTrial):
    def build_training_data_loader(self):
        return DigitsSequence()


class ThreadedSequenceTrial(DropoutTrial):
    def build_training_data_loader(self):
        return keras.KerasDataAdapter(DigitsSequence(), workers=2, use_multiprocessing=False)


class ProcessSequenceTrial(DropoutTrial):
    def build_training_data_loader(self):
        return keras.KerasDataAdapter(DigitsSequence(), workers=2, use_multiprocessing=True)


class DatasetTrial(DropoutTrial):
    def build_training_data_loader(self):
        x, y = _digits()
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(400, seed=5).batch(16)
        return self.context.wrap_dataset(dataset)


class WideTrial(DropoutTrial):
    """Wide enough (a 1.3 MB .h5 with Adam's slots) that the store keeps its .h5 in many
    chunks: each resume reads it where the chunks lie, never joined into a file."""

    UNITS = 1024


BIT_FOR_BIT = dict(scheduling_unit=7, min_validation_period={"batches": 14},
                  hyperparameters={"global_batch_size": 16}, records_per_epoch=400)
# The Sequence read in threads or in processes is the same stream as the Sequence read in
# the main process, batch for batch ("batches always come out in order"): one straight run
# of it stands for the three.
SAME_STREAM = {ThreadedSequenceTrial: SequenceTrial, ProcessSequenceTrial: SequenceTrial}


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory):
    """`straight_run(trial_class)`: (weights, metrics) of the trial's stream run 60 batches
    without a pause, once per stream in the module."""
    done = {}

    def straight(trial_class):
        stream = SAME_STREAM.get(trial_class, trial_class)
        if stream not in done:
            _, weights, metrics = run(stream, tmp_path_factory.mktemp("straight"), target=60,
                                      **BIT_FOR_BIT)
            done[stream] = weights, metrics
        return done[stream]

    return straight


@pytest.mark.parametrize("trial_class", [
    pytest.param(DropoutTrial, marks=pytest.mark.keras2),
    pytest.param(SequenceTrial, marks=pytest.mark.keras2),
    ThreadedSequenceTrial, ProcessSequenceTrial,
    pytest.param(DatasetTrial, marks=pytest.mark.keras2)])
def test_paused_three_times_ends_bit_for_bit_like_an_uninterrupted_run(trial_class, tmp_path,
                                                                        straight_run):
    straight, straight_metrics = straight_run(trial_class)
    # 25 batches per pass: pauses mid-pass (7, 35) and just after a pass (28). Worker
    # processes start anew at each launch (seconds each): one pause, mid-pass, shows that
    # their stream resumes; the others' pauses show the positions.
    pause_at = (35,) if trial_class is ProcessSequenceTrial else (7, 28, 35)
    _, paused, paused_metrics = run(trial_class, tmp_path / "paused", target=60,
                                    pause_at=pause_at, **BIT_FOR_BIT)
    for a, b in zip(straight, paused, strict=True):
        np.testing.assert_array_equal(a, b)
    assert paused_metrics == straight_metrics


@pytest.mark.keras2
def test_a_model_read_in_place_from_its_chunks_resumes_bit_for_bit(tmp_path, straight_run,
                                                                   monkeypatch):
    from localdet.checkpoints.store import Store

    read_in_place = []
    open_file = Store.open_file

    def spy(store, entry, name=""):
        read_in_place.append((name, len(entry.chunks)))
        return open_file(store, entry, name)

    monkeypatch.setattr(Store, "open_file", spy)
    straight, straight_metrics = straight_run(WideTrial)
    _, paused, paused_metrics = run(WideTrial, tmp_path / "paused", target=60,
                                    pause_at=(7, 28, 35), **BIT_FOR_BIT)
    assert [name for name, _ in read_in_place] == ["determined-keras-model.h5"] * 3
    assert min(chunks for _, chunks in read_in_place) > 4
    for a, b in zip(straight, paused, strict=True):
        np.testing.assert_array_equal(a, b)
    assert paused_metrics == straight_metrics


def test_a_corrupt_chunk_of_the_model_fails_the_resume_naming_the_file(tmp_path):
    from localdet.checkpoints.store import StoreError

    db, _, reporter, _ = start_trial(tmp_path, 20, **BIT_FOR_BIT)
    pausing = PausingReporter(reporter, {7})
    TrialController.for_trial_class(WideTrial, reporter.trial_info(), pausing).run()
    (checkpoint,) = db.checkpoints()
    first = checkpoint.manifest["files"]["determined-keras-model.h5"]["chunks"][0][0]
    blob = reporter.store.blob_path(first)  # the .h5's superblock: h5py cannot open it
    blob.chmod(0o644)
    blob.write_bytes(bytes(blob.stat().st_size))
    resumed = TrialController.for_trial_class(WideTrial, reporter.trial_info(), pausing)
    with pytest.raises(StoreError, match="checkpoint files determined-keras-model.h5 are "
                                         "corrupt or missing in the store"):
        resumed.run()


# -- every random generator a trial can reach --------------------------------------------------
DRAWS: list = []


def draw(where, keras_random=True) -> None:
    """One draw from each generator: Python's, NumPy's, TensorFlow's eager ops without a seed
    of their own (op seeds from the global seed), TensorFlow's global tf.random.Generator and,
    under Keras 3, keras.random without a seed (Keras's global seed generator: one per
    thread, so only the main thread's resumes; a Sequence is read in tf.data's threads)."""
    from determined.keras._trial_controller import keras_line

    values = [random.random(), float(np.random.rand()), float(tf.random.uniform(())),
              float(tf.random.get_global_generator().normal(()))]
    if keras_random and keras_line() == "keras3":
        import keras as keras3

        values.append(float(keras3.random.uniform(())))
    DRAWS.append((where, values))


class DrawingSequence(DigitsSequence):
    def __getitem__(self, index):
        draw("sequence", keras_random=False)
        return super().__getitem__(index)


class DrawingTrial(DropoutTrial):
    """Draws from every generator in each place a trial's code runs."""

    def __init__(self, context):
        super().__init__(context)
        # Read in step with training, not ahead of it (see the test below).
        context.configure_fit(workers=0)
        draw("__init__")

    def build_model(self):
        draw("build_model")
        return super().build_model()

    def build_training_data_loader(self):
        draw("build_training_data_loader")
        return DrawingSequence()

    def keras_callbacks(self):
        class DrawEveryBatch(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                draw("on_train_batch_end")

            def on_train_workload_end(self, total_batches_trained, logs):
                draw("on_train_workload_end")

            def on_test_end(self, logs=None):
                draw("on_test_end")

        return [DrawEveryBatch()]


@pytest.mark.keras2
def test_every_generator_draws_after_a_resume_what_it_would_have_drawn_never_paused(tmp_path):
    """Each process starts from the trial's seed, so the code run once per process
    (__init__, build_model, the loaders) draws the same in every process; everything after
    the restore continues the checkpointed states. Draws inside a Sequence that is read ahead
    of training (workers >= 1) cannot resume: the reader has drawn for batches the
    checkpoint does not hold yet."""
    config = dict(scheduling_unit=5, min_validation_period={"batches": 10},
                  hyperparameters={"global_batch_size": 16}, records_per_epoch=400)
    DRAWS.clear()
    run(DrawingTrial, tmp_path / "straight", target=30, **config)
    straight = list(DRAWS)
    DRAWS.clear()
    run(DrawingTrial, tmp_path / "paused", target=30, pause_at=(5, 20), **config)
    paused = list(DRAWS)

    once_per_process = ("__init__", "build_model", "build_training_data_loader")
    setup = [d for d in straight if d[0] in once_per_process]
    assert [d for d in paused if d[0] in once_per_process] == setup * 3
    after = [d for d in straight if d[0] not in once_per_process]
    assert len(after) > 60
    assert [d for d in paused if d[0] not in once_per_process] == after
