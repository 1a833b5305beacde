"""Run a script as `python FILE.py ARGS...` would, with some of its module-level constants
replaced: how localdet gives hyperparameters to a script that never imports `determined`
and has no command-line option for them.

    python -m determined.exec.run_script --constants '{"EPOCHS": 3}' train.py ARGS...

The file is never changed, nor copied: its syntax tree is parsed, each top-level
`NAME = literal` (or `NAME: type = literal`) of a named constant gets the new value, and the
tree is compiled under the file's own path. Line numbers are the file's, so tracebacks,
`inspect` and debuggers point at the user's own file and lines. The script runs as
`__main__` in a fresh module (pickling and `if __name__ == "__main__":` behave as usual),
with sys.argv and sys.path[0] as Python sets them for a script.
"""

from __future__ import annotations

import ast
import importlib.machinery
import json
import os
import sys
import types
from typing import Any

CONSTANTS_OPTION = "--constants"  # JSON: {name: value}; in argv, so each trial's own (a
# warm process's environment must match its trials', localdet/processes/warm_pool.py)


def _literal_target(node: ast.stmt) -> str | None:
    """The name a top-level statement assigns an int, float, str or bool literal to (the
    same statements localdet's discovery lists as constants)."""
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target, value = node.targets[0], node.value
    elif isinstance(node, ast.AnnAssign) and node.value is not None and node.simple:
        target, value = node.target, node.value
    else:
        return None
    if not isinstance(target, ast.Name):
        return None
    try:
        literal = ast.literal_eval(value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return target.id if isinstance(literal, (int, float, str)) else None


def _value_node(value: Any, at: ast.AST) -> ast.expr:
    node: ast.expr = ast.parse(repr(value), mode="eval").body
    for child in ast.walk(node):  # every piece of the new value sits on the old one's line
        ast.copy_location(child, at)
        if hasattr(child, "end_lineno"):
            child.end_lineno, child.end_col_offset = at.end_lineno, at.end_col_offset  # type: ignore[attr-defined]
    return node


def rewritten(source: bytes, path: str, constants: dict[str, Any]) -> types.CodeType:
    """The script's code with the constants replaced; SystemExit naming a constant the
    file no longer assigns at module level."""
    tree = ast.parse(source, filename=path)
    replaced = set()
    for node in tree.body:
        name = _literal_target(node)
        if name in constants and isinstance(node, (ast.Assign, ast.AnnAssign)) \
                and node.value is not None:
            node.value = _value_node(constants[name], node.value)
            replaced.add(name)
    missing = sorted(set(constants) - replaced)
    if missing:
        raise SystemExit(f"error: {os.path.basename(path)} no longer assigns "
                         f"{', '.join(missing)} a literal at module level, so localdet cannot "
                         "give it the hyperparameter; submit the experiment again")
    return compile(tree, path, "exec", dont_inherit=True)


def run(path: str, args: list[str], constants: dict[str, Any]) -> None:
    """Run the script at `path` as __main__ with `args`, the constants replaced."""
    path = os.path.abspath(path)
    with open(path, "rb") as file:
        code = rewritten(file.read(), path, constants)
    module = types.ModuleType("__main__")
    module.__dict__.update({
        "__file__": path, "__cached__": None, "__package__": None, "__spec__": None,
        "__loader__": importlib.machinery.SourceFileLoader("__main__", path),
        "__builtins__": __builtins__})
    sys.modules["__main__"] = module
    sys.argv = [path, *args]
    # `python FILE.py` puts the file's folder first; `-m` had put the working directory.
    if sys.path:
        sys.path[0] = os.path.dirname(path)
    else:
        sys.path.insert(0, os.path.dirname(path))
    exec(code, module.__dict__)


def main() -> None:
    args = sys.argv[1:]
    constants = {}
    if args[:1] == [CONSTANTS_OPTION] and len(args) >= 2:
        constants, args = json.loads(args[1]), args[2:]
    if not args:
        raise SystemExit("usage: python -m determined.exec.run_script [--constants JSON] "
                         "FILE.py [ARGS...]")
    run(args[0], args[1:], constants)


if __name__ == "__main__":
    main()
