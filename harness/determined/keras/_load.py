"""Load the model a checkpoint holds, in a downstream script.

A checkpoint of a `TFKerasTrial` is loaded the way Determined loaded it: the trial class in
the checkpoint's `code/` is built with the checkpoint's config and hyperparameters, and the
saved weights go into the model it builds. So custom layers, losses and metrics need no
registration, and the model comes back compiled as the trial compiled it. A checkpoint of a
script (the New Keras API) has no trial class: its `.h5` holds the architecture, and the
model is compiled with the loss, metrics and optimizer the `.h5` records.

A checkpoint written under the other Keras line loads too: its weights go into the model
built here. Where building or loading it here fails for a Keras-line reason (an
AttributeError, TypeError or ImportError raised in or through Keras or TensorFlow: code
written against the other line's API or internals), or the code fails and the other line
trained it, the other line builds it: from the checkpoint's own `.h5` where that line wrote
it, else in a subprocess of that line that hands it over as an `.h5`; one warning on the
`determined.keras` logger says which. A model from an `.h5` is compiled with the loss,
metrics and optimizer it records, translated for this line (`_compile_translation`): a
metric without an equivalent here is left out, a loss without one leaves the model
uncompiled, each named in one warning. A model that only the other line can host (a layer
built on that line's internals) ends in one sentence saying which line to load it with.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

from determined import _old_releases
from determined.errors import exception_line
from determined.keras._checkpoint_formats import (
    LEGACY_MODEL_FILENAME,
    MODEL_FILENAME,
    CheckpointFormatError,
    SavedCheckpoint,
    read_checkpoint,
)
from determined.keras._quiet import quiet_keras_warnings

log = logging.getLogger("determined.keras")
# Set in the subprocess that builds a model in the other line: it does not fall back again.
_NO_FALLBACK = "LOCALDET_LOAD_IN_THIS_LINE_ONLY"


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

    A checkpoint trained under the other Keras line (Keras 2 is `tf_keras`, chosen with
    `TF_USE_LEGACY_KERAS=1`) comes back compiled with the equivalent loss, metrics and
    optimizer; what has no equivalent in this line is named in a warning (a metric is left
    out; for a loss, the model is returned uncompiled for you to compile). Where the model
    cannot be built in this line, the other line builds it, with a warning saying so.
    """
    from determined.keras import _backend_checkpoint

    if _backend_checkpoint.model_file(Path(path)) is not None:
        # Keras's own format (a trial on JAX or PyTorch wrote it): any backend reads it.
        try:
            return _backend_checkpoint.load_model(Path(path))
        except _backend_checkpoint.BackendCheckpointError as error:
            raise CheckpointLoadError(str(error)) from None
    try:
        saved = read_checkpoint(Path(path))
    except CheckpointFormatError as error:
        from determined.keras._callback import weights_only_refusal

        raise CheckpointLoadError(weights_only_refusal(Path(path)) or str(error)) from None
    from determined.keras._line import keras_line

    line = keras_line()
    attempt = _Attempt()
    try:
        # The checkpoint's code may be written for an older TensorFlow or NumPy: the bridges
        # its trial had, for this load only.
        with _old_releases.bridged(saved.config):
            return _load_in_this_line(saved, line, attempt)
    except CheckpointLoadError:
        raise
    except Exception as error:
        if os.environ.get(_NO_FALLBACK) == "1" or not (
                attempt.needs_other_line or _is_keras_line_error(error)):
            raise CheckpointLoadError(
                f"loading '{saved.folder}' under {_spoken(line)} failed: "
                f"{exception_line(error)}") from error
        return _load_from_other_line(saved, line, attempt, error)


def load_weights_from_checkpoint_path(model: Any, path: str) -> Any:
    """Read the weights a checkpoint holds into `model`, built by your code; returns it.

    For a script's checkpoint that holds its model as weights alone (a subclassed model, or
    one whose `.h5` Keras cannot write), which `load_model_from_checkpoint_path` cannot
    build. localdet's extension; Determined had no such checkpoints.

        model = MyModel()
        load_weights_from_checkpoint_path(model, "./best")
    """
    from determined.keras import _backend_checkpoint

    folder = Path(path)
    native = _backend_checkpoint.model_file(folder)
    if native is not None:  # Keras's own format, on any backend
        model.load_weights(str(native))
        return model
    from determined.keras import _weights_file  # TensorFlow's formats: it imports TensorFlow
    weights = folder / _weights_file.WEIGHTS_FILENAME
    if weights.is_file():
        try:
            _weights_file.read_weights(model, weights)
        except _weights_file.WeightsMismatch as error:
            raise CheckpointLoadError(f"the weights in '{weights}' do not fit this model: "
                                      f"{error}") from None
        return model
    if (folder / MODEL_FILENAME).is_file():
        model.load_weights(str(folder / MODEL_FILENAME))
        return model
    raise CheckpointLoadError(f"'{folder}' holds no weights file of localdet's "
                              f"({_weights_file.WEIGHTS_FILENAME} or {MODEL_FILENAME}); "
                              "give the folder of an exported checkpoint")


