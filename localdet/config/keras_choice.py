"""Which Keras a trial runs under: Keras 3 (TensorFlow's default) or Keras 2 (`tf-keras`).

A config may choose with `TF_USE_LEGACY_KERAS` in `environment.environment_variables`.
Otherwise the code the entrypoint runs decides: a file that uses what only Keras 2 has (the
legacy optimizers Determined's examples used, `keras.engine`, `tf_keras`, ...) runs under
Keras 2, so Determined trials run unchanged; everything else runs under Keras 3. TensorFlow
before 2.16 (the Horovod environment's 2.15) has Keras 2 only.

The code is read with `ast`, not searched as text: imports and attribute chains are resolved
through their aliases (`import tensorflow as tf`, `from tensorflow import keras`, ...), so
`from determined import keras; keras.InputData` is not Keras, and a comment or a string that
mentions `optimizers.legacy` changes nothing. Only files the entrypoint reaches count: its
module or script, then the model folder's modules they import, transitively.
"""

from __future__ import annotations

import ast
import functools
import re
import shlex
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

# Where Keras lives, under the names code imports it by. `tf_keras` is Keras 2 itself.
_KERAS_ROOTS = ("tensorflow.keras", "keras")
# Parts of the Keras API (relative to its root) that only the Keras 2 line has: checked
# against TensorFlow 2.21's `keras` 3 and `tf_keras` 2.21. (`keras.wrappers.scikit_learn`
# is in neither: Keras 2.12 removed it, so it does not choose a line.)
_KERAS2_ONLY = ("optimizers.legacy", "optimizers.experimental", "engine", "src.engine",
                "layers.experimental", "layers.DenseFeatures", "estimator", "dtensor",
                "experimental", "utils.generic_utils", "premade")
# For a file that does not parse: the same names, searched as text.
_KERAS2_TEXT = re.compile(r"optimizers\.legacy|keras\.engine\b|\btf_keras\b|"
                          r"keras\.layers\.experimental|keras\.optimizers\.experimental")


def choose(model_dir: Path, environment: dict[str, str],
           config: dict | None = None) -> tuple[str, str]:
    """("keras2" | "keras3", why), for the launcher and the trial's record. `config`: the
    parsed experiment config, whose entrypoint says which files count (without it, every
    file in the model folder does)."""
    version = tensorflow_version()
    if version and version < (2, 16):
        return default()
    if "TF_USE_LEGACY_KERAS" in environment:
        line = "keras2" if environment["TF_USE_LEGACY_KERAS"] == "1" else "keras3"
        return line, "TF_USE_LEGACY_KERAS in environment.environment_variables"
    model_dir = Path(model_dir)
    starts = entry_files(model_dir, config) if config is not None else None
    files = reachable(model_dir, starts) if starts else sorted(model_dir.rglob("*.py"))
    unparsed: list[tuple[Path, int | str]] = []  # (file, line or "?")
    for source in files:
        found = _keras2_use(source, unparsed)
        if found:
            line_no, spelling = found
            where = source.relative_to(model_dir)
            note = " (the file does not parse; found in its text)" if unparsed and \
                unparsed[-1][0] == source else ""
            return "keras2", (f"{where}:{line_no} uses {spelling}, which only Keras 2 "
                              f"has{note}")
    if unparsed:
        places = ", ".join(f"{path.relative_to(model_dir)} (line {line})"
                           for path, line in unparsed)
        return "keras3", f"the default; {places} does not parse, so its text was searched"
    return default()


def default() -> tuple[str, str]:
    """The line of a model folder with no sign of Keras 2, and why."""
    version = tensorflow_version()
    if version and version < (2, 16):
        return "keras2", f"TensorFlow {'.'.join(map(str, version))} here has Keras 2 only"
    return "keras3", "the default"


@functools.cache
def tensorflow_version() -> tuple[int, int] | None:
    """The installed TensorFlow's (major, minor), read without importing it."""
    for distribution in ("tensorflow", "tensorflow-cpu"):
        try:
            major, minor = metadata.version(distribution).split(".")[:2]
            return int(major), int(minor)
        except (metadata.PackageNotFoundError, ValueError):
            continue
    return None


