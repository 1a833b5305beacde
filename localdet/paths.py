"""Where localdet keeps its state: one root folder, `$LOCALDET_HOME`.

Example:

    layout = Layout.from_environment()
    layout.db         # .../localdet/localdet.db
    layout.queue      # .../localdet/queue  (the watched folder)
    layout.job_queue  # .../localdet/queue/jobs  (what is dropped here runs as a job)
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from determined.core._reporting import HOME_VAR


def default_home() -> Path:
    """`$LOCALDET_HOME`, else `${XDG_DATA_HOME:-~/.local/share}/localdet`."""
    if os.environ.get(HOME_VAR):
        return Path(os.environ[HOME_VAR]).expanduser()
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home).expanduser() / "localdet"


def state_formats_dir() -> Path:
    """The `state/` folder (schemas, migrations): the source tree's, or the installed copy."""
    source = Path(__file__).resolve().parent.parent / "state"
    if (source / "migrations").is_dir():
        return source
    import importlib.resources  # an installed copy only: ~5 ms of every command's start

    return Path(str(importlib.resources.files("localdet") / "state"))


@dataclass(frozen=True)
class Layout:
    home: Path

    @classmethod
    def from_environment(cls) -> "Layout":
        return cls(default_home())

    @property
    def db(self) -> Path:
        return self.home / "localdet.db"

    @property
    def queue(self) -> Path:
        return self.home / "queue"

    @property
    def job_queue(self) -> Path:
        return self.queue / "jobs"

    @property
    def rejected(self) -> Path:
        return self.queue / "rejected"

    @property
    def store(self) -> Path:
        return self.home / "store"

    @property
    def daemon_lock(self) -> Path:
        return self.home / "daemon.lock"

    @property
    def daemon_log(self) -> Path:
        """What the daemon says, kept under the same cap as a trial's log."""
        return self.home / "daemon.log"

    @property
    def slot_file(self) -> Path:
        """The slots the daemon found at start (JSON), for commands that run no daemon."""
        return self.home / "slots.json"

    @property
    def warm_imports(self) -> Path:
        """What warm processes' trials imported, for a later daemon's warm processes
        (localdet/processes/learned_imports.py's RememberedImports)."""
        return self.home / "warm-imports"

    def experiment_dir(self, experiment_id: int) -> Path:
        return self.home / "experiments" / str(experiment_id)

    def model_dir(self, experiment_id: int) -> Path:
        return self.experiment_dir(experiment_id) / "model"

    def run_lock(self, experiment_id: int) -> Path:
        """Held by the `localdet run` process driving the experiment in the foreground."""
        return self.experiment_dir(experiment_id) / "run.lock"

    def trial_dir(self, experiment_id: int, trial_id: int) -> Path:
        return self.experiment_dir(experiment_id) / "trials" / str(trial_id)

    def trial_log(self, experiment_id: int, trial_id: int) -> Path:
        return self.trial_dir(experiment_id, trial_id) / "trial.log"

    def ensure(self) -> "Layout":
        for folder in (self.home, self.queue, self.job_queue, self.rejected, self.store):
            folder.mkdir(parents=True, exist_ok=True)
        return self


def user_cache_dir() -> Path:
    """Where localdet keeps what it can compute again (outside any state folder, which only
    the daemon writes): $LOCALDET_CACHE, else $XDG_CACHE_HOME/localdet, else
    ~/.cache/localdet (scripts/horovod-env keeps its environment there too)."""
    if os.environ.get("LOCALDET_CACHE"):
        return Path(os.environ["LOCALDET_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "localdet"


def write_cache_file(path: Path, value: Any) -> None:
    """Write `value` as JSON to a file of the user's cache, whole or not at all (readers in
    other processes never see half of it); a folder that cannot be written only costs the
    next call a computation, so it is not an error."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        scratch.write_text(json.dumps(value))
        os.replace(scratch, path)
    except OSError:
        pass
