"""A `context.fit` checkpoint on Keras's JAX and PyTorch backends, in Keras's own formats, so
that any backend (TensorFlow included) loads it downstream:

    <checkpoint>/
        model.keras          a Functional or Sequential model whole (architecture, weights,
                             compile settings, optimizer): `keras.saving.load_model`
        model.weights.h5     any other model's weights alone, for the model the code builds
        code/, config.yaml, hparams.json, metadata.json (names the file and the backend)
        trial_state.pkl      batches, epochs, the optimizers' variables, the models' other
                             variables (Keras's SeedGenerator states), Keras's global seed
                             generator, Python's, NumPy's and the backend's own generators,
                             the callbacks' states
"""

from __future__ import annotations

import json
import pickle
import random
import shutil
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np

from determined.errors import exception_line

WHOLE_FILENAME = "model.keras"
WEIGHTS_FILENAME = "model.weights.h5"
STATE_FILENAME = "trial_state.pkl"
FORM_WHOLE = "keras-v3"
FORM_WEIGHTS = "keras-v3-weights"
SECRET_KEYS = ("access_key", "secret_key")  # checkpoint_storage credentials (type s3)


class BackendCheckpointError(RuntimeError):
    """A checkpoint does not fit the trial resuming from it; the message says why."""


def without_secrets(config: Dict[str, Any]) -> Dict[str, Any]:
    """The config as a checkpoint keeps it: storage credentials blanked."""
    storage = config.get("checkpoint_storage")
    if not isinstance(storage, dict) or not any(storage.get(k) for k in SECRET_KEYS):
        return config
    hidden = {k: ("<hidden>" if k in SECRET_KEYS and v else v) for k, v in storage.items()}
    return {**config, "checkpoint_storage": hidden}


def saves_whole(model: Any) -> bool:
    import keras

    # keras.src: checked against keras 3.15 (pyproject's bound <3.16)
    from keras.src.models.functional import Functional

    return isinstance(model, (keras.Sequential, Functional))


def _numpy(variable: Any) -> np.ndarray:
    return np.array(variable.numpy())


def _non_weight_variables(model: Any) -> List[Any]:
    weights = {id(w) for w in model.weights}
    return [v for v in model.variables if id(v) not in weights]


def _global_seed_generator(create: bool = False) -> Any:
    """Keras's generator behind `keras.random` calls given no seed, or None while unmade."""
    # keras.src: checked against keras 3.15 (pyproject's bound <3.16)
    from keras.src.backend.common import global_state
    from keras.src.random import seed_generator

    if create:
        return seed_generator.global_seed_generator()
    return global_state.get_global_attribute("global_seed_generator")


def _backend_generator_state() -> Any:
    import keras

    if keras.backend.backend() == "torch":
        import torch

        return torch.get_rng_state()
    return None  # JAX has no global generator: every draw is given its key


def _set_backend_generator_state(value: Any) -> None:
    import keras

    if value is not None and keras.backend.backend() == "torch":
        import torch

        torch.set_rng_state(value)


def _build(optimizer: Any, model: Any) -> None:
    if not getattr(optimizer, "built", False):
        optimizer.build(model.trainable_variables)


def capture(model: Any, optimizers: List[Any]) -> Dict[str, Any]:
    seeds = _global_seed_generator()
    return {
        "python_random": random.getstate(),
        "numpy_random": np.random.get_state(),
        "backend_random": _backend_generator_state(),
        "keras_global_seed": None if seeds is None else _numpy(seeds.state),
        "model_variables": [_numpy(v) for v in _non_weight_variables(model)],
        "optimizers": [{"built": bool(getattr(o, "built", False)),
                        "values": [_numpy(v) for v in o.variables]} for o in optimizers],
    }