class _Attempt:
    """What loading in this line tried, for the fallback to the other line."""

    def __init__(self) -> None:
        self.tried_h5 = False           # the checkpoint's own whole-model .h5
        self.needs_other_line = False   # the code failed and the other line trained it


def _load_in_this_line(saved: SavedCheckpoint, line: str, attempt: _Attempt) -> Any:
    if saved.trial_spec is None:
        attempt.tried_h5 = True
        return _whole_model(saved, saved.weights, line)
    if not saved.code.is_dir():
        raise CheckpointLoadError(
            f"'{saved.folder}' has no code/ folder to rebuild trial class "
            f"'{saved.trial_spec}' from; export the whole checkpoint again")
    try:
        model = _build_trial_model(saved)
    except Exception as error:
        if saved.keras_line not in (None, line):
            attempt.needs_other_line = True  # its code may need the line that trained it
            raise
        if _is_keras_line_error(error) or saved.whole_model is None:
            raise
        # The code cannot build it (a class renamed since, say): the .h5 can.
        attempt.tried_h5 = True
        return _whole_model(saved, saved.whole_model, line)
    from determined.keras._saved_weights import WeightsMismatch, load_weights

    try:
        load_weights(model, saved.weights)
    except (WeightsMismatch, ValueError) as error:
        trained = saved.keras_line or "keras2"
        raise CheckpointLoadError(
            f"{_remedy(trained)} under {_spoken(trained)}, which trained it: the checkpoint's "
            f"weights do not fit the model '{saved.trial_spec}' builds under {_spoken(line)} "
            f"({exception_line(error)})") from error
    return model


def _is_keras_line_error(error: BaseException) -> bool:
    """Whether `error` is what code written for the other Keras line raises in this one: an
    AttributeError, TypeError or ImportError raised in, or on its way through, Keras or
    TensorFlow (a layer reaching for Keras 2's internals, an argument one line lacks)."""
    if not isinstance(error, (AttributeError, TypeError, ImportError)):
        return False
    if isinstance(error, ImportError) and any(
            name in f"{error.name or ''} {error}" for name in ("keras", "tensorflow")):
        return True
    roots = _keras_roots()
    return any(frame.filename.startswith(roots)
               for frame in traceback.extract_tb(error.__traceback__))


def _keras_roots() -> Tuple[str, ...]:
    roots: List[str] = []
    for package in ("keras", "tf_keras", "tensorflow"):
        spec = importlib.util.find_spec(package)
        if spec is not None:
            roots.extend(os.path.join(location, "")
                         for location in spec.submodule_search_locations or [])
    return tuple(roots)


def _spoken(line: str) -> str:
    return "Keras 2" if line == "keras2" else "Keras 3"


def _load_from_other_line(saved: SavedCheckpoint, line: str, attempt: _Attempt,
                          error: BaseException) -> Any:
    """Loading here failed for a Keras-line reason: the other line builds the model (the
    checkpoint's own `.h5` where that line wrote it, else a subprocess of that line from
    its code), and it comes back here compiled with the equivalent loss and metrics."""
    other = "keras3" if line == "keras2" else "keras2"
    reason = exception_line(error)
    own_h5 = saved.whole_model is not None and saved.keras_line == other
    if own_h5 and attempt.tried_h5:
        raise CheckpointLoadError(
            f"{_remedy(other)}: the model in '{saved.folder}' needs {_spoken(other)}, which "
            f"wrote it, and cannot be rebuilt under {_spoken(line)} ({reason})") from error
    if own_h5 and saved.whole_model is not None:
        log.warning("Building the model of '%s' under %s failed (%s); loading the %s .h5 "
                    "the checkpoint holds instead.", saved.folder, _spoken(line), reason,
                    _spoken(other))
        return _handed_over(saved, saved.whole_model, line, other, reason)
    log.warning("Building the model of '%s' under %s failed (%s); building it under %s in "
                "a subprocess instead.", saved.folder, _spoken(line), reason, _spoken(other))
    with tempfile.TemporaryDirectory(prefix="localdet-load-") as scratch:
        h5_path = Path(scratch) / "model.h5"
        try:
            _rebuild_in_line(saved, other, h5_path, reason)
        except CheckpointLoadError:
            if saved.whole_model is None or attempt.tried_h5:
                raise
            # Neither line builds it from the code; the .h5 of this line still may.
            with contextlib.suppress(Exception):
                return _whole_model(saved, saved.whole_model, line)
            raise
        return _handed_over(saved, h5_path, line, other, reason)


