"""A model folder's `startup-hook.sh`, run before the trial's processes as Determined ran it:
sourced by bash (`set -e`) in the trial's folder, with the trial's environment, so what it
exports (and a `cd`) holds for the trial's command, which then replaces this process.

    argv = wrapped(argv, model_dir)   # argv itself when the folder has no hook
    # python -P -m localdet.processes.startup_hook [--allow-system] [--strict] -- ARGV...

Determined ran hooks in a throwaway container; here they run in an environment of the
experiment's own (localdet/processes/hook_environment.py), whose `python3` is first on PATH
for the hook and runs the trial's command, so what the hook's `pip install`s add is
importable by the trial and never lands in the user's environment. Its install lines go
through localdet/processes/hook_commands.py: pip is held to the versions localdet runs on,
and lines that change the machine (`apt-get`, `yum`, `conda install`, `sudo ...`) are not
run unless the daemon allows them (`localdet daemon --allow-system-hooks`). Such a line that
fails or is refused is a warning in the trial's log and in `localdet status`, the trial goes
on, and an ImportError of what it was installing names it (determined/exec/hook_failures.py).
With `environment.startup_hook: strict`, any failing line ends the trial, as under Determined.

The hook's output goes to the trial's log first. If it fails (its own command fails, or it
exits), the trial does not start: the log's last line is the failure mark
(`determined.core._reporting.FAILURE_MARK`) with one sentence naming the hook's exit code and
its last output line, a failure before training (localdet/processes/failures.py), which
therefore fails fast when it repeats.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from localdet.processes import hook_commands
from localdet.processes.hook_environment import HookEnvironment

HOOK = "startup-hook.sh"
MODULE = "localdet.processes.startup_hook"
ALLOW_SYSTEM = "--allow-system"
STRICT = "--strict"
WARNING_EVENT = "startup_hook_warning"  # shown in the experiment's warnings

# Commands that change the machine rather than the experiment: not run unless allowed.
SYSTEM = ("apt-get", "apt", "aptitude", "add-apt-repository", "dpkg", "yum", "dnf",
          "microdnf", "rpm", "zypper", "apk", "pacman", "snap", "brew")
CONDA = ("conda", "mamba", "micromamba")  # their install lines only
_PYTHONS = ("python", "python3", f"python3.{sys.version_info.minor}")
_PIPS = ("pip", "pip3", f"pip3.{sys.version_info.minor}")

# Shell functions the hook's lines call instead of the commands of these names (the line
# that called is ${BASH_LINENO[0]}); `command NAME` is the real one.
_FUNCTIONS = """\
_localdet_commands() { "$_LOCALDET_HOOK_RUNNER" -P -m localdet.processes.hook_commands "$@"; }
_localdet_system() {
  local line=$1; shift
  if [ "$_LOCALDET_HOOK_SYSTEM" != 1 ]; then _localdet_commands refuse "$line" "$@"; return; fi
  local code=0
  command "$@" || code=$?
  if [ "$code" != 0 ]; then _localdet_commands failed "$line" "$code" "$@"; fi
}
"""
_PIP_FUNCTION = '{name}() {{ _localdet_commands pip "${{BASH_LINENO[0]}}" "$@"; }}\n'
_PYTHON_FUNCTION = """\
{name}() {{
  if [ "$1" = -m ] && [ "$2" = pip ]; then
    shift 2; _localdet_commands pip "${{BASH_LINENO[0]}}" "$@"
  else command {name} "$@"; fi
}}
"""
_SYSTEM_FUNCTION = '{name}() {{ _localdet_system "${{BASH_LINENO[0]}}" {name} "$@"; }}\n'
_CONDA_FUNCTION = """\
{name}() {{
  case "$1" in
    install|update|upgrade|remove|uninstall|create|env)
      _localdet_system "${{BASH_LINENO[0]}}" {name} "$@";;
    *) command {name} "$@";;
  esac
}}
"""
# `sudo pip install x` installs x into the experiment's environment; any other sudo line
# changes the machine.
_SUDO_FUNCTION = """\
sudo() {
  local line=${BASH_LINENO[0]} words=("$@")
  while [ $# -gt 0 ]; do
    case "$1" in -u|-g|-C|-D|-p|-r|-t|-U) shift 2;; -*) shift;; *) break;; esac
  done
  case "$1" in
    pip|pip3|pip3.*) shift; _localdet_commands pip "$line" "$@";;
    python|python3|python3.*)
      if [ "$2" = -m ] && [ "$3" = pip ]; then shift 3; _localdet_commands pip "$line" "$@"
      else _localdet_system "$line" sudo "${words[@]}"; fi;;
    *) _localdet_system "$line" sudo "${words[@]}";;
  esac
}
"""
# Programs of the same names first on PATH while the hook runs, for what the hook's own
# scripts run (they see no shell functions; "-": no line of the hook's own).
_PIP_PROGRAM = """#!/bin/sh
exec "$_LOCALDET_HOOK_RUNNER" -P -m localdet.processes.hook_commands pip - "$@"
"""
_SYSTEM_PROGRAM = """#!/bin/sh
exec "$_LOCALDET_HOOK_RUNNER" -P -m localdet.processes.hook_commands refuse - {name} "$@"
"""

# After the hook: the folder it left the shell in, then the environment, NUL-separated, on
# a pipe of their own (the hook's output stays on stdout and stderr).
_SCRIPT = """set -e
{functions}
source ./{hook}
printf '%s\\0' "$PWD" >&{fd}
env -0 >&{fd}
"""
_SHELL_ONLY = ("_", "SHLVL", "OLDPWD", "PWD")  # bash's own bookkeeping, not the hook's


def wrapped(argv: list[str], folder: Path, allow_system: bool = False,
            strict: bool = False) -> list[str]:
    """`argv` run after the folder's startup hook; `argv` itself when there is none.
    `allow_system`: run the hook's lines that change the machine (the daemon's
    --allow-system-hooks); `strict`: any failing line ends the trial."""
    if not (folder / HOOK).is_file():
        return argv
    options = [ALLOW_SYSTEM] * allow_system + [STRICT] * strict
    return [sys.executable, "-P", "-m", MODULE, *options, "--", *argv]


def unwrapped(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the hook's prefix, the command it runs); ([], argv) for a command without a hook."""
    if argv[1:4] == ["-P", "-m", MODULE] and "--" in argv:
        end = argv.index("--") + 1
        return argv[:end], argv[end:]
    return [], argv


