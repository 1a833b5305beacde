"""sqlite_utils, imported without pandas and numpy.

sqlite_utils imports pandas and numpy whenever they are installed, only to map their scalar
types to column types; that took ~0.15 s of every command's start (`localdet status`,
`det e list`). localdet's columns are its migrations' and its values plain Python and JSON,
so it never needs those mappings. Import sqlite_utils from here (`localdet.records.db`
does); a process that imported pandas or numpy before (a trial, with TensorFlow) keeps them.

    from localdet.records.sqlite_utils_without_arrays import Migrations, sqlite_utils
"""

from __future__ import annotations

import importlib.abc
import sys
import threading


class _WithoutArrays(importlib.abc.MetaPathFinder):
    """Makes `import pandas` and `import numpy` fail in the thread that created it (only
    there: another thread may be importing numpy for itself meanwhile)."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()

    def find_spec(self, name, path=None, target=None):
        if name in ("pandas", "numpy") and threading.get_ident() == self.thread:
            raise ModuleNotFoundError(f"{name} is not imported for sqlite_utils", name=name)
        return None


# Relies on sqlite_utils importing pandas and numpy only inside try/except ImportError:
# checked against sqlite-utils 4.2 (pyproject's bound <4.3).
def _import() -> None:
    finder = _WithoutArrays()
    sys.meta_path.insert(0, finder)
    try:
        import sqlite_utils  # noqa: F401
    finally:
        sys.meta_path.remove(finder)


_import()
import sqlite_utils  # noqa: E402  (imported above, without them)
from sqlite_utils.migrations import Migrations  # noqa: E402

__all__ = ["Migrations", "sqlite_utils"]
