"""A model folder's `startup-hook.sh`, run before the trial's processes as Determined ran it:
sourced by bash (`set -e`) in the trial's folder, with the trial's environment (its Python's
`python3` and `pip` first on PATH, as in Determined's container), so what it exports (and a
`cd`) holds for the trial's command, which then replaces this process.

    argv = wrapped(argv, model_dir)   # argv itself when the folder has no hook
    # python -P -m localdet.processes.startup_hook -- ARGV...

The hook's output goes to the trial's log first. If it fails, the trial does not start:
the log's last line is the failure mark (`determined.core._reporting.FAILURE_MARK`) with
one sentence naming the hook's exit code and its last output line, a failure before
training (localdet/processes/failures.py), which therefore fails fast when it repeats.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HOOK = "startup-hook.sh"
MODULE = "localdet.processes.startup_hook"

# After the hook: the folder it left the shell in, then the environment, NUL-separated, on
# a pipe of their own (the hook's output stays on stdout and stderr).
_SCRIPT = """set -e
source ./{hook}
printf '%s\\0' "$PWD" >&{fd}
env -0 >&{fd}
"""
_SHELL_ONLY = ("_", "SHLVL", "OLDPWD", "PWD")  # bash's own bookkeeping, not the hook's


def wrapped(argv: list[str], folder: Path) -> list[str]:
    """`argv` run after the folder's startup hook; `argv` itself when there is none."""
    if not (folder / HOOK).is_file():
        return argv
    return [sys.executable, "-P", "-m", MODULE, "--", *argv]


def unwrapped(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the hook's prefix, the command it runs); ([], argv) for a command without a hook."""
    prefix = [sys.executable, "-P", "-m", MODULE, "--"]
    if argv[1:5] == prefix[1:5]:
        return argv[:5], argv[5:]
    return [], argv


def hook_environment() -> dict[str, str]:
    """The trial's environment, with the trial's interpreter's folder first on PATH: in
    Determined's container `python3` and `pip` were the trial's, so a hook's `pip install`
    must reach the Python the trial runs in, not whichever is first on the daemon's PATH."""
    env = dict(os.environ)
    own = os.path.dirname(sys.executable)
    path = env.get("PATH", "")
    if path.split(os.pathsep)[:1] != [own]:
        env["PATH"] = os.pathsep.join([own, path]) if path else own
    return env


def run_hook() -> tuple[int, str, str | None, dict[str, str]]:
    """Source the hook in this folder: (exit code, its last output line, the folder and
    the environment it left; None and {} when it failed or exited the shell itself)."""
    read_end, write_end = os.pipe()
    state = bytearray()
    script = _SCRIPT.format(hook=HOOK, fd=write_end)
    process = subprocess.Popen(["bash", "-c", script], stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               pass_fds=(write_end,), env=hook_environment())
    os.close(write_end)
    last = ""
    out = sys.stdout.buffer
    pipe = process.stdout
    if pipe is None:  # never: stdout is a pipe
        raise RuntimeError("the startup hook's output pipe is missing")
    for line in iter(pipe.readline, b""):
        out.write(line)
        out.flush()
        text = line.decode("utf-8", "replace").strip()
        if text:
            last = text
    # The hook's output has ended; what it left comes once bash reaches the end.
    with os.fdopen(read_end, "rb") as left:
        state.extend(left.read())
    code = process.wait()
    if code != 0 or not state:
        return code, last, None, {}
    folder, *entries = bytes(state).decode("utf-8", "surrogateescape").split("\0")
    env = dict(entry.split("=", 1) for entry in entries if "=" in entry)
    for name in _SHELL_ONLY:
        env.pop(name, None)
    return code, last, folder, env


def failure_message(code: int, last: str) -> str:
    said = f"; its last output line: {last}" if last else " without printing anything"
    return f"{HOOK} failed with exit code {code}{said}"


def main(argv: list[str]) -> int:
    command = argv[argv.index("--") + 1:] if "--" in argv else argv
    if not command:
        print(f"usage: python -m {MODULE} -- COMMAND...", file=sys.stderr)
        return 2
    code, last, folder, env = run_hook()
    if code != 0:
        from determined.core._reporting import FAILURE_MARK

        message = failure_message(code, last)
        print(f"error: {message}", flush=True)
        print(FAILURE_MARK + json.dumps({"signature": message, "message": message,
                                         "stage": "setup", "trained": False}), flush=True)
        return 1
    if folder is not None:  # None: the hook ended the shell with `exit 0`; nothing changes
        os.chdir(folder)
        os.environ.clear()
        os.environ.update(env)
    sys.stdout.flush()
    try:
        os.execvp(command[0], command)
    except OSError as error:
        reason = ("there is no such program; install it, or fix the entrypoint"
                  if isinstance(error, FileNotFoundError) else error.strerror or str(error))
        print(f"error: cannot start '{command[0]}' from the entrypoint: {reason}", flush=True)
        return 127
    return 0  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