def functions() -> str:
    """The shell functions the hook runs with (allowed, a system line runs through its
    function too: its failure is a warning)."""
    text = _FUNCTIONS + "".join(_PIP_FUNCTION.format(name=n) for n in _PIPS)
    text += "".join(_PYTHON_FUNCTION.format(name=n) for n in _PYTHONS) + _SUDO_FUNCTION
    text += "".join(_SYSTEM_FUNCTION.format(name=n) for n in SYSTEM)
    return text + "".join(_CONDA_FUNCTION.format(name=n) for n in CONDA)


def _programs(folder: Path, allow_system: bool) -> None:
    folder.mkdir()
    names = {name: _PIP_PROGRAM for name in _PIPS}
    if not allow_system:
        names.update((name, _SYSTEM_PROGRAM.format(name=name)) for name in (*SYSTEM, "sudo"))
    for name, text in names.items():
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)


def _with_path(first: list[str], path: str) -> str:
    kept = [p for p in path.split(os.pathsep) if p and p not in first]
    return os.pathsep.join([*first, *kept])


def hook_environment(environment: HookEnvironment, scratch: Path, allow_system: bool,
                     strict: bool) -> dict[str, str]:
    """The trial's environment for the hook: the experiment's environment's `python3`
    first on PATH (after the programs that stand in for pip and the system's package
    managers), pip held to localdet's versions, and the hook runner's settings."""
    env = dict(os.environ)
    env["PATH"] = _with_path([str(scratch / "bin"), str(environment.bin)], env.get("PATH", ""))
    env["VIRTUAL_ENV"] = str(environment.root)
    env.pop("PYTHONHOME", None)
    user_constraint = env.get("PIP_CONSTRAINT", "")
    # For pip run any other way than the hook's `pip` (which passes them with -c, keeping
    # those of the machine's pip configuration too).
    env["PIP_CONSTRAINT"] = " ".join(filter(None, [str(environment.constraints),
                                                   user_constraint]))
    env.update({hook_commands.ENV_VAR: str(environment.root),
                hook_commands.NOTES_VAR: str(scratch / "notes"),
                hook_commands.STRICT_VAR: "1" if strict else "",
                hook_commands.CONSTRAINT_VAR: user_constraint,
                "_LOCALDET_HOOK_SYSTEM": "1" if allow_system else "",
                "_LOCALDET_HOOK_RUNNER": sys.executable})
    return env


def run_hook(env: dict[str, str]) -> tuple[int, str, str | None, dict[str, str]]:
    """Source the hook in this folder: (exit code, its last output line, the folder and
    the environment it left; None and {} when it failed or exited the shell itself)."""
    read_end, write_end = os.pipe()
    state = bytearray()
    script = _SCRIPT.format(functions=functions(), hook=HOOK, fd=write_end)
    process = subprocess.Popen(["bash", "-c", script], stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               pass_fds=(write_end,), env=env)
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


