"""The in-process trial runner on tiny models: exact batch counts, workload boundaries,
window-averaged training metrics, every data form, and clear errors for broken trials."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from conftest import start_trial

from determined import keras
from determined.keras._data import DataLoaderError
from determined.keras._trial_controller import TrialController, TrialError


class ConstantLossTrial(keras.TFKerasTrial):
    """Learns nothing (learning rate 0), so batch k's MSE loss is exactly k**2: training
    metrics reveal which batches each workload averaged."""

    def build_model(self):
        model = self.context.wrap_model(tf.keras.Sequential([
            tf.keras.Input(shape=(1,)),
            tf.keras.layers.Dense(1, kernel_initializer="zeros", bias_initializer="zeros")]))
        model.compile(optimizer=self.context.wrap_optimizer(tf.keras.optimizers.SGD(0.0)),
                      loss="mse")
        return model

    def build_training_data_loader(self):
        # 30 batches of 4; every target in batch k equals k.
        targets = np.repeat(np.arange(30, dtype="float32"), 4).reshape(-1, 1)
        dataset = tf.data.Dataset.from_tensor_slices((np.zeros_like(targets), targets))
        return self.context.wrap_dataset(dataset.batch(4))

    def build_validation_data_loader(self):
        data = (np.zeros((8, 1), "float32"), np.full((8, 1), 2.0, "float32"))
        return self.context.wrap_dataset(tf.data.Dataset.from_tensor_slices(data).batch(4))


def test_training_metrics_average_each_workload_and_boundaries_follow_the_periods(tmp_path):
    db, trial_id, reporter, info = start_trial(
        tmp_path, target=25, scheduling_unit=10, min_validation_period={"batches": 15})
    TrialController.for_trial_class(ConstantLossTrial, info, reporter).run()

    training = {r.batches_trained: r.metrics["loss"] for r in db.metrics(trial_id, "training")}
    # Workloads end at every 10 batches, at the validation every 15, and at the end (25).
    expected_windows = {10: range(0, 10), 15: range(10, 15), 20: range(15, 20),
                        25: range(20, 25)}
    assert sorted(training) == sorted(expected_windows)
    for end, window in expected_windows.items():
        assert training[end] == pytest.approx(np.mean([k * k for k in window]))
    validation = [(r.batches_trained, r.metrics) for r in db.metrics(trial_id, "validation")]
    assert validation == [(15, {"val_loss": pytest.approx(4.0)}),
                          (25, {"val_loss": pytest.approx(4.0)})]
    assert [c.batches_trained for c in db.checkpoints(trial_id=trial_id)] == [25]
    assert db.trial(trial_id).batches_trained == 25


class DigitsLikeTrial(keras.TFKerasTrial):
    """Two named inputs, NumPy data with sample weights; counts optimizer steps."""

    def build_model(self):
        left = tf.keras.Input(shape=(3,), name="left")
        right = tf.keras.Input(shape=(2,), name="right")
        merged = tf.keras.layers.Concatenate()([left, right])
        output = tf.keras.layers.Dense(2, activation="softmax")(merged)
        model = self.context.wrap_model(tf.keras.Model({"left": left, "right": right}, output))
        model.compile(optimizer=self.context.wrap_optimizer(tf.keras.optimizers.SGD(0.1)),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        return model

    def _data(self, n):
        rng = np.random.default_rng(0)
        x = {"left": rng.normal(size=(n, 3)).astype("float32"),
             "right": rng.normal(size=(n, 2)).astype("float32")}
        y = (x["left"][:, 0] > 0).astype("int32")
        return x, y, np.ones(n, "float32")

    def build_training_data_loader(self):
        return self._data(50)

    def build_validation_data_loader(self):
        x, y, _ = self._data(20)
        return x, y


def test_numpy_dict_inputs_with_sample_weights_train_exactly_the_requested_batches(tmp_path):
    db, trial_id, reporter, info = start_trial(tmp_path, target=37,
                                               hparams={"global_batch_size": 8})
    controller = TrialController.for_trial_class(DigitsLikeTrial, info, reporter)
    controller.run()
    # 50 examples in batches of 8 run past several passes over the data: still 37 steps.
    assert int(controller.model.optimizer.iterations.numpy()) == 37
    (last,) = [r for r in db.metrics(trial_id, "validation")]
    assert last.batches_trained == 37 and set(last.metrics) == {"val_loss", "val_accuracy"}


class WrongLoaderTrial(ConstantLossTrial):
    def build_training_data_loader(self):
        return [1, 2, 3]


class UnwrappedModelTrial(ConstantLossTrial):
    def build_model(self):
        model = tf.keras.Sequential([tf.keras.Input(shape=(1,)), tf.keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        return model


def test_a_loader_of_the_wrong_type_is_named_with_the_accepted_forms(tmp_path):
    _, _, reporter, info = start_trial(tmp_path, target=5)
    with pytest.raises(DataLoaderError, match=r"build_training_data_loader returned list; "
                                              r"return one of: \(x, y\)"):
        TrialController.for_trial_class(WrongLoaderTrial, info, reporter).run()


def test_an_unwrapped_model_is_refused_before_training(tmp_path):
    _, _, reporter, info = start_trial(tmp_path, target=5)
    with pytest.raises(TrialError, match=r"wrap the model with self.context.wrap_model"):
        TrialController.for_trial_class(UnwrappedModelTrial, info, reporter)


def test_context_answers_from_the_trial_record(tmp_path):
    _, trial_id, _, info = start_trial(tmp_path, target=5,
                                       hparams={"global_batch_size": 4, "units": 3})
    context = keras.TFKerasTrialContext(info)
    assert context.get_hparams() == {"global_batch_size": 4, "units": 3}
    assert context.get_trial_id() == trial_id and context.get_trial_seed() == 3
    assert context.get_per_slot_batch_size() == 4 == context.get_global_batch_size()
    assert context.get_experiment_config()["searcher"]["max_length"] == {"batches": 5}
    with pytest.raises(ValueError, match="known hyperparameters are: global_batch_size, units"):
        context.get_hparam("unit")
    context.configure_fit(verbose=True, workers=3)
    context.configure_fit(shuffle=False)
    assert context.fit_config == {"verbose": True, "workers": 3, "shuffle": False}


class MetadataTrial(ConstantLossTrial):
    def __init__(self, context):
        super().__init__(context)
        context.add_checkpoint_metadata({"dataset": "constant-v1"})

    def keras_callbacks(self):
        context = self.context

        class Stamp(keras.callbacks.Callback):
            def on_checkpoint_end(self, checkpoint_dir):
                (Path(checkpoint_dir) / "notes.txt").write_text("written by a callback")
                context.add_checkpoint_metadata({"stamped_at": context.get_trial_id()})

        return [Stamp()]


def test_checkpoint_metadata_and_callback_files_are_part_of_the_checkpoint(tmp_path):
    db, trial_id, reporter, info = start_trial(tmp_path, target=10)
    TrialController.for_trial_class(MetadataTrial, info, reporter).run()
    (checkpoint,) = db.checkpoints(trial_id=trial_id)
    assert checkpoint.metadata["dataset"] == "constant-v1"
    assert checkpoint.metadata["stamped_at"] == trial_id
    exported = reporter.restore_checkpoint(checkpoint.uuid, tmp_path / "export")
    assert (exported / "notes.txt").read_text() == "written by a callback"
    assert json.loads((exported / "metadata.json").read_text())["dataset"] == "constant-v1"


EVENTS: list = []


class HookRecorder(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        EVENTS.append(("epoch_begin", epoch, dict(logs or {})))

    def on_epoch_end(self, epoch, logs=None):
        EVENTS.append(("epoch_end", epoch, dict(logs or {})))

    def on_train_workload_begin(self, total_batches_trained, batches_requested, logs):
        EVENTS.append(("workload_begin", total_batches_trained, batches_requested))

    def on_train_workload_end(self, total_batches_trained, logs):
        EVENTS.append(("workload_end", total_batches_trained, sorted(logs)))

    def on_test_end(self, logs=None):
        EVENTS.append(("test_end", sorted(logs)))


class EarlyStoppingTrial(ConstantLossTrial):
    """Validation loss never improves (nothing is learned): EarlyStopping with patience 1
    stops the trial at the second validation."""

    def keras_callbacks(self):
        return [HookRecorder(), keras.callbacks.EarlyStopping(patience=1)]


def test_callbacks_see_determined_epochs_workloads_and_validations(tmp_path):
    EVENTS.clear()
    # 4 records per batch, 12 records per epoch: an epoch every 3 batches.
    db, trial_id, reporter, info = start_trial(
        tmp_path, target=30, scheduling_unit=4, records_per_epoch=12,
        min_validation_period={"batches": 4})
    TrialController.for_trial_class(EarlyStoppingTrial, info, reporter).run()
    assert db.trial(trial_id).batches_trained == 8, "EarlyStopping ended the trial"
    assert [e for e in EVENTS if e[0].startswith("epoch")][:4] == [
        ("epoch_begin", 0, {}), ("epoch_end", 0, {}), ("epoch_begin", 1, {}),
        ("epoch_end", 1, {})]
    assert ("workload_begin", 0, 4) in EVENTS and ("workload_end", 4, ["loss"]) in EVENTS
    assert [e for e in EVENTS if e[0] == "test_end"] == [("test_end", ["val_loss"])] * 2
    assert [c.batches_trained for c in db.checkpoints(trial_id=trial_id)] == [8]


class SelfStoppingTrial(ConstantLossTrial):
    def keras_callbacks(self):
        context = self.context

        class StopAtSix(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                if batch + 1 == 6:
                    context.set_stop_requested(True)

        return [StopAtSix()]


def test_a_trial_can_end_itself_at_the_next_boundary(tmp_path):
    db, trial_id, reporter, info = start_trial(tmp_path, target=30, scheduling_unit=10)
    controller = TrialController.for_trial_class(SelfStoppingTrial, info, reporter)
    controller.run()
    assert controller.context.get_stop_requested()
    assert db.trial(trial_id).batches_trained == 6
    assert [r.batches_trained for r in db.metrics(trial_id, "validation")] == [6]
    assert [c.batches_trained for c in db.checkpoints(trial_id=trial_id)] == [6]


def test_tensorboard_callback_writes_into_the_trials_folder(tmp_path):
    class TensorBoardTrial(ConstantLossTrial):
        def keras_callbacks(self):
            return [keras.callbacks.TensorBoard(log_dir="/somewhere/else")]

    pytest.importorskip("tensorboard")
    _, _, reporter, info = start_trial(tmp_path, target=8, scheduling_unit=4)
    TrialController.for_trial_class(TensorBoardTrial, info, reporter).run()
    events = list((info.trial_dir / "tensorboard").rglob("events.out.tfevents.*"))
    assert events, "TensorBoard event files land in the trial's own folder"


def test_session_config_is_honoured(tmp_path):
    class HardPlacementTrial(ConstantLossTrial):
        def session_config(self):
            return tf.compat.v1.ConfigProto(allow_soft_placement=False)

    _, _, reporter, info = start_trial(tmp_path, target=2)
    try:
        TrialController.for_trial_class(HardPlacementTrial, info, reporter)
        assert tf.config.get_soft_device_placement() is False
        # The default: soft placement.
        TrialController.for_trial_class(ConstantLossTrial, info, reporter)
        assert tf.config.get_soft_device_placement() is True
    finally:
        tf.config.set_soft_device_placement(True)


class FirstBatchSpy:
    """The real reporter, noting how many batches had ended (a user callback counts them)
    each time the runner reports a launch's first batch."""

    def __init__(self, inner, batch_ends: list):
        self._inner = inner
        self.batch_ends = batch_ends
        self.reported_after: list[int] = []

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def report_first_batch(self) -> None:
        self.reported_after.append(len(self.batch_ends))
        self._inner.report_first_batch()


