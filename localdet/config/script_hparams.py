"""Hyperparameters for a script that never imports `determined`: each reaches it as one of
its own command-line options, else as one of its module-level constants, replaced before it
runs (localdet/config/script_options.py finds both without running the script).

    check(config, model_dir)        # at submit: ScriptHparamError names one it cannot take
    launch = for_launch(argv, config, model_dir, {"learning_rate": 0.01, "EPOCHS": 3})
    launch.argv      # [..., "train.py", "--learning-rate=0.01"]: options after the entrypoint's
    # constants: [..., "-m", "determined.exec.run_script", "--constants", JSON, "train.py", ...]
    launch.lines     # what the trial log says: which form each hyperparameter took

When it applies: the entrypoint is `python[3] FILE.py ...` and that file (or a module of the
model folder it imports) imports nothing of `determined`. A script that imports it reads
its hyperparameters through Determined's API, as before; any other command (`bash run.sh`,
`python3 -m pkg`) gets none, as before.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from determined.exec.run_script import CONSTANTS_OPTION
from localdet.config.schema import ConfigError
from localdet.config.script_options import (
    ScriptError,
    ScriptInterface,
    ScriptOption,
    discover,
)

# The trial side's runner, which replaces the constants in memory as it runs the script.
RUNNER_MODULE = "determined.exec.run_script"
_PYTHON = re.compile(r"^(.*/)?python(\d+(\.\d+)?)?$")
_INTERPRETER_OPTIONS = {"-u", "-O", "-OO", "-B", "-E", "-s", "-S", "-I", "-P", "-b", "-bb",
                        "-q", "-v", "-d", "-R"}


class ScriptHparamError(ConfigError):
    """A hyperparameter the script cannot take; one sentence naming it and the script."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "hyperparameters")


@dataclass
class ScriptLaunch:
    argv: list[str]
    lines: list[str] = field(default_factory=list)  # the trial log's: which form each took


def script_index(argv: list[str]) -> int | None:
    """Where the script's path is in a `python [OPTIONS] FILE.py ARGS...` command; None for
    any other command (a module run with -m, a shell script, code given with -c)."""
    if not argv or not _PYTHON.match(argv[0]):
        return None
    i = 1
    while i < len(argv) and (argv[i] in _INTERPRETER_OPTIONS or argv[i] in ("-X", "-W")):
        i += 2 if argv[i] in ("-X", "-W") else 1  # those two take a value of their own
    if i < len(argv) and argv[i].endswith(".py") and not argv[i].startswith("-"):
        return i
    return None


def _command(config: dict) -> list[str] | None:
    if config.get("entrypoint_kind") != "script" or not config.get("script_command"):
        return None
    try:
        return shlex.split(config["script_command"])
    except ValueError:
        return None


_CACHE: dict[tuple[str, int, int], ScriptInterface] = {}


def interface(config: dict, model_dir: Path) -> ScriptInterface | None:
    """What the config's script defines, when hyperparameters reach it this way: None
    for a trial class, another command, a script that is not in the model folder (its
    launch says so), or one that imports `determined`. ScriptError: it does not parse."""
    argv = _command(config)
    index = script_index(argv) if argv else None
    if argv is None or index is None:
        return None
    path = Path(model_dir) / argv[index]
    try:
        stat = path.stat()
    except OSError:
        return None
    if not path.is_file():
        return None
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    found = _CACHE.get(key)
    if found is None:
        found = _CACHE[key] = discover(path, Path(model_dir))
        if len(_CACHE) > 256:  # a long-lived daemon launching many experiments' scripts
            _CACHE.pop(next(iter(_CACHE)))
    return None if found.imports_determined else found


def _possible_values(spec: Any) -> list[Any]:
    if not isinstance(spec, dict):
        return [spec]
    if spec.get("type") == "const":
        return [spec.get("val")]
    if spec.get("type") == "categorical":
        return list(spec.get("vals") or [])
    if spec.get("type") == "int":
        return [spec.get("minval"), spec.get("maxval")]
    return []  # double and log ranges: numbers an option of type float takes


def _form(found: ScriptInterface, name: str) -> ScriptOption | str | None:
    """The option a hyperparameter goes to, else the constant's name, else None."""
    option = found.option(name)
    if option is not None:
        return option
    if name in found.constants:
        return name
    return None


