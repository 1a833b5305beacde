"""The New Keras API in process: det.keras.init()'s context, context.fit through the trial
runner (lengths, History, validation, exact resume), wrap_data sharding, jobs."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from conftest import start_trial
from test_exact_resume import PausingReporter

from determined.core import DistributedContext
from determined.keras import KerasContext
from determined.keras._backend_context import JobHasNoTrainingError
from determined.keras._trial_controller import TrialError, prepare_process

pytestmark = pytest.mark.keras2  # and again under Keras 2 (tests/test_keras_2_line.py)

RNG = np.random.default_rng(0)
X = RNG.normal(size=(96, 6)).astype("float32")
Y = (X[:, 0] + X[:, 1] > 0).astype("int64")
X_VAL, Y_VAL = X[:32], Y[:32]


@pytest.fixture(autouse=True)
def op_determinism():
    tf.config.experimental.enable_op_determinism()
    yield
    from tensorflow.python.framework import config as tf_config
    tf_config.disable_op_determinism()


class Batches(tf.keras.utils.Sequence):
    def __init__(self, batch=8):
        super().__init__()
        self.batch = batch

    def __len__(self):
        return len(X) // self.batch

    def __getitem__(self, i):
        rows = slice(i * self.batch, (i + 1) * self.batch)
        return X[rows], Y[rows]


def build(context: KerasContext) -> tf.keras.Model:
    model = tf.keras.Sequential([tf.keras.Input(shape=(6,)),
                                 tf.keras.layers.Dense(8, activation="relu"),
                                 tf.keras.layers.Dropout(0.3),
                                 tf.keras.layers.Dense(2, activation="softmax")])
    optimizer = context.wrap_optimizer(tf.keras.optimizers.Adam(0.01))
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


def script(reporter, data: str = "numpy", **fit_args):
    """What a training script does: init (seeding), build, wrap, fit."""
    info = reporter.trial_info()
    prepare_process(info)
    context = KerasContext(info, reporter)
    model = build(context)
    if data == "numpy":
        x, y = context.wrap_data(X, Y)
        fit_args = {"x": x, "y": y, "batch_size": 8, **fit_args}
    else:
        fit_args = {"x": context.wrap_data(Batches()), **fit_args}
    fit_args.setdefault("validation_data", (X_VAL, Y_VAL))
    history = context.fit(model, **fit_args)
    return context, model, history


def test_fit_trains_to_the_searcher_length_and_reports(tmp_path):
    db, trial_id, reporter, _ = start_trial(tmp_path, 30, scheduling_unit=10)
    _, _, history = script(reporter, epochs=1000)  # epochs: ignored, the searcher says 30
    trial = db.trial(trial_id)
    assert trial.batches_trained == 30 and trial.latest_checkpoint
    training = db.metrics(trial_id, "training")
    assert [m.batches_trained for m in training] == [10, 20, 30]
    validation = db.metrics(trial_id, "validation")
    # 12 batches per pass (96 / 8): validated at each epoch end, and at the end.
    assert [m.batches_trained for m in validation] == [12, 24, 30]
    assert len(history.history["val_loss"]) == 3
    assert history.history["val_loss"][-1] == pytest.approx(validation[-1].metrics["val_loss"])
    assert {"loss", "accuracy", "val_loss", "val_accuracy"} <= set(history.history)


def test_fit_records_when_its_launchs_first_batch_ended(tmp_path):
    from localdet.records.db import now

    db, trial_id, reporter, _ = start_trial(tmp_path, 6, scheduling_unit=2)
    db.update_trial(trial_id, state="RUNNING", started_at=now())  # as the daemon launches it
    script(reporter)
    [seconds] = [e["payload"]["seconds"] for e in db.events()
                 if e["kind"] == "trial_first_batch" and e["trial_id"] == trial_id]
    assert seconds > 0


def test_fit_without_a_searcher_length_trains_the_scripts_epochs(tmp_path):
    db, trial_id, reporter, _ = start_trial(tmp_path, 1)
    db.update_trial(trial_id, target_batches=0)  # what a config without max_length gives
    _, _, history = script(reporter, epochs=3, initial_epoch=1)
    assert db.trial(trial_id).target_batches == 24  # (3 - 1) epochs of 12 batches
    assert history.epoch == [1, 2]
    assert db.trial(trial_id).batches_trained == 24


def test_fit_needs_validation_data(tmp_path):
    _, _, reporter, _ = start_trial(tmp_path, 10)
    with pytest.raises(ValueError, match="needs validation data: pass validation_data"):
        script(reporter, validation_data=None)


def test_validation_split_takes_the_last_records(tmp_path):
    db, trial_id, reporter, _ = start_trial(tmp_path, 12)
    _, _, history = script(reporter, validation_data=None, validation_split=0.25)
    # 72 training records: 9 batches of 8 per epoch, so the 12 batches end inside epoch 2.
    assert [m.batches_trained for m in db.metrics(trial_id, "validation")] == [9, 12]
    assert len(history.history["val_loss"]) == 2


def test_x_val_and_y_val_are_validation_data(tmp_path):
    db, trial_id, reporter, _ = start_trial(tmp_path, 12)
    script(reporter, validation_data=None, x_val=X_VAL, y_val=Y_VAL)
    assert db.metrics(trial_id, "validation")


def test_an_uncompiled_model_is_refused_in_one_sentence(tmp_path):
    _, _, reporter, info = start_trial(tmp_path, 10)
    context = KerasContext(info, reporter)
    model = tf.keras.Sequential([tf.keras.Input(shape=(6,)), tf.keras.layers.Dense(2)])
    with pytest.raises(TrialError, match="compiled model"):
        context.fit(model, X, Y, validation_data=(X_VAL, Y_VAL))


def test_evaluate_returns_what_keras_returns_and_records_test_metrics(tmp_path):
    db, trial_id, reporter, _ = start_trial(tmp_path, 12)
    context, model, _ = script(reporter)
    loss, accuracy = context.evaluate(model, X_VAL, Y_VAL, verbose=0)
    expected = model.evaluate(X_VAL, Y_VAL, verbose=0, return_dict=True)
    assert (loss, accuracy) == pytest.approx((expected["loss"], expected["accuracy"]))
    last = db.metrics(trial_id, "validation")[-1]
    assert last.batches_trained == 12
    assert last.metrics["test_loss"] == pytest.approx(loss)
    assert "val_loss" in last.metrics  # fit's validation at 12 is kept beside it
    predictions = context.predict(model, X_VAL, verbose=0)
    np.testing.assert_allclose(predictions, model.predict(X_VAL, verbose=0))


@pytest.mark.parametrize("data", ["numpy", "sequence"])
def test_a_paused_and_resumed_fit_ends_with_the_same_weights(tmp_path, data):
    def run(folder, pause_at):
        db, trial_id, reporter, _ = start_trial(folder, 40, scheduling_unit=5)
        pausing = PausingReporter(reporter, set(pause_at))
        segments = 0
        while True:
            segments += 1
            _, model, _ = script(pausing, data)
            if db.trial(trial_id).batches_trained >= 40:
                break
        assert segments == len(pause_at) + 1
        metrics = [(m.kind, m.batches_trained, m.metrics) for m in db.metrics(trial_id)]
        return [w.numpy() for w in model.weights], metrics

    straight, straight_metrics = run(tmp_path / "straight", ())
    paused, paused_metrics = run(tmp_path / "paused", (5, 15, 25))
    for a, b in zip(straight, paused, strict=True):
        np.testing.assert_array_equal(a, b)
    assert paused_metrics == straight_metrics


def test_wrap_data_shards_by_rank(tmp_path):
    _, _, reporter, info = start_trial(tmp_path, 10)
    context = KerasContext(info, reporter, DistributedContext(rank=1, size=3))
    x, y = context.wrap_data(X, Y)
    np.testing.assert_array_equal(x, X[1::3])
    np.testing.assert_array_equal(y, Y[1::3])
    sequence = context.wrap_data(Batches())
    assert len(sequence) == 4  # batches 1, 4, 7, 10 of 12
    np.testing.assert_array_equal(sequence[1][0], Batches()[4][0])
    dataset = context.wrap_data(tf.data.Dataset.range(9))
    assert list(dataset.as_numpy_iterator()) == [1, 4, 7]
    single = KerasContext(info, reporter)
    assert single.wrap_data(X) is X


def test_shard_batch_size():
    assert DistributedContext().shard_batch_size(128) == 128
    assert DistributedContext(rank=0, size=4).shard_batch_size(128) == 32
    with pytest.raises(ValueError, match="multiple of 3"):
        DistributedContext(rank=0, size=3).shard_batch_size(128)


def test_hparams_name_where_values_come_from(tmp_path):
    _, _, reporter, info = start_trial(tmp_path, 10)
    context = KerasContext(info, reporter)
    assert context.training.hparams["global_batch_size"] == 4
    with pytest.raises(KeyError, match="det.keras.init\\(hparams="):
        context.training.hparams["dropout"]


def test_a_job_has_no_training_context(tmp_path):
    _, _, reporter, info = start_trial(tmp_path, 10, data={"batch_size": 64})
    info.kind = "job"
    context = KerasContext(info, reporter)
    assert context.config_data == {"batch_size": 64}
    with pytest.raises(JobHasNoTrainingError, match="jobs have no training context"):
        _ = context.training
    with pytest.raises(JobHasNoTrainingError):
        context.fit(None, X, Y, validation_data=(X_VAL, Y_VAL))
