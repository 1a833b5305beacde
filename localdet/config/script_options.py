"""What an unchanged Python script accepts, read with `ast` and never run: its command-line
options (`argparse`, `click`, `absl.flags`) and its module-level constants.

    found = discover(Path("train.py"))
    found.options["learning_rate"].flag      # "--learning-rate" (argparse's dest matched)
    found.constants["EPOCHS"].value          # 10, from `EPOCHS = 10` at module level
    found.imports_determined                 # True: it reads its hyperparameters itself

Guild AI reads scripts the same way; what is found here decides how localdet's
hyperparameters reach a script (localdet/config/script_hparams.py). Options are found
wherever they are defined in the file (inside a `parse_args()` function too); constants
only among the module's own top-level statements, and only literals (int, float, str,
bool), since only those can be replaced without changing what the script computes.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localdet.config import keras_choice, keras_uses

_NOTHING = object()  # a default or value that is not a literal


class ScriptError(ValueError):
    """The script cannot be read for its options; the message says why, in one sentence."""


@dataclass(frozen=True)
class ScriptOption:
    name: str                 # what the value is called inside the script: argparse's dest
    flag: str                 # how it is spelled on the command line: --learning-rate
    library: str              # argparse, click or absl
    line: int
    kind: str = "value"       # value, true (store_true), false (store_false), boolean
                              # (--x / --no-x), count, positional
    negative: str | None = None  # boolean: the spelling that sets False (--no-x, --nox)
    type: str | None = None   # int, float, str, bool when the definition says so
    default: Any = None
    choices: tuple | None = None

    def describe(self) -> str:
        return self.flag if self.kind != "positional" else f"{self.name} (positional)"


@dataclass(frozen=True)
class ScriptConstant:
    name: str
    value: Any
    line: int


@dataclass
class ScriptInterface:
    path: Path
    options: dict[str, ScriptOption] = field(default_factory=dict)  # by name
    positionals: list[ScriptOption] = field(default_factory=list)   # in definition order
    constants: dict[str, ScriptConstant] = field(default_factory=dict)
    # An option's long spellings (dashes as underscores) when they differ from its name:
    # `--batch-size` with dest='bs' takes the hyperparameter batch_size too.
    aliases: dict[str, str] = field(default_factory=dict)
    imports_determined: bool = False
    libraries: set[str] = field(default_factory=set)  # argparse, click, absl: those used

    def option(self, name: str) -> ScriptOption | None:
        """The option a hyperparameter of this name reaches, as argparse matches a dest."""
        key = normalized(name)
        return self.options.get(key) or self.options.get(self.aliases.get(key, ""))

    def defined_names(self) -> str:
        """What the script defines, for a message: its options, then its constants."""
        parts = []
        if self.options:
            parts.append("options " + ", ".join(o.describe() for o in self.options.values()))
        if self.constants:
            parts.append("module-level constants " + ", ".join(self.constants))
        return " and ".join(parts) if parts else "no command-line options and no " \
            "module-level constants"


def normalized(name: str) -> str:
    """A hyperparameter's or option's name as argparse makes a dest: dashes to underscores."""
    return name.replace("-", "_")


def parse_script(path: Path) -> ast.Module:
    """The script's syntax tree; ScriptError when it cannot be read or does not parse."""
    try:
        source = path.read_bytes()
    except OSError as error:
        raise ScriptError(f"cannot read {path.name} ({error.strerror or error})") from None
    try:
        return ast.parse(source, filename=str(path))
    except (SyntaxError, ValueError) as error:  # ValueError: null bytes
        line = getattr(error, "lineno", None)
        where = f" at line {line}" if line else ""
        reason = getattr(error, "msg", None) or str(error)
        raise ScriptError(f"{path.name} does not parse as Python ({reason}{where}), so its "
                          "options and constants cannot be read; fix the script") from None


def discover(path: Path, model_dir: Path | None = None) -> ScriptInterface:
    """The options and constants `path` defines, and whether it imports `determined`
    (itself or through modules of `model_dir`, the script's folder by default)."""
    tree = parse_script(path)
    found = ScriptInterface(path=path)
    _Finder(found).visit(tree)
    for positional in found.positionals:
        found.options.setdefault(positional.name, positional)
    found.constants = module_constants(tree)
    found.imports_determined = _imports_determined(path, model_dir or path.parent)
    return found


