"""Who may report: each launch of a trial gets its own token, HMAC-SHA256 of (trial id,
launch number) under a daemon secret kept in `$LOCALDET_HOME/report_secret` (mode 0600).

    env = trial_environment(layout, trial_id, launch=trial.restarts + 1, url=server.url)
    token_matches(secret, trial_id, launch, presented)      # the server's check

A daemon restarted later derives the same tokens, so nothing is stored per launch. Whether
the launch is still the trial's running one is the requests' own check
(`report_request.check_launch`).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import threading

from determined.core._reporting import (
    LAUNCH_VAR,
    REPORT_CHECK_PGRP_VAR,
    REPORT_TOKEN_VAR,
    REPORT_URL_VAR,
    TRIAL_ID_VAR,
)
from localdet.paths import Layout

SECRET_FILE = "report_secret"


class ReportServerError(RuntimeError):
    """The report server cannot start; the message says why and what to change."""


def daemon_secret(layout: Layout) -> bytes:
    """The daemon's secret: created once (mode 0600), then read back by every daemon."""
    path = layout.home / SECRET_FILE
    if not path.exists():
        layout.home.mkdir(parents=True, exist_ok=True)
        fresh = layout.home / f".{SECRET_FILE}.{os.getpid()}.{threading.get_ident()}"
        fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(32))
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(fresh, path)  # atomic: a daemon racing us keeps its secret or takes ours
        except FileExistsError:
            pass
        finally:
            os.unlink(fresh)
    try:
        return bytes.fromhex(path.read_text().strip())
    except ValueError:
        raise ReportServerError(f"{path} is not a hex secret; delete it (running remote "
                                "trials then cannot report) and restart the daemon") from None


def launch_token(secret: bytes, trial_id: int, launch: int) -> str:
    return hmac.new(secret, f"trial {trial_id} launch {launch}".encode(),
                    hashlib.sha256).hexdigest()


def token_matches(secret: bytes, trial_id: int, launch: int, token: str) -> bool:
    """Whether `token` is this launch's (compared in constant time)."""
    return hmac.compare_digest(token.encode(), launch_token(secret, trial_id, launch).encode())


def trial_environment(layout: Layout, trial_id: int, launch: int, url: str, *,
                      local: bool = False) -> dict[str, str]:
    """What a launch puts in its trial's environment to report over HTTP to `url`.
    `launch` is the trial's restarts + 1; `local`: the process runs on the daemon's machine,
    in a process group the daemon records (its launch record is checked as SQLite's is)."""
    env = {REPORT_URL_VAR: url, TRIAL_ID_VAR: str(trial_id),
           LAUNCH_VAR: str(launch),
           REPORT_TOKEN_VAR: launch_token(daemon_secret(layout), trial_id, launch)}
    if local:
        env[REPORT_CHECK_PGRP_VAR] = "1"
    return env
