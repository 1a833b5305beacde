"""Each trial's system metrics in the records (table `system_metrics`, migration 0014): the
daemon's samples of its process tree and GPUs (localdet/monitoring/system_metrics.py),
written a pass's worth at a time, thinned as a trial runs on, read by `localdet metrics
--system`, the dashboard and the SDK (`Trial.iter_metrics("system")`).

    record(db, [Sample(trial_id, at, {"cpu_util": 93.0, ...})], windows={})  # in the pass
    thin(db, trial_id)                     # older rows averaged into OLDER_ROWS spans
    rows(db, trial_id)                     # [{"at", "batches_trained", "samples", "metrics"}]

Rows stay bounded per trial: once a trial has more than MAX_ROWS, every row but the newest
RECENT_ROWS is merged into at most OLDER_ROWS rows of equal spans of time, each the average
of the samples it stands for (`samples` says how many). Recent samples stay as sampled, the
whole run stays drawn, and a week-long trial keeps MAX_ROWS rows, not 120,000.
"""

from __future__ import annotations

import datetime
import json
import math
from dataclasses import dataclass
from typing import Any

from localdet.records.db import StateDB

RECENT_ROWS = 500   # kept as sampled (at 5 s, the last 40 minutes)
OLDER_ROWS = 500    # what the rest is merged into, evenly over its time
MAX_ROWS = RECENT_ROWS + 2 * OLDER_ROWS  # thinned past this


@dataclass
class Sample:
    trial_id: int
    at: float                 # seconds since the epoch
    metrics: dict[str, float]


def record(db: StateDB, samples: list[Sample],
           windows: dict[int, tuple[int, int | None]] | None = None) -> dict[int, int]:
    """Write the samples in one transaction, each with its trial's recorded batches; a
    trial with a window (`profiling.begin_on_batch`, `end_after_batch`) only while its
    batches lie in it, and a trial no longer recorded not at all. Returns, per trial, how
    many rows were written."""
    windows = windows or {}
    written: dict[int, int] = {}
    with db.atomic():
        for sample in samples:
            begin, end = windows.get(sample.trial_id, (0, None))
            count = db.db.execute(
                "INSERT INTO system_metrics (trial_id, at, batches_trained, samples, metrics) "
                "SELECT id, ?, batches_trained, 1, ? FROM trials WHERE id = ? "
                "AND batches_trained >= ? AND (? IS NULL OR batches_trained <= ?)",
                [sample.at, json.dumps(sample.metrics), sample.trial_id, begin, end,
                 end]).rowcount
            written[sample.trial_id] = written.get(sample.trial_id, 0) + count
    return written


def count(db: StateDB, trial_id: int) -> int:
    return db.db.execute("SELECT COUNT(*) FROM system_metrics WHERE trial_id = ?",
                         [trial_id]).fetchone()[0]


def thin(db: StateDB, trial_id: int, recent: int = RECENT_ROWS,
         older: int = OLDER_ROWS) -> int:
    """Merge every row of the trial but the newest `recent` into at most `older` rows,
    each the sample-weighted average of an equal span of the older rows' time (their
    latest batches); returns the trial's rows after."""
    with db.atomic():
        found = db.db.execute(
            "SELECT id, at, batches_trained, samples, metrics FROM system_metrics "
            "WHERE trial_id = ? ORDER BY at, id", [trial_id]).fetchall()
        old = found[:max(0, len(found) - recent)]
        if len(old) <= older:
            return len(found)
        first, last = old[0][1], old[-1][1]
        width = (last - first) / older or 1.0
        buckets: dict[int, list[tuple]] = {}
        for row in old:
            buckets.setdefault(min(older - 1, int((row[1] - first) / width)), []).append(row)
        merged = [_merged(group) for _, group in sorted(buckets.items())]
        db.db.execute("DELETE FROM system_metrics WHERE id IN (SELECT value FROM json_each(?))",
                      [json.dumps([row[0] for row in old])])
        db.db.conn.executemany(
            "INSERT INTO system_metrics (trial_id, at, batches_trained, samples, metrics) "
            "VALUES (?, ?, ?, ?, ?)",
            [(trial_id, at, batches, samples, json.dumps(metrics))
             for at, batches, samples, metrics in merged])
        return len(found) - len(old) + len(merged)


def _merged(group: list[tuple]) -> tuple[float, int, int, dict[str, float]]:
    """(at, batches, samples, metrics) standing for the rows: averages weighted by how many
    samples each already stands for; a metric averages over the rows that have it."""
    total = sum(row[3] for row in group)
    sums: dict[str, float] = {}
    weights: dict[str, int] = {}
    for _, _, _, samples, text in group:
        for name, value in json.loads(text).items():
            if isinstance(value, (int, float)) and math.isfinite(value):
                sums[name] = sums.get(name, 0.0) + value * samples
                weights[name] = weights.get(name, 0) + samples
    at = sum(row[1] * row[3] for row in group) / total
    metrics = {name: sums[name] / weights[name] for name in sums}
    return at, max(row[2] for row in group), total, metrics


def rows(db: StateDB, trial_id: int) -> list[dict[str, Any]]:
    """The trial's rows, oldest first: at (ISO 8601, UTC), batches_trained, samples,
    metrics."""
    return [{"at": iso(at), "batches_trained": batches, "samples": samples,
             "metrics": json.loads(text)}
            for at, batches, samples, text in db.db.execute(
                "SELECT at, batches_trained, samples, metrics FROM system_metrics "
                "WHERE trial_id = ? ORDER BY at, id", [trial_id])]


def iso(at: float) -> str:
    return datetime.datetime.fromtimestamp(at, datetime.timezone.utc).isoformat(
        timespec="milliseconds")