def module_constants(tree: ast.Module) -> dict[str, ScriptConstant]:
    """`NAME = literal` (or `NAME: type = literal`) among the module's top-level statements;
    a name assigned twice there keeps its first line (every assignment is replaced)."""
    constants: dict[str, ScriptConstant] = {}
    for node in tree.body:
        target, value = assigned_literal(node)
        if target is not None and target not in constants:
            constants[target] = ScriptConstant(target, value, node.lineno)
    return constants


def assigned_literal(node: ast.stmt) -> tuple[str | None, Any]:
    """(name, value) when `node` assigns an int, float, str or bool literal to one name."""
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target, value_node = node.targets[0], node.value
    elif isinstance(node, ast.AnnAssign) and node.value is not None and node.simple:
        target, value_node = node.target, node.value
    else:
        return None, None
    if not isinstance(target, ast.Name):
        return None, None
    value = _literal(value_node)
    if value is _NOTHING or value is None or not isinstance(value, (int, float, str)):
        return None, None
    return target.id, value


def _literal(node: ast.AST | None) -> Any:
    if node is None:
        return _NOTHING
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _NOTHING


def _dotted(node: ast.AST) -> str:
    """`click.option` for the call's function, `flags.DEFINE_float`, `add_argument`..."""
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else node.attr
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Call):  # parser.add_argument_group(...).add_argument(...)
        return _dotted(node.func) + "()"
    return ""


def _type_name(node: ast.AST | None) -> str | None:
    name = _dotted(node) if node is not None else ""
    last = name.rsplit(".", 1)[-1]
    return {"int": "int", "float": "float", "str": "str", "bool": "bool", "INT": "int",
            "FLOAT": "float", "STRING": "str", "BOOL": "bool"}.get(last)


def _strings(nodes: list[ast.expr]) -> list[str] | None:
    values = [node.value for node in nodes if isinstance(node, ast.Constant)]
    if len(values) != len(nodes) or not all(isinstance(v, str) for v in values):
        return None
    return values  # type: ignore[return-value]


