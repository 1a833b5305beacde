"""`import keras` means Keras 2 in a Keras 2 trial, as it did where Determined ran.

Determined's users wrote `import keras` / `from keras.optimizers.legacy import Adam` when
the `keras` package was Keras 2 (TensorFlow up to 2.15). Since TensorFlow 2.16 that package
is Keras 3 and Keras 2 is `tf_keras`; a trial localdet runs under Keras 2 gets `keras` (and
every `keras.*`) as the very module objects of `tf_keras`, so classes are the ones
`tf.keras` hands out. Older internal paths (`keras.engine`) resolve under `tf_keras.src`.

    install()   # before the trial's code is imported
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType
from typing import Optional, Sequence


class _KerasIsTfKeras(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Optional[Sequence[str]] = None,
                  target: Optional[ModuleType] = None) -> Optional[importlib.machinery.ModuleSpec]:
        if name != "keras" and not name.startswith("keras."):
            return None
        rest = name[len("keras"):]
        # tf_keras.src: checked against tf-keras 2.21 (pyproject's bound <2.22)
        for candidate in ("tf_keras" + rest, "tf_keras.src" + rest):
            try:
                if importlib.util.find_spec(candidate) is not None:
                    return importlib.util.spec_from_loader(name, self,
                                                           origin=candidate)
            except ModuleNotFoundError:
                continue
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(spec.origin or "")

    def exec_module(self, module: ModuleType) -> None:
        pass  # the tf_keras module is already executed


def wanted() -> bool:
    """Keras 2 was asked for, it is the `tf_keras` package, and `keras` is not loaded yet."""
    return (os.environ.get("TF_USE_LEGACY_KERAS") == "1" and "keras" not in sys.modules
            and importlib.util.find_spec("tf_keras") is not None)


def install() -> bool:
    """Alias `keras` to `tf_keras` in this process when `wanted()`; whether it did."""
    if not wanted() or any(isinstance(f, _KerasIsTfKeras) for f in sys.meta_path):
        return False
    sys.meta_path.insert(0, _KerasIsTfKeras())
    return True