def _handed_over(saved: SavedCheckpoint, h5_path: Path, line: str, other: str,
                 reason: str) -> Any:
    try:
        return _whole_model(saved, h5_path, line)
    except Exception as error:
        raise CheckpointLoadError(
            f"{_remedy(other)}: the model in '{saved.folder}' needs {_spoken(other)}; under "
            f"{_spoken(line)} building it failed ({reason}), and so did rebuilding the model "
            f"{_spoken(other)} built ({exception_line(error)})") from error


def _switch(line: str) -> str:
    value = "1" if line == "keras2" else "0"
    return f"set TF_USE_LEGACY_KERAS={value} before TensorFlow is imported"


def _remedy(line: str) -> str:
    """What to do where only the Keras line `line` hosts the model: the words an error
    starts with, its cause following."""
    return f"{_switch(line)} and load it again"


@contextlib.contextmanager
def _in_code_folder(code: Path) -> Iterator[None]:
    """Import from the checkpoint's code, and run in it as its trial ran (relative paths)."""
    import determined as det
    from determined.keras._graph_mode import eager_kept

    cwd = os.getcwd()
    with det.import_from_path(code), eager_kept():  # code that disables eager execution
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
    from determined.keras._saved_architecture import native_architecture, operation_names
    from determined.keras._saved_compile import compile_as_saved

    if h5_path.suffix != ".h5" and h5_path.name != LEGACY_MODEL_FILENAME:
        raise CheckpointLoadError(
            f"'{saved.folder}' holds only weights and no trial class to build their model "
            "from; it cannot be loaded")
    native = native_architecture(h5_path)
    if native is not None and line == "keras2":
        raise CheckpointLoadError(
            f"{_remedy('keras3')}: the model in '{h5_path}' holds Keras 3 operations "
            f"({', '.join(sorted(set(operation_names(native))))}: `keras.ops` or arithmetic on "
            "symbolic tensors), which Keras 2 cannot build")
    custom = _custom_objects(saved)
    try:
        with quiet_keras_warnings(), \
                _readable_here(h5_path, line, frozenset(custom)) as readable:
            if native is not None:  # operations its `.h5` architecture cannot name
                model = tf.keras.models.model_from_json(native, custom_objects=custom)
                model.load_weights(str(h5_path))
            else:
                if line == "keras3":
                    custom = {**_keras2_layers_kept_aside(), **custom}
                model = tf.keras.models.load_model(str(readable), compile=False,
                                                   custom_objects=custom)
            compiled = compile_as_saved(model, h5_path, custom)
    except (ValueError, TypeError) as error:
        # Keras 2 says "Unknown layer"; Keras 3 "Could not locate class".
        unknown = "Unknown" in str(error) or "Could not locate" in str(error)
        if not unknown and _is_keras_line_error(error):
            raise  # the other line may build it
        remedy = ("wrap the call in `with tf.keras.utils.custom_object_scope({...}):` naming "
                  "the custom layers, losses and metrics the model uses"
                  if unknown or saved.keras_line in (None, line)
                  else _remedy(saved.keras_line or "keras2"))
        raise CheckpointLoadError(f"{remedy}: the model in '{h5_path}' cannot be rebuilt "
                                  f"under {_spoken(line)} ({exception_line(error)})") from error
    if compiled and saved.keras_line == line:
        # The same line saved the optimizer's state; continue training from it.
        with contextlib.suppress(RuntimeError, ValueError, KeyError):
            _state.restore_optimizer_from_h5(model.optimizer, model, h5_path)
    return model