def keras2_only(dotted: str) -> bool:
    """Whether a fully resolved dotted name is Keras 2 API: `tf_keras...`, or a Keras-2-only
    part under `keras` / `tensorflow.keras`."""
    if dotted == "tf_keras" or dotted.startswith("tf_keras."):
        return True
    for root in _KERAS_ROOTS:
        if dotted.startswith(root + "."):
            rest = dotted[len(root) + 1:]
            return any(rest == part or rest.startswith(part + ".") for part in _KERAS2_ONLY)
    return False


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
            if not base.is_dir():  # a namespace package goes on; anything else stops here
                break
    return files


def reachable(model_dir: Path, starts: list[Path]) -> list[Path]:
    """`starts` and every model-folder module they import, transitively, in that order."""
    seen: list[Path] = []
    pending = list(starts)
    while pending:
        path = pending.pop(0).resolve()
        if path in seen or not path.is_file():
            continue
        seen.append(path)
        tree = _parse(path)
        if tree is None:
            continue
        roots = [model_dir.resolve(), path.parent]
        for name in _imported_modules(tree, path, model_dir.resolve()):
            for root in roots:
                found = module_files(root, name)
                if found:
                    pending += found
                    break
    return [model_dir / p.relative_to(model_dir.resolve()) for p in seen
            if p.is_relative_to(model_dir.resolve())]


def _imported_modules(tree: ast.AST, path: Path, model_dir: Path) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the importing file's package, up level-1
                package = path.parent
                for _ in range(node.level - 1):
                    package = package.parent
                if not package.is_relative_to(model_dir):
                    continue
                prefix = ".".join(package.relative_to(model_dir).parts)
                base = ".".join(p for p in (prefix, base) if p)
            # `from pkg import mod` may import the module pkg/mod.py.
            names += [base] if base else []
            names += [f"{base}.{a.name}" if base else a.name for a in node.names
                      if a.name != "*"]
    return names


# -- what a file uses -----------------------------------------------------------------------

@dataclass
class _Use:
    line: int
    spelling: str


def _parse(path: Path) -> ast.AST | None:
    try:
        return ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError, OSError):
        return None


def _keras2_use(path: Path, unparsed: list[tuple[Path, int | str]]) -> tuple[int, str] | None:
    """(line, spelling) of the first Keras-2-only use in the file, or None. A file that
    does not parse is searched as text, and noted in `unparsed`."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    try:
        tree = ast.parse(data, filename=str(path))
    except (SyntaxError, ValueError) as error:
        unparsed.append((path, getattr(error, "lineno", None) or "?"))
        text = data.decode("utf-8", "replace")
        match = _KERAS2_TEXT.search(text)
        if match:
            return text.count("\n", 0, match.start()) + 1, match.group(0)
        return None
    text = data.decode("utf-8", "replace")
    uses = _uses(tree, text)
    return (uses[0].line, uses[0].spelling) if uses else None


def _uses(tree: ast.AST, text: str) -> list[_Use]:
    aliases = _aliases(tree)
    uses = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if keras2_only(alias.name):
                    uses.append(_Use(node.lineno, _segment(text, node)))
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if keras2_only(node.module) or any(keras2_only(f"{node.module}.{a.name}")
                                               for a in node.names):
                uses.append(_Use(node.lineno, _segment(text, node)))
        elif isinstance(node, ast.Attribute):
            dotted = _resolve(node, aliases)
            if dotted and keras2_only(dotted):
                uses.append(_Use(node.lineno, _segment(text, node)))
    # ast.walk is breadth-first; report the first in the file.
    return sorted(uses, key=lambda use: use.line)


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Name -> the dotted module path it stands for, from the file's imports and plain
    assignments of one (`keras = tf.keras`). One map for the whole file: enough to tell
    Keras from anything else called `keras`."""
    aliases: dict[str, str] = {}
    assignments: list[tuple[ast.Name, ast.expr]] = []  # `name = value`
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:  # `import a.b` binds `a`
                    top = alias.name.split(".")[0]
                    aliases[top] = top
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            for alias in node.names:
                if alias.name != "*":
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name):
            assignments.append((node.targets[0], node.value))
    for target, value in assignments:  # after the imports, whatever their order in the file
        dotted = _resolve(value, aliases)
        if dotted and target.id not in aliases:
            aliases[target.id] = dotted
    return aliases


def _resolve(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """The dotted name an attribute chain (or a name) stands for, or None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in aliases:
        return None
    return ".".join([aliases[node.id], *reversed(parts)])


def _segment(text: str, node: ast.AST) -> str:
    segment = ast.get_source_segment(text, node) or ""
    segment = " ".join(segment.split())
    return segment if len(segment) <= 80 else segment[:77] + "..."
