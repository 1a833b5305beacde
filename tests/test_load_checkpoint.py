"""`load_model_from_checkpoint_path` on every checkpoint format: localdet's own (a
TFKerasTrial's and a New-Keras-API script's), and Determined's as its versions wrote them
(tests/compat/write_determined_checkpoints.py makes those under Keras 2), loaded under
Keras 3 here and under Keras 2 in a subprocess."""

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

import determined as det
from determined.keras import load_model_from_checkpoint_path
from determined.keras._load import CheckpointLoadError

COMPAT = Path(__file__).parent / "compat"
CUSTOM = COMPAT / "custom_objects"

with det.import_from_path(CUSTOM):
    import model_def as custom_objects


def run_python(*argv: str, keras2: bool) -> subprocess.CompletedProcess:
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1" if keras2 else "0",
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    result = subprocess.run([sys.executable, *argv], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def determined_checkpoints(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("determined")
    run_python(str(COMPAT / "write_determined_checkpoints.py"), str(out), keras2=True)
    return out


VALIDATION = custom_objects.make_data(seed=1, rows=128)


def check_like_expected(model, expected: dict) -> None:
    x, y = VALIDATION
    np.testing.assert_allclose(model.predict(x, verbose=0), expected["predictions"],
                               atol=1e-6)
    metrics = model.evaluate(x, y, verbose=0, return_dict=True)
    assert metrics["loss"] == pytest.approx(float(expected["loss"]), rel=1e-6)
    assert "within_half" in metrics  # the trial's custom metric, compiled back in


@pytest.mark.parametrize("version", ["0.38.0", "0.17.7"])
def test_determined_weights_checkpoints_load_under_keras_3(determined_checkpoints, version):
    """load_data.json (0.17.8 on) and metadata.json (0.13.8 to 0.17.7): the trial class is
    rebuilt from code/, and Keras 2's TensorFlow-format weights go into the Keras 3 model."""
    model = load_model_from_checkpoint_path(str(determined_checkpoints / version))
    check_like_expected(model, np.load(determined_checkpoints / "expected.npz"))


def test_a_lone_determined_h5_needs_its_custom_objects_named(determined_checkpoints):
    folder = str(determined_checkpoints / "0.13.7")
    with pytest.raises(CheckpointLoadError, match="custom_object_scope"):
        load_model_from_checkpoint_path(folder)
    names = {"LearnedScale": custom_objects.LearnedScale, "soft_l1": custom_objects.soft_l1,
             "WithinHalf": custom_objects.WithinHalf}
    with tf.keras.utils.custom_object_scope(names):
        model = load_model_from_checkpoint_path(folder)
    check_like_expected(model, np.load(determined_checkpoints / "expected.npz"))


def test_a_keras2_only_trial_checkpoint_loads_under_keras_3(determined_checkpoints):
    """Its code (`legacy.Adam(lr=...)`) cannot build here; Keras 2 builds it in a
    subprocess and hands the model over."""
    model = load_model_from_checkpoint_path(str(determined_checkpoints / "0.38.0-legacy"))
    expected = np.load(determined_checkpoints / "expected-legacy.npz")
    with det.import_from_path(COMPAT / "legacy_optimizers"):
        from iris_base import IrisBase
    trial = IrisBase.__new__(IrisBase)
    IrisBase.__init__(trial, None)
    np.testing.assert_allclose(model.predict(trial.x_val, verbose=0), expected["predictions"],
                               atol=1e-6)
    loss = model.evaluate(trial.x_val, trial.y_val, verbose=0, return_dict=True)["loss"]
    assert loss == pytest.approx(float(expected["loss"]), rel=1e-5)


CHECK_UNDER_KERAS_2 = """
import json, sys
import numpy as np
from determined.keras import load_model_from_checkpoint_path
root, x, y = sys.argv[1], np.load(sys.argv[2])["x"], np.load(sys.argv[2])["y"]
out = {}
for version in sys.argv[3:]:
    model = load_model_from_checkpoint_path(root + "/" + version)
    out[version] = {"predictions": model.predict(x, verbose=0).tolist(),
                    "metrics": model.evaluate(x, y, verbose=0, return_dict=True)}
print(json.dumps(out))
"""


def test_determined_checkpoints_load_under_keras_2(determined_checkpoints, tmp_path):
    data = tmp_path / "validation.npz"
    np.savez(data, x=VALIDATION[0], y=VALIDATION[1])
    result = run_python("-c", CHECK_UNDER_KERAS_2, str(determined_checkpoints), str(data),
                        "0.38.0", "0.17.7", keras2=True)
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    expected = np.load(determined_checkpoints / "expected.npz")
    for facts in loaded.values():
        np.testing.assert_allclose(facts["predictions"], expected["predictions"], atol=1e-6)
        assert facts["metrics"]["loss"] == pytest.approx(float(expected["loss"]), rel=1e-6)


# -- localdet's own checkpoints ----------------------------------------------------------
def export_latest(reporter, trial_id: int, folder: Path) -> Path:
    from localdet.reporting.sqlite_reporter import CheckpointReader

    reader = CheckpointReader(reporter.layout)
    return reader.materialize(reader.resolve(trial_id=trial_id), folder)


@pytest.fixture(scope="module")
def localdet_trial_checkpoint(tmp_path_factory):
    """The custom-objects trial trained here (Keras 3) by the trial runner; its exported
    checkpoint and the validation loss it recorded."""
    from determined.keras._trial_controller import TrialController

    tmp_path = tmp_path_factory.mktemp("localdet")
    db, trial_id, reporter, info = start_trial(
        tmp_path, 20, hparams={"global_batch_size": 32, "hidden": 8, "learning_rate": 0.02},
        entrypoint="model_def:CustomObjectsTrial")
    shutil.copytree(CUSTOM, tmp_path / "model", dirs_exist_ok=True)  # over the stub
    TrialController.for_trial_class(custom_objects.CustomObjectsTrial, info, reporter).run()
    folder = export_latest(reporter, trial_id, tmp_path / "export")
    return folder, db.metrics(trial_id, kind="validation")[-1].metrics


def test_a_trial_checkpoint_comes_back_compiled_with_its_custom_objects(
        localdet_trial_checkpoint):
    folder, recorded = localdet_trial_checkpoint
    model = load_model_from_checkpoint_path(str(folder))
    # Built from the checkpoint's own copy of the code.
    assert "LearnedScale" in [type(layer).__name__ for layer in model.layers]
    metrics = model.evaluate(*VALIDATION, verbose=0, return_dict=True)
    assert metrics["loss"] == pytest.approx(recorded["val_loss"], rel=1e-5)
    assert metrics["within_half"] == pytest.approx(recorded["val_within_half"], abs=1e-6)


def test_a_keras3_trial_checkpoint_loads_under_keras_2(localdet_trial_checkpoint, tmp_path):
    folder, recorded = localdet_trial_checkpoint
    data = tmp_path / "validation.npz"
    np.savez(data, x=VALIDATION[0], y=VALIDATION[1])
    result = run_python("-c", CHECK_UNDER_KERAS_2, str(folder.parent), str(data), folder.name,
                        keras2=True)
    metrics = json.loads(result.stdout.strip().splitlines()[-1])[folder.name]["metrics"]
    assert metrics["loss"] == pytest.approx(recorded["val_loss"], rel=1e-5)


def test_a_script_checkpoint_with_string_losses_loads_under_keras_3(tmp_path):
    """A New-Keras-API script has no trial class: the model comes from the .h5 and is
    compiled from what it records, `loss="mse"` included (Keras 3 cannot deserialize that
    from an .h5 by itself)."""
    from determined.keras import KerasContext
    from determined.keras._trial_controller import prepare_process

    x, y = custom_objects.make_data(seed=0, rows=256)
    db, trial_id, reporter, info = start_trial(
        tmp_path, 16, hparams={"global_batch_size": 32}, entrypoint="python3 train.py")
    prepare_process(info)
    context = KerasContext(info, reporter)
    model = tf.keras.Sequential([tf.keras.Input(shape=(4,)), tf.keras.layers.Dense(8),
                                 tf.keras.layers.Dense(1)])
    model.compile(optimizer=context.wrap_optimizer(tf.keras.optimizers.Adam(0.01)),
                  loss="mse", metrics=["mae"])
    context.fit(model, x, y, batch_size=32, validation_data=VALIDATION)
    folder = export_latest(reporter, trial_id, tmp_path / "export")

    loaded = load_model_from_checkpoint_path(str(folder))
    np.testing.assert_allclose(loaded.predict(VALIDATION[0], verbose=0),
                               model.predict(VALIDATION[0], verbose=0), atol=1e-6)
    recorded = db.metrics(trial_id, kind="validation")[-1].metrics
    metrics = loaded.evaluate(*VALIDATION, verbose=0, return_dict=True)
    assert metrics["loss"] == pytest.approx(recorded["val_loss"], rel=1e-5)
    assert metrics["mae"] == pytest.approx(recorded["val_mae"], rel=1e-5)
    # The optimizer's state came back too: training can go on from it.
    assert int(loaded.optimizer.iterations.numpy()) == 16


def test_what_cannot_be_loaded_says_why_in_one_sentence(tmp_path, determined_checkpoints):
    with pytest.raises(CheckpointLoadError, match="is not a folder"):
        load_model_from_checkpoint_path(str(tmp_path / "missing"))
    with pytest.raises(CheckpointLoadError, match="holds neither determined-keras-model.h5"):
        load_model_from_checkpoint_path(str(tmp_path))
    # Determined's weights without the file that names their trial class.
    bare = tmp_path / "bare"
    shutil.copytree(determined_checkpoints / "0.38.0", bare)
    (bare / "load_data.json").unlink()
    with pytest.raises(CheckpointLoadError, match="write_metadata_file"):
        load_model_from_checkpoint_path(str(bare))
    # Its code gone.
    shutil.rmtree(bare / "code")
    shutil.copy(determined_checkpoints / "0.38.0" / "load_data.json", bare)
    with pytest.raises(CheckpointLoadError, match="no code/ folder"):
        load_model_from_checkpoint_path(str(bare))


MIXED_PRECISION_MODEL = '''
import sys
import numpy as np
import tensorflow as tf

tf.keras.mixed_precision.set_global_policy("mixed_float16")
inputs = tf.keras.Input((4,))
hidden = tf.keras.layers.Dense(3)(inputs)
model = tf.keras.Model(inputs, tf.keras.layers.Dense(1, dtype="float32")(hidden))
model.compile(optimizer=tf.keras.optimizers.Adam(0.01), loss="mse")
model.fit(np.ones((8, 4)), np.ones((8, 1)), verbose=0)
model.save(sys.argv[1] + "/determined-keras-model.h5")
np.save(sys.argv[1] + "/predicted.npy", model.predict(np.ones((2, 4)), verbose=0))
'''


@pytest.mark.parametrize("writer", ["keras2", "keras3"])
def test_a_mixed_precision_model_loads_with_its_loss_scaling_in_either_line(tmp_path, writer):
    """Mixed precision's LossScaleOptimizer wraps the compiled optimizer: the loader builds
    the inner one and wraps it again in this line's; a Keras 2 layer's dtype policy object
    is read by Keras 3 as the policy's name."""
    subprocess.run([sys.executable, "-c", MIXED_PRECISION_MODEL, str(tmp_path)], check=True,
                   env={**os.environ, "TF_USE_LEGACY_KERAS": str(int(writer == "keras2"))},
                   capture_output=True)
    try:
        model = load_model_from_checkpoint_path(str(tmp_path))
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
    optimizer = model.optimizer
    assert "LossScaleOptimizer" in type(optimizer).__name__
    assert type(optimizer.inner_optimizer).__name__ == "Adam"
    assert float(optimizer.inner_optimizer.learning_rate) == pytest.approx(0.01)
    assert model.layers[1].dtype_policy.name == "mixed_float16"
    np.testing.assert_allclose(model.predict(np.ones((2, 4)), verbose=0),
                               np.load(tmp_path / "predicted.npy"), rtol=1e-3)


class Scaling(tf.keras.layers.Layer):
    """A custom layer whose __init__ takes no `trainable` or `dtype`, which its config holds:
    Keras cannot rebuild it from its config, in either line."""

    def __init__(self, name=None):
        super().__init__(name=name)

    def call(self, inputs):
        return inputs * 2.0


def test_a_model_its_own_line_cannot_rebuild_names_no_line_switch(tmp_path):
    """Where the line that trained a script's model fails to rebuild it (and the other line
    does too), the error leads with fixing the model's code, not with switching lines."""
    from determined.keras import KerasContext
    from determined.keras._line import keras_line
    from determined.keras._trial_controller import prepare_process

    x, y = custom_objects.make_data(seed=0, rows=64)
    db, trial_id, reporter, info = start_trial(
        tmp_path, 2, hparams={"global_batch_size": 32}, entrypoint="python3 train.py")
    prepare_process(info)
    context = KerasContext(info, reporter)
    model = tf.keras.Sequential([tf.keras.Input(shape=(4,)), Scaling(), tf.keras.layers.Dense(1)])
    model.compile(optimizer=context.wrap_optimizer(tf.keras.optimizers.Adam(0.01)), loss="mse")
    context.fit(model, x, y, batch_size=32, validation_data=VALIDATION)
    folder = export_latest(reporter, trial_id, tmp_path / "export")
    with tf.keras.utils.custom_object_scope({"Scaling": Scaling}):
        with pytest.raises(CheckpointLoadError) as refused:
            load_model_from_checkpoint_path(str(folder))
    said = str(refused.value)
    assert said.startswith("fix what this error names in the model's code or custom objects, "
                           "or build the model in your code and read its weights with "
                           "determined.keras.load_weights_from_checkpoint_path(model, ")
    assert "Scaling" in said and "TF_USE_LEGACY_KERAS" not in said.split(":")[0]
    # That second remedy works: the model built by the code takes the checkpoint's weights.
    from determined.keras import load_weights_from_checkpoint_path

    rebuilt = tf.keras.Sequential([tf.keras.Input(shape=(4,)), Scaling(), tf.keras.layers.Dense(1)])
    load_weights_from_checkpoint_path(rebuilt, str(folder))
    np.testing.assert_allclose(rebuilt.predict(VALIDATION[0], verbose=0),
                               model.predict(VALIDATION[0], verbose=0), atol=1e-6)
    assert f"under {'Keras 2' if keras_line() == 'keras2' else 'Keras 3'}, which trained it" \
        in said


LOAD_AND_PRINT = '''
import sys
from determined.keras import load_model_from_checkpoint_path
from determined.keras._load import CheckpointLoadError
try:
    load_model_from_checkpoint_path(sys.argv[1])
except CheckpointLoadError as error:
    print(error)
'''


def test_a_script_model_with_keras_3_operations_loads_and_keras_2_says_what_to_do(tmp_path):
    """Keras 3 records `inputs / 4.0` and `x + y` on symbolic tensors as operations, not
    layers, which its `.h5` architecture cannot name (plain Keras 3 cannot load that `.h5`
    either): the checkpoint keeps Keras 3's own serialisation beside it."""
    from determined.keras import KerasContext
    from determined.keras._line import keras_line
    from determined.keras._saved_architecture import NATIVE_ARCHITECTURE
    from determined.keras._trial_controller import prepare_process

    if keras_line() == "keras2":
        pytest.skip("Keras 2 wraps such arithmetic in layers of its own")
    x, y = custom_objects.make_data(seed=0, rows=64)
    db, trial_id, reporter, info = start_trial(
        tmp_path, 2, hparams={"global_batch_size": 32}, entrypoint="python3 train.py")
    prepare_process(info)
    context = KerasContext(info, reporter)
    inputs = tf.keras.Input(shape=(4,))
    scaled = inputs / 4.0
    hidden = tf.keras.layers.Dense(4)(scaled)
    outputs = tf.keras.layers.Dense(1)(hidden + scaled)
    model = tf.keras.Model(inputs, outputs)
    model.compile(optimizer=context.wrap_optimizer(tf.keras.optimizers.Adam(0.01)), loss="mse")
    context.fit(model, x, y, batch_size=32, validation_data=VALIDATION)
    folder = export_latest(reporter, trial_id, tmp_path / "export")

    loaded = load_model_from_checkpoint_path(str(folder))
    np.testing.assert_allclose(loaded.predict(VALIDATION[0], verbose=0),
                               model.predict(VALIDATION[0], verbose=0), atol=1e-6)
    assert int(loaded.optimizer.iterations.numpy()) == 2
    # Without it, the .h5 alone fails as plain Keras 3's load_model does.
    import h5py

    with h5py.File(folder / "determined-keras-model.h5", "r+") as h5:
        kept = h5[NATIVE_ARCHITECTURE][()]
        del h5[NATIVE_ARCHITECTURE]
    with pytest.raises(CheckpointLoadError, match="TrueDivide"):
        load_model_from_checkpoint_path(str(folder))
    with h5py.File(folder / "determined-keras-model.h5", "r+") as h5:
        h5.create_dataset(NATIVE_ARCHITECTURE, data=kept)

    said = run_python("-c", LOAD_AND_PRINT, str(folder), keras2=True).stdout.strip()
    assert said.startswith("set TF_USE_LEGACY_KERAS=0 before TensorFlow is imported and load "
                           "it again: "), said
    assert "Keras 3 operations (Add, TrueDivide" in said
