"""A warm start: a trial with no checkpoint of its own starts its model from the experiment's
`searcher.source_checkpoint_uuid` (`TrialInfo.warm_start_checkpoint`), as Determined started
it: the weights, every optimizer's state and the random generators' states where the
checkpoint holds them, and none of its counters (batches, epochs, the data position,
callback states): the trial trains from batch 0.

Any Keras checkpoint serves, whoever wrote it:

- localdet's (a trial's: `determined-keras-model.h5` or `localdet-keras-weights.h5` beside
  `trial_state.pkl`; a script's `model_checkpoint` from `DeterminedCallback`);
- Determined's of every release: `determined-keras-model-weights.*` (TensorFlow's format,
  0.13.8 on) with `determined-keras-optimizer-weights.h5`, `determined-keras-model.h5`
  (0.13.x), or a lone HDF5 file named `determined-keras-model` (0.12), with `rng_state.pkl`
  where it was written.

    start_from(uuid, reporter, model, optimizers, trial_dir, trial_id)   # once, before training
"""

from __future__ import annotations

import logging
import os
import pickle
import shutil
import tempfile
from pathlib import Path
from typing import Any, List, Optional

import h5py
import numpy as np
import tensorflow as tf

from determined.core import TrialReporter
from determined.keras import _rng, _state, _weights_file
from determined.keras._checkpoint_formats import MODEL_FILENAME, WEIGHTS_PREFIX
from determined.keras._saved_weights import load_weights

STATE_FILENAME = "trial_state.pkl"               # localdet's trial state (its runner's)
LEGACY_MODEL_FILENAME = "determined-keras-model"  # Determined 0.12: an HDF5 file, no suffix
OPTIMIZER_FILENAME = "determined-keras-optimizer-weights.h5"  # Determined 0.13.8 on
RNG_FILENAME = "rng_state.pkl"                    # Determined's random generators
SCRIPT_WEIGHTS = "model_checkpoint"               # DeterminedCallback's (localdet's)
log = logging.getLogger("determined.keras")


class WarmStartError(RuntimeError):
    """The warm-start checkpoint does not fit the trial's model; the message says why."""


def start_from(uuid: str, reporter: TrialReporter, model: Any, optimizers: List[Any],
               trial_dir: Path, trial_id: int) -> None:
    """Load checkpoint `uuid` into `model` and `optimizers` (the compiled one first) through
    the reporter, checking every file's hash before training starts."""
    trial_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=trial_dir, prefix=".warm-start-"))
    try:
        folder = reporter.restore_checkpoint(uuid, scratch / "checkpoint")
        restored = load_into(folder, model, optimizers, scratch)
        reporter.verify_restored_checkpoint()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"[trial {trial_id}] warm start from checkpoint {uuid}: {', '.join(restored)}; "
          "training starts at batch 0", flush=True)


def load_into(folder: Path, model: Any, optimizers: List[Any], scratch: Path) -> List[str]:
    """Load what the checkpoint folder holds (`scratch`: a folder of the caller's, for a
    file Keras must read under another name); returns what was restored, in words. Raises
    WarmStartError when its weights do not fit the model; an optimizer or generator state
    that does not fit is left as it was, with a warning (another optimizer may be chosen
    to fine-tune with)."""
    weights = _weights_path(folder, scratch)
    try:
        load_weights(model, weights)
    except (ValueError, KeyError) as error:  # WeightsMismatch among them
        raise WarmStartError(f"the weights of warm-start checkpoint '{weights.name}' do not "
                             f"fit the trial's model ({error}); searcher.source_checkpoint_uuid"
                             " must name a checkpoint of the same architecture") from None
    restored = ["weights"]
    # The trial's own learning rates stay: its hyperparameters chose them (a fine-tuning
    # rate, say), while the optimizer's state (slots, step count) comes from the checkpoint.
    rates = [_rate_variable(optimizer) for optimizer in optimizers]
    rates = [None if v is None else _value(v) for v in rates]
    try:
        if (folder / STATE_FILENAME).is_file():
            restored += _localdet_state(folder, weights, model, optimizers)
        else:
            restored += _determined_state(folder, weights, model, optimizers)
    except (ValueError, RuntimeError, KeyError, OSError) as error:
        log.warning("warm start: the checkpoint's optimizer or random-generator state was not "
                    "restored (%s); the trial starts from its weights with its own", error)
    for optimizer, rate in zip(optimizers, rates, strict=True):
        variable = _rate_variable(optimizer)
        if rate is not None and variable is not None:
            _assign([variable], [rate])
    return restored


