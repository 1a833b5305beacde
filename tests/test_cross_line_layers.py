"""A Keras 2 checkpoint of a model Keras 3 can host loads in Keras 3: every built-in layer
class that Keras 2 (tf_keras) and Keras 3 share, in a handful of models
(tests/cross_line/shared_layers/), each trained by a Keras 2 TFKerasTrial through the trial
runner (whose process enables TensorFlow's random generator, as every trial's does), loads
in Keras 3 from the checkpoint's `.h5` alone (the trial's code names a Keras-2-only layer,
so it cannot be imported here) and predicts what Keras 2 predicted. A shared class that still
cannot be loaded is in a model of its own, marked with why.

One Keras 2 subprocess (tests/cross_line/layers_keras2.py) trains them all.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

CROSS = Path(__file__).parent / "cross_line"


def _by_path(name: str, path: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


layer_models = _by_path("cross_line_layer_models", CROSS / "shared_layers" / "layer_models.py")
ROWS, SEED = 16, 2  # as layers_keras2.py predicts
GROUPS = layer_models.groups()
FELL_BACK = "loading the Keras 2 .h5 the checkpoint holds instead"
# The groups whose models hold a layer drawing random numbers (Dropout, GaussianNoise, an RNN
# with dropout, the Random* preprocessing layers): the trial process's generator choice
# reached their configs.
RANDOM = {"vectors", "sequences", "frames", "images", "volumes", "RandomCrop"}


def _layer_names(module, base) -> set:
    return {name for name, value in vars(module).items() if inspect.isclass(value)
            and issubclass(value, base) and not name.startswith("_")}


def test_the_models_hold_every_layer_class_both_lines_share():
    import tensorflow as tf
    import tf_keras

    shared = _layer_names(tf_keras.layers, tf_keras.layers.Layer) & \
        _layer_names(tf.keras.layers, tf.keras.layers.Layer)
    by_class = {getattr(tf.keras.layers, name) for name in shared - set(layer_models.NOT_CASES)}
    cases = {getattr(tf.keras.layers, name) for case in layer_models.case_names()
             for name in layer_models.classes_of(case)}
    assert by_class == cases  # aliases (AvgPool2D, Convolution2D, ...) are the same classes
    assert set(layer_models.NOT_CASES) <= shared


@pytest.fixture(scope="module")
def keras2_checkpoints(tmp_path_factory) -> dict:
    scratch = tmp_path_factory.mktemp("shared_layers")
    request = scratch / "request.json"
    request.write_text(json.dumps({"scratch": str(scratch / "keras2"), "groups": list(GROUPS)}))
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    result = subprocess.run(
        [sys.executable, str(CROSS / "layers_keras2.py"), str(request),
         str(scratch / "answer.json")], env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((scratch / "answer.json").read_text())


def _inputs(group: str) -> dict:
    import tensorflow as tf

    x, _ = layer_models.data(group, ROWS, SEED)
    # Keras 3 takes strings as tensors, not as NumPy's unicode arrays.
    return {kind: tf.constant(value) if value.dtype.kind == "U" else value
            for kind, value in x.items()}


def _architecture(folder: Path) -> str:
    with h5py.File(folder / "determined-keras-model.h5", "r") as h5:
        raw = h5.attrs["model_config"]
    return raw.decode() if isinstance(raw, bytes) else raw


def _loads_as_keras_2_predicted(folder: Path, predictions: Path, group: str, caplog) -> None:
    import tensorflow as tf

    from determined.keras import load_model_from_checkpoint_path

    with caplog.at_level(logging.WARNING, logger="determined.keras"):
        model = load_model_from_checkpoint_path(str(folder))
    assert FELL_BACK in caplog.text  # from the .h5 alone: the trial's code needs Keras 2
    np.testing.assert_allclose(model.predict(_inputs(group), verbose=0), np.load(predictions),
                               rtol=1e-5, atol=1e-5)
    held = {type(layer) for layer in model._flatten_layers(include_self=False)}
    for case in GROUPS[group]:
        for name in layer_models.classes_of(case):
            assert getattr(tf.keras.layers, name) in held, (case, name)


@pytest.mark.slow
@pytest.mark.parametrize("group", [
    pytest.param(group, marks=pytest.mark.xfail(
        reason=layer_models.UNLOADABLE[group], strict=True)) if group in layer_models.UNLOADABLE
    else group for group in GROUPS])
def test_a_keras2_trial_checkpoint_of_shared_layers_loads_in_keras_3_from_its_h5(
        keras2_checkpoints, group, caplog):
    saved = keras2_checkpoints[group]
    # The trial process's generator choice is the process's: its layers recorded it, the
    # checkpoint's architecture does not.
    assert saved["rng_types"] == (["stateful"] if group in RANDOM else [])
    assert "rng_type" not in _architecture(Path(saved["folder"]))
    _loads_as_keras_2_predicted(Path(saved["folder"]), Path(saved["predictions"]), group, caplog)


def _with_generator_choice(value) -> int:
    """Put back what localdet's earlier versions left in a random layer's config."""
    added = 0
    if isinstance(value, list):
        return sum(_with_generator_choice(item) for item in value)
    if isinstance(value, dict):
        if value.get("class_name", "").startswith(("Dropout", "Gaussian", "Random", "LSTM")):
            value["config"]["rng_type"] = "stateful"
            added += 1
        added += sum(_with_generator_choice(item) for item in value.values())
    return added


@pytest.mark.slow
@pytest.mark.parametrize("group", ["vectors", "images"])
def test_a_checkpoint_written_before_localdet_left_out_rng_type_loads_in_keras_3_too(
        keras2_checkpoints, group, tmp_path, caplog):
    saved = keras2_checkpoints[group]
    folder = tmp_path / "older"
    shutil.copytree(saved["folder"], folder)
    config = json.loads(_architecture(folder))
    assert _with_generator_choice(config) >= 3
    with h5py.File(folder / "determined-keras-model.h5", "r+") as h5:
        h5.attrs["model_config"] = json.dumps(config)
    _loads_as_keras_2_predicted(folder, Path(saved["predictions"]), group, caplog)
