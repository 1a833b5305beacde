"""`det.import_from_path`: import a model folder's modules for a moment, e.g. to load two
experiments' `model_def.py` side by side."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Iterator, Set, Union


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
    # A module of the same name imported earlier (another folder's `model_def`) would be
    # found in sys.modules first; hide it inside the block.
    for name in _top_level_names(Path(path)):
        for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[loaded]
    sys.path.insert(0, str(path))
    try:
        yield
    finally:
        sys.path[:] = saved_path
        for name in list(sys.modules):
            if name not in saved_modules:
                del sys.modules[name]
        sys.modules.update(saved_modules)


def _top_level_names(path: Path) -> Set[str]:
    """The module and package names that `path` on sys.path provides."""
    if not path.is_dir():
        return set()
    return {entry.stem if entry.suffix == ".py" else entry.name for entry in path.iterdir()
            if (entry.suffix == ".py" and entry.is_file())
            or (entry.is_dir() and (entry / "__init__.py").is_file())}