@contextlib.contextmanager
def _readable_here(h5_path: Path, line: str,
                   custom_names: frozenset = frozenset()) -> Iterator[Path]:
    """The `.h5` itself, or a copy whose architecture is rewritten in this line's form where
    the other line wrote it (`_architecture_translation`; `custom_names`: the trial's own
    classes, which keep their arguments)."""
    import h5py

    from determined.keras import _architecture_translation as translation

    if h5_path.suffix != ".h5":  # Determined 0.12's: Keras reads HDF5 only by its suffix
        with tempfile.TemporaryDirectory(prefix="localdet-load-") as scratch:
            named = Path(scratch) / MODEL_FILENAME
            shutil.copyfile(h5_path, named)
            with _readable_here(named, line, custom_names) as readable:
                yield readable
        return
    with h5py.File(h5_path, "r") as h5:
        version = h5.attrs.get("keras_version")
        raw = h5.attrs.get("model_config")
    version = version.decode() if isinstance(version, bytes) else str(version or "")
    writer = "keras3" if version.startswith("3.") else "keras2"
    if raw is None or writer == line:
        yield h5_path
        return
    recorded = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
    config = translation.keras3_model_config_for_keras2(recorded) if line == "keras2" \
        else translation.keras2_model_config_for_keras3(recorded, custom_names)
    if config == recorded:
        yield h5_path
        return
    with tempfile.TemporaryDirectory(prefix="localdet-load-") as scratch:
        copy = Path(scratch) / h5_path.name
        shutil.copyfile(h5_path, copy)
        with h5py.File(copy, "r+") as h5:
            h5.attrs["model_config"] = json.dumps(config)
        yield copy


def _keras2_layers_kept_aside() -> Dict[str, Any]:
    """What a Keras 2 architecture names that Keras 3's `.h5` reader does not find: built-in
    layers Keras 3 keeps only under `tf.keras.layers` (`ThresholdedReLU`, `RandomHeight`,
    `RandomWidth`), and Keras 2's `hard_sigmoid` (see `_architecture_translation`)."""
    import tensorflow as tf

    from determined.keras._architecture_translation import KERAS2_HARD_SIGMOID

    def keras2_hard_sigmoid(x: Any) -> Any:
        return tf.clip_by_value(0.2 * x + 0.5, 0.0, 1.0)

    # keras.src: checked against keras 3.15 (pyproject's bound <3.16)
    return {KERAS2_HARD_SIGMOID: keras2_hard_sigmoid,
            **{name: value for name, value in vars(tf.keras.layers).items()
               if inspect.isclass(value)
               and getattr(value, "__module__", "").startswith("keras.src.legacy.")}}


def _rebuild_in_line(saved: SavedCheckpoint, other: str, out: Path, reason: str) -> None:
    """Build and load the model in a subprocess of the Keras line `other`, which saves it
    (architecture and weights) to the `.h5` `out`; it does not fall back in turn."""
    environment = {**os.environ, "TF_USE_LEGACY_KERAS": "1" if other == "keras2" else "0",
                   "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "", _NO_FALLBACK: "1"}
    code = ("import sys; from determined.exec import keras_alias; keras_alias.install(); "
            "from determined.keras._load import _save_whole_model; "
            "_save_whole_model(sys.argv[1], sys.argv[2])")
    result = subprocess.run([sys.executable, "-c", code, str(saved.folder), str(out)],
                            env=environment, capture_output=True, text=True)
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    if result.returncode == _NOT_HANDED_OVER:
        raise CheckpointLoadError(
            f"{_remedy(other)}: '{saved.folder}' holds a subclassed model ({lines[-1]}) whose "
            f"code runs only under {_spoken(other)}, and only Functional and Sequential models "
            "can be handed from one Keras line to the other")
    if result.returncode != 0:
        trained = saved.keras_line or "keras2"
        there = lines[-1] if lines else "no output"
        if trained != other:  # this very line trained it: another line is no remedy
            raise CheckpointLoadError(
                f"fix what this error names in the model's code or custom objects, or build "
                f"the model in your code and read its weights with determined.keras."
                f"load_weights_from_checkpoint_path(model, '{saved.folder}'): building "
                f"the model of '{saved.folder}' failed under {_spoken(trained)}, which "
                f"trained it ({reason}), and under {_spoken(other)} too ({there})")
        raise CheckpointLoadError(
            f"{_remedy(trained)} under {_spoken(trained)}, which trained it: building the "
            f"model of '{saved.folder}' failed here ({reason}) and under {_spoken(other)} too "
            f"({there})")


def _save_whole_model(folder: str, out: str) -> None:
    """In the subprocess: load the checkpoint in this line, save the whole model."""
    from determined.keras._saved_compile import record_missing_arguments
    from determined.keras._trial_controller import saves_whole

    model = load_model_from_checkpoint_path(folder)
    if not saves_whole(model):
        print(type(model).__name__, file=sys.stderr)
        sys.exit(_NOT_HANDED_OVER)
    with quiet_keras_warnings():
        model.save(out)
    record_missing_arguments(model, Path(out))


# The hand-over subprocess's exit status for a model only its own line can hold.
_NOT_HANDED_OVER = 3

