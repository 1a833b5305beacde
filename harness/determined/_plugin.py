"""The one implementation of a seam, found through an entry point group: `determined`
imports nothing of localdet, and localdet registers its classes in its pyproject.toml.

    factory = only_plugin("determined.reporters", "daemon side", "record this run")
"""

from __future__ import annotations

from typing import Any


def only_plugin(group: str, what: str, needed_for: str) -> Any:
    """An instance of the class the one entry point of `group` names (made with no
    arguments); RuntimeError, in one sentence, when there is none or several."""
    import importlib.metadata  # here: most processes never need it

    found = {ep.name: ep for ep in importlib.metadata.entry_points(group=group)}
    if not found:
        raise RuntimeError(f"no {what} is installed to {needed_for} (nothing in the entry "
                           f"point group '{group}'): install localdet with "
                           "`pip install localdet`")
    if len(found) > 1:
        raise RuntimeError(f"several {what}s are installed ({', '.join(sorted(found))} in the "
                           f"entry point group '{group}'); uninstall all but one")
    (entry_point,) = found.values()
    return entry_point.load()()
