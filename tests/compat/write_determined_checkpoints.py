"""Write checkpoints of the custom-objects trial the way Determined's versions wrote them,
for the loader's tests: `TF_USE_LEGACY_KERAS=1 python write_determined_checkpoints.py OUT`.

Determined ran Keras 2 only, so this runs under Keras 2 and trains with a plain `fit`:
- OUT/0.13.7: a lone `determined-keras-model.h5` (`model.save` in HDF5).
- OUT/0.17.7: the weights as a TensorFlow checkpoint (`save_weights(..., save_format="tf")`
  to the prefix `determined-keras-model-weights`), the model folder as `code/`, and the `metadata.json` that `Checkpoint.download()` wrote
  (framework, format "saved_weights", experiment config, hyperparameters).
- OUT/0.38.0: the same weights and code with a `load_data.json` (trial type, experiment
  config, hyperparameters, trial class) and no metadata.json.
  (The optimizer's weights, for resuming training, are left out: loading never reads them.)
- OUT/expected.npz: the model's predictions on the validation inputs, and its loss there.
"""

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf
import yaml

HERE = Path(__file__).resolve().parent
FOLDER = HERE / "custom_objects"
sys.path.insert(0, str(FOLDER))

from model_def import CustomObjectsTrial  # noqa: E402

from determined import keras  # noqa: E402


def determined_config() -> dict:
    """The experiment config as Determined's master stored it: typed hyperparameters."""
    raw = yaml.safe_load((FOLDER / "const.yaml").read_text())
    raw["hyperparameters"] = {name: {"type": "const", "val": value}
                              for name, value in raw["hyperparameters"].items()}
    return raw


def main(out: Path) -> None:
    config = determined_config()
    hparams = {name: spec["val"] for name, spec in config["hyperparameters"].items()}
    tf.keras.utils.set_random_seed(7)
    context = keras.TFKerasTrialContext.from_config(yaml.safe_load(
        (FOLDER / "const.yaml").read_text()))
    trial = CustomObjectsTrial(context)
    model = trial.build_model()
    x, y = trial.build_training_data_loader()
    model.fit(x, y, batch_size=32, epochs=3, verbose=0)
    x_val, y_val = trial.build_validation_data_loader()
    np.savez(out / "expected.npz", predictions=model.predict(x_val, verbose=0),
             loss=model.evaluate(x_val, y_val, verbose=0)[0])

    (out / "0.13.7").mkdir(parents=True)
    model.save(out / "0.13.7" / "determined-keras-model.h5", save_format="h5")

    for version in ("0.17.7", "0.38.0"):
        folder = out / version
        folder.mkdir()
        model.save_weights(str(folder / "determined-keras-model-weights"), save_format="tf")
        shutil.copytree(FOLDER, folder / "code",
                        ignore=shutil.ignore_patterns("__pycache__"))
    (out / "0.17.7" / "metadata.json").write_text(json.dumps({
        "determined_version": "0.17.7", "framework": "tensorflow-2.4.1",
        "format": "saved_weights", "experiment_config": config, "hparams": hparams}))
    (out / "0.38.0" / "load_data.json").write_text(json.dumps({
        "trial_type": "TFKerasTrial", "experiment_config": config, "hparams": hparams,
        "trial_cls_spec": "model_def:CustomObjectsTrial"}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
