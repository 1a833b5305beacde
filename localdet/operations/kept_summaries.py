"""An experiment's validation summary (`facts.validation_summary`), kept in the user's cache
between commands and dashboard requests.

Summarising 100,000 validations (1,000 trials) has SQLite read the searcher metric out of
every row's JSON: 0.13 s of every `localdet status EXP` and experiment page. A summary is kept
beside a mark that one pass over the validations' index computes in a fifth of that: their
count, the newest row's id and their total length. Rows are only ever appended or merged
with metrics they lacked (records/db.py's record_metrics), which lengthens them, so a summary
whose mark matches is the one SQLite would compute. Experiments with fewer than KEEP_FROM
validations are summarised each time (it is quick) and leave no file. Kept per records file
under `paths.user_cache_dir()`, never in the state folder, which only the daemon writes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Callable

from localdet.paths import user_cache_dir, write_cache_file
from localdet.records.db import Experiment, StateDB

KEEP_FROM = 5000
_FORMAT = 1  # bumped when the summary's shape changes

Summary = dict[int, dict[str, Any]]


def summary(db: StateDB, experiment: Experiment,
            compute: Callable[[StateDB, Experiment], Summary]) -> Summary:
    """The kept summary where its mark matches these records, else `compute`'s (kept)."""
    file = db.db.execute("PRAGMA database_list").fetchone()[2]  # "" for one in memory
    count, newest, length = db.db.execute(
        "SELECT count(*), max(id), total(length(metrics)) FROM metrics INDEXED BY "
        "metrics_validations WHERE kind = 'validation' AND trial_id IN "
        "(SELECT id FROM trials WHERE experiment_id = ?)", [experiment.id]).fetchone()
    if not file or count < KEEP_FROM:
        return compute(db, experiment)
    mark = [_FORMAT, experiment.metric, bool(experiment.smaller_is_better), count, newest,
            length]
    path = _path(file, experiment.id)
    try:
        kept = json.loads(path.read_text())
        if kept["mark"] == mark:
            return {int(trial_id): found for trial_id, found in kept["summary"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass  # none yet, or unreadable: computed again
    found = compute(db, experiment)
    write_cache_file(path, {"mark": mark, "summary": found})
    return found


def _path(file: str, experiment_id: int) -> Path:
    records = hashlib.sha256(str(Path(file).resolve()).encode()).hexdigest()[:16]
    return user_cache_dir() / "summaries" / records / f"{experiment_id}.json"
