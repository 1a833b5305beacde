"""A script that never imports `determined`, run as a localdet trial: every `Model.fit` it
calls goes through localdet's runner (`_unchanged_fit`), in the script's own process.

    install(fit)   # before the script runs: `fit(original, model, args, kwargs)` serves
                   # each Model.fit call from then on

Nothing here imports a framework: the Model classes are patched when Keras defines them (a
post-import hook on the modules below), or at once where they are already imported (a warm
process has imported Keras before it forks the trial). Which Keras, and which backend under
it, is the script's affair; another backend's Keras defines its `Model` in the same module.
A script run outside localdet never reaches this module (`determined.exec.unchanged_script`,
which the launcher runs in front of the script, is what installs it).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import inspect
import sys
from types import ModuleType
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

# The module defining each Keras line's Model class (whose `fit` every model inherits):
# Keras 3 (`keras`, `tf.keras` from TensorFlow 2.16), Keras 2 as `tf_keras`, and Keras 2
# as the `keras` package of TensorFlow 2.15 and before.
MODEL_MODULES = {
    "keras.src.models.model": "Model",
    "tf_keras.src.engine.training": "Model",
    "keras.src.engine.training": "Model",
    "keras.engine.training": "Model",
}
MARK = "_localdet_unchanged"  # set on the wrapper: a class is patched once

Serve = Callable[[Callable[..., Any], Any, Tuple[Any, ...], Dict[str, Any]], Any]
_serve: Optional[Serve] = None
_busy = False  # a fit called while one is served (a callback's own fit) runs as Keras's


def _patch(module: ModuleType) -> None:
    model_class = getattr(module, MODEL_MODULES[module.__name__], None)
    original = getattr(model_class, "fit", None)
    if model_class is None or original is None or getattr(original, MARK, False):
        return

    @functools.wraps(original)
    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        global _busy
        if _serve is None or _busy:
            return original(self, *args, **kwargs)
        _busy = True
        try:
            return _serve(original, self, args, kwargs)
        finally:
            _busy = False

    setattr(fit, MARK, True)
    model_class.fit = fit  # type: ignore[attr-defined]


class _Loader(importlib.abc.Loader):
    """The module's own loader, then the patch."""

    def __init__(self, loader: importlib.abc.Loader):
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Optional[ModuleType]:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _patch(module)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds the Model modules with the finders after it, and patches them once loaded."""

    def find_spec(self, name: str, path: Optional[Sequence[str]] = None,
                  target: Optional[ModuleType] = None) -> Optional[importlib.machinery.ModuleSpec]:
        if name not in MODEL_MODULES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader)  # type: ignore[arg-type]
                return spec
        return None


def install(serve: Serve) -> None:
    """Serve every `Model.fit` call of this process with `serve(original, model, args,
    kwargs)`: the classes already imported at once, the others as Keras defines them."""
    global _serve
    _serve = serve
    if not any(isinstance(finder, _AfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())
    for name in MODEL_MODULES:
        if name in sys.modules:
            _patch(sys.modules[name])


def uninstall() -> None:
    """Every `Model.fit` is Keras's own again (the patched classes pass calls through)."""
    global _serve
    _serve = None


def fit_arguments(original: Callable[..., Any], model: Any, args: Tuple[Any, ...],
                  kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """The fit call's arguments by name, as the Keras line's own `fit` reads them (Keras 2
    and 3 order them alike; Keras 2 adds the worker settings)."""
    bound = inspect.signature(original).bind(model, *args, **kwargs)
    arguments = dict(bound.arguments)
    arguments.pop(next(iter(arguments)))  # the model itself
    extra = arguments.pop("kwargs", None) or {}
    arguments.update(extra)
    return arguments
