"""Write checkpoints of two compat trials the way Determined's versions wrote them,
for the loader's tests: `TF_USE_LEGACY_KERAS=1 python write_determined_checkpoints.py OUT`.

Determined ran Keras 2 only, so this runs under Keras 2 and trains with a plain `fit`:
- OUT/0.13.7: a lone `determined-keras-model.h5` (`model.save` in HDF5).
- OUT/0.17.7: the weights as a TensorFlow checkpoint (`save_weights(..., save_format="tf")`
  to the prefix `determined-keras-model-weights`), the model folder as `code/`, and the
  `metadata.json` that `Checkpoint.download()` wrote (framework, format "saved_weights",
  experiment config, hyperparameters).
- OUT/0.38.0: the same weights and code with a `load_data.json` (trial type, experiment
  config, hyperparameters, trial class) and no metadata.json.
  (The optimizer's weights, for resuming training, are left out: loading never reads them.)
- OUT/expected.npz: the model's predictions on the validation inputs, and its loss there.
- OUT/0.38.0-legacy and OUT/expected-legacy.npz: the same for a trial whose code only runs
  under Keras 2 (legacy_optimizers/from_import.py: `legacy.Adam(lr=..., decay=...)`).
"""

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf
import yaml

import determined as det
from determined import keras

HERE = Path(__file__).resolve().parent
FOLDER = HERE / "custom_objects"
LEGACY = HERE / "legacy_optimizers"


def determined_config(config_path: Path) -> dict:
    """The experiment config as Determined's master stored it: typed hyperparameters."""
    raw = yaml.safe_load(config_path.read_text())
    raw["hyperparameters"] = {name: {"type": "const", "val": value}
                              for name, value in raw["hyperparameters"].items()}
    return raw


def trained_model(folder: Path, config_path: Path, spec: str, expected: Path):
    """The trial's model after a few epochs of plain `fit`; its predictions and loss on
    the validation data saved to `expected`."""
    module_name, _, class_name = spec.partition(":")
    with det.import_from_path(folder):
        trial_class = getattr(__import__(module_name), class_name)
    tf.keras.utils.set_random_seed(7)
    context = keras.TFKerasTrialContext.from_config(yaml.safe_load(config_path.read_text()))
    trial = trial_class(context)
    model = trial.build_model()
    x, y = trial.build_training_data_loader()
    model.fit(x, y, batch_size=32, epochs=3, verbose=0)
    x_val, y_val = trial.build_validation_data_loader()
    np.savez(expected, predictions=model.predict(x_val, verbose=0),
             loss=model.evaluate(x_val, y_val, verbose=0)[0])
    return model


def write_load_data_format(folder: Path, model, code: Path, config: dict, spec: str) -> None:
    folder.mkdir()
    model.save_weights(str(folder / "determined-keras-model-weights"), save_format="tf")
    shutil.copytree(code, folder / "code", ignore=shutil.ignore_patterns("__pycache__"))
    hparams = {name: item["val"] for name, item in config["hyperparameters"].items()}
    (folder / "load_data.json").write_text(json.dumps({
        "trial_type": "TFKerasTrial", "experiment_config": config, "hparams": hparams,
        "trial_cls_spec": spec}))


def main(out: Path) -> None:
    spec = "model_def:CustomObjectsTrial"
    config = determined_config(FOLDER / "const.yaml")
    hparams = {name: item["val"] for name, item in config["hyperparameters"].items()}
    model = trained_model(FOLDER, FOLDER / "const.yaml", spec, out / "expected.npz")

    (out / "0.13.7").mkdir(parents=True)
    model.save(out / "0.13.7" / "determined-keras-model.h5", save_format="h5")

    write_load_data_format(out / "0.38.0", model, FOLDER, config, spec)
    older = out / "0.17.7"
    older.mkdir()
    model.save_weights(str(older / "determined-keras-model-weights"), save_format="tf")
    shutil.copytree(FOLDER, older / "code", ignore=shutil.ignore_patterns("__pycache__"))
    (older / "metadata.json").write_text(json.dumps({
        "determined_version": "0.17.7", "framework": "tensorflow-2.4.1",
        "format": "saved_weights", "experiment_config": config, "hparams": hparams}))

    legacy_spec = "from_import:Trial"
    legacy_model = trained_model(LEGACY, LEGACY / "from_import.yaml", legacy_spec,
                                 out / "expected-legacy.npz")
    write_load_data_format(out / "0.38.0-legacy", legacy_model, LEGACY,
                           determined_config(LEGACY / "from_import.yaml"), legacy_spec)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