def check(config: dict, model_dir: Path) -> None:
    """Raise ScriptHparamError (a ConfigError) for a hyperparameter of the config that the
    script defines neither as an option nor as a module-level constant, or cannot take."""
    space = config.get("hyperparameters") or {}
    if not space:
        return
    try:
        found = interface(config, Path(model_dir))
    except ScriptError as error:
        raise ScriptHparamError(f"{error} (it is given hyperparameters "
                                f"{', '.join(sorted(space))})") from None
    if found is None:
        return
    script = found.path.name
    positionals = []
    for name in space:
        spec = space[name]
        if isinstance(spec, dict) and "type" not in spec:
            raise ScriptHparamError(
                f"hyperparameter '{name}' is a nested group, which {script} (a script that "
                "never imports determined) cannot take as an option or constant; give each "
                "of its members as a hyperparameter of its own")
        form = _form(found, name)
        if form is None:
            raise ScriptHparamError(
                f"hyperparameter '{name}' is defined by {script} neither as a command-line "
                f"option nor as a module-level constant (it defines {found.defined_names()}); "
                "rename the hyperparameter or define it in the script")
        if isinstance(form, ScriptOption):
            _check_values(script, name, form, _possible_values(spec))
            if form.kind == "positional":
                positionals.append(form.name)
    defined = [p.name for p in found.positionals]
    if positionals and defined[:len(positionals)] != sorted(positionals, key=defined.index):
        missing = next(p for p in defined if p not in positionals)
        raise ScriptHparamError(
            f"{script}'s positional argument '{missing}' comes before "
            f"{', '.join(repr(p) for p in positionals)} but is not a hyperparameter; make it "
            "one too, or give the script options instead")


def _check_values(script: str, name: str, option: ScriptOption, values: list[Any]) -> None:
    for value in values:
        if option.kind in ("true", "false", "boolean") and not isinstance(value, bool):
            raise ScriptHparamError(
                f"hyperparameter '{name}' can be {value!r}, but {script}'s {option.flag} is "
                "a flag that is on or off; give it true or false")
        if option.kind == "count" and (not isinstance(value, int) or value < 0):
            raise ScriptHparamError(
                f"hyperparameter '{name}' can be {value!r}, but {script}'s {option.flag} "
                "counts how often it is given; give it a whole number, 0 or more")
        if option.choices is not None and value not in option.choices and \
                str(value) not in [str(c) for c in option.choices]:
            raise ScriptHparamError(
                f"hyperparameter '{name}' can be {value!r}, which {script}'s {option.flag} "
                f"does not accept (its choices: {', '.join(map(str, option.choices))})")


def shown_value(value: Any) -> str:
    """A value as a command-line argument: what the script's own parser turns back into it."""
    if isinstance(value, float):
        return repr(value)  # the shortest spelling that reads back as the same float
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


def _option_argv(option: ScriptOption, value: Any) -> list[str]:
    if option.kind == "positional":
        return [shown_value(value)]
    if option.kind == "true":
        return [option.flag] if value else []
    if option.kind == "false":
        return [] if value else [option.flag]
    if option.kind == "boolean":
        return [option.flag] if value else [option.negative or option.flag]
    if option.kind == "count":
        return [option.flag] * int(value)
    text = shown_value(value)
    # --flag=value: a negative number cannot be mistaken for an option
    return [f"{option.flag}={text}"] if option.flag.startswith("--") else [option.flag, text]


def for_launch(argv: list[str], config: dict, model_dir: Path,
               hparams: dict[str, Any]) -> ScriptLaunch:
    """The trial's argv and environment with its hyperparameters given to the script.
    Options go after the entrypoint's own arguments (the last spelling wins, so a
    hyperparameter overrides the entrypoint's); constants go to the runner. Unchanged when
    the hyperparameters reach the script otherwise (or not at all)."""
    if not hparams:
        return ScriptLaunch(list(argv))
    try:
        found = interface(config, Path(model_dir))
    except ScriptError as error:
        raise ScriptHparamError(str(error)) from None
    index = script_index(argv)
    if found is None or index is None:
        return ScriptLaunch(list(argv))
    script = found.path.name
    options: list[tuple[ScriptOption, list[str]]] = []
    positionals: list[tuple[ScriptOption, list[str]]] = []
    constants: dict[str, Any] = {}
    lines = []
    for name in sorted(hparams):
        value = hparams[name]
        form = _form(found, name)
        if form is None:
            raise ScriptHparamError(
                f"hyperparameter '{name}' is defined by {script} neither as a command-line "
                f"option nor as a module-level constant (it defines {found.defined_names()})")
        if isinstance(form, str):
            constant = found.constants[form]
            constants[form] = value
            lines.append(f"[localdet] hyperparameter {name}={value!r}: {script}'s module-level "
                         f"constant {form} (line {constant.line}, {constant.value!r} in the "
                         "file), replaced in memory before the script runs")
            continue
        given = _option_argv(form, value)
        (positionals if form.kind == "positional" else options).append((form, given))
        spelled = " ".join(given) if given else f"nothing ({form.flag} left off)"
        lines.append(f"[localdet] hyperparameter {name}={value!r}: {script}'s {form.library} "
                     f"option {form.describe()} (line {form.line}), given as {spelled}")
    order = {p.name: i for i, p in enumerate(found.positionals)}
    positionals.sort(key=lambda pair: order[pair[0].name])
    new_argv = [*argv]
    for _, given in options:
        new_argv.extend(given)
    for _, given in positionals:
        new_argv.extend(given)
    if constants:
        # `python -m determined.exec.run_script --constants JSON FILE.py ARGS`: the same
        # interpreter and options; the runner parses the file, replaces the constants and
        # runs it as __main__.
        new_argv = [*new_argv[:index], "-m", RUNNER_MODULE, CONSTANTS_OPTION,
                    json.dumps(constants), *new_argv[index:]]
    return ScriptLaunch(new_argv, lines)
