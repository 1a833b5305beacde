"""What `localdet metrics EXPERIMENT --system` shows: the system metrics the daemon sampled
of an experiment's trials (localdet/monitoring/system_metrics.py). With `--trial`, that
trial's samples; without, one line a trial summing them up.

    console.print(table(db, db.experiment(1), trial_id=None))
    write_csv(db, db.experiment(1), trial_id=7, out=sys.stdout)
"""

from __future__ import annotations

import csv
import datetime
from typing import Any, TextIO

from rich.table import Table

from localdet.records import system_metrics as records
from localdet.records.db import Experiment, StateDB

# The metrics, as the columns show them: (name, heading, how a value reads).
_MB = 1e6
COLUMNS: list[tuple[str, str, Any]] = [
    ("cpu_util", "CPU %", lambda v: f"{v:.0f}"),
    ("memory_rss", "memory", lambda v: _size(v)),
    ("disk_throughput_read", "disk read/s", lambda v: _size(v)),
    ("disk_throughput_write", "disk write/s", lambda v: _size(v)),
    ("gpu_util", "GPU %", lambda v: f"{v:.0f}"),
    ("gpu_memory_used", "GPU memory", lambda v: _size(v)),
    ("gpu_power", "GPU W", lambda v: f"{v:.0f}"),
]


class SystemMetricsError(Exception):
    """The user asked for system metrics that are not there (one sentence)."""


def _size(value: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", _MB), ("kB", 1e3)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} B"


def _trials(db: StateDB, experiment: Experiment, trial_id: int | None) -> list[int]:
    ids = [t.id for t in db.trials(experiment.id)]
    if trial_id is not None and trial_id not in ids:
        raise SystemMetricsError(f"experiment {experiment.id} has no trial {trial_id}; "
                                 f"`localdet status {experiment.id}` lists its trials")
    return [trial_id] if trial_id is not None else ids


def _used(found: list[dict[str, Any]]) -> list[tuple[str, str, Any]]:
    """The columns some row has a value for: without NVML, no GPU columns."""
    names = {name for row in found for name in row["metrics"]}
    return [column for column in COLUMNS if column[0] in names]


def table(db: StateDB, experiment: Experiment, trial_id: int | None) -> Table:
    if trial_id is not None:
        return _samples_table(experiment, trial_id, records.rows(
            db, _trials(db, experiment, trial_id)[0]))
    return _summary_table(db, experiment, _trials(db, experiment, None))


def _summary_table(db: StateDB, experiment: Experiment, trial_ids: list[int]) -> Table:
    """One row a trial: over its samples, the mean and peak of each metric."""
    result = Table(title=f"experiment {experiment.id}: system metrics, mean (peak) over "
                         "each trial's samples")
    result.add_column("trial", justify="right")
    result.add_column("samples", justify="right")
    result.add_column("sampled for", justify="right")
    by_trial = {trial_id: records.rows(db, trial_id) for trial_id in trial_ids}
    columns = _used([row for found in by_trial.values() for row in found])
    for _, heading, _ in columns:
        result.add_column(heading, justify="right")
    for trial_id, found in by_trial.items():
        if not found:
            result.add_row(str(trial_id), "0", "-", *("-" for _ in columns))
            continue
        span = _seconds(found[-1]["at"]) - _seconds(found[0]["at"])
        cells = []
        for name, _, shown in columns:
            values = [(row["metrics"][name], row["samples"]) for row in found
                      if name in row["metrics"]]
            if not values:
                cells.append("-")
                continue
            mean = sum(v * n for v, n in values) / sum(n for _, n in values)
            cells.append(f"{shown(mean)} ({shown(max(v for v, _ in values))})")
        result.add_row(str(trial_id), str(sum(row["samples"] for row in found)),
                       f"{span:.0f} s", *cells)
    if not any(by_trial.values()):
        result.caption = ("no system metrics recorded: the daemon samples running trials "
                          "(`localdet daemon --system-metrics-period`)")
    return result


def _samples_table(experiment: Experiment, trial_id: int, found: list[dict]) -> Table:
    result = Table(title=f"trial {trial_id} (experiment {experiment.id}): system metrics")
    result.add_column("time (UTC)")
    result.add_column("batches", justify="right")
    columns = _used(found)
    for _, heading, _ in columns:
        result.add_column(heading, justify="right")
    merged = any(row["samples"] > 1 for row in found)
    if merged:
        result.add_column("samples", justify="right")
    for row in found:
        cells = [shown(row["metrics"][name]) if name in row["metrics"] else "-"
                 for name, _, shown in columns]
        result.add_row(row["at"][:19].replace("T", " "), str(row["batches_trained"]), *cells,
                       *([str(row["samples"])] if merged else []))
    if not found:
        result.caption = "no system metrics recorded for this trial"
    elif merged:
        result.caption = "older rows are averages of several samples (`samples`)"
    return result


def _seconds(iso: str) -> float:
    return datetime.datetime.fromisoformat(iso).timestamp()


def write_csv(db: StateDB, experiment: Experiment, trial_id: int | None, out: TextIO) -> None:
    """Every row of the trials' samples: trial_id, at, batches_trained, samples, then each
    metric (the raw values: bytes, percent, watts)."""
    found = [(t, row) for t in _trials(db, experiment, trial_id) for row in records.rows(db, t)]
    names = [name for name, _, _ in _used([row for _, row in found])]
    extra = sorted({n for _, row in found for n in row["metrics"]} - set(names))
    writer = csv.writer(out)
    writer.writerow(["trial_id", "at", "batches_trained", "samples", *names, *extra])
    for t, row in found:
        writer.writerow([t, row["at"], row["batches_trained"], row["samples"],
                         *(row["metrics"].get(name, "") for name in names + extra)])
