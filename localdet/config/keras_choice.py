"""Which Keras a trial runs under: Keras 3 (TensorFlow's default) or Keras 2 (`tf-keras`).

The first of these rules that applies decides, and the reason names it (`rule NAME,
decided by SOURCE: ...`, see `reason`):

1. `tensorflow`: TensorFlow before 2.16 (the Horovod environment's 2.15) has Keras 2 only.
2. `config`: `TF_USE_LEGACY_KERAS` in `environment.environment_variables` (1: Keras 2,
   0: Keras 3), as in Determined.
3. `keras2_api` / `keras3_api`: a file the entrypoint reaches uses what only one line has
   (Keras 2's legacy optimizers, `keras.engine`, `tf_keras`; Keras 3's `keras.ops`,
   `keras.Layer`, `PyDataset`, ...). Keras 2 first: such code cannot run under Keras 3.
4. `package`: a package those files import (not the model folder's own), or one it imports,
   uses what only one line has (localdet/config/keras_packages.py).
5. `new_keras_api`: the code uses localdet's New Keras API (`det.keras.init()`), written
   for this TensorFlow: Keras 3.
6. `determined_api`: the code is written against Determined's APIs (a trial class, a
   `determined.launch` launcher, a script that uses `determined`: the Core API,
   `det.keras.DeterminedCallback`, ...): Keras 2, the line Determined ran all of it under.
7. `default`: anything else (a plain script): Keras 3, TensorFlow's own default.

Only files the entrypoint reaches count: its module or script, then the model folder's
modules they import, transitively (localdet/config/keras_uses.py reads each one).
"""

from __future__ import annotations

import functools
import re
import shlex
from pathlib import Path

from localdet.config import keras_packages, keras_uses
from localdet.config.keras_packages import module_files

TENSORFLOW, CONFIG, KERAS2_API, KERAS3_API, PACKAGE = (
    "tensorflow", "config", "keras2_api", "keras3_api", "package")
NEW_KERAS_API, DETERMINED_API, DEFAULT = "new_keras_api", "determined_api", "default"
RULES = (TENSORFLOW, CONFIG, KERAS2_API, KERAS3_API, PACKAGE, NEW_KERAS_API, DETERMINED_API,
         DEFAULT)
_REASON = re.compile(r"^rule (\w+)(?:, decided by (.+?))?: ")
_WHY_DETERMINED = ("code written for Determined's APIs runs under Keras 2, as Determined ran "
                   "it, unless it needs Keras 3")


def reason(rule: str, detail: str, source: str | None = None) -> str:
    """The recorded why: the rule's name, what decided (a file and line, a package, the
    config), and in words."""
    decided = f", decided by {source}" if source else ""
    return f"rule {rule}{decided}: {detail}"


def rule_of(why: str | None) -> tuple[str | None, str | None]:
    """(rule, source) of a reason `reason` wrote; (None, None) for one recorded before."""
    match = _REASON.match(why or "")
    if not match or match.group(1) not in RULES:
        return None, None
    return match.group(1), match.group(2)


def choose(model_dir: Path, environment: dict[str, str],
           config: dict | None = None) -> tuple[str, str]:
    """("keras2" | "keras3", why), for the launcher and the trial's record. `config`: the
    parsed experiment config, whose entrypoint says which files count (without it, every
    file in the model folder does, and no entrypoint form is known)."""
    version = tensorflow_version()
    if version and version < (2, 16):
        return "keras2", reason(TENSORFLOW, f"TensorFlow {'.'.join(map(str, version))} here "
                                            "has Keras 2 only")
    if "TF_USE_LEGACY_KERAS" in environment:
        value = environment["TF_USE_LEGACY_KERAS"]
        return ("keras2" if value == "1" else "keras3",
                reason(CONFIG, f"TF_USE_LEGACY_KERAS={value}", "environment.environment_variables"))
    model_dir = Path(model_dir)
    starts = entry_files(model_dir, config) if config is not None else None
    files = reachable(model_dir, starts) if starts else sorted(model_dir.rglob("*.py"))
    read: list[tuple[Path, keras_uses.FileUses]] = []
    for path in files:
        found_uses = keras_uses.uses(path)
        if found_uses is not None:
            read.append((path, found_uses))
    unparsed = [(path, found.unparsed) for path, found in read if found.unparsed is not None]

    def where(path: Path, use: keras_uses.Use) -> str:
        return f"{path.relative_to(model_dir).as_posix()}:{use.line}"

    for path, found in read:
        if found.keras2:
            note = (" (the file does not parse; found in its text)"
                    if found.unparsed is not None else "")
            return "keras2", reason(KERAS2_API, f"it uses {found.keras2.spelling}, which only "
                                                f"Keras 2 has{note}", where(path, found.keras2))
    for path, found in read:
        if found.keras3:
            return "keras3", reason(KERAS3_API, f"it uses {found.keras3.spelling}, which only "
                                                f"Keras 3 has", where(path, found.keras3))
    need = keras_packages.first_need(_imported_packages(model_dir, read),
                                     keras_packages.search_path(model_dir, environment))
    if need is not None:
        return need.line, reason(PACKAGE, need.describe(), need.named())
    note = ""
    if unparsed:
        places = ", ".join(f"{path.relative_to(model_dir).as_posix()} (line {line})"
                           for path, line in unparsed)
        note = f"; {places} does not parse, so its text was searched"
    for path, found in read:
        if found.new_keras:
            return "keras3", reason(NEW_KERAS_API, f"it uses {found.new_keras.spelling} "
                                                   f"(localdet's New Keras API), written for "
                                                   f"Keras 3{note}", where(path, found.new_keras))
    determined = _determined_entrypoint(config or {})
    if determined:
        return "keras2", reason(DETERMINED_API, f"{determined[1]}; {_WHY_DETERMINED}{note}",
                                determined[0])
    for path, found in read:
        if found.determined:
            return "keras2", reason(DETERMINED_API, f"it uses {found.determined.spelling}; "
                                                    f"{_WHY_DETERMINED}{note}",
                                    where(path, found.determined))
    return "keras3", reason(DEFAULT, "nothing the entrypoint reaches uses Determined's APIs or "
                                     f"what only one Keras line has{note}")


