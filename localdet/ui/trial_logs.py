"""What `localdet logs` prints: a trial's log (`experiments/<exp>/trials/<id>/trial.log`), as
written: `[rank r] ...` prefixes of multi-process trials and the supervisor's `[localdet]`
lines included; with `follow`, new lines until the trial stops running.

    path = log_path(layout, db, trial_id)      # LogError when it has none yet
    follow(layout, db, trial_id, sys.stdout.buffer)
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import BinaryIO

from localdet.paths import Layout
from localdet.processes import capped_log
from localdet.records.db import NotFound, StateDB
from localdet.records.states import TrialState

POLL_SECONDS = 0.5
# A trial that may still write to its log.
ACTIVE_STATES = frozenset({TrialState.RUNNING, TrialState.QUEUED, TrialState.WAITING})


class LogError(Exception):
    """No such trial, or no log to show (one sentence)."""


def log_path(layout: Layout, db: StateDB, trial_id: int, wait: bool = False) -> Path:
    """The trial's log. Raises LogError if the trial does not exist or, unless `wait` and the
    trial may still start, if it has no log yet."""
    try:
        trial = db.trial(trial_id)
    except NotFound as error:
        raise LogError(str(error)) from None
    path = layout.trial_log(trial.experiment_id, trial.id)
    if not path.exists() and not (wait and trial.state in ACTIVE_STATES):
        raise LogError(f"trial {trial_id} has no log yet (it is {trial.state}); it starts "
                       "when the trial's process does")
    return path


def copy_new(path: Path, offset: int, out: BinaryIO) -> int:
    """Write what the log holds past stream offset `offset`; returns the new offset. Past
    the log's cap its middle is dropped: a follower that fell that far behind gets the line
    saying so, then the most recent lines (localdet/processes/capped_log.py)."""
    while True:
        data, offset = capped_log.read_from(path, offset, limit=1 << 20)
        if not data:
            return offset
        out.write(data)
        out.flush()


def follow(layout: Layout, db: StateDB, trial_id: int, out: BinaryIO,
           poll_seconds: float = POLL_SECONDS) -> None:
    """Copy the log to `out`, then what is appended to it, until the trial is no longer
    RUNNING, QUEUED or WAITING (everything written before that is copied). Raises LogError."""
    path = log_path(layout, db, trial_id, wait=True)
    offset = 0
    while True:
        ended = db.trial(trial_id).state not in ACTIVE_STATES  # read before the log
        if ended:  # its last lines may still be on their way through the log's writer
            capped_log.wait_for_writer(path)
        offset = copy_new(path, offset, out)
        if ended:
            return
        time.sleep(poll_seconds)


def show(layout: Layout, db: StateDB, trial_id: int, out: BinaryIO) -> None:
    """Copy the whole log to `out`. Raises LogError."""
    copy_new(log_path(layout, db, trial_id), 0, out)
