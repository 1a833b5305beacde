"""What a warm process imports ahead of its trials, learned from the trials it forked.

    installed = InstalledPaths()
    tell = tell_imports(teach, installed)     # in the forked trial, first thing: its imports
    ...                                       # are told as they come; the trial runs
    tell()                                    # and as it ends, the rest
    import_quietly(names)                     # in the warm process, as they come
    installed.changed()                       # something was installed or removed since
    remembered = RememberedImports(folder)    # kept in the state folder, for the next daemon:
    import_quietly(remembered.names)          # a new warm process starts with them
    remembered.add(names)                     # what its trials told it

A warm process starts with TensorFlow, Keras and the harness imported. The trial code then
imports what it uses (scikit-learn, SciPy, pandas: a second or more of each trial's start);
each trial forked from a warm process tells it the modules it imported from the interpreter's
installed paths (the standard library and site-packages) as it imports them (what is new, every
quarter of a second in its first seconds) and as it ends, and the warm process imports them
meanwhile, so that the second trial of a search onwards starts with them. (Telling once the
trial's imports had settled came too late in short trials: a Keras trial imports modules in
each of its first phases, so a two-epoch digits trial settled only as it traced its training
step, and the next launch waited 0.7 s for the warm process to finish importing
scikit-learn.) The trial's own code (its model folder, its working folder, an editable
install) is never imported ahead: each trial reads it afresh.

A warm process also keeps what its trials told it in the state folder (`warm-imports/`, a
file per interpreter, Keras line and backend), and a warm process of the same kind started by
a later daemon imports those before it says it is ready: the first trial after a restart starts
as the later trials of a search do. The list only grows; removing the folder forgets it.

A module imported ahead is the version installed when it was imported, so a warm process
whose installed paths changed since (a `pip install` into its environment) ends at its next
order instead of forking, and the trial starts cold, with what is installed now.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import socket
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Collection, Iterable
from pathlib import Path

from localdet.paths import write_cache_file

TELL_PERIOD = 0.25  # seconds between a trial's looks for modules it imported since
# How long a trial keeps looking: its own imports (its module, the model's, the data's) come
# in its first seconds; the rest is told as it ends (a thread that looks for the whole trial
# wakes four times a second for nothing).
LOOK_SECONDS = 10.0


class InstalledPaths:
    """The interpreter's installed paths, and their state when this was made."""

    def __init__(self, roots: Iterable[str] | None = None) -> None:
        if roots is None:
            paths = sysconfig.get_paths()
            roots = (paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib"))
        self.roots = tuple(sorted({os.path.join(os.path.realpath(root), "") for root in roots}))
        self._stamps = self._stamp()

    def _stamp(self) -> list[int]:
        # A package installed, upgraded or removed adds or removes entries in site-packages
        # (its dist-info folder at the least), which changes the folder's modification time.
        stamps = []
        for root in self.roots:
            try:
                stamps.append(os.stat(root).st_mtime_ns)
            except OSError:
                stamps.append(-1)
        return stamps

    def changed(self) -> bool:
        return self._stamp() != self._stamps

    def modules_since(self, before: Collection[str]) -> list[str]:
        """The modules imported since `before` (names of sys.modules) whose files are in
        the installed paths, in the order they were imported."""
        names = []
        for name, module in list(sys.modules.items()):
            if name in before or name == "__main__":
                continue
            path = getattr(module, "__file__", None)
            if isinstance(path, str) and os.path.realpath(path).startswith(self.roots):
                names.append(name)
        return names


def tell_imports(teach: socket.socket, installed: InstalledPaths) -> Callable[[], None]:
    """In a forked trial, before it runs: tells the warm process over `teach` (a datagram
    socket), from a thread, what the trial imported from the installed paths since the last
    look, every TELL_PERIOD for its first LOOK_SECONDS; the call returned tells what is left
    (as the trial ends). Each module is told once; a list too long for a datagram is not
    told."""
    seen = set(sys.modules)  # looked at already: told, or not from the installed paths
    telling = threading.Lock()  # the thread and the trial's end

    def tell() -> None:
        with telling:
            now = list(sys.modules)
            names = installed.modules_since(seen)
            seen.update(now)
            if names:
                try:
                    teach.send(json.dumps(names).encode())
                except (OSError, ValueError):
                    pass  # the warm process has gone, or the list is too long for a datagram

    def tell_as_they_come() -> None:
        count, until = len(sys.modules), time.monotonic() + LOOK_SECONDS
        while time.monotonic() < until:
            time.sleep(TELL_PERIOD)
            if len(sys.modules) != count:
                count = len(sys.modules)
                tell()

    threading.Thread(target=tell_as_they_come, name="tell-imports", daemon=True).start()
    return tell


def import_quietly(names: Iterable[str]) -> int:
    """Import each module not yet imported, in order; one that fails is left for the trial
    to import (its error is the trial's to show). What a module prints or warns as it is
    imported goes to the warm process's log. Returns how many were imported."""
    imported = 0
    for name in names:
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
            imported += 1
        except (Exception, SystemExit):  # what a module does on import stays its own
            sys.modules.pop(name, None)
    return imported


class RememberedImports:
    """The modules the trials of this interpreter, Keras line and backend told warm processes
    they imported, kept as JSON in `folder` (the state folder's `warm-imports/`) for the warm
    processes of later daemons. A file that cannot be read or written is an empty list: it
    only costs the next first trial its imports."""

    def __init__(self, folder: Path) -> None:
        kind = (sys.executable, os.environ.get("TF_USE_LEGACY_KERAS", ""),
                os.environ.get("KERAS_BACKEND", ""))
        self.path = folder / f"{hashlib.sha256(repr(kind).encode()).hexdigest()[:16]}.json"
        self.names = self._read()

    def _read(self) -> list[str]:
        try:
            names = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return []
        return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []

    def add(self, names: Iterable[str]) -> None:
        """Keep these too. The file is written only when one is new, with what another warm
        process of the kind wrote meanwhile."""
        known = set(self.names)
        new = [name for name in dict.fromkeys(names) if name not in known]
        if new:
            self.names = list(dict.fromkeys(self._read() + self.names + new))
            write_cache_file(self.path, self.names)
