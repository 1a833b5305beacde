"""A systemd *user* unit that runs the foreground daemon, so it survives logouts (with
lingering) and reboots:

    text = unit_text(layout, sys.executable, ["--slots", "2"])
    path = unit_path()        # ~/.config/systemd/user/localdet.service

Stopping the unit runs `localdet daemon stop` first (running trials checkpoint and are queued
again); `KillMode=mixed` then ends what is left (warm processes, jobs) only after that.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from localdet.daemon.service import STOP_SECONDS
from localdet.paths import Layout

UNIT_NAME = "localdet.service"
# Kept from the shell that installs the unit: a user service starts with systemd's bare
# environment, where startup hooks' tools and CUDA's libraries may not be found.
PASSED_ON = ("PATH", "LD_LIBRARY_PATH")


def unit_path() -> Path:
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config).expanduser() / "systemd" / "user" / UNIT_NAME


def _quoted(text: str) -> str:
    if text and not any(c.isspace() or c in "\"'\\;" for c in text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _word(text: str) -> str:
    """One word of an Exec line as systemd reads it: quoted where needed, its specifiers
    (%) and variables ($) kept literal."""
    return _quoted(text.replace("%", "%%").replace("$", "$$"))


def _command(python: str, arguments: Sequence[str]) -> str:
    return " ".join(_word(part) for part in (python, "-m", "localdet", *arguments))


def unit_text(layout: Layout, python: str, arguments: Sequence[str] = (),
              stop_seconds: int = STOP_SECONDS,
              environment: Mapping[str, str] | None = None) -> str:
    """The unit: `python -m localdet daemon ARGUMENTS` on `layout`'s state folder, with
    `environment`'s PASSED_ON variables (os.environ's by default)."""
    home = str(layout.home).replace("%", "%%")
    source = os.environ if environment is None else environment
    settings = [("LOCALDET_HOME", str(layout.home)), ("PYTHONUNBUFFERED", "1"),
                *((name, source[name]) for name in PASSED_ON if source.get(name))]
    # Specifiers apply in Environment=, variables do not.
    environment_lines = "\n".join(
        "Environment=" + _quoted(f"{name}={value}".replace("%", "%%"))
        for name, value in settings)
    return f"""\
[Unit]
Description=localdet daemon (Determined-style Keras training) on {home}

[Service]
Type=simple
{environment_lines}
ExecStart={_command(python, ["daemon", *arguments])}
ExecStop={_command(python, ["daemon", "stop", "--timeout", str(stop_seconds)])}
KillMode=mixed
TimeoutStopSec={stop_seconds + 30}
Restart=on-failure
RestartSec=10

[Install]
WantedBy=default.target
"""


def enable_commands(path: Path) -> list[str]:
    """What the user runs to start it now, at every login and, with lingering, at boot."""
    return ["systemctl --user daemon-reload",
            f"systemctl --user enable --now {path.stem}",
            "loginctl enable-linger \"$USER\"   # keep it running after logout, start it at boot",
            f"systemctl --user status {path.stem}   # `localdet daemon status` shows it too"]
