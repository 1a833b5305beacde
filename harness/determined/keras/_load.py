"""Load the model a checkpoint holds, in a downstream script.

A checkpoint of a `TFKerasTrial` is loaded the way Determined loaded it: the trial class in
the checkpoint's `code/` is built with the checkpoint's config and hyperparameters, and the
saved weights go into the model it builds. So custom layers, losses and metrics need no
registration, and the model comes back compiled as the trial compiled it. A checkpoint of a
script (the New Keras API) has no trial class: its `.h5` holds the architecture, and the
model is compiled with the loss, metrics and optimizer the `.h5` records.

A checkpoint written under the other Keras line loads too: its weights go into the model
built here, and where the trial's code itself only runs under the other line, that line
rebuilds the model in a subprocess and hands it over as an `.h5`.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

from determined.exec.run_trial import exception_line
from determined.keras._checkpoint_formats import (
    CheckpointFormatError,
    SavedCheckpoint,
    read_checkpoint,
)
from determined.keras._quiet import quiet_keras_warnings


class CheckpointLoadError(RuntimeError):
    """The checkpoint cannot be loaded in this process; the message says why and what to
    do."""


def load_model_from_checkpoint_path(path: str, tags: Optional[List[str]] = None) -> Any:
    """Load the `tf.keras.Model` a checkpoint holds, compiled as it was trained.

    Example:

        from determined.keras import load_model_from_checkpoint_path
        model = load_model_from_checkpoint_path("./best")
        model.evaluate(x, y)

    Args:
        path: the checkpoint's folder: from `localdet checkpoint export UUID FOLDER`, or one
            that Determined wrote (any version: `load_data.json`, `metadata.json`, or a lone
            `determined-keras-model.h5`).
        tags: accepted for compatibility with Determined (SavedModel tags); Keras
            checkpoints have none, so it is ignored.
    """
    try:
        saved = read_checkpoint(Path(path))
    except CheckpointFormatError as error:
        raise CheckpointLoadError(str(error)) from None
    from determined.keras._line import keras_line

    line = keras_line()
    if saved.trial_spec is None:
        return _whole_model(saved, saved.weights, line)
    if not saved.code.is_dir():
        raise CheckpointLoadError(
            f"'{saved.folder}' has no code/ folder to rebuild trial class "
            f"'{saved.trial_spec}' from; export the whole checkpoint again")
    try:
        model = _build_trial_model(saved)
    except Exception as error:
        if saved.keras_line in (None, line):
            if saved.whole_model is None:
                raise CheckpointLoadError(
                    f"building the model of '{saved.trial_spec}' from the checkpoint's code "
                    f"failed: {exception_line(error)}") from error
            # The code cannot build it (a class renamed since, say): the .h5 can.
            return _whole_model(saved, saved.whole_model, line)
        # The trial's code needs the line that trained it.
        with tempfile.TemporaryDirectory(prefix="localdet-load-") as scratch:
            h5_path = Path(scratch) / "model.h5"
            _rebuild_in_other_line(saved, h5_path)
            return _whole_model(saved, h5_path, line)
    from determined.keras._saved_weights import WeightsMismatch, load_weights

    try:
        load_weights(model, saved.weights)
    except (WeightsMismatch, ValueError) as error:
        raise CheckpointLoadError(
            f"the checkpoint's weights do not fit the model '{saved.trial_spec}' builds "
            f"under {line} ({exception_line(error)}); load it with the Keras line that trained it "
            f"({saved.keras_line or 'keras2'}): {_switch(saved.keras_line or 'keras2')}") \
            from error
    return model


def _switch(line: str) -> str:
    value = "1" if line == "keras2" else "0"
    return f"set TF_USE_LEGACY_KERAS={value} before TensorFlow is imported"


@contextlib.contextmanager
def _in_code_folder(code: Path) -> Iterator[None]:
    """Import from the checkpoint's code, and run in it as its trial ran (relative paths)."""
    import determined as det

    cwd = os.getcwd()
    with det.import_from_path(code):
        os.chdir(code)
        try:
            yield
        finally:
            os.chdir(cwd)


def _trial_class(spec: str) -> type:
    module_name, _, class_name = spec.partition(":")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, class_name)
    except AttributeError:
        raise CheckpointLoadError(f"the checkpoint's code has no class '{class_name}' in "
                                  f"module '{module_name}'") from None


