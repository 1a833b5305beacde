"""Which Keras 3 backend this process trains on, found without importing TensorFlow.

`KERAS_BACKEND` (the config's `environment.environment_variables`, or the user's own
environment) picks it, as Keras itself does: "tensorflow" (Keras's default, and always under
the Keras 2 line, `TF_USE_LEGACY_KERAS=1`), "jax" or "torch". On TensorFlow, `context.fit`
trains through the TFKerasTrial runner (tf.data streams, iterator checkpoints); on the others
through `_backend_fit`, which uses only Keras's own backend-neutral API.
"""

from __future__ import annotations

import os
import sys

TENSORFLOW = "tensorflow"


class BackendError(ImportError):
    """A TensorFlow-only API was used on another Keras backend; the message says what to do."""


def backend() -> str:
    """"tensorflow", "jax", "torch" or "numpy": Keras's backend in this process."""
    if os.environ.get("TF_USE_LEGACY_KERAS", "").strip().lower() in ("1", "true", "yes"):
        return TENSORFLOW  # the Keras 2 line is tf_keras, TensorFlow's alone
    loaded = sys.modules.get("keras")
    if loaded is not None and hasattr(getattr(loaded, "backend", None), "backend"):
        return str(loaded.backend.backend())
    name = os.environ.get("KERAS_BACKEND", "").strip()
    if name:
        return name
    # Keras's own answer: its config file (~/.keras/keras.json), else TensorFlow. Importing
    # keras imports TensorFlow only when that is the backend, so nothing is lost.
    import keras

    return str(keras.backend.backend())


def is_tensorflow() -> bool:
    return backend() == TENSORFLOW


def tensorflow_only(what: str) -> BackendError:
    """The one sentence for a TensorFlow-only API used on another backend."""
    return BackendError(
        f"{what} runs on Keras's TensorFlow backend only, and this process runs on "
        f"KERAS_BACKEND={backend()}; use det.keras.init() with context.fit, or set "
        "KERAS_BACKEND=tensorflow in environment.environment_variables")


class _LoadedOnly:
    """Keras's lazy `tensorflow` module, available only once something imported TensorFlow.
    Keras asks `tf.available` before `isinstance(obj, tf.TensorShape)` while saving a model
    and before seeding TensorFlow in `set_random_seed`; asked, the lazy module imports
    TensorFlow wherever it is installed (10 s of a JAX trial's first checkpoint). No object
    of TensorFlow's can exist, nor any seed of its matter, before it is imported."""

    def __init__(self, lazy: object):
        self._lazy = lazy

    @property
    def available(self) -> bool:
        return "tensorflow" in sys.modules and bool(self._lazy.available)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self._lazy, name)


def keep_tensorflow_unloaded() -> None:
    """Stop Keras's saving and seeding from importing TensorFlow on another backend."""
    import importlib

    # keras.src: checked against keras 3.15 (pyproject's bound <3.16)
    from keras.src.utils.module_utils import LazyModule

    for name in ("keras.src.saving.serialization_lib", "keras.src.utils.rng_utils",
                 "keras.src.legacy.saving.json_utils"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if isinstance(getattr(module, "tf", None), LazyModule):
            module.tf = _LoadedOnly(module.tf)  # type: ignore[attr-defined]
