"""What users write about their experiments, beside what the experiments record themselves:
names, descriptions, notes, labels and the archived flag; and the removal of every row of a
deleted experiment, in one transaction.

    set_fields(db, 3, description="baseline", notes="lr too high?")
    add_label(db, 3, "baseline")
    labels_of(db, [3, 4])                 # {3: ["baseline"], 4: []}
    with_labels(db, ["baseline", "v2"])   # ids of the experiments with both labels
    remove_experiment_rows(db, 3)         # metrics, checkpoints, trials, ..., the experiment

Every change is also written to the event log (`experiment_changed`), so that what was
written before stays in the history.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from localdet.records.db import NotFound, StateDB, now

# The columns a user may change with set_fields.
USER_FIELDS = ("name", "description", "notes", "archived")


def _exists(db: StateDB, experiment_id: int) -> None:
    if db.db.execute("SELECT 1 FROM experiments WHERE id = ?", [experiment_id]).fetchone() is None:
        raise NotFound(f"there is no experiment {experiment_id}; `localdet status` lists them")


def set_fields(db: StateDB, experiment_id: int, **changes: Any) -> None:
    """Change some of USER_FIELDS; the event log records the new values."""
    unknown = set(changes) - set(USER_FIELDS)
    if unknown:  # a programming error, not a user's
        raise TypeError(f"set_fields cannot change {', '.join(sorted(unknown))}")
    if "archived" in changes:
        changes["archived"] = int(bool(changes["archived"]))
    with db.atomic():
        _exists(db, experiment_id)
        db.db.table("experiments").update(experiment_id, changes)
        db.log_event("experiment_changed", experiment_id=experiment_id, **changes)


def set_config(db: StateDB, experiment_id: int, config: dict, changed: dict[str, Any]) -> None:
    """Record a changed config (`changed`: dotted key -> new value, for the event log)."""
    with db.atomic():
        _exists(db, experiment_id)
        db.db.table("experiments").update(experiment_id, {"config": json.dumps(config)})
        db.log_event("experiment_config_changed", experiment_id=experiment_id, changes=changed)


# -- labels ---------------------------------------------------------------------------------

def labels_of(db: StateDB, experiment_ids: Iterable[int] | None = None) -> dict[int, list[str]]:
    """experiment id -> its labels, sorted (every given id is a key; None: all experiments
    that have labels)."""
    if experiment_ids is None:
        rows = db.db.execute("SELECT experiment_id, label FROM experiment_labels "
                             "ORDER BY experiment_id, label").fetchall()
        found: dict[int, list[str]] = {}
    else:
        ids = list(experiment_ids)
        found = {i: [] for i in ids}
        if not ids:
            return found
        # One query for a page of experiments: a listing of 200 reads their labels at once.
        rows = db.db.execute(
            "SELECT experiment_id, label FROM experiment_labels WHERE experiment_id IN "
            "(SELECT value FROM json_each(?)) ORDER BY experiment_id, label",
            [json.dumps(ids)]).fetchall()
    for experiment_id, label in rows:
        found.setdefault(experiment_id, []).append(label)
    return found


def with_labels(db: StateDB, labels: Iterable[str]) -> set[int]:
    """The ids of the experiments that have every one of `labels` (by the label index)."""
    wanted = sorted(set(labels))
    if not wanted:
        return {row[0] for row in db.db.execute("SELECT id FROM experiments").fetchall()}
    rows = db.db.execute(
        "SELECT experiment_id FROM experiment_labels WHERE label IN "
        f"({', '.join('?' * len(wanted))}) GROUP BY experiment_id HAVING count(*) = ?",
        [*wanted, len(wanted)]).fetchall()
    return {row[0] for row in rows}


def add_label(db: StateDB, experiment_id: int, label: str) -> bool:
    """False if the experiment had it already."""
    with db.atomic():
        _exists(db, experiment_id)
        cursor = db.db.execute("INSERT OR IGNORE INTO experiment_labels (experiment_id, label) "
                               "VALUES (?, ?)", [experiment_id, label])
        if cursor.rowcount:
            db.log_event("experiment_label_added", experiment_id=experiment_id, label=label)
        return bool(cursor.rowcount)


def remove_label(db: StateDB, experiment_id: int, label: str) -> bool:
    """False if the experiment did not have it."""
    with db.atomic():
        _exists(db, experiment_id)
        cursor = db.db.execute("DELETE FROM experiment_labels WHERE experiment_id = ? "
                               "AND label = ?", [experiment_id, label])
        if cursor.rowcount:
            db.log_event("experiment_label_removed", experiment_id=experiment_id, label=label)
        return bool(cursor.rowcount)


def set_labels(db: StateDB, experiment_id: int, labels: Iterable[str]) -> None:
    """Make `labels` the experiment's labels, in one transaction."""
    wanted = set(labels)
    with db.atomic():
        _exists(db, experiment_id)
        have = set(labels_of(db, [experiment_id])[experiment_id])
        for label in sorted(have - wanted):
            remove_label(db, experiment_id, label)
        for label in sorted(wanted - have):
            add_label(db, experiment_id, label)