def _rate_variable(optimizer: Any) -> Any:
    """The variable holding the optimizer's learning rate (Keras 3's and Keras 2's
    `_learning_rate`, a legacy optimizer's hyperparameter), or None: a schedule, or not
    made yet."""
    hyper = getattr(optimizer, "_hyper", None)
    candidates = [getattr(optimizer, "_learning_rate", None),
                  hyper.get("learning_rate") if isinstance(hyper, dict) else None]
    return next((c for c in candidates if hasattr(c, "assign")), None)


def _value(variable: Any) -> np.ndarray:
    if tf.executing_eagerly():
        return np.asarray(variable.numpy())
    return np.asarray(tf.keras.backend.get_value(variable))


def _weights_path(folder: Path, scratch: Path) -> Path:
    for name in (_weights_file.WEIGHTS_FILENAME, MODEL_FILENAME, SCRIPT_WEIGHTS + ".weights.h5"):
        if (folder / name).is_file():
            return folder / name
    for prefix in (WEIGHTS_PREFIX, SCRIPT_WEIGHTS):
        if (folder / f"{prefix}.index").is_file():
            return folder / prefix
    legacy = folder / LEGACY_MODEL_FILENAME
    if legacy.is_file() and h5py.is_hdf5(legacy):
        # Keras reads an HDF5 file by its suffix: the same bytes under the 0.13 name.
        named = scratch / MODEL_FILENAME
        try:
            os.link(legacy, named)
        except OSError:
            shutil.copyfile(legacy, named)
        return named
    raise WarmStartError(
        f"warm-start checkpoint folder holds no Keras weights ({MODEL_FILENAME}, "
        f"{WEIGHTS_PREFIX}.index, {_weights_file.WEIGHTS_FILENAME} or {LEGACY_MODEL_FILENAME});"
        " searcher.source_checkpoint_uuid must name a Keras checkpoint")


def _localdet_state(folder: Path, weights: Path, model: Any,
                    optimizers: List[Any]) -> List[str]:
    with open(folder / STATE_FILENAME, "rb") as handle:
        saved = pickle.load(handle)["generators"]
    if not _state.holds_every_optimizer(saved) and weights.suffix == ".h5":
        _state.restore_optimizer_from_h5(model.optimizer, model, weights)
    _state.restore(saved, model, optimizers, weights if weights.suffix == ".h5" else None)
    return ["optimizer state", "random generators"]


def _determined_state(folder: Path, weights: Path, model: Any,
                      optimizers: List[Any]) -> List[str]:
    restored = []
    sources = [folder / OPTIMIZER_FILENAME, weights]
    groups = _optimizer_groups(next((p for p in sources if _is_h5(p)), None))
    if groups:
        if len(groups) > len(optimizers):
            raise ValueError(f"the checkpoint holds the state of {len(groups)} optimizers but "
                             f"the trial has {len(optimizers)}")
        for optimizer, values in zip(optimizers[:len(groups)], groups, strict=True):
            _state.build_optimizer(optimizer, model)
            variables = _state._variables(optimizer)
            if len(variables) != len(values):
                raise ValueError(f"the checkpoint holds {len(values)} variables of "
                                 f"{type(optimizer).__name__} but it has {len(variables)}")
            _assign(variables, values)
        restored.append("optimizer state")
    if (folder / RNG_FILENAME).is_file():
        with open(folder / RNG_FILENAME, "rb") as handle:
            _rng.set_rng_state(pickle.load(handle))
        restored.append("random generators")
    return restored


def _is_h5(path: Path) -> bool:
    return path.suffix == ".h5" and path.is_file()


def _optimizer_groups(path: Optional[Path]) -> List[List[np.ndarray]]:
    """Each optimizer's saved variables, in order: Keras's `optimizer_weights` group of a
    whole-model `.h5`, or Determined's `optimizer-N/optimizer_weights` groups."""
    if path is None:
        return []
    with h5py.File(path, "r") as h5:
        groups = [h5["optimizer_weights"]] if "optimizer_weights" in h5 else [
            h5[f"optimizer-{n}/optimizer_weights"] for n in range(len(h5))
            if f"optimizer-{n}/optimizer_weights" in h5]
        found = []
        for group in groups:
            names = [n.decode() if isinstance(n, bytes) else n
                     for n in group.attrs["weight_names"]]
            found.append([np.asarray(group[name]) for name in names])
    return found


def _assign(variables: List[Any], values: List[Any]) -> None:
    if tf.executing_eagerly():
        for variable, value in zip(variables, values, strict=True):
            variable.assign(value)
    else:  # a trial that disabled eager execution (Keras 2): through its session
        tf.keras.backend.batch_set_value(list(zip(variables, values, strict=True)))
