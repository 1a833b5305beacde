"""Models Keras cannot save whole (a `keras.Model` subclass with its own `train_step` and
`test_step`, two wrapped optimizers and a `compile` of its own arguments: the GAN-like
tests/compat/subclassed_gan) checkpoint their weights, resume bit for bit, through a
TFKerasTrial and through `context.fit`, and load from the checkpoint's code."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import tensorflow as tf
from conftest import start_trial
from test_exact_resume import PausingReporter

import determined as det
from determined.keras import KerasContext, load_model_from_checkpoint_path
from determined.keras._load import CheckpointLoadError
from determined.keras._trial_controller import TrialController, prepare_process, saves_whole
from determined.keras._weights_file import (
    FORM,
    WEIGHTS_FILENAME,
    WeightsMismatch,
    ordered_weights,
    read_weights,
    write_weights,
)

GAN = Path(__file__).parent / "compat" / "subclassed_gan"
HPARAMS = {"global_batch_size": 32, "noise_dim": 3, "hidden": 16, "generator_lr": 0.01,
           "discriminator_lr": 0.005}
CONFIG = dict(scheduling_unit=5, min_validation_period={"batches": 5},
              records_per_epoch=512)
TARGET = 10

with det.import_from_path(GAN):
    import model_def as gan


@pytest.fixture(autouse=True)
def op_determinism():
    tf.config.experimental.enable_op_determinism()
    yield
    from tensorflow.python.framework import config as tf_config
    tf_config.disable_op_determinism()


def optimizer_values(optimizers) -> list:
    return [[np.asarray(v) for v in (o.variables() if callable(o.variables) else o.variables)]
            for o in optimizers]


def export_latest(reporter, trial_id: int, folder: Path) -> Path:
    from localdet.reporting.sqlite_reporter import CheckpointReader

    reader = CheckpointReader(reporter.layout)
    return reader.materialize(reader.resolve(trial_id=trial_id), folder)


class NoisyGan(gan.TinyGan):
    """Draws part of its noise inside train_step with tf.random.normal, as Determined's GAN
    example drew all of it."""

    def train_step(self, data):
        real, noise = data
        return super().train_step((real, noise + 0.1 * tf.random.normal(tf.shape(noise))))


def build_gan(context, optimizers=None):
    optimizers = optimizers or tf.keras.optimizers
    model = context.wrap_model(NoisyGan(noise_dim=HPARAMS["noise_dim"],
                                        hidden=HPARAMS["hidden"]))
    model.compile(
        generator_optimizer=context.wrap_optimizer(optimizers.Adam(HPARAMS["generator_lr"])),
        discriminator_optimizer=context.wrap_optimizer(
            optimizers.Adam(HPARAMS["discriminator_lr"])),
        loss_fn=tf.keras.losses.BinaryCrossentropy(from_logits=True))
    return model


class NoisyGanTrial(gan.GanTrial):
    def build_model(self):
        return build_gan(self.context)


class LegacyOptimizersGanTrial(gan.GanTrial):
    """With Keras 2's legacy optimizers, as Determined's GAN example built it."""

    def build_model(self):
        return build_gan(self.context, tf.keras.optimizers.legacy)


def train(folder: Path, pause_at=(), fit=False, trial_class=NoisyGanTrial) -> dict:
    """The GAN (drawing noise in its train_step) trained to TARGET batches, paused (and
    resumed in a fresh runner) as asked; through its TFKerasTrial or through `context.fit`
    in a script."""
    entrypoint = "python3 train.py" if fit else "model_def:GanTrial"
    db, trial_id, reporter, _ = start_trial(folder, TARGET, hparams=HPARAMS,
                                            entrypoint=entrypoint, **CONFIG)
    shutil.copytree(GAN, folder / "model", dirs_exist_ok=True)  # the checkpoint's code/
    pausing = PausingReporter(reporter, set(pause_at))
    launches = 0
    while db.trial(trial_id).batches_trained < TARGET:
        launches += 1
        model, optimizers = fit_script(pausing) if fit else run_trial(pausing, trial_class)
    assert launches == len(pause_at) + 1, "every requested pause happened"
    return {"weights": [np.asarray(w) for w in model.weights],
            "layer_weights": [np.asarray(w) for w in ordered_weights(model)[0]],
            "optimizers": optimizer_values(optimizers),
            "metrics": [(m.kind, m.batches_trained, m.metrics) for m in db.metrics(trial_id)],
            "export": export_latest(reporter, trial_id, folder / "export")}


def run_trial(reporter, trial_class):
    controller = TrialController.for_trial_class(trial_class, reporter.trial_info(), reporter)
    controller.run()
    return controller.model, controller._optimizers()


def fit_script(reporter):
    """The GAN as a New-Keras-API script would train it: built, compiled and fitted in the
    script (the trial class's parts, called by hand)."""
    info = reporter.trial_info()
    prepare_process(info)
    context = KerasContext(info, reporter)
    trial = NoisyGanTrial(context._trial_context)
    model = trial.build_model()
    context.fit(model, trial.build_training_data_loader(),
                validation_data=trial.build_validation_data_loader(), verbose=0)
    return model, [model.optimizer, model.generator_optimizer, model.discriminator_optimizer]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    return train(tmp_path_factory.mktemp("straight"))


def assert_same_run(a: dict, b: dict) -> None:
    for x, y in zip(a["weights"], b["weights"], strict=True):
        np.testing.assert_array_equal(x, y)
    # Every optimizer: the compiled one (unused) and the two wrapped ones, each built on its
    # own sub-model's variables.
    assert [len(o) for o in a["optimizers"]] == [len(o) for o in b["optimizers"]]
    for x, y in zip(sum(a["optimizers"], []), sum(b["optimizers"], []), strict=True):
        np.testing.assert_array_equal(x, y)
    assert a["metrics"] == b["metrics"]


@pytest.mark.keras2
def test_a_paused_trial_ends_bit_for_bit_like_an_uninterrupted_run_and_loads(straight,
                                                                              tmp_path, caplog):
    paused = train(tmp_path, pause_at=(5,))
    assert_same_run(straight, paused)
    # wrap_dataset(d).batch(n), as Determined's GAN wrote it, counts as wrapped.
    assert "not wrapped" not in caplog.text

    folder = paused["export"]
    metadata = json.loads((folder / "metadata.json").read_text())
    assert metadata["weights_file"] == WEIGHTS_FILENAME and metadata["weights_form"] == FORM
    assert not (folder / "determined-keras-model.h5").exists()

    model = load_model_from_checkpoint_path(str(folder))
    assert type(model).__name__ == "TinyGan"  # built by the compat trial class in code/
    # Its layers' weights, that is: tf_keras counts the metric trackers' states among a
    # model's weights too, and the trained model's were reset after the checkpoint.
    for x, y in zip(straight["layer_weights"], ordered_weights(model)[0], strict=True):
        np.testing.assert_array_equal(x, np.asarray(y))
    # Compiled with its own arguments: evaluate runs its test_step to the recorded metrics.
    real, noise = gan.make_data(seed=1, rows=128, noise_dim=HPARAMS["noise_dim"])
    results = model.evaluate(tf.data.Dataset.from_tensor_slices((real, noise)).batch(32),
                             verbose=0, return_dict=True)
    recorded = [m for kind, _, m in straight["metrics"] if kind == "validation"][-1]
    assert results["d_loss"] == pytest.approx(recorded["val_d_loss"], abs=1e-6)
    assert results["g_loss"] == pytest.approx(recorded["val_g_loss"], abs=1e-6)


@pytest.mark.keras2
def test_context_fit_of_a_subclassed_model_pauses_and_resumes_like_the_trial(straight,
                                                                            tmp_path):
    """The same model, data and seed through `context.fit`, paused once, ends where the
    uninterrupted TFKerasTrial ended. Its checkpoint has no trial class to build the model
    from, which loading says in one sentence."""
    fitted = train(tmp_path, pause_at=(5,), fit=True)
    assert_same_run(straight, fitted)
    with pytest.raises(CheckpointLoadError, match=r"^build the model in your code and read "
                                                  r"its weights with determined.keras.load_"
                                                  r"weights_from_checkpoint_path\(model, "):
        load_model_from_checkpoint_path(str(fitted["export"]))
    # What it says to do: the model built downstream, never called, gets the trained weights.
    model = NoisyGan(noise_dim=HPARAMS["noise_dim"], hidden=HPARAMS["hidden"])
    det.keras.load_weights_from_checkpoint_path(model, str(fitted["export"]))
    for a, b in zip(ordered_weights(model)[0], fitted["layer_weights"], strict=True):
        np.testing.assert_array_equal(np.asarray(a), b)


@pytest.mark.keras2
@pytest.mark.skipif(__import__("os").environ.get("TF_USE_LEGACY_KERAS") != "1",
                    reason="Keras 2's legacy optimizers (tests/test_keras_2_line.py runs it)")
def test_legacy_optimizers_resume_built_on_their_own_sub_models(tmp_path):
    straight = train(tmp_path / "straight", trial_class=LegacyOptimizersGanTrial)
    paused = train(tmp_path / "paused", pause_at=(5,), trial_class=LegacyOptimizersGanTrial)
    assert_same_run(straight, paused)
    assert all(len(o) > 4 for o in paused["optimizers"][1:]), "slots were saved and compared"


@pytest.mark.keras2
def test_unseeded_random_ops_in_a_tf_function_continue_from_the_checkpointed_generator():
    """A custom train_step drawing its noise with tf.random.normal (Determined's GAN): what
    a fresh tf.function draws after the generator's state is restored (a resumed process)
    is what the first function drew next. Seeded and eager calls are TensorFlow's own."""
    from determined.keras import _graph_random, _state

    def step():  # a new tf.function each time, as each process traces its own
        return tf.function(lambda: tf.concat([tf.random.normal([2]), tf.random.uniform([2]),
                                              tf.random.truncated_normal([2])], 0))

    _state.seed_tf_global_generator(5)
    _graph_random.install()
    uninterrupted = step()
    draws = [uninterrupted().numpy()]
    saved = _state._tf_global_generator().state.numpy()  # the checkpoint after one step
    draws += [uninterrupted().numpy() for _ in range(2)]
    resumed = step()
    _state.seed_tf_global_generator(5)
    _state._tf_global_generator().reset(saved)
    for expected in draws[1:]:
        np.testing.assert_array_equal(resumed().numpy(), expected)
    seeded = tf.function(lambda: tf.random.normal([2], seed=3))
    tf.random.set_seed(1)
    first = seeded().numpy()
    tf.random.set_seed(1)
    np.testing.assert_array_equal(tf.function(lambda: tf.random.normal([2], seed=3))(), first)


class Regressor(tf.keras.Model):
    """The commonest subclassed model: layers made in __init__, their weights on the first
    call, Keras's own train_step and compile."""

    def __init__(self):
        super().__init__()
        self.hidden = tf.keras.layers.Dense(8, activation="tanh")
        self.out = tf.keras.layers.Dense(1)

    def call(self, inputs, training=None):
        return self.out(self.hidden(inputs))


class RegressorTrial(det.keras.TFKerasTrial):
    def __init__(self, context):
        self.context = context
        rng = np.random.default_rng(0)
        self.x = rng.normal(size=(64, 3)).astype("float32")
        self.y = self.x.sum(axis=1, keepdims=True)

    def build_model(self):
        model = self.context.wrap_model(Regressor())
        model.compile(optimizer=self.context.wrap_optimizer(tf.keras.optimizers.Adam(0.01)),
                      loss="mse")
        return model

    def build_training_data_loader(self):
        return self.x, self.y

    def build_validation_data_loader(self):
        return self.x[:16], self.y[:16]


@pytest.mark.keras2
def test_a_model_built_on_its_first_call_resumes_from_the_shapes_keras_recorded(tmp_path):
    straight = train(tmp_path / "straight", trial_class=RegressorTrial)
    paused = train(tmp_path / "paused", pause_at=(5,), trial_class=RegressorTrial)
    assert_same_run(straight, paused)
    with h5py.File(paused["export"] / WEIGHTS_FILENAME, "r") as h5:
        assert json.loads(h5.attrs["build_config"])["input_shape"][1:] == [3]


@pytest.mark.keras2
def test_an_optimizer_resumes_built_on_layers_frozen_since():
    """A fine-tuning callback froze a layer after the optimizer was built on it: the state
    goes back onto the same variables of a fresh model."""
    from determined.keras import _state

    def make():
        tf.keras.utils.set_random_seed(0)
        model = tf.keras.Sequential([tf.keras.Input(shape=(3,)), tf.keras.layers.Dense(4),
                                     tf.keras.layers.Dense(1)])
        return model, tf.keras.optimizers.Adam(0.1)

    model, optimizer = make()
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(tf.ones((2, 3))))
    variables = model.trainable_variables
    optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))
    model.layers[0].trainable = False
    saved = _state.capture(model, [optimizer])
    fresh, fresh_optimizer = make()
    _state.restore(saved, fresh, [fresh_optimizer])
    assert saved["optimizers"][0]["targets"] == [0, 1, 2, 3]
    for x, y in zip(optimizer_values([optimizer])[0], optimizer_values([fresh_optimizer])[0],
                    strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.keras2
def test_which_models_are_saved_whole():
    inputs = tf.keras.Input(shape=(3,))
    functional = tf.keras.Model(inputs, tf.keras.layers.Dense(2)(inputs))
    sequential = tf.keras.Sequential([tf.keras.Input(shape=(3,)), tf.keras.layers.Dense(2)])
    assert saves_whole(functional) and saves_whole(sequential)
    assert not saves_whole(gan.TinyGan(noise_dim=3, hidden=4))


@pytest.mark.keras2
def test_weights_that_do_not_fit_are_refused_in_one_sentence(tmp_path):
    path = tmp_path / WEIGHTS_FILENAME
    write_weights(gan.TinyGan(noise_dim=3, hidden=4), path)
    with h5py.File(path, "r") as h5:
        names = [h5["layers"][str(i)].attrs["name"] for i in range(h5["layers"].attrs["count"])]
    # The model's own weight first, then each sub-model's layers in order.
    assert names == ["steps_trained"] + ["kernel", "bias"] * 4
    with pytest.raises(WeightsMismatch, match=r"^layer weights number 1 is 'kernel' \(3, 4\) "
                                              r"in the checkpoint but .*\(3, 8\) in the model"):
        read_weights(gan.TinyGan(noise_dim=3, hidden=8), path)


LOAD_UNDER_KERAS_2 = """
import json, sys
import h5py, numpy as np, tensorflow as tf
import determined as det
from determined.keras import load_model_from_checkpoint_path
from determined.keras._weights_file import ordered_weights
folder, gan_folder = sys.argv[1], sys.argv[2]
model = load_model_from_checkpoint_path(folder)
with h5py.File(folder + "/localdet-keras-weights.h5", "r") as h5:
    saved = [np.asarray(h5["layers"][str(i)]) for i in range(h5["layers"].attrs["count"])]
equal = all(np.array_equal(a, np.asarray(b))
            for a, b in zip(saved, ordered_weights(model)[0], strict=True))
with det.import_from_path(gan_folder):
    from model_def import make_data
real, noise = make_data(seed=1, rows=128, noise_dim=3)
results = model.evaluate(tf.data.Dataset.from_tensor_slices((real, noise)).batch(32),
                         verbose=0, return_dict=True)
print(json.dumps({"line": tf.keras.__name__, "equal": equal,
                  "results": {k: float(v) for k, v in results.items()}}))
"""


@pytest.mark.slow
@pytest.mark.skipif(__import__("os").environ.get("TF_USE_LEGACY_KERAS") == "1",
                    reason="already running under Keras 2")
def test_a_keras_3_checkpoint_of_a_subclassed_model_loads_under_keras_2(straight):
    import os
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", LOAD_UNDER_KERAS_2, str(straight["export"]), str(GAN)],
        env={**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"},
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["line"].startswith("tf_keras") and found["equal"], found
    recorded = [m for kind, _, m in straight["metrics"] if kind == "validation"][-1]
    assert found["results"]["d_loss"] == pytest.approx(recorded["val_d_loss"], abs=1e-5)
    assert found["results"]["g_loss"] == pytest.approx(recorded["val_g_loss"], abs=1e-5)


# -- end to end: the compat folder under a daemon, paused and resumed through the CLI --------
E2E_LENGTH = 3000  # long enough that a pause asked after 40 batches lands well before the end


@pytest.mark.slow
def test_the_compat_gan_pauses_resumes_and_loads_under_a_daemon(home, tmp_path, daemons):
    import yaml
    from conftest import wait_for

    raw = yaml.safe_load((GAN / "const.yaml").read_text())
    raw["searcher"]["max_length"] = {"batches": E2E_LENGTH}
    # Trained under Keras 2, loaded below in this Keras 3 process.
    raw["environment"] = {"environment_variables": ["TF_USE_LEGACY_KERAS=1"]}
    raw.update(scheduling_unit=20, min_validation_period={"batches": 1000},
               min_checkpoint_period={"batches": 1000})
    config = tmp_path / "gan.yaml"
    config.write_text(yaml.safe_dump(raw))
    daemon = daemons(home)
    home.cli("submit", config, GAN)
    experiment_id = home.experiment_named(raw["name"])["id"]
    wait_for(lambda: home.first_trial(experiment_id).get("batches_trained", 0) >= 40, 180,
             "the trial to train a while", 0.1)
    home.cli("pause", experiment_id)
    wait_for(lambda: home.first_trial(experiment_id)["state"] == "PAUSED", 120, "the pause", 0.1)
    stopped_at = home.first_trial(experiment_id)["batches_trained"]
    assert 40 <= stopped_at < E2E_LENGTH
    home.cli("resume", experiment_id)
    facts = home.wait_until_ended(experiment_id, timeout=300)
    daemon.stop()
    trial = facts["trials"][0]
    assert facts["state"] == "COMPLETED" and trial["batches_trained"] == E2E_LENGTH, facts
    assert "restored checkpoint" in home.cli("logs", trial["id"]).stdout

    last = home.json("checkpoints", experiment_id)[-1]
    folder = tmp_path / "export"
    home.cli("checkpoint", "export", last["uuid"], folder)
    metadata = json.loads((folder / "metadata.json").read_text())
    assert metadata["weights_form"] == FORM and metadata["keras_line"] == "keras2"
    assert trial["keras_line"] == "keras2"
    # Loaded here, under Keras 3: the layers' weights of the file.
    model = load_model_from_checkpoint_path(str(folder))
    with h5py.File(folder / WEIGHTS_FILENAME, "r") as h5:
        saved = [np.asarray(h5["layers"][str(i)]) for i in range(h5["layers"].attrs["count"])]
    for x, y in zip(saved, ordered_weights(model)[0], strict=True):
        np.testing.assert_array_equal(x, np.asarray(y))
    real, noise = gan.make_data(seed=1, rows=128, noise_dim=raw["hyperparameters"]["noise_dim"])
    results = model.evaluate(tf.data.Dataset.from_tensor_slices((real, noise)).batch(32),
                             verbose=0, return_dict=True)
    recorded = trial["latest_validation"]
    assert results["d_loss"] == pytest.approx(recorded["val_d_loss"], abs=1e-5)
    assert results["g_loss"] == pytest.approx(recorded["val_g_loss"], abs=1e-5)
