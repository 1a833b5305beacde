"""What the SDK (and `det trial ...`) reads of one trial: its facts with Determined's
summary of its metrics, its metric reports, and its log's lines.

    describe_trial(db, 3)["summary_metrics"]["validation_metrics"]["val_loss"]["min"]
    trial_metrics(db, [3, 4], "validation")     # oldest first, trial by trial
    trial_logs(layout, db, 3, tail=20)
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from localdet.operations.errors import OperationError
from localdet.operations.facts import launches_by_trial, trial_facts
from localdet.paths import Layout
from localdet.processes import capped_log
from localdet.records import system_metrics
from localdet.records.db import MetricRow, StateDB

GROUPS = ("training", "validation")
# The daemon's samples of each trial (localdet/monitoring/system_metrics.py): "system" has
# every metric of a sample; Determined's profiler groups have their part of it.
SYSTEM_GROUPS = {"system": None, "cpu": ("cpu_util",), "memory": ("memory_rss",),
                 "disk": ("disk_throughput_read", "disk_throughput_write"),
                 "gpu": ("gpu_util", "gpu_memory_used", "gpu_power")}


def _summary(rows: list[MetricRow]) -> dict[str, dict[str, Any]]:
    """Per metric name: count, last, min, max, sum and type, as Determined's trial
    summary_metrics (numbers only aggregate; others count and keep their last value)."""
    summary: dict[str, dict[str, Any]] = {}
    for row in rows:
        for name, value in row.metrics.items():
            entry = summary.setdefault(name, {"count": 0, "last": None, "type": "number"})
            entry["count"] += 1
            entry["last"] = value
            if isinstance(value, (int, float)) and not isinstance(value, bool) \
                    and math.isfinite(value):
                entry["min"] = min(entry.get("min", value), value)
                entry["max"] = max(entry.get("max", value), value)
                entry["sum"] = entry.get("sum", 0) + value
            else:
                entry["type"] = "string" if isinstance(value, str) else "number"
    return summary


def describe_trial(db: StateDB, trial_id: int) -> dict[str, Any]:
    """The trial's facts (as `localdet status EXP` shows each trial), when it started and
    ended, and `summary_metrics` ({"avg_metrics": training, "validation_metrics": ...})."""
    trial = db.trial(trial_id)
    experiment = db.experiment(trial.experiment_id)
    launches = launches_by_trial(db.events(experiment.id, trial_id=trial.id, kinds=(
        "trial_launched", "script_run_started", "trial_first_batch")))
    facts = trial_facts(db, trial, experiment, launches.get(trial.id))
    facts.update({
        "started_at": trial.started_at, "ended_at": trial.ended_at,
        "summary_metrics": {"avg_metrics": _summary(db.metrics(trial.id, "training")),
                            "validation_metrics": _summary(db.metrics(trial.id,
                                                                      "validation"))},
    })
    return facts


def experiment_trials(db: StateDB, experiment_id: int) -> list[dict[str, Any]]:
    """`describe_trial` of each of the experiment's trials, by id."""
    db.experiment(experiment_id)  # NotFound, in one sentence
    return [describe_trial(db, t.id) for t in db.trials(experiment_id)]


def trial_metrics(db: StateDB, trial_ids: Iterable[int], group: str) -> list[dict[str, Any]]:
    """The trials' reports of `group` ("training" or "validation", or the system metrics
    the daemon sampled: "system", or Determined's "cpu", "memory", "disk" and "gpu"), trial
    by trial, oldest first: trial_id, batches_trained, recorded_at, metrics, group."""
    if group not in GROUPS and group not in SYSTEM_GROUPS:
        raise OperationError(f"localdet records the metric groups {', '.join(GROUPS)} and "
                             f"{', '.join(SYSTEM_GROUPS)}, not {group!r}")
    reports: list[dict[str, Any]] = []
    for trial_id in trial_ids:
        db.trial(trial_id)  # NotFound, in one sentence
        if group in SYSTEM_GROUPS:
            reports.extend(_system(db, trial_id, group))
            continue
        reports.extend({"trial_id": row.trial_id, "batches_trained": row.batches_trained,
                        "recorded_at": row.recorded_at, "metrics": row.metrics,
                        "group": row.kind} for row in db.metrics(trial_id, group))
    return reports


def _system(db: StateDB, trial_id: int, group: str) -> list[dict[str, Any]]:
    names = SYSTEM_GROUPS[group]
    reports = []
    for row in system_metrics.rows(db, trial_id):
        metrics = row["metrics"] if names is None else \
            {name: row["metrics"][name] for name in names if name in row["metrics"]}
        if metrics:
            reports.append({"trial_id": trial_id, "batches_trained": row["batches_trained"],
                            "recorded_at": row["at"], "metrics": metrics, "group": group})
    return reports


def trial_logs(layout: Layout, db: StateDB, trial_id: int, head: int | None = None,
               tail: int | None = None) -> list[str]:
    """The lines of the trial's log (none before its process starts), the first `head` or
    the last `tail` of them."""
    trial = db.trial(trial_id)
    path = layout.trial_log(trial.experiment_id, trial.id)
    if not path.exists():
        return []
    chunks, offset = [], 0
    while True:
        data, offset = capped_log.read_from(path, offset, limit=1 << 20)
        if not data:
            break
        chunks.append(data)
    lines = b"".join(chunks).decode("utf-8", errors="replace").splitlines()
    if head is not None:
        return lines[:head]
    if tail is not None:
        return lines[-tail:] if tail else []
    return lines