class BatchCountingTrial(ConstantLossTrial):
    ENDS: list = []

    def keras_callbacks(self):
        ends = self.ENDS

        class Count(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                ends.append(batch)

        return [Count()]


def test_each_launch_records_when_its_first_batch_ended_once(tmp_path):
    import datetime

    from localdet.records import lifecycle
    from localdet.records.db import now
    from localdet.reporting.sqlite_reporter import SQLiteReporter

    db, trial_id, reporter, _ = start_trial(tmp_path, target=12, scheduling_unit=4)
    BatchCountingTrial.ENDS = ends = []
    # Launch 1, started (as the daemon records it) a minute ago; a pause ends it at 4 batches.
    a_minute_ago = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=1)
    db.update_trial(trial_id, state="RUNNING", started_at=a_minute_ago.isoformat(),
                    stop_requested=lifecycle.PAUSE)
    spy = FirstBatchSpy(reporter, ends)
    TrialController.for_trial_class(BatchCountingTrial, reporter.trial_info(), spy).run()
    assert db.trial(trial_id).batches_trained == 4
    # Launch 2: a fresh process (reporter) resumes from the checkpoint and trains 8 more.
    db.update_trial(trial_id, started_at=now(), stop_requested=None)
    second = FirstBatchSpy(SQLiteReporter(reporter.layout, trial_id), ends)
    TrialController.for_trial_class(BatchCountingTrial, second.trial_info(), second).run()
    assert db.trial(trial_id).batches_trained == 12 and len(ends) == 12

    # Reported once per launch, right after that launch's first batch, never again.
    assert (spy.reported_after, second.reported_after) == ([1], [5])
    recorded = [e["payload"]["seconds"] for e in db.events() if e["kind"] == "trial_first_batch"]
    assert len(recorded) == 2
    assert recorded[0] >= 60  # counted from the launch's start, not from the process's
    assert recorded[1] > 0
    # A second fit in the same process is no new launch: nothing more is recorded.
    second.report_first_batch()
    assert sum(e["kind"] == "trial_first_batch" for e in db.events()) == 2


def test_a_reporter_never_launched_records_no_first_batch(tmp_path):
    db, _, reporter, info = start_trial(tmp_path, target=2)  # no started_at: never launched
    TrialController.for_trial_class(ConstantLossTrial, info, reporter).run()
    assert not [e for e in db.events() if e["kind"] == "trial_first_batch"]
