"""Each launch's timeline: the rows of `launch_phases` (state/migrations/0015), written and read.

    insert(db, experiment_id, trial_id, launch, [("validation", 12.0, 12.4, {"batches": 50})])
    rows = of_experiment(db, 7)          # [{"trial_id", "launch", "phase", "started", ...}]

A launch is named by its start as `trials.started_at` spells it. Times are seconds since the
epoch. Writers call `insert` inside a transaction they already hold (the launch's record, an
exit's, a trial's heartbeat): the timeline costs no commit of its own.
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Iterable
from typing import Any

# Each phase and what `localdet status --timeline` sums it under, in the order they happen.
# The daemon records `launch` (from the scheduling pass that chose the trial to its process
# being started) and `exit` (from the launch's last recorded phase to the exit's record:
# the slot is free again); the trial's process records the rest through its reporter.
PHASES: dict[str, str] = {
    "launch": "daemon",
    "process_ready": "start-up",   # a warm process forked, or a cold one started
    "import": "start-up",          # the trial's module imported
    "model_built": "start-up",     # the trial made, build_model, its callbacks
    "data_ready": "start-up",      # the data loaders and the training and validation streams
    "restore": "start-up",         # a checkpoint restored (a resume, a warm start)
    "steps_traced": "start-up",    # started ahead of its slot: train and test steps traced
    "first_batch": "start-up",     # the train function made, the first batch trained
    "training": "training",        # one workload (a scheduling unit, or to a boundary)
    "validation": "validation",
    "checkpoint": "checkpoints",   # training paused while the checkpoint's files are written
    "checkpoint_store": "checkpoints",  # its files made durable in the store and recorded
    "end": "shut-down",            # after the last workload: streams closed, last checkpoint
    "exit": "daemon",
}


def seconds(iso: str) -> float:
    """`records.db.now()`'s spelling as seconds since the epoch."""
    return datetime.datetime.fromisoformat(iso).timestamp()


Row = tuple[str, float, float, "dict[str, Any] | None"]  # (phase, started, ended, details)


def insert(db: Any, experiment_id: int, trial_id: int, launch: str,
           rows: Iterable[Row]) -> None:
    """Add a launch's phases, in the transaction the caller (a StateDB's) holds."""
    rows = list(rows)
    values = [[experiment_id, trial_id, launch, phase, float(started), float(ended),
               json.dumps(details, default=str) if details else None]
              for phase, started, ended, details in rows]
    if values:
        db.db.conn.executemany("INSERT INTO launch_phases (experiment_id, trial_id, launch, phase, "
                        "started, ended, details) VALUES (?, ?, ?, ?, ?, ?, ?)", values)
    # A trial's last phases can arrive after the daemon recorded its exit (its slot is freed
    # once its end is recorded, a moment before its process is gone): the exit then ends
    # with them, so that every phase of a launch lies within it.
    own = [float(ended) for phase, _, ended, _ in rows if phase not in ("launch", "exit")]
    if own:
        db.db.conn.execute("UPDATE launch_phases SET ended = ? WHERE trial_id = ? AND launch = ? "
                           "AND phase = 'exit' AND ended < ?",
                           [max(own), trial_id, launch, max(own)])


def last_ended(db: Any, trial_id: int, launch: str) -> float | None:
    """When the launch's last recorded phase ended (None: none yet)."""
    row = db.db.execute("SELECT max(ended) FROM launch_phases WHERE trial_id = ? AND launch = ?",
                       [trial_id, launch]).fetchone()
    return row[0] if row else None


def of_experiment(db: Any, experiment_id: int, trial_id: int | None = None) -> list[dict]:
    """The experiment's (or one of its trials') phases, by trial and start."""
    sql = ("SELECT trial_id, launch, phase, started, ended, details FROM launch_phases "
           "WHERE experiment_id = ?")
    args: list[Any] = [experiment_id]
    if trial_id is not None:
        sql += " AND trial_id = ?"
        args.append(trial_id)
    try:
        found = db.db.execute(sql + " ORDER BY trial_id, started, id", args).fetchall()
    except Exception as error:  # records from before the timeline (read-only: not migrated)
        if "no such table" in str(error):
            return []
        raise
    return [{"trial_id": t, "launch": launch, "phase": phase, "started": started,
             "ended": ended, "details": json.loads(details) if details else {}}
            for t, launch, phase, started, ended, details in found]


def record_launch(db: Any, experiment_id: int, trial_id: int, launch: str, decided: float,
                  details: dict[str, Any]) -> None:
    """The daemon's part of a launch: from the scheduling pass that chose it to the moment
    its process was asked for (`launch`), in the launch record's transaction."""
    launched = seconds(launch)  # (to the millisecond: `decided` may be a little later)
    insert(db, experiment_id, trial_id, launch,
           [("launch", min(decided, launched), launched, details)])


def record_exit(db: Any, trial_id: int, noticed: float, details: dict[str, Any]) -> None:
    """The end of the trial's running launch, as the daemon records it (in the exit's
    transaction): from the last phase its process recorded to now, when its slot is free
    again. A process that recorded nothing of its own (a script, a job, one that failed
    before its first report) gets an exit of no length: its time stays unexplained."""
    row = db.db.execute("SELECT experiment_id, started_at FROM trials WHERE id = ?",
                        [trial_id]).fetchone()
    if row is None or row[1] is None:
        return
    experiment_id, launch = row
    last = db.db.execute("SELECT max(ended) FROM launch_phases WHERE trial_id = ? AND launch = ? "
                         "AND phase != 'launch'", [trial_id, launch]).fetchone()[0]
    ended = time.time()
    insert(db, experiment_id, trial_id, launch, [
        ("exit", min(last, ended) if last is not None else ended, ended,
         {**details, "noticed": round(noticed, 3)})])


def from_report(rows: Any) -> list[Row]:
    """A remote trial's reported phases (`[[phase, started, ended, details], ...]`, started
    None: since the launch began), checked; ValueError names what is wrong."""
    if rows is None:
        return []
    try:
        return [(str(phase), None if started is None else float(started),  # type: ignore[misc]
                 float(ended), details if isinstance(details, dict) else None)
                for phase, started, ended, details in rows]
    except (TypeError, ValueError):
        raise ValueError("a report's \"phases\" must be a list of [phase, started, ended, "
                         "details]") from None
