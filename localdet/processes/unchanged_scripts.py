"""Which trials run an unchanged script, and the command that runs one with localdet's
fit hook in front (determined/exec/unchanged_script.py).

An experiment's `entrypoint_script` whose files (the script and every model-folder module
it imports) import Keras (or TensorFlow) and never `determined` is an unchanged Keras
script: each `model.fit` it calls is trained by localdet. A script that imports
`determined` (`det.keras.init()`, the Core API) runs as it always did, and so do a script
without Keras and a batch job.

    argv = injected(argv, config, model_dir)   # argv itself unless it is such a script
"""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

from localdet.config import keras_choice, keras_packages, keras_uses

RUNNER = "determined.exec.unchanged_script"


def is_unchanged(model_dir: Path, config: dict) -> bool:
    """Whether the experiment's script imports Keras and never `determined`, in the files it
    reaches."""
    if config.get("entrypoint_kind") != "script" or not config.get("script_command"):
        return False
    return _unchanged(Path(model_dir), config["script_command"])


@functools.lru_cache(maxsize=256)  # a model folder is a snapshot: read once per experiment
def _unchanged(model_dir: Path, script_command: str) -> bool:
    config = {"entrypoint_kind": "script", "script_command": script_command}
    starts = keras_choice.entry_files(model_dir, config)
    if not starts:
        return False  # not a Python file of the folder: nothing to hook
    uses_keras = False
    for path in keras_choice.reachable(model_dir, starts):
        found = keras_uses.uses(path)
        if found is None or found.unparsed is not None:
            return False  # unreadable: run it as it is
        if any(_within(name, "determined") for name in found.absolute_imports):
            return False
        uses_keras = uses_keras or any(_within(name, package) for name in found.absolute_imports
                                       for package in KERAS_PACKAGES)
    # A script that imports no Keras has no fit to serve: it runs as it is, without the
    # hook's imports (TensorFlow's memory would count against its limit).
    return uses_keras


KERAS_PACKAGES = ("keras", "tf_keras", "tensorflow")


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def injected(argv: list[str], config: dict, model_dir: Path, job: bool = False) -> list[str]:
    """The trial's command with the fit hook in front, for an unchanged script run by this
    interpreter (`python FILE.py ...`, `python -m MODULE ...`); else `argv` as it is."""
    if job or len(argv) < 2 or argv[0] != sys.executable or argv[1:3] == ["-m", RUNNER]:
        return argv
    if not (argv[1].endswith(".py") or (argv[1] == "-m" and len(argv) > 2)):
        return argv
    if not is_unchanged(model_dir, config):
        return argv
    return [argv[0], "-m", RUNNER, *argv[1:]]


BACKEND_VAR = "KERAS_BACKEND"


def backend_environment(env: dict[str, str], config: dict, model_dir: Path) -> None:
    """The Keras backend an unchanged script picks itself, at its top, before it imports
    Keras (keras.io's examples do: `os.environ["KERAS_BACKEND"] = "jax"`), or in a module of
    its folder that it imports first (`import settings`), put into the trial's environment
    `env`, as running the script gives it: an assignment replaces the environment's,
    `os.environ.setdefault(...)` applies where the environment sets none. The hook imports
    Keras before the script's first line runs, and a warm process has imported it already, so
    the script's own line would come too late."""
    if not is_unchanged(model_dir, config):
        return
    starts = keras_choice.entry_files(Path(model_dir), config)
    chosen = _backend_set_by(starts[0], Path(model_dir)) if len(starts) == 1 else None
    if chosen is not None:
        value, replaces = chosen
        if replaces:
            env[BACKEND_VAR] = value
        else:
            env.setdefault(BACKEND_VAR, value)


Choice = tuple[str, bool]  # (backend, whether it replaces the environment's)


@functools.lru_cache(maxsize=256)
def _backend_set_by(path: Path, model_dir: Path) -> Choice | None:
    """The backend the file's top level sets before Keras is imported, following the
    imports of the model folder's own modules as they run; None where it sets none."""
    return _top_level_choice(path, model_dir, set(), None)[0]


def _top_level_choice(path: Path, model_dir: Path, imported: set[Path],
                      chosen: Choice | None) -> tuple[Choice | None, bool]:
    """(the choice in force, whether Keras is imported by then) once the file's top level
    has run, from `chosen` before it: its `os.environ["KERAS_BACKEND"] = "..."` and
    `os.environ.setdefault("KERAS_BACKEND", "...")` statements, and those of the folder's
    modules it imports (each once, as Python imports them), up to its first Keras import
    (Keras reads the variable once, as it is imported)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return chosen, False
    for statement in tree.body:
        if isinstance(statement, (ast.Import, ast.ImportFrom)):
            names = _imported(statement)
            if any(_within(name, package) for name in names for package in KERAS_PACKAGES):
                return chosen, True
            for module in _own_modules(statement, names, model_dir):
                if module in imported:
                    continue
                imported.add(module)
                chosen, keras_imported = _top_level_choice(module, model_dir, imported, chosen)
                if keras_imported:
                    return chosen, True
        elif isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target = statement.targets[0]
            if isinstance(target, ast.Subscript) and _is_environ(target.value) and \
                    _string(target.slice) == BACKEND_VAR and _string(statement.value):
                chosen = (_string(statement.value), True)
        elif isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
            call = statement.value
            if isinstance(call.func, ast.Attribute) and call.func.attr == "setdefault" and \
                    _is_environ(call.func.value) and len(call.args) == 2 and \
                    _string(call.args[0]) == BACKEND_VAR and _string(call.args[1]) and \
                    chosen is None:  # a value set before stays
                chosen = (_string(call.args[1]), False)
    return chosen, False


def _own_modules(statement: ast.Import | ast.ImportFrom, names: list[str],
                 model_dir: Path) -> list[Path]:
    """The model folder's files an import statement runs, in order (a `from package import
    module` runs the module's file too)."""
    if isinstance(statement, ast.ImportFrom) and names:
        names = names + [f"{names[0]}.{alias.name}" for alias in statement.names]
    files: list[Path] = []
    for name in names:
        files += [f.resolve() for f in keras_packages.module_files(model_dir, name)
                  if f.resolve() not in files]
    return files


def _imported(statement: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(statement, ast.ImportFrom):
        return [statement.module or ""] if not statement.level else []
    return [alias.name for alias in statement.names]


def _is_environ(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ" and \
        isinstance(node.value, ast.Name) and node.value.id == "os"


def _string(node: ast.expr) -> str:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ""
