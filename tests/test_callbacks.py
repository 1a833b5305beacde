"""determined.keras.callbacks on tiny models: EarlyStopping and ReduceLROnPlateau decide
after each validation exactly as Keras's own callbacks do after each epoch, a pause (state
pickled into a fresh instance) changes no decision, and TensorBoard writes into the trial's
folder whatever log_dir it is given.

Runs under whichever Keras line `tf.keras` is, and again under Keras 2 (marked `keras2`:
tests/test_keras_2_line.py).
"""

from __future__ import annotations

import importlib.util
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from determined.core._reporting import TENSORBOARD_DIR_VAR
from determined.keras import callbacks
from determined.keras.callbacks import tensorboard as tensorboard_module

pytestmark = pytest.mark.keras2  # and again under Keras 2 (tests/test_keras_2_line.py)

KERAS2 = os.environ.get("TF_USE_LEGACY_KERAS") == "1"


def tiny_model(learning_rate: float = 1.0) -> tf.keras.Model:
    tf.keras.utils.set_random_seed(0)  # also works where op determinism is enabled
    model = tf.keras.Sequential([tf.keras.Input(shape=(2,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer=tf.keras.optimizers.SGD(learning_rate), loss="mse")
    model.stop_training = False
    return model


def learning_rate(model: tf.keras.Model) -> float:
    return float(model.optimizer.learning_rate.numpy())


def mark_weights(model: tf.keras.Model, value: float) -> None:
    model.set_weights([np.full_like(w, value) for w in model.get_weights()])


def kernel_value(model: tf.keras.Model) -> float:
    kernel = model.get_weights()[0]
    assert np.all(kernel == kernel.flat[0])
    return float(kernel.flat[0])


def decide(callback, model, monitor, values, *, start=0, keras_epochs=False):
    """Feed one validation per value, as the runner does (`on_test_end`) or as `fit` does
    (`on_epoch_end`, `keras_epochs=True`); returns, per validation, whether training was
    stopped there, the callback's wait and the learning rate after it."""
    trace = []
    for i, value in enumerate(values, start=start):
        mark_weights(model, i)  # each validation sees weights filled with its number
        model.stop_training = False
        if keras_epochs:
            callback.on_epoch_end(i, {monitor: value})
        else:
            callback.on_epoch_begin(i, {})
            callback.on_epoch_end(i, {})  # Determined's epochs: empty logs, ignored
            callback.on_test_end({monitor: value})
        trace.append((bool(model.stop_training), int(callback.wait), learning_rate(model)))
    return trace


def fresh(cls, model, **kwargs):
    callback = cls(**kwargs)
    callback.set_model(model)
    callback.on_train_begin()
    return callback


def resumed(cls, model, state, **kwargs):
    """A new instance as the runner builds it on resume: set_model, load_state, then
    on_train_begin; the state goes through pickle like a checkpoint's."""
    callback = cls(**kwargs)
    callback.set_model(model)
    callback.load_state(pickle.loads(pickle.dumps(state)))
    callback.on_train_begin()
    return callback


# -- EarlyStopping ----------------------------------------------------------------------

EARLY_STOPPING_CASES = {
    "patience": ("val_loss", dict(patience=2), [1.0, 0.9, 0.95, 0.92, 0.91, 0.85, 0.9, 0.9]),
    "min_delta": ("val_loss", dict(patience=1, min_delta=0.05),
                  [1.0, 0.97, 0.9, 0.88, 0.8, 0.79, 0.7]),
    "baseline": ("val_loss", dict(patience=2, baseline=0.5),
                 [0.9, 0.8, 0.85, 0.7, 0.4, 0.45, 0.5, 0.6]),
    "start_from_epoch": ("val_loss", dict(patience=0, start_from_epoch=3),
                         [1.0, 2.0, 3.0, 0.5, 0.6, 0.4, 0.7]),
    "max_mode": ("val_accuracy", dict(mode="max", patience=1),
                 [0.5, 0.6, 0.6, 0.7, 0.65, 0.66, 0.8]),
    "restore_best_weights": ("val_loss", dict(patience=2, restore_best_weights=True),
                             [1.0, 0.5, 0.8, 0.9, 0.4, 0.6, 0.7]),
}


@pytest.mark.parametrize("case", sorted(EARLY_STOPPING_CASES))
def test_early_stopping_decides_like_keras_after_each_validation(case):
    monitor, kwargs, values = EARLY_STOPPING_CASES[case]
    kwargs = dict(monitor=monitor, **kwargs)
    keras_model, our_model = tiny_model(), tiny_model()
    keras_cb = fresh(tf.keras.callbacks.EarlyStopping, keras_model, **kwargs)
    ours = fresh(callbacks.EarlyStopping, our_model, **kwargs)

    expected = decide(keras_cb, keras_model, monitor, values, keras_epochs=True)
    assert decide(ours, our_model, monitor, values) == expected
    assert any(stopped for stopped, _, _ in expected), "each case should stop somewhere"
    assert ours.stopped_epoch == keras_cb.stopped_epoch
    assert ours.best == pytest.approx(float(keras_cb.best))


def test_early_stopping_stops_where_patience_runs_out():
    model = tiny_model()
    ours = fresh(callbacks.EarlyStopping, model, patience=2)
    trace = decide(ours, model, "val_loss", [1.0, 0.9, 0.95, 0.92, 0.91, 0.85])
    # Best at validation 1; validations 2 and 3 do not improve: stop at 3.
    assert [stopped for stopped, _, _ in trace] == [False, False, False, True, True, False]


@pytest.mark.parametrize("case", sorted(EARLY_STOPPING_CASES))
def test_early_stopping_pause_anywhere_changes_nothing(case):
    monitor, kwargs, values = EARLY_STOPPING_CASES[case]
    kwargs = dict(monitor=monitor, **kwargs)
    model = tiny_model()
    uninterrupted = fresh(callbacks.EarlyStopping, model, **kwargs)
    expected = decide(uninterrupted, model, monitor, values)
    for pause in range(1, len(values)):
        before_model, after_model = tiny_model(), tiny_model()
        before = fresh(callbacks.EarlyStopping, before_model, **kwargs)
        trace = decide(before, before_model, monitor, values[:pause])
        after = resumed(callbacks.EarlyStopping, after_model, before.get_state(), **kwargs)
        trace += decide(after, after_model, monitor, values[pause:], start=pause)
        assert trace == expected, f"paused after validation {pause}"
        assert after.get_state()["best"] == uninterrupted.get_state()["best"]
        assert after.test_end_count == len(values)


def test_early_stopping_restores_best_weights_when_it_stops_even_after_a_pause():
    kwargs = dict(patience=2, restore_best_weights=True)
    values = [1.0, 0.5, 0.8, 0.9]  # best at validation 1; stops at 3

    model = tiny_model()
    ours = fresh(callbacks.EarlyStopping, model, **kwargs)
    trace = decide(ours, model, "val_loss", values)
    assert trace[-1][0] and kernel_value(model) == 1.0

    # Paused after validation 2: the best weights travel in the state, as NumPy arrays.
    before_model, after_model = tiny_model(), tiny_model()
    before = fresh(callbacks.EarlyStopping, before_model, **kwargs)
    decide(before, before_model, "val_loss", values[:3])
    state = before.get_state()
    assert all(isinstance(w, np.ndarray) for w in state["best_weights"])
    after = resumed(callbacks.EarlyStopping, after_model, state, **kwargs)
    decide(after, after_model, "val_loss", values[3:], start=3)
    assert after_model.stop_training and kernel_value(after_model) == 1.0

    # on_train_end also ends pauses: it must not put the best weights back.
    paused_model = tiny_model()
    paused = fresh(callbacks.EarlyStopping, paused_model, **kwargs)
    decide(paused, paused_model, "val_loss", values[:3])
    paused.on_train_end()
    assert kernel_value(paused_model) == 2.0


def test_early_stopping_on_train_begin_resets_unless_state_was_loaded():
    model = tiny_model()
    ours = fresh(callbacks.EarlyStopping, model, patience=5)
    decide(ours, model, "val_loss", [1.0, 2.0, 3.0])
    assert (ours.wait, ours.test_end_count) == (2, 3)
    state = ours.get_state()
    ours.on_train_begin()  # reused for another run, as Keras allows: starts afresh
    assert (ours.wait, ours.test_end_count, ours.best_weights) == (0, 0, None)
    ours.load_state(state)
    ours.on_train_begin()  # resumed: keeps the loaded state
    assert (ours.wait, ours.test_end_count, ours.best) == (2, 3, 1.0)


# -- ReduceLROnPlateau ------------------------------------------------------------------

REDUCE_LR_CASES = {
    "patience": ("val_loss", dict(factor=0.5, patience=2),
                 [1.0, 0.9, 0.95, 0.92, 0.91, 0.85, 0.9, 0.9, 0.9]),
    "cooldown_min_lr": ("val_loss", dict(factor=0.5, patience=1, cooldown=2, min_lr=0.2),
                        [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]),
    "min_delta_max_mode": ("val_accuracy", dict(factor=0.1, patience=1, mode="max",
                                                min_delta=0.05),
                           [0.5, 0.52, 0.6, 0.62, 0.7, 0.71, 0.72]),
}


@pytest.mark.parametrize("case", sorted(REDUCE_LR_CASES))
def test_reduce_lr_decides_like_keras_after_each_validation(case):
    monitor, kwargs, values = REDUCE_LR_CASES[case]
    kwargs = dict(monitor=monitor, **kwargs)
    keras_model, our_model = tiny_model(), tiny_model()
    keras_cb = fresh(tf.keras.callbacks.ReduceLROnPlateau, keras_model, **kwargs)
    ours = fresh(callbacks.ReduceLROnPlateau, our_model, **kwargs)

    expected = decide(keras_cb, keras_model, monitor, values, keras_epochs=True)
    assert decide(ours, our_model, monitor, values) == expected
    assert learning_rate(our_model) < 1.0, "each case should reduce the rate"


def test_reduce_lr_reduces_where_patience_runs_out():
    model = tiny_model()
    ours = fresh(callbacks.ReduceLRScheduler, model, factor=0.5, patience=2)
    trace = decide(ours, model, "val_loss", [1.0, 0.9, 0.95, 0.92, 0.91, 0.92])
    # Best at validation 1; 2 and 3 do not improve: halve at 3, then wait again.
    assert [lr for _, _, lr in trace] == pytest.approx([1.0, 1.0, 1.0, 0.5, 0.5, 0.25])


@pytest.mark.parametrize("case", sorted(REDUCE_LR_CASES))
def test_reduce_lr_pause_anywhere_changes_nothing(case):
    monitor, kwargs, values = REDUCE_LR_CASES[case]
    kwargs = dict(monitor=monitor, **kwargs)
    model = tiny_model()
    expected = decide(fresh(callbacks.ReduceLROnPlateau, model, **kwargs),
                      model, monitor, values)
    for pause in range(1, len(values)):
        before_model = tiny_model()
        before = fresh(callbacks.ReduceLROnPlateau, before_model, **kwargs)
        trace = decide(before, before_model, monitor, values[:pause])
        # The checkpoint holds the optimizer, and with it the current learning rate.
        after_model = tiny_model(learning_rate(before_model))
        after = resumed(callbacks.ReduceLROnPlateau, after_model, before.get_state(),
                        **kwargs)
        trace += decide(after, after_model, monitor, values[pause:], start=pause)
        assert trace == expected, f"paused after validation {pause}"


def test_reduce_lr_on_train_begin_resets_unless_state_was_loaded():
    model = tiny_model()
    ours = fresh(callbacks.ReduceLROnPlateau, model, patience=5)
    decide(ours, model, "val_loss", [1.0, 2.0, 3.0])
    state = ours.get_state()
    assert (state["wait"], state["test_end_count"], state["best"]) == (2, 3, 1.0)
    ours.on_train_begin()
    assert (ours.wait, ours.test_end_count) == (0, 0)
    ours.load_state(state)
    ours.on_train_begin()
    assert ours.get_state() == state


def test_callbacks_are_determined_callbacks():
    assert callbacks.ReduceLRScheduler is callbacks.ReduceLROnPlateau
    for cls in (callbacks.EarlyStopping, callbacks.ReduceLROnPlateau, callbacks.TensorBoard):
        assert issubclass(cls, callbacks.Callback)
        assert issubclass(cls, tf.keras.callbacks.Callback)


# -- TensorBoard ------------------------------------------------------------------------

needs_tensorboard = pytest.mark.skipif(
    importlib.util.find_spec("tensorboard") is None,
    reason="the tensorboard package is not installed (TensorFlow no longer installs it)")


def test_tensorboard_without_the_package_says_what_to_install(monkeypatch):
    monkeypatch.setattr(tensorboard_module.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match="pip install tensorboard"):
        callbacks.TensorBoard()


def scalars(folder: Path):
    """(run folder, tag, step, value) of every scalar in the event files under `folder`."""
    found = []
    for path in folder.rglob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                if value.tag.startswith(("epoch_", "evaluation_", "batch_")):
                    number = (float(tf.make_ndarray(value.tensor))
                              if value.HasField("tensor") else value.simple_value)
                    found.append((path.parent.name, value.tag, event.step, number))
    return found


@needs_tensorboard
@pytest.mark.parametrize("how", ["keyword", "positional", "none"])
def test_tensorboard_writes_into_the_trial_folder_whatever_log_dir(tmp_path, monkeypatch,
                                                                   caplog, how):
    trial_dir = tmp_path / "trial" / "tensorboard"
    elsewhere = tmp_path / "elsewhere"
    monkeypatch.setenv(TENSORBOARD_DIR_VAR, str(trial_dir))
    monkeypatch.chdir(tmp_path)
    args, kwargs = {"keyword": ((), {"log_dir": str(elsewhere)}),
                    "positional": ((str(elsewhere),), {}), "none": ((), {})}[how]
    board = callbacks.TensorBoard(*args, histogram_freq=1, **kwargs)
    assert board.log_dir == str(trial_dir)
    assert ("ignores log_dir" in caplog.text) == (how != "none")

    x = np.random.default_rng(0).normal(size=(16, 2)).astype("float32")
    tiny_model(0.01).fit(x, x[:, :1], validation_data=(x, x[:, :1]), batch_size=4, epochs=2,
                         callbacks=[board], verbose=0)
    assert list((trial_dir / "train").glob("events.out.tfevents.*"))
    assert list((trial_dir / "validation").glob("events.out.tfevents.*"))
    assert not elsewhere.exists() and not (tmp_path / "logs").exists()
    assert {tag for _, tag, _, _ in scalars(trial_dir)} >= {"epoch_loss"}


@needs_tensorboard
def test_tensorboard_falls_back_to_a_local_folder(tmp_path, monkeypatch):
    monkeypatch.delenv(TENSORBOARD_DIR_VAR, raising=False)
    assert callbacks.TensorBoard().log_dir == "tensorboard"


@needs_tensorboard
def test_tensorboard_writes_workload_and_validation_scalars_at_batches_trained(
        tmp_path, monkeypatch):
    monkeypatch.setenv(TENSORBOARD_DIR_VAR, str(tmp_path / "tb"))
    model = tiny_model()

    def validate(board, val_loss):
        board.set_model(model)  # each `evaluate` sets the model again
        board.on_test_begin()
        board.on_test_end({"val_loss": val_loss})

    board = callbacks.TensorBoard(log_dir="ignored")
    board.set_model(model)
    board.on_train_begin()
    board.on_train_workload_begin(0, 3, {})
    board.on_train_workload_end(3, {"loss": 2.0})
    validate(board, 1.5)
    board.on_train_end()
    validate(board, 1.25)  # the runner's last validation comes after on_train_end

    # Resumed: a fresh instance carries on at the same step.
    again = callbacks.TensorBoard()
    again.set_model(model)
    again.load_state(pickle.loads(pickle.dumps(board.get_state())))
    again.on_train_begin()
    again.on_train_workload_begin(3, 2, {})
    again.on_train_workload_end(5, {"loss": 1.0})
    validate(again, 0.5)
    again.on_train_end()

    epoch = sorted((run, step, value) for run, tag, step, value in scalars(tmp_path / "tb")
                   if tag == "epoch_loss")
    assert epoch == [("train", 3, 2.0), ("train", 5, 1.0), ("validation", 3, 1.25),
                     ("validation", 3, 1.5), ("validation", 5, 0.5)]
