"""An unchanged script's `model.fit` calls served by localdet in process (the hook
determined/keras/_unchanged.py installs, the phases of _unchanged_fit.py): real Keras on a
tiny model, a real SQLite file; pause and resume across two fit phases."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from conftest import start_trial
from test_exact_resume import PausingReporter

from determined.core._reporting import HOME_VAR
from determined.keras import _unchanged
from determined.keras._trial_controller import prepare_process
from determined.keras._unchanged_fit import METADATA_KEY, ScriptFits

pytestmark = pytest.mark.keras2  # and again under Keras 2 (tests/test_keras_2_line.py)

RNG = np.random.default_rng(0)
X = RNG.normal(size=(96, 6)).astype("float32")
Y = (X[:, 0] + X[:, 1] > 0).astype("int64")
X_VAL, Y_VAL = X[:32], Y[:32]


@pytest.fixture(autouse=True)
def deterministic_and_unhooked():
    tf.config.experimental.enable_op_determinism()
    yield
    _unchanged.uninstall()
    from tensorflow.python.framework import config as tf_config
    tf_config.disable_op_determinism()


def train_py():
    """What an unchanged script does: build, compile, fit; then fine-tune with the first
    layer frozen, without validation data."""
    model = tf.keras.Sequential([tf.keras.Input(shape=(6,)),
                                 tf.keras.layers.Dense(8, activation="relu"),
                                 tf.keras.layers.Dropout(0.3),
                                 tf.keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer=tf.keras.optimizers.Adam(0.01),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    first = model.fit(X, Y, batch_size=8, epochs=2, validation_data=(X_VAL, Y_VAL), verbose=0)
    model.layers[0].trainable = False
    model.compile(optimizer=tf.keras.optimizers.Adam(0.001),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    second = model.fit(X, Y, batch_size=8, epochs=3, verbose=0)
    return model, first, second


def launch(reporter):
    """One launch of the trial: what determined.exec.unchanged_script prepares, then the
    script; None when a pause ended it."""
    info = reporter.trial_info()
    prepare_process(info)
    _unchanged.install(ScriptFits(info, reporter).fit)
    try:
        return train_py()
    except SystemExit as exit:  # a pause: checkpointed, the process ends
        assert exit.code == 0
        return None
    finally:
        _unchanged.uninstall()


def test_each_fit_is_a_phase_recorded_at_the_trials_batches(tmp_path):
    db, trial_id, reporter, _ = start_trial(tmp_path, 1, scheduling_unit=6)
    db.update_trial(trial_id, target_batches=0)  # no searcher length: the script's epochs
    _, first, second = launch(reporter)
    # 96 records in batches of 8: 12 a epoch; 2 epochs, then 3.
    assert first.epoch == [0, 1] and second.epoch == [0, 1, 2]
    assert {"loss", "accuracy", "val_loss", "val_accuracy"} <= set(first.history)
    assert set(second.history) == {"loss", "accuracy"}
    trial = db.trial(trial_id)
    assert trial.batches_trained == 60 and trial.target_batches == 60
    training = [m.batches_trained for m in db.metrics(trial_id, "training")]
    assert training == list(range(6, 61, 6))
    validation = db.metrics(trial_id, "validation")
    assert [m.batches_trained for m in validation] == [12, 24, 36, 48, 60]
    assert "val_loss" in validation[1].metrics
    # Without validation data, the training metrics stand in, under History's names, and
    # the searcher's val_loss is taken from loss (a search over such a script compares it).
    assert set(validation[-1].metrics) == {"loss", "accuracy", "val_loss"}
    assert validation[-1].metrics["val_loss"] == validation[-1].metrics["loss"]
    last = db.checkpoint(trial.latest_checkpoint)
    assert last.batches_trained == 60
    assert last.metadata[METADATA_KEY]["phase"] == 1
    assert last.metadata[METADATA_KEY]["offset"] == 24


def test_a_searcher_metric_a_fit_without_validation_cannot_report_is_named_at_once(
        tmp_path, capsys):
    db, trial_id, reporter, _ = start_trial(
        tmp_path, 12, scheduling_unit=6,
        searcher={"name": "single", "metric": "val_auc", "max_length": {"batches": 12}})
    launch(reporter)
    validation = db.metrics(trial_id, "validation")
    assert set(validation[-1].metrics) == {"loss", "accuracy"}  # nothing made up
    said = capsys.readouterr().out
    assert said.count("fit call 2 has no validation data: the searcher's metric 'val_auc' "
                      "cannot be reported (it reports accuracy, loss)") == 1


def test_the_searchers_length_is_each_phases(tmp_path):
    db, trial_id, reporter, _ = start_trial(tmp_path, 10, scheduling_unit=5)
    _, first, second = launch(reporter)
    assert db.trial(trial_id).batches_trained == 20
    assert len(first.epoch) == 1 and len(second.epoch) == 1  # 10 batches: inside epoch 1


def test_a_script_run_outside_a_trial_is_keras_own(tmp_path):
    db, trial_id, reporter, _ = start_trial(tmp_path, 10)
    _unchanged.install(ScriptFits(reporter.trial_info(), reporter, managed=False).fit)
    _unchanged.uninstall()
    _, first, second = train_py()
    assert first.epoch == [0, 1] and second.epoch == [0, 1, 2]
    assert not db.metrics(trial_id)


def test_a_paused_and_resumed_script_ends_with_the_same_weights(tmp_path, monkeypatch):
    # Paused in the first phase (at its first epoch's end), then in the second: the second
    # launch resumes inside phase 0, the third skips phase 0 and resumes inside phase 1.
    pause_at = (12, 42)

    def run(folder, pause_at):
        # Where a trial's process finds its checkpoints' records, as the launcher sets it.
        monkeypatch.setenv(HOME_VAR, str(folder / "home"))
        db, trial_id, reporter, _ = start_trial(folder, 1, scheduling_unit=6)
        db.update_trial(trial_id, target_batches=0)
        pausing = PausingReporter(reporter, set(pause_at))
        launches = 0
        while True:
            launches += 1
            ended = launch(pausing)
            if ended is not None:
                model, first, second = ended
                break
        assert launches == len(pause_at) + 1
        metrics = [(m.kind, m.batches_trained, m.metrics) for m in db.metrics(trial_id)]
        return [w.numpy() for w in model.weights], metrics, first, second

    straight, straight_metrics, *_ = run(tmp_path / "straight", ())
    paused, paused_metrics, first, second = run(tmp_path / "paused", pause_at)
    for a, b in zip(straight, paused, strict=True):
        np.testing.assert_array_equal(a, b)
    assert paused_metrics == straight_metrics
    # Phase 0 was skipped by the last launch: its History is the one it recorded.
    assert len(first.history["val_loss"]) == 2
    # Phase 1 was resumed: its History has its epochs from before the pause too.
    assert second.epoch == [0, 1, 2] and len(second.history["loss"]) == 3
