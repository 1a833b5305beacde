"""The Keras line the packages a model folder imports need: a layer package written against
Keras 2's internals needs Keras 2 as much as code in the folder that uses them.

Imports that are not the model folder's own are found as the trial's interpreter would find
them (the folder, then `PYTHONPATH`, then this interpreter's path) with importlib's path
finder, which reads folders and never imports anything. A package's files are read with the
same check as the folder's (localdet/config/keras_uses.py), from the modules imported
through to the modules of the same package they import, and on to the packages those
import, within bounds: Keras, TensorFlow, NumPy and the like are not read (they are the
lines themselves, or need neither), nor the standard library; at most `MAX_FILES` files of a
package, each under `MAX_BYTES`, `MAX_DEPTH` packages deep, `MAX_PACKAGES` in all. A
package's answer is kept per version: an installed one's version, a folder's files' times.

A package that uses what only one line has needs that line; one that uses what only Keras
2 has and what only Keras 3 has checks which line it runs under, and decides nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.machinery
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from localdet.config import keras_uses

MAX_FILES = 200
MAX_BYTES = 2_000_000
MAX_DEPTH = 2
MAX_PACKAGES = 40
# Read by no one: the Keras lines themselves, what they are built on, localdet's own, and
# widely used packages that need neither line.
NOT_READ = frozenset({
    "tensorflow", "tf_keras", "keras", "tensorboard", "tensorflow_estimator",
    "tensorflow_io_gcs_filesystem", "tensorflow_datasets", "tensorflow_probability", "numpy",
    "scipy", "pandas", "sklearn", "h5py", "ml_dtypes", "absl", "google", "grpc", "protobuf",
    "optree", "rich", "namex", "determined", "localdet", "yaml", "PIL", "matplotlib",
    "torch", "jax", "jaxlib", "flax", "horovod", "ray", "requests", "urllib3", "tqdm", "six",
    "attr", "attrs", "click", "typing_extensions", "packaging", "setuptools", "pkg_resources",
    "wrapt", "termcolor", "opt_einsum", "gast", "astunparse", "flatbuffers", "pytest",
    "_pytest", "IPython", "psutil", "filelock", "boto3", "botocore", "cloudpickle",
})


@dataclass(frozen=True)
class PackageUse:
    """A package's first use of what only one line has."""
    package: str       # its top-level name
    version: str | None
    file: str          # relative to the package's folder's parent (`multi_head/layer.py`)
    use: keras_uses.Use
    line: str          # "keras2" | "keras3"
    imported_by: str = ""  # the folder's file that imports it ("a.py imports pkg, which")

    def describe(self) -> str:
        only = "Keras 2" if self.line == "keras2" else "Keras 3"
        return (f"{self.imported_by} imports {self.named()}, whose {self.file}:{self.use.line} "
                f"uses {self.use.spelling}, which only {only} has")

    def named(self) -> str:
        return f"{self.package} {self.version}" if self.version else self.package


def search_path(model_dir: Path, environment: dict[str, str]) -> list[str]:
    """Where the trial's interpreter looks for modules: its folder, `PYTHONPATH` (the
    config's, else the daemon's, as the launcher passes it on), then this interpreter's."""
    python_path = environment.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    entries = [str(model_dir), *(p for p in python_path.split(os.pathsep) if p)]
    entries += [p for p in sys.path if p and Path(p).resolve() != Path.cwd().resolve()]
    return list(dict.fromkeys(entries))


def first_need(imports: list[tuple[str, str]], path: list[str]) -> PackageUse | None:
    """The first package (in the order given: (dotted name, where it is imported)) that
    needs one line, at depth 1, then the packages those import, and so on."""
    importlib.machinery.PathFinder.invalidate_caches()  # a package installed since
    seen: set[str] = set()
    level = _group(imports)
    for _ in range(MAX_DEPTH):
        following: list[tuple[str, str]] = []
        for top, (names, via) in level.items():
            if top in seen or len(seen) >= MAX_PACKAGES:
                continue
            seen.add(top)
            answer = _package(top, tuple(sorted(set(names))), tuple(path))
            if answer is None:
                continue
            need, imported = answer
            if need is not None:
                return dataclasses.replace(need, imported_by=via)
            following += [(name, f"{via} imports {top}, which") for name in imported]
        level = {top: found for top, found in _group(following).items() if top not in seen}
    return None