def trial_environment(left: dict[str, str], hooked: dict[str, str], scratch: Path,
                      notes: list[dict]) -> dict[str, str]:
    """The environment the hook left, for the trial: the runner's settings and stand-in
    programs gone, PIP_CONSTRAINT as it was, and the failed lines for the trial to name."""
    env = {k: v for k, v in left.items() if not k.startswith("_LOCALDET_HOOK_")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p != str(scratch / "bin"))
    if env.get("PIP_CONSTRAINT") == hooked["PIP_CONSTRAINT"]:  # the hook left it as it was
        if hooked[hook_commands.CONSTRAINT_VAR]:
            env["PIP_CONSTRAINT"] = hooked[hook_commands.CONSTRAINT_VAR]
        else:
            env.pop("PIP_CONSTRAINT")
    from determined.exec.hook_failures import VAR

    if notes:
        env[VAR] = json.dumps(notes)
    return env


def read_notes(scratch: Path) -> list[dict]:
    try:
        text = (scratch / "notes").read_text()
    except OSError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def warning_text(note: dict) -> str:
    return f"{hook_commands.where(note['line'])}: `{note['command']}` {note['reason']}"


def record(notes: list[dict], env: dict[str, str]) -> None:
    """The warnings, for `localdet status`: events of the trial, written where the trial
    reports into the state folder (over HTTP, from another machine, the log alone has
    them). Never fails the trial."""
    from determined.core._reporting import HOME_VAR, REPORT_URL_VAR, TRIAL_ID_VAR

    if not notes or env.get(REPORT_URL_VAR) or not env.get(HOME_VAR) \
            or not env.get(TRIAL_ID_VAR, "").isdigit():
        return
    from localdet.paths import Layout
    from localdet.records.db import StateDB

    layout = Layout(Path(env[HOME_VAR]))
    if not layout.db.exists():
        return
    try:
        db = StateDB.open(layout.db)
        try:
            trial = db.trial(int(env[TRIAL_ID_VAR]))
            with db.atomic():
                for note in notes:
                    db.log_event(WARNING_EVENT, experiment_id=trial.experiment_id,
                                 trial_id=trial.id, message=warning_text(note),
                                 line=note["line"], command=note["command"])
        finally:
            db.close()
    except Exception as error:  # the log has the warnings
        print(f"[localdet] the startup hook's warnings could not be recorded: {error}",
              flush=True)


def failure_message(code: int, last: str) -> str:
    said = f"; its last output line: {last}" if last else " without printing anything"
    return f"{HOOK} failed with exit code {code}{said}"


def _fail(message: str) -> int:
    from determined.core._reporting import FAILURE_MARK

    print(f"error: {message}", flush=True)
    print(FAILURE_MARK + json.dumps({"signature": message, "message": message,
                                     "stage": "setup", "trained": False}), flush=True)
    return 1


def main(argv: list[str]) -> int:
    options, command = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) \
        if "--" in argv else ([], argv)
    if not command:
        print(f"usage: python -m {MODULE} [{ALLOW_SYSTEM}] [{STRICT}] -- COMMAND...",
              file=sys.stderr)
        return 2
    allow_system, strict = ALLOW_SYSTEM in options, STRICT in options
    from localdet.paths import default_home

    try:
        environment = HookEnvironment.ensure(default_home(), Path(HOOK).read_bytes())
    except (OSError, subprocess.CalledProcessError) as error:
        said = getattr(error, "stderr", None) or str(error)
        said = said.decode("utf-8", "replace") if isinstance(said, bytes) else said
        return _fail(f"the experiment's environment for {HOOK} could not be made: "
                     f"{said.strip().splitlines()[-1] if said.strip() else error}")
    scratch = Path(tempfile.mkdtemp(prefix="localdet-hook-"))
    try:
        _programs(scratch / "bin", allow_system)
        hooked = hook_environment(environment, scratch, allow_system, strict)
        code, last, folder, left = run_hook(hooked)
        notes = read_notes(scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    record(notes, hooked)
    if code != 0:
        return _fail(failure_message(code, last))
    if notes:
        print(f"[localdet] {HOOK}: {len(notes)} of its lines failed or were not run (the "
              "warnings above); the trial goes on without them", flush=True)
    if folder is not None:
        os.chdir(folder)
    else:  # the hook ended the shell with `exit 0`: its own changes are unknown
        left = hooked
    os.environ.clear()
    os.environ.update(trial_environment(left, hooked, scratch, notes))
    # The trial's Python is the experiment's environment's, where the hook installed.
    command = [str(environment.python) if part == sys.executable else part for part in command]
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
