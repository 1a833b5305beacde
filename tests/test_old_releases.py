"""Code written for TensorFlow 2.2 to 2.15 and NumPy 1.x runs, with one warning per bridge
(harness/determined/_old_releases.py, docs/old-releases.md)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import write_config

from determined import _old_releases
from localdet.paths import Layout
from localdet.records.db import StateDB

REPO = Path(__file__).resolve().parents[1]
IMAGE_23 = "determinedai/environments:py-3.7-cuda-10.2-pytorch-1.7-tf-2.3-gpu-0.19.4"
IMAGE_24 = "determinedai/environments:py-3.8-cuda-10.2-pytorch-1.7-tf-2.4-gpu-0.19.4"
IMAGE_28 = "determinedai/environments:cuda-11.3-pytorch-1.10-tf-2.8-gpu-0.19.10"

# A TFKerasTrial as written for TensorFlow 2.3 and NumPy 1.x: NumPy's old aliases (one at
# import), Adam(lr=, decay=), and a model built for 8x8x1 images fed flat rows of 64.
OLD_TRIAL = '''
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

from determined import keras

LABELS = np.int


class OldTrial(keras.TFKerasTrial):
    def __init__(self, context):
        self.context = context
        x, y = load_digits(return_X_y=True)
        self.x = (x[:256] / 16.0).astype(np.float32)
        self.y = y[:256].astype(LABELS)
        assert np.asscalar(np.array([np.float(self.x.shape[1])])) == 64.0

    def build_model(self):
        model = tf.keras.Sequential([
            tf.keras.layers.Flatten(input_shape=(8, 8, 1)),
            tf.keras.layers.Dense(16, activation="relu"),
            tf.keras.layers.Dense(10, activation="softmax"),
        ])
        model = self.context.wrap_model(model)
        optimizer = self.context.wrap_optimizer(tf.keras.optimizers.Adam(lr=0.01, decay=1e-3))
        model.compile(optimizer, "sparse_categorical_crossentropy", metrics=["accuracy"])
        return model

    def build_training_data_loader(self):
        return self.x[:192], self.y[:192]

    def build_validation_data_loader(self):
        return self.x[192:], self.y[192:]
'''

# A context.fit script of the same era, under Keras 3.
OLD_SCRIPT = '''
import numpy as np
from sklearn.datasets import load_digits
from tensorflow import keras

import determined as det
import determined.keras

context = det.keras.init()
x, y = load_digits(return_X_y=True)
x, y = (x[:256] / 16.0).astype(np.float32), y[:256].astype(np.int)
assert np.isnan(np.NaN) and np.product([2, 3]) == 6
model = keras.Sequential([keras.Input(shape=(64,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(10, activation="softmax")])
optimizer = context.wrap_optimizer(keras.optimizers.Adam(lr=0.01, decay=1e-3))
model.compile(optimizer, "sparse_categorical_crossentropy", metrics=["accuracy"])
context.fit(model, x[:192], y[:192], batch_size=32, epochs=2, validation_data=(x[192:], y[192:]))
'''

TRIAL_WARNINGS = ("np.int was removed in NumPy 1.24", "np.float was removed in NumPy 1.24",
                  "np.asscalar was removed in NumPy 1.23",
                  "Adam(lr=...) is the learning_rate of optimizers up to TensorFlow 2.10",
                  "Adam(decay=...) was removed in TensorFlow 2.11",
                  "TensorFlow 2.3 and before ran such a model with a warning")
SCRIPT_WARNINGS = ("np.int was removed in NumPy 1.24", "np.NaN was removed in NumPy 2.0",
                   "np.product was removed in NumPy 2.0",
                   "Adam(lr=...) is the learning_rate of optimizers up to TensorFlow 2.10",
                   "Adam(decay=...) was removed in TensorFlow 2.11")


def model_folder(tmp_path: Path, name: str, code: str, filename: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / filename).write_text(textwrap.dedent(code))
    return folder


def run(home, tmp_path: Path, name: str, folder: Path, image: str, **config):
    """`localdet run` of the folder; (experiment, its one trial, the trial's log)."""
    path = write_config(tmp_path, name, environment={"image": image}, **config)
    result = home.cli("run", path, folder, check=False)
    db = StateDB.open(home.path / "localdet.db")
    experiment = [e for e in db.experiments() if e.name == name][0]
    [trial] = db.trials(experiment.id)
    log = Layout(home.path).trial_log(experiment.id, trial.id).read_text()
    return result, experiment, trial, log


def warned_once(log: str, what: str) -> bool:
    return sum(what in line for line in log.splitlines()
               if line.startswith("[localdet] warning: ")) == 1


# -- which release the code was written for -----------------------------------------------

@pytest.mark.parametrize("image, release", [
    (IMAGE_24, (2, 4)),
    ({"cpu": "determinedai/environments:py-3.8-pytorch-1.12-tf-2.11-cpu-0.21.2",
      "cuda": "determinedai/environments:cuda-11.3-pytorch-1.12-tf-2.8-gpu-0.21.2"}, (2, 8)),
    ("determinedai/environments:py-3.8-pytorch-1.12-cpu-0.21.2", None),
    ("nvcr.io/nvidia/tensorflow:23.03-tf2-py3", None),
])
def test_the_release_an_image_names(image, release):
    assert _old_releases.release_of_image(image) == release


def test_the_image_is_kept_in_the_parsed_config_for_the_release_it_names():
    from localdet.config.experiment import parse_config

    parsed = parse_config({"entrypoint": "model_def:T", "searcher": {
        "name": "single", "metric": "loss", "max_length": {"batches": 1}},
        "environment": {"image": {"cpu": IMAGE_24, "gpu": IMAGE_28}}})
    assert _old_releases.release_named(parsed.config) == (2, 4)  # the oldest it names
    assert any("'environment.image'" in w for w in parsed.warnings)  # no container here
    assert _old_releases.release_named({}) is None


def test_which_bridges_a_release_gets():
    plan = _old_releases.Plan
    assert plan((2, 3), keras2=True).model_input_check
    assert not plan((2, 4), keras2=True).model_input_check
    assert plan((2, 10), keras2=False).optimizer_args
    assert not plan((2, 11), keras2=True).optimizer_args  # 2.11 to 2.15 behaved as today
    assert plan(None, keras2=True).optimizer_args and not plan(None, keras2=False).optimizer_args
    assert plan((2, 15), keras2=False).generator_methods
    assert not plan((2, 15), keras2=True).generator_methods  # tf_keras still has them


# -- NumPy ----------------------------------------------------------------------------------

NUMPY_ALIASES = """
import numpy as np
import pytest
from determined import _old_releases

with _old_releases.bridged({}):
    assert np.float is float and np.object is object and np.unicode_ is np.str_
    assert np.asscalar(np.array([2.5])) == 2.5 and np.isinf(np.Inf) and np.NINF < 0
    assert np.product([2, 3]) == 6 and list(np.cumproduct([2, 3])) == [2, 6]
    assert np.alltrue([True]) and np.sometrue([False, True]) and np.float_ is np.float64
    assert list(np.in1d([[1, 2], [3, 4]], [2, 3])) == [False, True, True, False]
    assert np.msort(np.array([[2, 1], [1, 2]]))[0].tolist() == [1, 1]
    assert np.float is float  # a second use
    with pytest.raises(AttributeError, match="find_common_type"):
        np.find_common_type  # no exact equivalent: NumPy's own message
with pytest.raises(AttributeError):
    np.float  # taken away again after a load
"""


def test_numpy_aliases_mean_what_they_meant_with_one_warning_each():
    # In a fresh interpreter: an in-process trial of another test may have bridged NumPy for
    # good in this one, and each warning is said once a process.
    done = subprocess.run([sys.executable, "-c", NUMPY_ALIASES], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    err = done.stderr
    assert err.count("np.float was removed in NumPy 1.24; localdet maps it to float") == 1
    assert "np.asscalar was removed in NumPy 1.23" in err
    assert "np.in1d was removed in NumPy 2.4" in err


# -- A TFKerasTrial (Keras 2) and a context.fit script (Keras 3) of TensorFlow 2.3 / 2.4 -----

@pytest.mark.slow
def test_a_tensorflow_2_3_trial_trains_and_its_checkpoint_loads(home, tmp_path):
    folder = model_folder(tmp_path, "old_trial", OLD_TRIAL, "model_def.py")
    result, experiment, trial, log = run(
        home, tmp_path, "old-trial", folder, IMAGE_23, entrypoint="model_def:OldTrial",
        hyperparameters={"global_batch_size": 32}, scheduling_unit=6,
        searcher={"name": "single", "metric": "val_accuracy", "smaller_is_better": False,
                  "max_length": {"batches": 12}})
    assert trial.state == "COMPLETED", result.stderr + log
    assert "keras2" in log.splitlines()[0]
    for what in TRIAL_WARNINGS:
        assert warned_once(log, what), what
    # Downstream: the checkpoint's code builds the model again, with its trial's bridges
    # (its config's image), for the load only.
    best = home.json("checkpoints", experiment.id, "--best")[0]["uuid"]
    home.cli("checkpoint", "export", best, tmp_path / "best")
    load = textwrap.dedent(f"""
        import numpy as np
        from determined.keras import load_model_from_checkpoint_path

        model = load_model_from_checkpoint_path({str(tmp_path / "best")!r})
        print("predicted", model.predict(np.zeros((3, 8, 8, 1), "float32"), verbose=0).shape,
              type(model.optimizer).__name__, hasattr(model, "predict_classes"))
    """)
    loaded = subprocess.run([sys.executable, "-c", load], capture_output=True, text=True,
                            env={**home.env, "TF_USE_LEGACY_KERAS": "1"}, timeout=300)
    assert "predicted (3, 10) Adam False" in loaded.stdout, loaded.stderr
    assert loaded.stderr.count("Adam(decay=...) was removed in TensorFlow 2.11") == 1


@pytest.mark.slow
def test_a_tensorflow_2_4_context_fit_script_trains_under_keras_3(home, tmp_path):
    folder = model_folder(tmp_path, "old_script", OLD_SCRIPT, "train.py")
    result, _, trial, log = run(home, tmp_path, "old-script", folder, IMAGE_24,
                                entrypoint="python3 train.py",
                                hyperparameters={"global_batch_size": 32})
    assert trial.state == "COMPLETED", result.stderr + log
    assert "keras3" in log.splitlines()[0]
    for what in SCRIPT_WARNINGS:
        assert warned_once(log, what), what


@pytest.mark.slow
def test_what_the_release_did_not_allow_is_refused_in_one_sentence(home, tmp_path):
    # TensorFlow 2.8 checked the model's inputs as today: no bridge, the remedy is named.
    folder = model_folder(tmp_path, "shape_28", OLD_TRIAL, "model_def.py")
    _, _, trial, log = run(
        home, tmp_path, "shape-28", folder, IMAGE_28, entrypoint="model_def:OldTrial",
        hyperparameters={"global_batch_size": 32},
        searcher={"name": "single", "metric": "val_accuracy", "smaller_is_better": False,
                  "max_length": {"batches": 6}})
    assert trial.state == "ERROR"
    [error] = [line for line in log.splitlines() if line.startswith("error: ")]
    assert error.startswith('error: ValueError: Input 0 of layer "sequential" is incompatible '
                            "with the layer: expected shape=(None, 8, 8, 1), found shape=")
    assert error.endswith("(the model was built for another input shape than its data has: "
                          "TensorFlow 2.4 and later refuse that (2.3 warned; localdet keeps "
                          "2.3's way only under Keras 2 for code whose environment.image names "
                          "TensorFlow 2.3 or older), so give the model the input_shape of its "
                          "data or reshape the data)")
    assert "Adam(lr=...)" in log  # 2.8's optimizers took lr: still bridged


def test_the_module_imports_nothing_heavy():
    code = ("import sys, determined; before = set(sys.modules); import determined._old_releases"
            " as o; o.install({}); print(sorted(set(sys.modules) - before))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, check=True).stdout
    assert out.strip() == "['determined._old_releases']", out


def test_keras_3_gets_the_removed_methods_and_optimizer_arguments_back(capsys):
    import numpy as np
    import tensorflow as tf

    keras = tf.keras
    if not keras.__version__.startswith("3."):
        pytest.skip("this process runs Keras 2")
    x, y = np.random.default_rng(0).random((8, 4), "float32"), np.arange(8) % 2

    def batches():
        while True:
            yield x, y
    with _old_releases.bridged({"environment": {"image": IMAGE_24}}):
        adam = keras.optimizers.Adam(lr=0.01, decay=0.5)
        steps = [float(adam._learning_rate(s)) for s in (0, 2)]
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
        model.compile(keras.optimizers.SGD(lr=0.1), "sparse_categorical_crossentropy")
        model.fit_generator(batches(), steps_per_epoch=2, epochs=1, verbose=0, workers=2)
        assert model.predict_classes(x).shape == (8,)
    assert steps == [pytest.approx(0.01), pytest.approx(0.005)]  # 0.01 / (1 + 0.5 * 2)
    assert float(model.optimizer.learning_rate) == pytest.approx(0.1)
    err = capsys.readouterr().err
    assert "Model.fit_generator was removed in TensorFlow 2.16 (Keras 3)" in err
    assert not hasattr(model, "fit_generator")  # taken away again
