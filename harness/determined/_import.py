"""`det.import_from_path`: import a model folder's modules for a moment, e.g. to load two
experiments' `model_def.py` side by side."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Iterator, Union


@contextlib.contextmanager
def import_from_path(path: Union[str, Path]) -> Iterator[None]:
    """Inside the block, `import model_def` finds `path/model_def.py`; afterwards
    `sys.path` and `sys.modules` are as before, so another folder's `model_def` can be
    imported next (the imported module objects stay usable).

        with det.import_from_path("./experiment_3"):
            import model_def
    """
    saved_path = list(sys.path)
    saved_modules = dict(sys.modules)
    sys.path.insert(0, str(path))
    try:
        yield
    finally:
        sys.path[:] = saved_path
        for name in list(sys.modules):
            if name not in saved_modules:
                del sys.modules[name]
        sys.modules.update(saved_modules)
