"""What the launcher modules share: split their arguments and start the script."""

from __future__ import annotations

import os
import re
import sys
from typing import List, NoReturn

_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")


def script_after_options(args: List[str], options_with_value: tuple = ()) -> List[str]:
    """The script of `[OPTIONS] [--] SCRIPT...`: everything after `--`, else after the
    leading options (those in `options_with_value` take the next argument)."""
    if "--" in args:
        return args[args.index("--") + 1:]
    rest = list(args)
    while rest and rest[0].startswith("-"):
        option = rest.pop(0)
        if option in options_with_value and "=" not in option and rest:
            rest.pop(0)
    return rest


def run(script: List[str], launcher: str) -> NoReturn:
    """Replace this process with the script (`python3` meaning this interpreter, so that
    `determined` stays importable)."""
    if not script:
        sys.exit(f"usage: python3 -m determined.launch.{launcher} [OPTIONS] [--] SCRIPT...: "
                 "give the script to run")
    argv = list(script)
    if _PYTHON.match(argv[0]):
        argv[0] = sys.executable
    try:
        os.execvp(argv[0], argv)
    except OSError as error:
        sys.exit(f"determined.launch.{launcher}: cannot start {script[0]!r}: {error.strerror}")