class _Finder(ast.NodeVisitor):
    """Collects option definitions from calls and decorators anywhere in the file."""

    def __init__(self, found: ScriptInterface):
        self.found = found
        self.imported: set[str] = set()  # top-level names of imported modules
        self.click_names: dict[str, str] = {}  # `from click import option`: option -> option

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.imported.add(alias.name.split(".")[0])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        root = (node.module or "").split(".")[0]
        self.imported.add(root)
        if root == "click":
            for alias in node.names:
                self.click_names[alias.asname or alias.name] = alias.name

    def visit_Call(self, node: ast.Call) -> None:
        name = _dotted(node.func)
        last = name.rsplit(".", 1)[-1]
        if last == "add_argument" and "argparse" in self.imported | {"configargparse"}:
            self._argparse(node)
        elif last.startswith("DEFINE_"):
            self._absl(node, last.removeprefix("DEFINE_"))
        elif (kind := self._click_kind(name)) in ("option", "argument"):
            self._click(node, str(kind))
        self.generic_visit(node)

    def _click_kind(self, name: str) -> str | None:
        parts = name.split(".")
        if len(parts) == 2 and parts[0] == "click":
            return parts[1]
        if len(parts) == 1 and parts[0] in self.click_names:
            return self.click_names[parts[0]]
        return None

    def _add(self, option: ScriptOption) -> None:
        self.found.libraries.add(option.library)
        if option.kind == "positional":
            if all(p.name != option.name for p in self.found.positionals):
                self.found.positionals.append(option)
        else:
            self.found.options.setdefault(option.name, option)
            alias = normalized(option.flag.lstrip("-"))
            if option.flag.startswith("--") and alias != option.name:
                self.found.aliases.setdefault(alias, option.name)

    def _keywords(self, node: ast.Call) -> dict[str, ast.expr]:
        return {k.arg: k.value for k in node.keywords if k.arg is not None}

    def _argparse(self, node: ast.Call) -> None:
        spellings = _strings(node.args)
        if not spellings:
            return
        keywords = self._keywords(node)
        action = _literal(keywords.get("action"))
        if action is _NOTHING and "action" in keywords:  # argparse.BooleanOptionalAction
            action = _dotted(keywords["action"]).rsplit(".", 1)[-1]
        if action in ("help", "version", "store_const", "append_const", "extend_const"):
            return
        choices = _literal(keywords.get("choices"))
        default = _literal(keywords.get("default"))
        common: dict[str, Any] = {
            "library": "argparse", "line": node.lineno, "type": _type_name(keywords.get("type")),
            "default": None if default is _NOTHING else default,
            "choices": tuple(choices) if isinstance(choices, (list, tuple)) else None}
        dest = _literal(keywords.get("dest"))
        if not spellings[0].startswith("-"):  # a positional argument: its name is its dest
            self._add(ScriptOption(name=spellings[0], flag=spellings[0], kind="positional",
                                   **common))
            return
        longs = [s for s in spellings if s.startswith("--")]
        flag = longs[0] if longs else spellings[0]
        name = dest if isinstance(dest, str) else normalized(flag.lstrip("-"))
        kind, negative = "value", None
        if action == "store_true":
            kind, common["type"] = "true", "bool"
        elif action == "store_false":
            kind, common["type"] = "false", "bool"
        elif action == "count":
            kind, common["type"] = "count", "int"
        elif action == "BooleanOptionalAction":
            kind, common["type"] = "boolean", "bool"
            negative = "--no-" + flag[2:] if flag.startswith("--") else None
        self._add(ScriptOption(name=name, flag=flag, kind=kind, negative=negative, **common))

    def _absl(self, node: ast.Call, kind: str) -> None:
        keywords = self._keywords(node)
        name_node = node.args[0] if node.args else keywords.get("name")
        name = _literal(name_node)
        if not isinstance(name, str):
            return
        default_node = node.args[1] if len(node.args) > 1 else keywords.get("default")
        default = _literal(default_node)
        types = {"float": "float", "integer": "int", "string": "str", "bool": "bool",
                 "boolean": "bool", "enum": "str"}
        if kind not in types:
            return  # multi_*, list, flag objects: not one value
        choices = None
        if kind == "enum":
            values = _literal(node.args[2] if len(node.args) > 2
                              else keywords.get("enum_values"))
            choices = tuple(values) if isinstance(values, (list, tuple)) else None
        self._add(ScriptOption(
            name=name, flag=f"--{name}", library="absl", line=node.lineno,
            kind="boolean" if types[kind] == "bool" else "value",
            negative=f"--no{name}" if types[kind] == "bool" else None, type=types[kind],
            default=None if default is _NOTHING else default, choices=choices))

    def _click(self, node: ast.Call, which: str) -> None:
        declarations = _strings([a for a in node.args if isinstance(a, ast.Constant)])
        if not declarations:
            return
        keywords = self._keywords(node)
        default = _literal(keywords.get("default"))
        type_node = keywords.get("type")
        choices = None
        if isinstance(type_node, ast.Call) and _dotted(type_node.func).endswith("Choice") \
                and type_node.args:
            values = _literal(type_node.args[0])
            choices = tuple(values) if isinstance(values, (list, tuple)) else None
        common: dict[str, Any] = {
            "library": "click", "line": node.lineno,
            "type": _type_name(type_node) if not isinstance(type_node, ast.Call) else None,
            "default": None if default is _NOTHING else default, "choices": choices}
        if which == "argument":
            name = normalized(declarations[0]).lower()
            self._add(ScriptOption(name=name, flag=name, kind="positional", **common))
            return
        explicit = next((d for d in declarations if not d.startswith("-")), None)
        # A --x/--no-x declaration's first half names it; the first long flag, else the first.
        flags = [d.split("/")[0].strip() for d in declarations if d.startswith("-")]
        if not flags:
            return
        longest = next((f for f in flags if f.startswith("--")), flags[0])
        slashed = next((d for d in declarations if d.startswith("-") and "/" in d), None)
        name = explicit or normalized(longest.lstrip("-")).lower()
        is_flag = _literal(keywords.get("is_flag")) is True
        if slashed is not None:
            positive, _, negative = (part.strip() for part in slashed.partition("/"))
            self._add(ScriptOption(name=name, flag=positive, kind="boolean", negative=negative,
                                   **{**common, "type": "bool"}))
        elif is_flag:
            self._add(ScriptOption(name=name, flag=longest, kind="true",
                                   **{**common, "type": "bool"}))
        else:
            self._add(ScriptOption(name=name, flag=longest, **common))


def _imports_determined(path: Path, model_dir: Path) -> bool:
    """Whether the script, or a module of the model folder it imports (transitively),
    imports `determined`: the same reading that decides whether localdet trains the
    script's fits (localdet/processes/unchanged_scripts.py). A file that does not parse
    is passed over: the launch says what is wrong with it."""
    for reached in keras_choice.reachable(model_dir, [path]):
        found = keras_uses.uses(reached)
        if found is not None and found.unparsed is None and any(
                name == "determined" or name.startswith("determined.")
                for name in found.absolute_imports):
            return True
    return False
