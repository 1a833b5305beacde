"""The learning curves' points, kept in the dashboard's process between requests for the
trials that have ended.

    by_trial = curve_cache.read(db, trial_ids)   # trial id -> series name -> (batches, values)

The experiment page asks for the curves of its best 25 trials (and the running ones) at every
refresh; reading and parsing their rows, a thousand a trial, was a third of its time. An
ended trial records no more rows, so its points are kept (KEEP trials at most, the least
recently drawn dropped first) and used again while its row count, its newest row, its state
and its end are what they were: one pass over the metrics' index says so for all of them. A
trial that may still record (running, paused, queued) is read each time: its rows grow, and
`context.evaluate` adds metrics to a row already recorded. Callers must not change what they
are given."""

from __future__ import annotations

import itertools
import json
import math
import threading
from collections import OrderedDict

from localdet.records.db import StateDB
from localdet.records.states import TERMINAL_STATES

KEEP = 64

Series = dict[str, tuple[list, list]]  # "val_loss" or "training loss" -> (batches, values)

_kept: OrderedDict[tuple[str, int], tuple[tuple, Series]] = OrderedDict()
_lock = threading.Lock()


def read(db: StateDB, trial_ids: list[int]) -> dict[int, Series]:
    """Each trial's every finite point, by series: validation names as recorded, training
    names after `training ` (an empty dict for a trial with no rows)."""
    where = "IN (SELECT value FROM json_each(?))"
    ids = json.dumps(trial_ids)
    file = db.db.execute("PRAGMA database_list").fetchone()[2]  # "" in memory: kept nowhere
    marks = {trial_id: (state, ended_at, 0, None) for trial_id, state, ended_at
             in db.db.execute(f"SELECT id, state, ended_at FROM trials WHERE id {where}", [ids])}
    for trial_id, count, newest in db.db.execute(  # the index alone answers
            f"SELECT trial_id, count(*), max(id) FROM metrics WHERE trial_id {where} "
            "GROUP BY trial_id", [ids]):
        marks[trial_id] = marks[trial_id][:2] + (count, newest)
    found: dict[int, Series] = {}
    with _lock:
        for trial_id in trial_ids:
            kept = _kept.get((file, trial_id))
            if kept is not None and kept[0] == marks.get(trial_id):
                _kept.move_to_end((file, trial_id))
                found[trial_id] = kept[1]
    fresh = _parse(db, [t for t in trial_ids if t not in found])
    with _lock:
        for trial_id, series in fresh.items():
            if file and marks.get(trial_id, ("",))[0] in TERMINAL_STATES:
                _kept[(file, trial_id)] = (marks[trial_id], series)
                _kept.move_to_end((file, trial_id))
        while len(_kept) > KEEP:
            _kept.popitem(last=False)
    return {trial_id: found.get(trial_id) or fresh.get(trial_id, {}) for trial_id in trial_ids}


def forget() -> None:
    """Keep nothing (tests; a process that changed its records behind the dashboard)."""
    with _lock:
        _kept.clear()


def _parse(db: StateDB, trial_ids: list[int]) -> dict[int, Series]:
    """The trials' rows in the index's order (each trial's training rows, then its
    validations), a series at a time."""
    found: dict[int, Series] = {trial_id: {} for trial_id in trial_ids}
    if not trial_ids:
        return found
    rows = db.db.execute(
        "SELECT trial_id, kind, batches_trained, metrics FROM metrics WHERE trial_id IN "
        "(SELECT value FROM json_each(?)) ORDER BY trial_id, kind, batches_trained",
        [json.dumps(trial_ids)])
    for (trial_id, kind), run in itertools.groupby(rows, key=lambda row: (row[0], row[1])):
        block = list(run)
        parsed = [json.loads(row[3]) for row in block]
        for name in sorted(set().union(*parsed)):
            xs, ys = [], []
            for row, values in zip(block, parsed, strict=True):
                value = values.get(name)
                if isinstance(value, (int, float)) and math.isfinite(value):
                    xs.append(row[2])
                    ys.append(value)
            if xs:
                found[trial_id][name if kind == "validation" else f"training {name}"] = (xs, ys)
    return found
