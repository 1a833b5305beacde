"""The environment a model folder's startup-hook.sh provisions: the experiment's own, never
the user's. A virtual environment layered over localdet's interpreter, made once per hook
content (and per set of installed distributions) under the state root and reused:

    env = HookEnvironment.ensure(layout.home, hook_text)
    env.python        # .../startup-hooks/<key>/bin/python: the hook's and the trial's Python
    env.constraints   # name==version of every distribution localdet runs on, for pip

It is made `--without-pip` (0.06 s here, against about 8 s with pip) and sees localdet's own
site-packages through a `.pth` line (`site.addsitedir`, so their `.pth` files, editable
installs among them, count too): `--system-site-packages` would reach the base
interpreter's, not those of the virtual environment localdet usually runs in. Its own
site-packages come first, so what a hook installs is what the trial imports; the
constraints keep pip from replacing what localdet itself runs on. pip is localdet's own,
run by the environment's interpreter, so it installs into the environment.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

FOLDER = "startup-hooks"  # under the state root
_READY = "ready"  # written last: a folder without it is half made, and made again


def _failures_source() -> Path:
    """determined/exec/hook_failures.py, copied into each environment (see its docstring);
    found without importing `determined`."""
    spec = importlib.util.find_spec("determined")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the determined package is not importable")
    return Path(list(spec.submodule_search_locations)[0]) / "exec" / "hook_failures.py"


def constraints() -> str:
    """`name==version` of each distribution localdet's interpreter imports (the first one
    on its path where two share a name), sorted: a pip constraints file."""
    import importlib.metadata  # (60 ms of imports, and 300 ms of reading: see `_pinned`)

    try:
        from packaging.version import InvalidVersion, Version
    except ImportError:  # (pip's own copy is not for importing)
        Version, InvalidVersion = str, ValueError  # type: ignore[assignment,misc]
    pinned: dict[str, str] = {}
    for distribution in importlib.metadata.distributions():
        name, version = distribution.metadata["Name"], distribution.version
        if not name or not version:
            continue
        try:
            Version(version)
        except InvalidVersion:
            continue  # pip would refuse the whole file for it
        pinned.setdefault(re.sub(r"[-_.]+", "-", name).lower(), version)
    return "".join(f"{name}=={version}\n" for name, version in sorted(pinned.items()))


@dataclass(frozen=True)
class HookEnvironment:
    root: Path

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def python(self) -> Path:
        return self.bin / "python"

    @property
    def constraints(self) -> Path:
        return self.root / "constraints.txt"

    @property
    def lock(self) -> Path:
        """Held while one of its hooks runs pip (two trials may start at once)."""
        return self.root / "pip.lock"

    @classmethod
    def ensure(cls, home: Path, hook: bytes) -> "HookEnvironment":
        """The environment for this hook's content, made now if it is not there yet."""
        pinned = _pinned(home / FOLDER)
        failures = _failures_source().read_bytes()
        key = hashlib.sha256(b"\0".join([hook, sys.executable.encode(), sys.version.encode(),
                                         pinned.encode(), failures])).hexdigest()[:16]
        environment = cls(home / FOLDER / key)
        if (environment.root / _READY).is_file():
            return environment
        environment.root.parent.mkdir(parents=True, exist_ok=True)
        with open(environment.root.parent / f"{key}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another trial of the experiment may be making it
            if not (environment.root / _READY).is_file():
                environment._make(pinned, failures)
        return environment

    def _make(self, pinned: str, failures: bytes) -> None:
        shutil.rmtree(self.root, ignore_errors=True)  # half made by a process that died
        with_pip = importlib.util.find_spec("pip") is None  # then it needs its own
        subprocess.run([sys.executable, "-m", "venv", *([] if with_pip else ["--without-pip"]),
                        str(self.root)], check=True, stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        packages = self._site_packages()
        # Named so they run in this order: localdet's packages first, then the hook.
        (packages / "_localdet_0_base.pth").write_text("".join(
            f"import site; site.addsitedir({folder!r})\n" for folder in _base_site_folders()))
        (packages / "_localdet_hook_failures.py").write_bytes(failures)
        (packages / "_localdet_1_hook_failures.pth").write_text(
            "import _localdet_hook_failures; _localdet_hook_failures.install()\n")
        self.constraints.write_text(pinned)
        (self.root / _READY).write_text("")

    def _site_packages(self) -> Path:
        relative = Path(sysconfig.get_path("purelib")).relative_to(sys.prefix)
        return self.root / relative


def _base_site_folders() -> list[str]:
    """localdet's interpreter's site-packages (and the user's, where it reads them)."""
    folders = list(site.getsitepackages())
    if site.ENABLE_USER_SITE and site.getusersitepackages():
        folders.append(site.getusersitepackages())
    return [f for f in folders if os.path.isdir(f)]


def _pinned(folder: Path) -> str:
    """`constraints()`, kept in `folder` for as long as the folders on localdet's import
    path are unchanged: reading 170 distributions' metadata takes 0.3 s, which a launch
    need not pay. Installing or removing a distribution adds or removes an entry in its
    folder, which changes the folder's modification time."""
    seen = [sys.executable]
    for entry in sys.path:
        try:
            seen.append(f"{entry}\0{os.stat(entry or '.').st_mtime_ns}")
        except OSError:
            continue
    kept = folder / f"constraints-{hashlib.sha256(chr(1).join(seen).encode()).hexdigest()[:16]}.txt"
    try:
        return kept.read_text()
    except OSError:
        pass
    pinned = constraints()
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("constraints-*.txt"):  # of an earlier set of distributions
        old.unlink(missing_ok=True)
    partial = kept.with_name(f"{kept.name}.{os.getpid()}")
    partial.write_text(pinned)
    os.replace(partial, kept)  # whole or absent, for a launch beside this one
    return pinned