# -- removal --------------------------------------------------------------------------------

def registered_checkpoints(db: StateDB, experiment_id: int) -> list[tuple[str, str, int]]:
    """``[(checkpoint uuid, model name, version), ...]`` of the experiment's checkpoints that
    a model version names."""
    return [tuple(row) for row in db.db.execute(
        "SELECT c.uuid, m.name, v.version FROM checkpoints c "
        "JOIN model_versions v ON v.checkpoint_uuid = c.uuid JOIN models m ON m.id = v.model_id "
        "WHERE c.experiment_id = ? ORDER BY m.name, v.version", [experiment_id]).fetchall()]


def remove_experiment_rows(db: StateDB, experiment_id: int, *,
                           pending: dict[str, Any] | None = None) -> dict[str, int]:
    """Delete every row of the experiment (its metrics, system metrics, checkpoints,
    requests, searcher events, labels, trials and the experiment itself) in one
    transaction; returns how many
    rows of each table went. The event log keeps its events (it is append-only) and gains
    `experiment_deleted`. With `pending` (``{"storage": {...}, "blobs": [...]}``), the same
    transaction writes the cleanup still to do to `experiment_deletions`.

    Raises NotFound for no such experiment; SQLite's foreign keys refuse it (IntegrityError)
    while a model version names one of its checkpoints."""
    statements = [
        ("metrics", "DELETE FROM metrics WHERE trial_id IN "
                    "(SELECT id FROM trials WHERE experiment_id = ?)"),
        ("system_metrics", "DELETE FROM system_metrics WHERE trial_id IN "
                           "(SELECT id FROM trials WHERE experiment_id = ?)"),
        ("launch_phases", "DELETE FROM launch_phases WHERE experiment_id = ?"),
        ("checkpoints", "DELETE FROM checkpoints WHERE experiment_id = ?"),
        ("requests", "DELETE FROM requests WHERE experiment_id = ? OR trial_id IN "
                     "(SELECT id FROM trials WHERE experiment_id = ?)"),
        ("searcher_events", "DELETE FROM searcher_events WHERE experiment_id = ?"),
        ("experiment_labels", "DELETE FROM experiment_labels WHERE experiment_id = ?"),
        ("trials", "DELETE FROM trials WHERE experiment_id = ?"),
        ("experiments", "DELETE FROM experiments WHERE id = ?"),
    ]
    removed: dict[str, int] = {}
    with db.atomic():
        row = db.db.execute("SELECT name FROM experiments WHERE id = ?",
                            [experiment_id]).fetchone()
        if row is None:
            raise NotFound(f"there is no experiment {experiment_id}; `localdet status` lists them")
        for table, sql in statements:
            removed[table] = db.db.execute(sql, [experiment_id] * sql.count("?")).rowcount
        if pending is not None:
            db.db.execute("INSERT OR REPLACE INTO experiment_deletions (experiment_id, "
                          "deleted_at, storage, blobs) VALUES (?, ?, ?, ?)",
                          [experiment_id, now(), json.dumps(pending["storage"]),
                           json.dumps(sorted(pending["blobs"]))])
        db.log_event("experiment_deleted", experiment_id=experiment_id, name=row[0],
                     rows=removed)
    return removed


def pending_deletions(db: StateDB) -> list[dict[str, Any]]:
    """The deletions whose files or blobs may be left: ``[{"experiment_id", "deleted_at",
    "storage", "blobs"}, ...]``, oldest first."""
    rows = db.db.execute("SELECT experiment_id, deleted_at, storage, blobs FROM "
                         "experiment_deletions ORDER BY deleted_at, experiment_id").fetchall()
    return [{"experiment_id": eid, "deleted_at": at, "storage": json.loads(storage),
             "blobs": json.loads(blobs)} for eid, at, storage, blobs in rows]


def finish_deletion(db: StateDB, experiment_id: int) -> None:
    """Its files and blobs are gone: forget the pending cleanup."""
    with db.atomic():
        db.db.execute("DELETE FROM experiment_deletions WHERE experiment_id = ?", [experiment_id])
        db.log_event("experiment_deletion_finished", experiment_id=experiment_id)