def default() -> tuple[str, str]:
    """The line most trials run under, and why: a trial class that uses nothing only one
    line has (the warm trial process the daemon keeps ready from its start is of it)."""
    version = tensorflow_version()
    if version and version < (2, 16):
        return "keras2", reason(TENSORFLOW, f"TensorFlow {'.'.join(map(str, version))} here "
                                            "has Keras 2 only")
    return "keras2", reason(DETERMINED_API, f"a TFKerasTrial; {_WHY_DETERMINED}")


def _determined_entrypoint(config: dict) -> tuple[str, str] | None:
    """(source, what) when the entrypoint itself is Determined's: a trial class, or a
    script started by one of Determined's launchers."""
    if config.get("entrypoint_kind") == "trial_class" and config.get("trial_class"):
        return config["trial_class"], "a TFKerasTrial"
    entrypoint = str(config.get("entrypoint") or "")
    launcher = re.search(r"determined\.launch\.\w+", entrypoint)
    if launcher:
        return launcher.group(0), "a script started by Determined's launcher"
    return None


def _imported_packages(model_dir: Path, read: list[tuple[Path, keras_uses.FileUses]]
                       ) -> list[tuple[str, str]]:
    """(dotted name, importing file) of every absolute import that is not the folder's own
    module, in the order the files were reached."""
    found = []
    for path, uses in read:
        for name in uses.absolute_imports:
            top = name.split(".")[0]
            if module_files(model_dir, top) or module_files(path.parent, top):
                continue
            found.append((name, path.relative_to(model_dir).as_posix()))
    return found


@functools.cache
def tensorflow_version() -> tuple[int, int] | None:
    """The installed TensorFlow's (major, minor), read without importing it."""
    from importlib import metadata  # here: `localdet status` reads reasons, never versions

    for distribution in ("tensorflow", "tensorflow-cpu"):
        try:
            major, minor = metadata.version(distribution).split(".")[:2]
            return int(major), int(minor)
        except (metadata.PackageNotFoundError, ValueError):
            continue
    return None


# -- which files the entrypoint reaches ---------------------------------------------------

def entry_files(model_dir: Path, config: dict) -> list[Path]:
    """The files the entrypoint runs first: the trial class's module (and its packages'
    `__init__.py`), or the script. Empty when the entrypoint names nothing in the folder."""
    if config.get("entrypoint_kind") == "trial_class" and config.get("trial_class"):
        return module_files(model_dir, config["trial_class"].partition(":")[0])
    try:
        argv = shlex.split(config.get("script_command") or "")
    except ValueError:
        return []
    for index, token in enumerate(argv):
        if token == "-m" and index + 1 < len(argv) and module_files(model_dir, argv[index + 1]):
            return module_files(model_dir, argv[index + 1])
        if token.endswith(".py") and (model_dir / token).is_file():
            return [model_dir / token]
    return []


def reachable(model_dir: Path, starts: list[Path]) -> list[Path]:
    """`starts` and every model-folder module they import, transitively, in that order."""
    seen: list[Path] = []
    pending = list(starts)
    root = model_dir.resolve()
    while pending:
        path = pending.pop(0).resolve()
        if path in seen or not path.is_file():
            continue
        seen.append(path)
        found = keras_uses.uses(path)
        if found is None or found.unparsed is not None:
            continue
        for name in _imported_modules(found.imports, path, root):
            for base in (root, path.parent):
                files = module_files(base, name)
                if files:
                    pending += files
                    break
    return [model_dir / p.relative_to(root) for p in seen if p.is_relative_to(root)]


def _imported_modules(imports: tuple[tuple[str, int], ...], path: Path,
                      model_dir: Path) -> list[str]:
    names = []
    for name, level in imports:
        if level:  # relative: from the importing file's package, up level-1
            package = path.parent
            for _ in range(level - 1):
                package = package.parent
            if not package.is_relative_to(model_dir):
                continue
            prefix = ".".join(package.relative_to(model_dir).parts)
            name = ".".join(p for p in (prefix, name) if p)
        if name:
            names.append(name)
    return names
