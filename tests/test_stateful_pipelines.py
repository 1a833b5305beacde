"""tf.data pipelines whose iterator TensorFlow cannot save (a stateful op: Keras's random
augmentation layers, `tf.random.*` in a `map`, `tf.py_function`, `from_generator`) train,
pause and resume in the three forms a Determined user writes: a `TFKerasTrial`, a
`context.fit` script and a plain `fit` with `DeterminedCallback`. They resume by position
(the pipeline rebuilt and read up to where training stopped), so the resumed run records
the batches, metrics and checkpoints an uninterrupted one does; a deterministic pipeline
ends bit for bit like it. Data of unknown length (`from_generator`) trains `context.fit`'s
epochs, each ending where the data does. Run in this process (Keras 3) and again under
Keras 2; two slots are in test_multi_slot_e2e."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from conftest import start_trial
from test_core_api import _Recorder
from test_exact_resume import BIT_FOR_BIT, DropoutTrial, PausingReporter, _digits, op_determinism
from test_exact_resume import run as run_trial

from determined.keras import DeterminedCallback, KerasContext
from determined.keras._trial_controller import prepare_process

__all__ = ["op_determinism"]  # the fixture, used here too


def augmented(x, y):
    """Keras's augmentation idiom: preprocessing layers mapped over the batches."""
    augment = tf.keras.Sequential([tf.keras.layers.RandomFlip("horizontal"),
                                   tf.keras.layers.RandomTranslation(0.1, 0.1)])
    images = tf.data.Dataset.from_tensor_slices((x.reshape(-1, 8, 8, 1), y))
    return images.shuffle(len(x), seed=3).batch(16).map(
        lambda a, b: (tf.reshape(augment(a, training=True), (-1, 64)), b))


def noised(x, y):
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(16).map(
        lambda a, b: (a + tf.random.uniform(tf.shape(a), 0.0, 0.1), b))


def py_function(x, y):
    def halve(a):
        return (a.numpy() * 0.5).astype("float32")

    def map_batch(a, b):
        halved = tf.py_function(halve, [a], tf.float32)
        halved.set_shape(a.shape)
        return halved, b

    return tf.data.Dataset.from_tensor_slices((x, y)).batch(16).map(map_batch)


def generated(x, y, keep=lambda i: True):
    def rows():
        for i in range(len(x)):
            if keep(i):
                yield x[i], y[i]

    signature = (tf.TensorSpec((x.shape[1],), tf.float32), tf.TensorSpec((), tf.int32))
    return tf.data.Dataset.from_generator(rows, output_signature=signature).batch(16)


PIPELINES = {"augmented": augmented, "noised": noised, "py_function": py_function,
             "generated": generated}
# The op TensorFlow names for each, as the trial log repeats it.
KERAS_2 = tf.keras.__name__.startswith("tf_keras")
STATEFUL_OPS = {"augmented": "RngReadAndSkip" if KERAS_2 else "ReadVariableOp",
                "noised": "RngReadAndSkip", "py_function": "EagerPyFunc", "generated": "PyFunc"}
# Pipelines that draw no random numbers resume bit for bit, even by position.
DETERMINISTIC = ("py_function", "generated")


def _same(a: list, b: list) -> bool:
    return all(np.array_equal(p, q) for p, q in zip(a, b, strict=True))


def _rows(metrics: list) -> list:
    return [(kind, batches) for kind, batches, _ in metrics]


# -- TFKerasTrial ------------------------------------------------------------------------------
def trial_class(pipeline: str) -> type:
    class PipelineTrial(DropoutTrial):
        def build_training_data_loader(self):
            return self.context.wrap_dataset(PIPELINES[pipeline](*_digits()))

    return PipelineTrial


# Under Keras 2 too: the form Keras 2 users write (TFKerasTrial) over Keras 2's augmentation
# layers (their generator's RngReadAndSkip) and a generator.
@pytest.mark.parametrize("pipeline", [
    pytest.param(name, marks=pytest.mark.keras2) if name in ("augmented", "generated") else name
    for name in PIPELINES])
