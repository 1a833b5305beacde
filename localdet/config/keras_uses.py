"""What one Python file uses that decides its Keras line: API only Keras 2 has, API only
Keras 3 has, Determined's APIs (trial classes, the Core API, its Keras callback) and
localdet's New Keras API; and which modules it imports.

The code is read with `ast`, not searched as text: imports and attribute chains are resolved
through their aliases (`import tensorflow as tf`, `from tensorflow import keras`, ...), so
`from determined import keras; keras.InputData` is not Keras, and a comment or a string that
mentions `optimizers.legacy` changes nothing. A file is read once per version of it (its
path, size and modification time).
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

# Where Keras lives, under the names code imports it by. `tf_keras` is Keras 2 itself.
_KERAS_ROOTS = ("tensorflow.keras", "keras")
# Parts of the Keras API (relative to its root) that only the Keras 2 line has: checked
# against TensorFlow 2.21's `keras` 3 and `tf_keras` 2.21 (tests/test_keras_line.py checks
# the installed ones). (`keras.wrappers.scikit_learn` is in neither: Keras 2.12 removed it,
# so it does not choose a line.)
KERAS2_ONLY = ("optimizers.legacy", "optimizers.experimental", "engine", "src.engine",
               "layers.experimental", "layers.DenseFeatures", "estimator", "dtensor",
               "experimental", "utils.generic_utils", "premade")
# What only Keras 3 has, the same way: its new modules, the classes it exports at the top,
# and the members of shared modules that Keras 2 lacks and code reaches for.
KERAS3_ONLY = ("ops", "random", "tree", "config", "distribution", "dtype_policies",
               "quantizers", "visualization", "remat", "distillation", "Layer", "Loss",
               "Metric", "Optimizer", "Initializer", "Regularizer", "InputSpec", "KerasTensor",
               "Operation", "Function", "Variable", "StatelessScope", "SymbolicScope",
               "DTypePolicy", "name_scope", "device", "src.ops", "src.trainers", "src.tree",
               "src.backend.common", "utils.PyDataset", "saving.save_weights",
               "saving.load_weights", "layers.TorchModuleWrapper", "layers.JaxLayer",
               "layers.FlaxLayer", "layers.TFSMLayer", "layers.Pipeline",
               "layers.RMSNormalization", "layers.GroupQueryAttention", "optimizers.Lamb",
               "optimizers.LossScaleOptimizer", "callbacks.SwapEMAWeights",
               "callbacks.OrbaxCheckpoint", "losses.Dice", "losses.Tversky", "losses.CTC")
# Keras 2 internals a layer touches on itself (Keras 3's Layer has `_trainable_variables`):
# counted in a file that imports Keras or TensorFlow.
_KERAS2_LAYER_INTERNALS = ("_trainable_weights", "_non_trainable_weights")
# Determined's APIs (anything of `determined`: the Core API, its Keras callback, trial
# classes, the experimental client), whose code Determined ran under Keras 2; and localdet's
# own New Keras API, which is not Determined's.
DETERMINED_API = ("determined",)
NEW_KERAS_API = ("determined.keras.init",)
# For a file that does not parse: the Keras 2 names, searched as text.
_KERAS2_TEXT = re.compile(r"optimizers\.legacy|keras\.engine\b|\btf_keras\b|"
                          r"keras\.layers\.experimental|keras\.optimizers\.experimental")


@dataclass(frozen=True)
class Use:
    line: int
    spelling: str  # as written (whitespace folded, at most 80 characters)


@dataclass(frozen=True)
class FileUses:
    """The first use of each kind in one file (by line), and the modules it imports."""
    keras2: Use | None = None
    keras3: Use | None = None
    determined: Use | None = None
    new_keras: Use | None = None
    imports: tuple[tuple[str, int], ...] = ()  # (dotted name, level), in the file's order
    unparsed: int | str | None = None          # the line where parsing failed ("?": unknown)
    absolute_imports: tuple[str, ...] = field(default=())  # level-0 names only


def _under(dotted: str, root: str, parts: tuple[str, ...]) -> bool:
    if not dotted.startswith(root + "."):
        return False
    rest = dotted[len(root) + 1:]
    return any(rest == part or rest.startswith(part + ".") for part in parts)


def keras2_only(dotted: str) -> bool:
    """Whether a fully resolved dotted name is Keras 2 API: `tf_keras...`, or a Keras-2-only
    part under `keras` / `tensorflow.keras`."""
    if dotted == "tf_keras" or dotted.startswith("tf_keras."):
        return True
    return any(_under(dotted, root, KERAS2_ONLY) for root in _KERAS_ROOTS)


def keras3_only(dotted: str) -> bool:
    """Whether a fully resolved dotted name is API only Keras 3 has."""
    return any(_under(dotted, root, KERAS3_ONLY) for root in _KERAS_ROOTS)


def _named(dotted: str, names: tuple[str, ...]) -> bool:
    return any(dotted == name or dotted.startswith(name + ".") for name in names)


def uses(path: Path) -> FileUses | None:
    """What the file uses; None if it cannot be read."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return _uses_of(path, stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=4096)
def _uses_of(path: Path, size: int, mtime_ns: int) -> FileUses | None:
    try:
        data = path.read_bytes()
    except OSError:
        return None
    text = data.decode("utf-8", "replace")
    try:
        tree = ast.parse(data, filename=str(path))
    except (SyntaxError, ValueError) as error:
        match = _KERAS2_TEXT.search(text)
        found = Use(text.count("\n", 0, match.start()) + 1, match.group(0)) if match else None
        return FileUses(keras2=found, unparsed=getattr(error, "lineno", None) or "?")
    return _read(tree, text)


def _read(tree: ast.AST, text: str) -> FileUses:
    aliases = _aliases(tree)
    found: dict[str, list[Use]] = {"keras2": [], "keras3": [], "determined": [], "new": []}
    imports: list[tuple[str, int]] = []
    touches_keras = any(v.split(".")[0] in ("keras", "tensorflow", "tf_keras")
                        for v in aliases.values())
    internals: list[Use] = []

    def classify(dotted: str, node: ast.stmt | ast.expr) -> None:
        kind = ("keras2" if keras2_only(dotted) else "keras3" if keras3_only(dotted)
                else "new" if _named(dotted, NEW_KERAS_API)
                else "determined" if _named(dotted, DETERMINED_API) else None)
        if kind:
            found[kind].append(Use(node.lineno, _segment(text, node)))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                imports.append((alias.name, 0))
                classify(alias.name, node)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            imports.append((base, node.level))
            imports.extend((f"{base}.{a.name}" if base else a.name, node.level)
                           for a in node.names if a.name != "*")
            if not node.level and base:
                for name in [base, *(f"{base}.{a.name}" for a in node.names)]:
                    classify(name, node)
        elif isinstance(node, ast.Attribute):
            dotted = _resolve(node, aliases)
            if dotted:
                classify(dotted, node)
            elif node.attr in _KERAS2_LAYER_INTERNALS and touches_keras:
                internals.append(Use(node.lineno, _segment(text, node)))
    found["keras2"] += internals

    def first(kind: str) -> Use | None:  # ast.walk is breadth-first: the first in the file
        return min(found[kind], key=lambda use: use.line, default=None)

    return FileUses(keras2=first("keras2"), keras3=first("keras3"),
                    determined=first("determined"), new_keras=first("new"),
                    imports=tuple(imports),
                    absolute_imports=tuple(name for name, level in imports if not level and name))


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
