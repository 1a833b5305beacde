"""Models saved whole whose `.h5` Keras cannot write keep their weights alone: a Functional
model with an adapted `TextVectorization` (tf_keras refuses its vocabulary; Keras 3 writes
the file without it) and one whose layer has two weights of one name (tf_keras's writer
cannot hold them). Each trains, pauses and resumes bit for bit, its vocabulary the adapted
one, and loads downstream; under both Keras lines, and from Keras 2 into Keras 3."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from conftest import start_trial
from test_exact_resume import PausingReporter

import determined as det
from determined.keras import load_model_from_checkpoint_path
from determined.keras._trial_controller import TrialController
from determined.keras._weights_file import FORM, WEIGHTS_FILENAME, lookup_layers

# The trial's module, written into the experiment's model folder: a checkpoint's code/.
MODEL_DEF = '''
import os

import numpy as np
import tensorflow as tf

from determined import keras

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()


def sentences(seed, count=48):
    rng = np.random.default_rng(seed)
    texts = [" ".join(rng.choice(WORDS, size=int(rng.integers(2, 7)))) for _ in range(count)]
    labels = np.array([float("alpha" in t or "kappa" in t) for t in texts], dtype="float32")
    return np.array(texts).reshape(-1, 1), labels


def adapt_texts():
    # Set by the tests after a pause: the vocabulary a rebuilt model adapts is then another,
    # and only the checkpoint brings the trained one back.
    if os.environ.get("H5_FALLBACKS_OTHER_VOCABULARY"):
        return np.array(["unrelated words only", "nothing else"])
    return sentences(seed=1, count=64)[0].ravel()


class VocabularyTrial(keras.TFKerasTrial):
    def build_model(self):
        vectorize = tf.keras.layers.TextVectorization(max_tokens=9, output_sequence_length=5)
        vectorize.adapt(adapt_texts())
        inputs = tf.keras.Input(shape=(1,), dtype="string")
        x = tf.keras.layers.Embedding(9, 4)(vectorize(inputs))
        x = tf.keras.layers.Dropout(0.2)(x)
        x = tf.keras.layers.GlobalAveragePooling1D()(x)
        model = self.context.wrap_model(tf.keras.Model(
            inputs, tf.keras.layers.Dense(1, activation="sigmoid")(x)))
        model.compile(optimizer=self.context.wrap_optimizer(tf.keras.optimizers.Adam(0.05)),
                      loss="binary_crossentropy", metrics=["accuracy"])
        return model

    def build_training_data_loader(self):
        return self.context.wrap_dataset(
            tf.data.Dataset.from_tensor_slices(sentences(seed=2)).batch(4))

    def build_validation_data_loader(self):
        return self.context.wrap_dataset(
            tf.data.Dataset.from_tensor_slices(sentences(seed=3, count=16)).batch(8))


class TwoOfOneName(tf.keras.layers.Layer):
    def build(self, input_shape):
        units = int(input_shape[-1])
        self.scale = self.add_weight(name="w", shape=(units,), initializer="ones")
        self.shift = self.add_weight(name="w", shape=(units,), initializer="zeros")

    def call(self, x):
        return x * self.scale + self.shift


def numbers(seed, count=48):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(count, 6)).astype("float32")
    return x, (x.sum(axis=1) > 0).astype("float32")


class SameNameTrial(keras.TFKerasTrial):
    def build_model(self):
        inputs = tf.keras.Input(shape=(6,))
        x = TwoOfOneName()(tf.keras.layers.Dense(6, activation="relu")(inputs))
        x = tf.keras.layers.Dropout(0.2)(x)
        model = self.context.wrap_model(tf.keras.Model(
            inputs, tf.keras.layers.Dense(1, activation="sigmoid")(x)))
        model.compile(optimizer=self.context.wrap_optimizer(tf.keras.optimizers.Adam(0.05)),
                      loss="binary_crossentropy", metrics=["accuracy"])
        return model

    def build_training_data_loader(self):
        return self.context.wrap_dataset(
            tf.data.Dataset.from_tensor_slices(numbers(seed=2)).batch(4))

    def build_validation_data_loader(self):
        return self.context.wrap_dataset(
            tf.data.Dataset.from_tensor_slices(numbers(seed=3, count=16)).batch(8))
'''

CONFIG = dict(scheduling_unit=3, min_validation_period={"batches": 6},
              min_checkpoint_period={"batches": 6}, records_per_epoch=48,
              hyperparameters={"global_batch_size": 4})
TARGET, PAUSE_AT = 15, 9  # 12 batches a pass: the pause lands mid-pass, resume crosses a pass
KERAS_2 = os.environ.get("TF_USE_LEGACY_KERAS") == "1"
OTHER_VOCABULARY = "H5_FALLBACKS_OTHER_VOCABULARY"
KEEP = "H5_FALLBACKS_KEEP"  # a folder the Keras 2 run leaves its checkpoints in, for Keras 3


@pytest.fixture(autouse=True)
def op_determinism(monkeypatch):
    monkeypatch.delenv(OTHER_VOCABULARY, raising=False)
    tf.config.experimental.enable_op_determinism()
    yield
    from tensorflow.python.framework import config as tf_config
    tf_config.disable_op_determinism()


def train(tmp_path: Path, class_name: str, pause_at=(), after_pause=lambda: None) -> dict:
    """The trial of `MODEL_DEF` run to TARGET, paused and resumed in a fresh controller as
    asked; its final weights, metrics and latest checkpoint exported."""
    db, trial_id, reporter, _ = start_trial(tmp_path, TARGET, entrypoint=f"model_def:{class_name}",
                                            **CONFIG)
    (tmp_path / "model" / "model_def.py").write_text(MODEL_DEF)
    with det.import_from_path(tmp_path / "model"):
        import model_def
    pausing = PausingReporter(reporter, pause_at)
    segments = 0
    while True:
        segments += 1
        controller = TrialController.for_trial_class(getattr(model_def, class_name),
                                                     reporter.trial_info(), pausing)
        controller.run()
        if not controller.paused:
            break
        after_pause()
    assert segments == len(pause_at) + 1, "every requested pause happened"
    from localdet.reporting.sqlite_reporter import CheckpointReader

    reader = CheckpointReader(reporter.layout)
    export = reader.materialize(reader.resolve(trial_id=trial_id), tmp_path / "export")
    return {"model": controller.model, "module": model_def, "export": export,
            "weights": [np.asarray(w) for w in controller.model.weights
                        if hasattr(w, "assign")],
            "metrics": [(m.kind, m.batches_trained, m.metrics) for m in db.metrics(trial_id)]}


def vocabulary(model) -> list:
    return [[str(t) for t in layer.get_vocabulary()] for layer, _ in lookup_layers(model)]


def predictions(model, inputs) -> np.ndarray:
    return np.asarray(model(tf.constant(inputs), training=False))


def check_resumed_and_loaded(tmp_path, capsys, monkeypatch, class_name, inputs, reason):
    straight = train(tmp_path / "straight", class_name)
    capsys.readouterr()
    paused = train(tmp_path / "paused", class_name, pause_at=(PAUSE_AT,),
                   after_pause=lambda: monkeypatch.setenv(OTHER_VOCABULARY, "1"))
    notes = [line for line in capsys.readouterr().out.splitlines()
             if f"keep this model's weights alone ({WEIGHTS_FILENAME})" in line]
    for a, b in zip(straight["weights"], paused["weights"], strict=True):
        np.testing.assert_array_equal(a, b)
    assert paused["metrics"] == straight["metrics"]
    assert vocabulary(paused["model"]) == vocabulary(straight["model"])
    metadata = json.loads((paused["export"] / "metadata.json").read_text())
    if reason is not None:
        assert metadata["weights_form"] == FORM
        assert len(notes) == 1 and reason in notes[0], notes  # said once, at the first
    # Downstream, built by the trial class (adapting the other vocabulary, if it adapts).
    monkeypatch.setenv(OTHER_VOCABULARY, "1")
    loaded = load_model_from_checkpoint_path(str(paused["export"]))
    assert vocabulary(loaded) == vocabulary(straight["model"])
    np.testing.assert_array_equal(predictions(loaded, inputs),
                                  predictions(paused["model"], inputs))
    if os.environ.get(KEEP):  # for the Keras 3 process to load
        kept = Path(os.environ[KEEP]) / class_name
        shutil.copytree(paused["export"], kept / "checkpoint")
        np.save(kept / "inputs.npy", inputs)
        np.save(kept / "predictions.npy", predictions(paused["model"], inputs))
        (kept / "vocabulary.json").write_text(json.dumps(vocabulary(paused["model"])))


def test_an_adapted_vocabulary_resumes_bit_for_bit_and_loads(tmp_path, capsys, monkeypatch):
    texts = np.array([["alpha beta"], ["gamma delta kappa"], ["words never seen"]])
    check_resumed_and_loaded(tmp_path, capsys, monkeypatch, "VocabularyTrial", texts,
                             "vocabulary of the TextVectorization layer")


def test_two_weights_of_one_name_checkpoint_resume_and_load(tmp_path, capsys, monkeypatch):
    inputs = np.random.default_rng(7).normal(size=(5, 6)).astype("float32")
    # tf_keras's .h5 writer cannot hold them; Keras 3's writes them (by position).
    check_resumed_and_loaded(tmp_path, capsys, monkeypatch, "SameNameTrial", inputs,
                             "two weights of one layer share a name" if KERAS_2 else None)


@pytest.mark.slow
@pytest.mark.skipif(KERAS_2, reason="already running under Keras 2")
def test_under_keras_2_and_its_checkpoints_load_under_keras_3(tmp_path, monkeypatch):
    """The tests above under Keras 2 (tf_keras), which needs a process of its own; the
    checkpoints it leaves load here, under Keras 3, predicting what they did there."""
    kept = tmp_path / "kept"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", __file__,
         "-m", "not slow", "--basetemp", str(tmp_path / "keras2")],
        env={**os.environ, "TF_USE_LEGACY_KERAS": "1", KEEP: str(kept)},
        capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    monkeypatch.setenv(OTHER_VOCABULARY, "1")
    for class_name in ("VocabularyTrial", "SameNameTrial"):
        folder = kept / class_name
        model = load_model_from_checkpoint_path(str(folder / "checkpoint"))
        assert vocabulary(model) == json.loads((folder / "vocabulary.json").read_text())
        np.testing.assert_allclose(predictions(model, np.load(folder / "inputs.npy")),
                                   np.load(folder / "predictions.npy"), rtol=1e-5, atol=1e-6)
