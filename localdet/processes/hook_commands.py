"""What a startup-hook.sh's install lines do here (the hook's shell calls this for them):

    python -P -m localdet.processes.hook_commands pip LINE ARGS...    # pip, into the hook env
    python -P -m localdet.processes.hook_commands refuse LINE CMD...  # a system line, not run
    python -P -m localdet.processes.hook_commands failed LINE CODE CMD...  # one that failed

`pip` runs localdet's pip with the hook environment's interpreter (so it installs there),
held to the versions localdet runs on (its constraints file, added to any the machine's pip
configuration names), one hook at a time per environment. A line that fails (no release of
a pinned version for this Python, a conflict with those versions, no network) or is refused
is a warning at its place in the log and a note for the hook's runner, and the hook goes on;
with `environment.startup_hook: strict` it ends the hook as under Determined. Where a line
asking for several requirements fails, each is tried alone, so one that cannot be had does
not keep the others out.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from localdet.processes.hook_environment import HookEnvironment

HOOK = "startup-hook.sh"
FLAG = "--allow-system-hooks"
# The hook runner's settings for the hook's shell (removed from the trial's environment).
ENV_VAR = "_LOCALDET_HOOK_ENV"        # the hook environment's folder
NOTES_VAR = "_LOCALDET_HOOK_NOTES"    # where the notes go, one JSON object a line
STRICT_VAR = "_LOCALDET_HOOK_STRICT"  # "1": a failing line ends the hook
CONSTRAINT_VAR = "_LOCALDET_HOOK_USER_CONSTRAINT"  # PIP_CONSTRAINT as the hook found it

# pip's options that take a value (the others are flags): what is left are requirements.
_VALUED = {"-r", "--requirement", "-c", "--constraint", "-e", "--editable", "-t", "--target",
           "--platform", "--python-version", "--implementation", "--abi", "--root",
           "--prefix", "--src", "--upgrade-strategy", "-C", "--config-settings",
           "--global-option", "--no-binary", "--only-binary", "--progress-bar",
           "--root-user-action", "--report", "-i", "--index-url", "--extra-index-url",
           "-f", "--find-links", "--log", "--proxy", "--retries", "--timeout",
           "--exists-action", "--trusted-host", "--cert", "--client-cert", "--cache-dir",
           "--keyring-provider", "--python", "--group"}
_NAME = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*([<>=!~;@ ]|$)")


def where(line: str | int) -> str:
    """`startup-hook.sh line 3`, or for a line of a script the hook ran (line "-"), that."""
    return f"{HOOK} line {line}" if str(line).isdigit() else f"a script {HOOK} ran"


def note(kind: str, line: str, command: str, reason: str,
         packages: list[str] | None = None) -> None:
    """Tell the log (now, at the line's place) and the hook's runner (its notes file)."""
    strict = os.environ.get(STRICT_VAR) == "1"
    goes_on = "" if strict else "; the hook goes on"
    print(f"[localdet] warning: {where(line)}: `{command}` {reason}{goes_on}",
          file=sys.stderr, flush=True)
    path = os.environ.get(NOTES_VAR)
    if path:
        with open(path, "a") as notes:
            notes.write(json.dumps({"kind": kind, "line": int(line) if line.isdigit() else line,
                                    "command": command, "reason": reason,
                                    "packages": packages or []}) + "\n")


def requirement_name(text: str) -> str | None:
    """The distribution a requirement names (`numpy==1.19`, `tf-models[x]>=2`); None for a
    folder, a file or a URL."""
    if "/" in text or text.startswith(".") or text.endswith((".whl", ".zip", ".tar.gz")):
        return None
    match = _NAME.match(text.strip())
    return match.group(1) if match else None


def _split(args: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(options, requirements, requirement files) of a `pip install`'s arguments."""
    options: list[str] = []
    requirements: list[str] = []
    files: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in _VALUED and i + 1 < len(args):
            if arg in ("-r", "--requirement"):
                files.append(args[i + 1])
            else:
                options += [arg, args[i + 1]]
            i += 2
            continue
        if arg.startswith("--requirement="):
            files.append(arg.split("=", 1)[1])
        elif arg.startswith("-r") and len(arg) > 2:
            files.append(arg[2:])
        elif arg.startswith("-"):
            options.append(arg)
        else:
            requirements.append(arg)
        i += 1
    return options, requirements, files


def _file_requirements(path: str) -> list[str]:
    """A requirements file's requirements (comments, blank lines and options left out)."""
    try:
        text = Path(path).read_text()
    except OSError:
        return []
    lines = (line.split(" #")[0].strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith(("#", "-"))]


def _run(python: Path, args: list[str]) -> tuple[int, list[str]]:
    """Run pip with these arguments, its output passed on as it comes: (exit code, its
    output lines)."""
    env = dict(os.environ)
    if env.get(CONSTRAINT_VAR):  # the hook's PIP_CONSTRAINT is ours plus this
        env["PIP_CONSTRAINT"] = env[CONSTRAINT_VAR]
    else:  # ours comes with -c, so the machine's pip configuration keeps its own
        env.pop("PIP_CONSTRAINT", None)
    env.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    process = subprocess.Popen([str(python), "-m", "pip", *args], env=env,
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
    said: list[str] = []
    assert process.stdout is not None
    for raw in iter(process.stdout.readline, b""):
        sys.stdout.buffer.write(raw)
        sys.stdout.flush()
        said.append(raw.decode("utf-8", "replace").rstrip())
    return process.wait(), said


def reason(said: list[str], code: int) -> str:
    """Why pip failed, in one clause, from what it printed."""
    held = [m.group(1) for line in said
            for m in [re.search(r"The user requested \(constraint\) (\S+)", line)] if m]
    if held:
        return ("cannot be installed: it conflicts with the versions localdet runs on ("
                + ", ".join(dict.fromkeys(held)) + ")")
    errors = [line.removeprefix("ERROR: ").strip() for line in said if line.startswith("ERROR:")]
    offline = any(re.search(r"NewConnectionError|Network is unreachable|Temporary failure in "
                            r"name resolution|Failed to establish a new connection", line)
                  for line in said)
    if offline and not errors:
        return "failed: no network"
    return f"failed: {errors[-1]}" if errors else f"failed with exit code {code}"


def pip(line: str, args: list[str]) -> int:
    environment = HookEnvironment(Path(os.environ[ENV_VAR]))
    command = " ".join(["pip", *args])
    if args and args[0] == "install":
        # A hook's `--user` meant "where I can import it": the hook environment is that.
        args = ["install", "-c", str(environment.constraints),
                *(a for a in args[1:] if a != "--user")]
    with open(environment.lock, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        code, said = _run(environment.python, args)
        if code == 0:
            return 0
        if os.environ.get(STRICT_VAR) == "1":
            return code
        if not args or args[0] != "install":
            note("pip", line, command, reason(said, code))
            return 0
        options, requirements, files = _split(args[1:])
        wanted = requirements + [r for f in files for r in _file_requirements(f)]
        names = [n for n in map(requirement_name, wanted) if n] if wanted else []
        if len(wanted) < 2:
            note("pip", line, command, reason(said, code), names)
            return 0
        print(f"[localdet] {HOOK} line {line}: trying its {len(wanted)} requirements one by "
              "one", file=sys.stderr, flush=True)
        for requirement in wanted:
            one, said_one = _run(environment.python, ["install", *options, requirement])
            if one != 0:
                name = requirement_name(requirement)
                note("pip", line, f"pip install {requirement}", reason(said_one, one),
                     [name] if name else [])
    return 0


def refuse(line: str, command: list[str]) -> int:
    note("system", line, " ".join(command),
         f"was not run: it changes the machine, not the experiment (start the daemon with "
         f"`localdet daemon {FLAG}`, or `localdet run {FLAG}`, to run such lines)",
         [a for a in command[1:] if requirement_name(a) and a not in _SYSTEM_WORDS])
    return 1 if os.environ.get(STRICT_VAR) == "1" else 0


def failed(line: str, code: str, command: list[str]) -> int:
    note("system", line, " ".join(command), f"failed with exit code {code}",
         [a for a in command[1:] if requirement_name(a) and a not in _SYSTEM_WORDS])
    return int(code) if os.environ.get(STRICT_VAR) == "1" else 0


# Words of a system line that are not packages (for naming what it was installing).
_SYSTEM_WORDS = {"install", "update", "upgrade", "remove", "sudo", "apt-get", "apt", "yum",
                 "dnf", "conda", "mamba", "micromamba", "zypper", "apk", "add", "pacman",
                 "brew", "snap", "dpkg", "aptitude", "microdnf", "-y", "-q", "--yes"}


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "pip":
        return pip(argv[1], argv[2:])
    if len(argv) >= 3 and argv[0] == "refuse":
        return refuse(argv[1], argv[2:])
    if len(argv) >= 4 and argv[0] == "failed":
        return failed(argv[1], argv[2], argv[3:])
    print("usage: python -m localdet.processes.hook_commands pip|refuse|failed LINE ...",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