def _group(imports: list[tuple[str, str]]) -> dict[str, tuple[list[str], str]]:
    """Top-level name -> (the dotted names imported of it, who imports it first)."""
    grouped: dict[str, tuple[list[str], str]] = {}
    for name, via in imports:
        grouped.setdefault(name.split(".")[0], ([], via))[0].append(name)
    return grouped


def readable(top: str) -> bool:
    return bool(top) and top not in NOT_READ and top not in sys.stdlib_module_names \
        and not top.startswith("_")


def _package(top: str, names: tuple[str, ...], path: tuple[str, ...]
             ) -> tuple[PackageUse | None, tuple[str, ...]] | None:
    """(its need, the other packages it imports), or None when it is not found or not read."""
    if not readable(top):
        return None
    try:
        spec = importlib.machinery.PathFinder.find_spec(top, list(path))
    except (ImportError, ValueError, OSError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None  # not found, a namespace package, or compiled
    origin = Path(spec.origin)
    is_package = bool(spec.submodule_search_locations)
    version = _version(top)
    try:
        changed = _changed(origin.parent if is_package else origin, version is None)
    except OSError:
        return None
    return _read(top, names, str(origin), is_package, version, changed)


def _version(top: str) -> str | None:
    from importlib import metadata  # here: importing this module stays cheap

    try:
        return metadata.version(top)
    except (metadata.PackageNotFoundError, ValueError):
        return None


def _changed(where: Path, every_file: bool) -> int:
    """When the package last changed, as far as its answer depends on it: an installed
    version, its origin's time; a folder on `PYTHONPATH` (no version to go by), the newest
    of its first files' times."""
    if not every_file or where.is_file():
        return (where / "__init__.py" if where.is_dir() else where).stat().st_mtime_ns
    newest = 0
    for count, file in enumerate(where.rglob("*.py")):
        if count >= MAX_FILES * 5:
            break
        newest = max(newest, file.stat().st_mtime_ns)
    return newest


@functools.lru_cache(maxsize=512)
def _read(top: str, names: tuple[str, ...], origin: str, is_package: bool,
          version: str | None, changed: int) -> tuple[PackageUse | None, tuple[str, ...]]:
    """One version of a package: the files `names` import and the package's modules they
    import, read in that order, bounded."""
    root = Path(origin).parent.parent if is_package else Path(origin).parent
    pending = [f for name in names for f in module_files(root, name)] or [Path(origin)]
    seen: list[Path] = []
    others: list[str] = []
    keras2: tuple[Path, keras_uses.Use] | None = None
    keras3: tuple[Path, keras_uses.Use] | None = None
    while pending and len(seen) < MAX_FILES:
        file = pending.pop(0)
        if file in seen or not file.is_file():
            continue
        seen.append(file)
        try:
            if file.stat().st_size > MAX_BYTES:
                continue
        except OSError:
            continue
        found = keras_uses.uses(file)
        if found is None:
            continue
        if found.keras2 and keras2 is None:
            keras2 = (file, found.keras2)
        if found.keras3 and keras3 is None:
            keras3 = (file, found.keras3)
        for name, level in found.imports:
            dotted = _absolute(name, level, file, root)
            if dotted is None:
                continue
            if dotted.split(".")[0] == top:
                pending += module_files(root, dotted)
            elif readable(dotted.split(".")[0]):
                others.append(dotted)
    if keras2 and keras3:  # it checks which line it runs under
        return None, tuple(dict.fromkeys(others))
    need = None
    for line, found_use in (("keras2", keras2), ("keras3", keras3)):
        if found_use:
            file, use = found_use
            need = PackageUse(top, version, file.relative_to(root).as_posix(), use, line)
    return need, tuple(dict.fromkeys(others))


def _absolute(name: str, level: int, file: Path, root: Path) -> str | None:
    if not level:
        return name or None
    package = file.parent
    for _ in range(level - 1):
        package = package.parent
    if not package.is_relative_to(root):
        return None
    prefix = ".".join(package.relative_to(root).parts)
    return ".".join(p for p in (prefix, name) if p) or None


def module_files(root: Path, module: str) -> list[Path]:
    """The files importing `module` from `root` runs: its packages' `__init__.py`s, then
    the module's own file."""
    parts = [p for p in module.split(".") if p]
    files = []
    for depth in range(1, len(parts) + 1):
        base = root.joinpath(*parts[:depth])
        for candidate in (base / "__init__.py", base.with_suffix(".py")):
            if candidate.is_file():
                files.append(candidate)
                break
        else:
            if not base.is_dir():
                break
    return files