def _build_trial_model(saved: SavedCheckpoint) -> Any:
    """The model the trial class builds with the checkpoint's config and hparams, as
    Determined rebuilt it (no training: `managed_training` is off)."""
    from determined.core import DistributedContext, TrialInfo
    from determined.keras._context import TFKerasTrialContext

    config = dict(saved.config)
    with tempfile.TemporaryDirectory(prefix="localdet-load-") as scratch, \
            _in_code_folder(saved.code), quiet_keras_warnings():
        info = TrialInfo(
            experiment_id=0, trial_id=0, hparams=dict(saved.hparams), seed=0,
            target_batches=0, scheduling_unit=int(config.get("scheduling_unit") or 100),
            validation_period=0, checkpoint_period=0, latest_checkpoint=None, config=config,
            model_dir=saved.code, trial_dir=Path(scratch))
        trial_class = _trial_class(saved.trial_spec or "")
        context = TFKerasTrialContext(info, DistributedContext(), managed_training=False)
        return trial_class(context).build_model()


def _custom_objects(saved: SavedCheckpoint) -> Dict[str, Any]:
    """Classes and functions of the trial's module, for an `.h5` that names custom layers,
    losses or metrics; empty when the module does not import in this line."""
    if saved.trial_spec is None or not saved.code.is_dir():
        return {}
    try:
        with _in_code_folder(saved.code):
            module = importlib.import_module(saved.trial_spec.partition(":")[0])
    except Exception:
        return {}
    return {name: value for name, value in vars(module).items()
            if not name.startswith("_") and (inspect.isclass(value) or inspect.isfunction(value))
            and getattr(value, "__module__", "") == module.__name__}


def _whole_model(saved: SavedCheckpoint, h5_path: Path, line: str) -> Any:
    """The model from an `.h5` that holds its architecture, compiled as it was saved."""
    import tensorflow as tf

    from determined.keras import _state
    from determined.keras._saved_weights import compile_as_saved

    if h5_path.suffix != ".h5":
        raise CheckpointLoadError(
            f"'{saved.folder}' holds only weights and no trial class to build their model "
            "from; it cannot be loaded")
    custom = _custom_objects(saved)
    try:
        with quiet_keras_warnings():
            model = tf.keras.models.load_model(str(h5_path), compile=False,
                                               custom_objects=custom)
            compiled = compile_as_saved(model, h5_path, custom)
    except (ValueError, TypeError) as error:
        unknown = "Unknown" in str(error) or saved.keras_line in (None, line)
        hint = ("wrap the call in `with tf.keras.utils.custom_object_scope({...}):` naming "
                "the custom layers, losses and metrics the model uses" if unknown
                else _switch(saved.keras_line or "keras2"))
        raise CheckpointLoadError(f"the model in '{h5_path}' cannot be rebuilt here "
                                  f"({exception_line(error)}); {hint}") from error
    if compiled and saved.keras_line == line:
        # The same line saved the optimizer's state; continue training from it.
        with contextlib.suppress(RuntimeError, ValueError, KeyError):
            _state.restore_optimizer_from_h5(model.optimizer, model, h5_path)
    return model


def _rebuild_in_other_line(saved: SavedCheckpoint, out: Path) -> None:
    """Build and load the model in a subprocess of the line that trained it, which saves it
    (architecture and weights) to the `.h5` `out`."""
    environment = {**os.environ, "TF_USE_LEGACY_KERAS": "1" if saved.keras_line == "keras2"
                   else "0", "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    code = ("import sys; from determined.exec import keras_alias; keras_alias.install(); "
            "from determined.keras._load import _save_whole_model; "
            "_save_whole_model(sys.argv[1], sys.argv[2])")
    result = subprocess.run([sys.executable, "-c", code, str(saved.folder), str(out)],
                            env=environment, capture_output=True, text=True)
    if result.returncode != 0:
        lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
        raise CheckpointLoadError(
            f"the checkpoint's trial code needs {saved.keras_line}, and building it there "
            f"failed too ({lines[-1] if lines else 'no output'}); "
            f"{_switch(saved.keras_line or 'keras2')} and load it again")


def _save_whole_model(folder: str, out: str) -> None:
    """In the subprocess: load the checkpoint in this line, save the whole model."""
    model = load_model_from_checkpoint_path(folder)
    with quiet_keras_warnings():
        model.save(out)