def test_a_trial_over_a_stateful_pipeline_pauses_and_resumes(pipeline, tmp_path, capsys):
    trial = trial_class(pipeline)
    _, straight, straight_metrics = run_trial(trial, tmp_path / "straight", target=40,
                                              **BIT_FOR_BIT)
    capsys.readouterr()
    controller, paused, paused_metrics = run_trial(trial, tmp_path / "paused", target=40,
                                                   pause_at=(7, 28), **BIT_FOR_BIT)
    log = capsys.readouterr().out
    # Said once, at the first checkpoint, naming the op; each resume says how it resumes.
    notes = re.findall(r"note: the training data's tf.data pipeline holds a stateful op "
                       r"\((\w+)", log)
    assert notes == [STATEFUL_OPS[pipeline]]
    assert log.count("the training data resumes by position") == 2
    assert controller.batches_trained == 40
    assert _rows(paused_metrics) == _rows(straight_metrics)
    db = controller.reporter.db
    assert [c.batches_trained for c in db.checkpoints(trial_id=controller.info.trial_id)] == \
        [7, 28, 40]
    assert all(np.isfinite(m["loss"]) for kind, _, m in paused_metrics if kind == "training")
    if pipeline in DETERMINISTIC:
        assert _same(straight, paused)
        assert paused_metrics == straight_metrics


def test_a_saveable_pipeline_still_resumes_from_its_saved_iterator(tmp_path, capsys):
    class PlainTrial(DropoutTrial):
        def build_training_data_loader(self):
            x, y = _digits()
            dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(400, seed=5)
            return self.context.wrap_dataset(dataset.batch(16))

    controller, _, _ = run_trial(PlainTrial, tmp_path, target=20, pause_at=(7,),
                                 **BIT_FOR_BIT)
    log = capsys.readouterr().out
    assert "stateful op" not in log and "resumes by position" not in log
    first = controller.reporter.db.checkpoints(trial_id=controller.info.trial_id)[0]
    assert any(name.startswith("data_iterator/") for name in first.manifest["files"])