def restore(state: Dict[str, Any], model: Any, optimizers: List[Any]) -> None:
    # Made before `random` gets its state back: made later, it would draw its seed from it.
    if state["keras_global_seed"] is not None:
        _global_seed_generator(create=True).state.assign(state["keras_global_seed"])
    random.setstate(state["python_random"])
    np.random.set_state(state["numpy_random"])
    _set_backend_generator_state(state.get("backend_random"))
    variables = _non_weight_variables(model)
    if len(variables) != len(state["model_variables"]):
        raise BackendCheckpointError(
            f"the checkpoint holds {len(state['model_variables'])} non-weight variables but "
            f"the model has {len(variables)}; build the same model as the run that saved it")
    for variable, value in zip(variables, state["model_variables"], strict=True):
        variable.assign(value)
    if len(optimizers) != len(state["optimizers"]):
        raise BackendCheckpointError(
            f"the checkpoint holds {len(state['optimizers'])} optimizers but the trial has "
            f"{len(optimizers)}; wrap the same optimizers as the run that saved it")
    for number, (optimizer, saved) in enumerate(zip(optimizers, state["optimizers"],
                                                     strict=True)):
        if saved["built"]:
            _build(optimizer, model)
        current = list(optimizer.variables)
        if len(current) != len(saved["values"]):
            raise BackendCheckpointError(
                f"the checkpoint holds {len(saved['values'])} variables of optimizer {number} "
                f"({type(optimizer).__name__}) but it has {len(current)}; build the same "
                "optimizers, in the same order, as the run that saved it")
        for variable, value in zip(current, saved["values"], strict=True):
            variable.assign(value)


def write_model(model: Any, directory: Path) -> Dict[str, str]:
    """The model in Keras's own format; returns the metadata naming its file and form."""
    if saves_whole(model):
        model.save(directory / WHOLE_FILENAME)
        return {"weights_file": WHOLE_FILENAME, "weights_form": FORM_WHOLE}
    model.save_weights(directory / WEIGHTS_FILENAME)
    return {"weights_file": WEIGHTS_FILENAME, "weights_form": FORM_WEIGHTS}


def write(directory: Path, model: Any, optimizers: List[Any], trial_state: Dict[str, Any],
          model_dir: Path, config: Dict[str, Any], hparams: Dict[str, Any]) -> Dict[str, str]:
    import yaml

    weights = write_model(model, directory)
    shutil.copytree(model_dir, directory / "code",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (directory / "config.yaml").write_text(yaml.safe_dump(without_secrets(config)))
    (directory / "hparams.json").write_text(json.dumps(hparams, indent=2))
    state = {"format": 1, **trial_state, "generators": capture(model, optimizers)}
    with open(directory / STATE_FILENAME, "wb") as handle:
        pickle.dump(state, handle, protocol=5)
    return weights


def read(directory: Path, model: Any, optimizers: List[Any]) -> Dict[str, Any]:
    """Put a checkpoint's weights and states into the model and optimizers; returns the
    saved trial state (batches, epochs, callbacks)."""
    with open(directory / STATE_FILENAME, "rb") as handle:
        state = pickle.load(handle)
    weights = model_file(directory)
    if weights is None:
        raise BackendCheckpointError(f"'{directory}' holds neither {WHOLE_FILENAME} nor "
                                     f"{WEIGHTS_FILENAME}")
    for optimizer, saved in zip(optimizers, state["generators"]["optimizers"], strict=False):
        if saved["built"]:  # so that its variables in a .keras file are read, not skipped
            _build(optimizer, model)
    model.load_weights(str(weights))
    restore(state["generators"], model, optimizers)
    return state


def model_file(directory: Path) -> Optional[Path]:
    """The checkpoint's model in Keras's own format, or None (a TensorFlow trial's `.h5`)."""
    for name in (WHOLE_FILENAME, WEIGHTS_FILENAME):
        if (directory / name).is_file():
            return directory / name
    return None


def load_model(directory: Path) -> Any:
    """`load_model_from_checkpoint_path` for a checkpoint in Keras's own format, on any
    backend: the whole model, compiled as it was trained."""
    import keras

    from determined.keras._backend import backend, keep_tensorflow_unloaded

    if backend() != "tensorflow":
        keep_tensorflow_unloaded()
    path = model_file(directory)
    if path is None or path.name != WHOLE_FILENAME:
        raise BackendCheckpointError(
            f"'{directory}' holds this model's weights alone ({WEIGHTS_FILENAME}, a "
            "subclassed model); build the model in your code and read them with "
            "determined.keras.load_weights_from_checkpoint_path(model, path)")
    try:
        return keras.saving.load_model(path)
    except (TypeError, ValueError) as error:
        cause: BaseException = error
        while cause.__cause__ is not None or cause.__context__ is not None:
            cause = cause.__cause__ or cause.__context__  # type: ignore[assignment]
        # Keras names the first class or function it could not find in the innermost one.
        raise BackendCheckpointError(
            "wrap the call in `with keras.saving.custom_object_scope({...}):` naming the "
            "custom layers, functions, losses and metrics the model uses, or build the model "
            "in your code and read its weights with "
            "determined.keras.load_weights_from_checkpoint_path(model, path): the model in "
            f"'{path}' cannot be rebuilt ({exception_line(cause)})") from error
