"""Checkpoints written as the harness writes them, and loaded back, in the Keras line this
process runs; for tests/test_cross_line.py (in its Keras 3 process, and in one Keras 2
subprocess together with catalogue.py's work).

- `script_checkpoint`: a New-Keras-API script's model (no trial class: it comes back from
  the `.h5`, compiled from what the `.h5` records) trained by `KerasContext.fit`.
- `trial_checkpoint`: a TFKerasTrial of keras2_internals/ trained by the trial runner.
- `evaluate_loaded`: `load_model_from_checkpoint_path` on a folder, evaluated.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any, Dict, Tuple

import numpy as np

TESTS = Path(__file__).resolve().parent.parent
FOLDER = Path(__file__).resolve().parent / "keras2_internals"


def script_data(seed: int, rows: int) -> Tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 5)).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype("int64") + (x[:, 2] > 0.5).astype("int64")
    return x, y


def _export(reporter: Any, trial_id: int, folder: Path) -> Path:
    from localdet.reporting.sqlite_reporter import CheckpointReader

    reader = CheckpointReader(reporter.layout)
    return reader.materialize(reader.resolve(trial_id=trial_id), folder)


def script_checkpoint(scratch: Path) -> Tuple[Path, Dict[str, float]]:
    """A tiny classifier compiled with several of the shared losses and metrics, given as
    objects with arguments and by name; its exported checkpoint and recorded validation."""
    import tensorflow as tf

    sys.path.insert(0, str(TESTS))
    from conftest import start_trial

    from determined.keras import KerasContext
    from determined.keras._trial_controller import prepare_process

    db, trial_id, reporter, info = start_trial(
        scratch, 4, hparams={"global_batch_size": 16}, entrypoint="python3 train.py")
    prepare_process(info)
    context = KerasContext(info, reporter)
    model = tf.keras.Sequential([tf.keras.Input(shape=(5,)),
                                 tf.keras.layers.Dense(8, activation="relu"),
                                 tf.keras.layers.Dense(3)])
    model.compile(
        optimizer=context.wrap_optimizer(tf.keras.optimizers.Adam(0.02)),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["acc", "sparse_top_k_categorical_accuracy",
                 tf.keras.metrics.SparseTopKCategoricalAccuracy(k=1, name="top1"),
                 tf.keras.metrics.SparseCategoricalCrossentropy(from_logits=True,
                                                                name="xent"),
                 tf.keras.metrics.MeanIoU(num_classes=3, sparse_y_pred=False, name="iou")])
    x, y = script_data(0, 64)
    context.fit(model, x, y, batch_size=16, validation_data=script_data(1, 64))
    folder = _export(reporter, trial_id, scratch / "export")
    return folder, dict(db.metrics(trial_id, kind="validation")[-1].metrics)


def trial_checkpoint(scratch: Path, entrypoint: str) -> Tuple[Path, Dict[str, float]]:
    """A trial of keras2_internals/ trained by the trial runner; its exported checkpoint and
    recorded validation."""
    sys.path.insert(0, str(TESTS))
    from conftest import start_trial

    import determined as det
    from determined.keras._trial_controller import TrialController

    scratch.mkdir(parents=True, exist_ok=True)
    db, trial_id, reporter, info = start_trial(
        scratch, 4, hparams={"global_batch_size": 32, "learning_rate": 0.02},
        entrypoint=entrypoint)
    shutil.copytree(FOLDER, scratch / "model", dirs_exist_ok=True)
    with det.import_from_path(FOLDER):
        import model_def
    trial_class = getattr(model_def, entrypoint.partition(":")[2])
    TrialController.for_trial_class(trial_class, info, reporter).run()
    folder = _export(reporter, trial_id, scratch / "export")
    return folder, dict(db.metrics(trial_id, kind="validation")[-1].metrics)


def trial_validation() -> Tuple[np.ndarray, np.ndarray]:
    import determined as det

    with det.import_from_path(FOLDER):
        import model_def
    return model_def.make_data(seed=1, rows=64)


def evaluate_loaded(folder: Path, data: Tuple[np.ndarray, np.ndarray]) -> Dict[str, float]:
    from determined.keras import load_model_from_checkpoint_path

    model = load_model_from_checkpoint_path(str(folder))
    found = model.evaluate(*data, verbose=0, return_dict=True)
    return {name: float(value) for name, value in found.items()}


def optimizer_of(folder: Path) -> Dict[str, Any]:
    """The class and learning rate of the optimizer the loaded model is compiled with."""
    from determined.keras import load_model_from_checkpoint_path

    optimizer = load_model_from_checkpoint_path(str(folder)).optimizer
    return {"class": type(optimizer).__name__,
            "learning_rate": float(np.asarray(optimizer.learning_rate))}