# -- context.fit -------------------------------------------------------------------------------
def _fit_model(context: KerasContext) -> tf.keras.Model:
    model = tf.keras.Sequential([tf.keras.Input(shape=(64,)),
                                 tf.keras.layers.Dense(16, activation="relu"),
                                 tf.keras.layers.Dropout(0.3),
                                 tf.keras.layers.Dense(10, activation="softmax")])
    model.compile(optimizer=context.wrap_optimizer(tf.keras.optimizers.Adam(0.01)),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def fit_script(folder: Path, pipeline: str, pause_at=(), **fit_args):
    """What a context.fit script does, launched again after each pause; the searcher gives
    no length, so the script's epochs are the trial's. Returns (weights, metric rows,
    each launch's History epochs, the trial's record)."""
    db, trial_id, reporter, _ = start_trial(folder, 1, scheduling_unit=4)
    db.update_trial(trial_id, target_batches=0)  # what a config without max_length gives
    pausing = PausingReporter(reporter, set(pause_at))
    x, y = _digits()
    epochs = []
    for _ in range(len(pause_at) + 1):
        info = reporter.trial_info()
        prepare_process(info)
        context = KerasContext(info, pausing)
        model = _fit_model(context)
        history = context.fit(model, context.wrap_data(PIPELINES[pipeline](x[:200], y[:200])),
                              validation_data=(x[200:], y[200:]), verbose=0, **fit_args)
        epochs.append(history.epoch)
    trial = db.trial(trial_id)
    metrics = [(m.kind, m.batches_trained, m.metrics) for m in db.metrics(trial_id)]
    return [w.numpy() for w in model.weights], metrics, epochs, trial


@pytest.mark.parametrize("pipeline", list(PIPELINES))
def test_a_fit_over_a_stateful_pipeline_pauses_and_resumes(pipeline, tmp_path):
    # 200 rows in batches of 16: 13 batches a pass, the last one short.
    straight, straight_metrics, _, done = fit_script(tmp_path / "a", pipeline, epochs=3)
    assert done.batches_trained == done.target_batches == 39
    paused, paused_metrics, epochs, trial = fit_script(tmp_path / "b", pipeline,
                                                       pause_at=(4, 20), epochs=3)
    assert trial.batches_trained == trial.target_batches == 39
    assert _rows(paused_metrics) == _rows(straight_metrics)
    assert [e for launch in epochs for e in launch][-1] == 2  # the last launch ends epoch 3
    if pipeline in DETERMINISTIC:
        assert _same(straight, paused)
        assert paused_metrics == straight_metrics


@pytest.mark.keras2
def test_fit_over_data_of_unknown_length_ends_each_epoch_where_the_data_does(tmp_path):
    """A generator that leaves out every 5th of 200 rows (160 rows, 10 batches a pass): 3
    epochs are 30 batches, validated at each epoch's end; paused mid-epoch and at an
    epoch's last batch, it ends as a straight run does."""
    def kept(i):
        return i % 5 != 0

    PIPELINES["filtered"] = lambda x, y: generated(x, y, kept)
    try:
        straight, straight_metrics, epochs, done = fit_script(tmp_path / "a", "filtered",
                                                              epochs=3)
        paused, paused_metrics, _, trial = fit_script(tmp_path / "b", "filtered",
                                                      pause_at=(4, 8, 20), epochs=3)
    finally:
        del PIPELINES["filtered"]
    assert epochs == [[0, 1, 2]]
    assert done.target_batches == trial.target_batches == trial.batches_trained == 30
    assert [b for kind, b, _ in straight_metrics if kind == "validation"] == [10, 20, 30]
    assert _same(straight, paused)
    assert paused_metrics == straight_metrics


def test_fit_with_steps_per_epoch_over_a_generator_checkpoints(tmp_path):
    """The generator's passes are endless data here: steps_per_epoch batches an epoch, a
    pass continuing into the next epoch, as Keras does over a repeated dataset."""
    x, y = _digits()

    def endless(x, y):
        return generated(x, y).repeat()

    PIPELINES["endless"] = endless
    try:
        straight, _, _, done = fit_script(tmp_path / "a", "endless", epochs=2,
                                          steps_per_epoch=9)
        paused, _, _, trial = fit_script(tmp_path / "b", "endless", pause_at=(4,), epochs=2,
                                         steps_per_epoch=9)
    finally:
        del PIPELINES["endless"]
    assert done.batches_trained == trial.batches_trained == 18
    assert _same(straight, paused)


# -- DeterminedCallback ------------------------------------------------------------------------
def callback_fit(folder: Path, pipeline: str, epochs: int, checkpoint=None,
                 preempt_after_epochs=None):
    """A plain model.fit under DeterminedCallback (Determined's Core API form); returns the
    recorded events and the final weights."""
    core = _Recorder(folder)
    core.preempt_after_epochs = preempt_after_epochs
    tf.keras.utils.set_random_seed(7)
    model = tf.keras.Sequential([tf.keras.Input(shape=(64,)),
                                 tf.keras.layers.Dense(16, activation="relu"),
                                 tf.keras.layers.Dense(10, activation="softmax")])
    model.compile(optimizer=tf.keras.optimizers.Adam(0.01),
                  loss="sparse_categorical_crossentropy")
    x, y = _digits()
    model.fit(PIPELINES[pipeline](x[:160], y[:160]), epochs=epochs, verbose=0,
              callbacks=[DeterminedCallback(core, checkpoint=checkpoint, continue_id=1)])
    return core.events, [w.numpy() for w in model.weights]


@pytest.mark.parametrize("pipeline", list(PIPELINES))
def test_a_determined_callback_fit_over_a_stateful_pipeline_resumes(pipeline, tmp_path):
    callback_fit(tmp_path, pipeline, epochs=2, preempt_after_epochs=1)
    saved = [path.parent.name for path in tmp_path.glob("*/metadata.json")]
    assert len(saved) == 1  # preempted after epoch 1, checkpointed there
    events, resumed = callback_fit(tmp_path, pipeline, epochs=2, checkpoint=saved[0])
    assert [v[0] for kind, v in events if kind == "training"] == [20]  # epoch 2 only
    if pipeline in DETERMINISTIC:  # the straight run, only where it must be matched
        _, straight = callback_fit(tmp_path / "straight", pipeline, epochs=2)
        assert _same(straight, resumed)

