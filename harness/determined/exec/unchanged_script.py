"""A script that never imports `determined`, run as a localdet trial, with every
`model.fit` it calls trained by localdet (metrics, checkpoints, pause, exact resume):

    python -m determined.exec.unchanged_script train.py ARGS...     # as `python train.py ARGS...`
    python -m determined.exec.unchanged_script -m package.main ARGS...

The launcher puts this in front of an `entrypoint_script` whose files never import
`determined` (localdet/processes/unchanged_scripts.py), in a cold process and in a warm
one's fork alike. It prepares the trial as `det.keras.init()` would (reporter, seeded
generators), installs the fit hook (determined/keras/_unchanged.py), then runs the command
exactly as Python would. Outside a localdet trial (no LOCALDET_TRIAL_ID) it only runs it.

Keras's backend is chosen before the script runs (the runner for it is prepared first): by
KERAS_BACKEND in the environment, else by the script's own top-level
`os.environ["KERAS_BACKEND"] = "jax"` (or `os.environ.setdefault(...)`), read without
running it, else by Keras's own default.
"""

from __future__ import annotations

import ast
import os
import runpy
import sys
from typing import Optional, Tuple

from determined.core._reporting import TRIAL_ID_VAR

BACKEND_VAR = "KERAS_BACKEND"


def script_backend(path: str) -> Tuple[Optional[str], bool]:
    """The backend a script sets at its top level, read from its source, and whether it
    overrides the environment's: `os.environ["KERAS_BACKEND"] = "jax"` (it does) or
    `os.environ.setdefault("KERAS_BACKEND", "jax")` (it does not)."""
    try:
        tree = ast.parse(open(path, "rb").read())
    except (OSError, SyntaxError, ValueError):
        return None, False

    def is_environ(node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "environ"
                and isinstance(node.value, ast.Name) and node.value.id == "os")

    def text(node: Optional[ast.AST]) -> Optional[str]:
        return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) \
            else None

    found, overrides = None, False
    for statement in tree.body:
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target = statement.targets[0]
            if isinstance(target, ast.Subscript) and is_environ(target.value) \
                    and text(target.slice) == BACKEND_VAR:
                found, overrides = text(statement.value) or found, True
        elif isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
            call = statement.value
            if isinstance(call.func, ast.Attribute) and call.func.attr == "setdefault" \
                    and is_environ(call.func.value) and len(call.args) == 2 \
                    and text(call.args[0]) == BACKEND_VAR:
                found, overrides = text(call.args[1]) or found, False
    return found, overrides


def _choose_backend(script: Optional[str]) -> None:
    """KERAS_BACKEND from the script where the environment sets none; the log says where
    the script's choice cannot apply."""
    wanted, overrides = script_backend(script) if script else (None, False)
    if not wanted:
        return
    given = os.environ.get(BACKEND_VAR)
    keras = sys.modules.get("keras")
    loaded = keras.backend.backend() if keras is not None and hasattr(
        getattr(keras, "backend", None), "backend") else None
    if given is None and loaded is None:
        os.environ[BACKEND_VAR] = wanted
    elif (loaded or given) != wanted and (loaded or overrides):
        print(f"[localdet] {os.path.basename(script or '')} sets {BACKEND_VAR}={wanted}, but "
              f"this trial runs on {loaded or given} ("
              + ("its warm process imported Keras before the script ran"
                 if loaded else f"the environment sets {BACKEND_VAR}")
              + f"); set {BACKEND_VAR}={wanted} in the config's "
              "environment.environment_variables", flush=True)


def prepare(script: Optional[str] = None) -> None:
    """Serve this process's `Model.fit` calls with localdet's runner (a trial's only);
    `script`: the file about to run, whose own KERAS_BACKEND counts."""
    if not os.environ.get(TRIAL_ID_VAR):
        return
    _choose_backend(script)
    from determined.exec import keras_alias

    keras_alias.install()  # `import keras` is the trial's Keras line, as run_trial gives it
    from determined.keras import _unchanged
    from determined.keras._unchanged_fit import ScriptFits

    _unchanged.install(ScriptFits.start().fit)


def main() -> int:
    args = sys.argv[1:]
    if not args or (args[0] == "-m" and len(args) < 2):
        raise SystemExit("usage: python -m determined.exec.unchanged_script FILE.py [ARGS...] "
                         "| -m MODULE [ARGS...]")
    prepare(None if args[0] == "-m" else args[0])
    if args[0] == "-m":
        sys.argv = [args[1], *args[2:]]
        sys.path[0:1] = [os.getcwd()]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        return 0
    sys.argv = args
    # `python FILE.py` puts the file's folder first (a warm process's fork put the cwd).
    sys.path[0:1] = [os.path.dirname(os.path.abspath(args[0]))]
    runpy.run_path(args[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
