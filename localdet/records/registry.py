"""The model registry's rows: named models, and their numbered versions, each naming one
checkpoint (`models`, `model_versions`; state/migrations/0006 and 0008).

    model_id = create_model(db, "mnist", description="digits")
    number = add_version(db, model_id, "3f2a...")     # 1, then 2, ...
    registered_checkpoints(db, experiment_id=4)      # kept from retention and gc

A version's number is the model's next one, never one a deleted version had
(`models.last_version`). Rows only: what a user may do, and the sentences that refuse it,
are `localdet.operations.registry`'s.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, cast

from localdet.records.db import StateDB, now

# What a model listing may be sorted by (Determined's ModelSortBy names, lower case) and the
# column each is.
SORT_COLUMNS = {
    "name": "m.name",
    "description": "m.description",
    "creation_time": "m.created_at",
    "last_updated_time": "m.updated_at",
    "num_versions": "num_versions",
    "id": "m.id",
}
MODEL_FIELDS = ("name", "description", "notes", "labels", "metadata", "archived")
VERSION_FIELDS = ("name", "comment", "notes", "labels", "metadata")
_JSON_FIELDS = ("labels", "metadata")


@dataclass
class Model:
    id: int
    name: str
    description: str
    notes: str
    labels: list[str]
    metadata: dict[str, Any]
    archived: bool
    created_at: str
    updated_at: str
    num_versions: int


@dataclass
class ModelVersion:
    id: int
    model_id: int
    version: int
    checkpoint_uuid: str
    name: str
    comment: str
    notes: str
    labels: list[str]
    metadata: dict[str, Any]
    created_at: str
    updated_at: str


_MODEL_SELECT = (
    "SELECT m.id, m.name, m.description, m.notes, m.labels, m.metadata, m.archived, "
    "m.created_at, m.updated_at, "
    "(SELECT COUNT(*) FROM model_versions v WHERE v.model_id = m.id) AS num_versions "
    "FROM models m")
_VERSION_SELECT = (
    "SELECT id, model_id, version, checkpoint_uuid, name, comment, notes, labels, metadata, "
    "created_at, updated_at FROM model_versions")


def _model(row: tuple) -> Model:
    model = Model(*row)
    model.labels, model.metadata = json.loads(row[4]), json.loads(row[5])
    model.archived = bool(model.archived)
    return model


def _version(row: tuple) -> ModelVersion:
    version = ModelVersion(*row)
    version.labels, version.metadata = json.loads(row[7]), json.loads(row[8])
    return version


def _encoded(fields: dict[str, Any]) -> dict[str, Any]:
    return {key: json.dumps(value) if key in _JSON_FIELDS else
            int(value) if key == "archived" else value for key, value in fields.items()}


# -- models ---------------------------------------------------------------------------------

def create_model(db: StateDB, name: str, *, description: str = "", notes: str = "",
                 labels: Iterable[str] = (), metadata: dict[str, Any] | None = None) -> int:
    """The new model's id; sqlite3.IntegrityError when the name is taken."""
    at = now()
    with db.atomic():
        model_id = cast(int, db.db.table("models").insert(_encoded({
            "name": name, "description": description, "notes": notes,
            "labels": list(labels), "metadata": metadata or {},
            "created_at": at, "updated_at": at})).last_pk)
        db.log_event("model_created", model_id=model_id, name=name)
    return model_id


def model_by_name(db: StateDB, name: str) -> Model | None:
    row = db.db.execute(f"{_MODEL_SELECT} WHERE m.name = ?", [name]).fetchone()
    return _model(row) if row else None


def model_by_id(db: StateDB, model_id: int) -> Model | None:
    row = db.db.execute(f"{_MODEL_SELECT} WHERE m.id = ?", [model_id]).fetchone()
    return _model(row) if row else None


def models(db: StateDB, *, archived: bool | None = None, name: str | None = None,
           labels: Iterable[str] = (), sort_by: str = "name",
           descending: bool = False) -> list[Model]:
    """The models, sorted by `sort_by` (a key of SORT_COLUMNS) and then id, both in one
    direction. `name`: those whose name holds it, ignoring case; `labels`: those with any
    of them; `archived`: only archived (True) or only not (False)."""
    clauses: list[str] = []
    args: list[Any] = []
    if archived is not None:
        clauses.append("m.archived = ?")
        args.append(int(archived))
    if name:
        clauses.append("instr(lower(m.name), lower(?)) > 0")
        args.append(name)
    wanted = list(labels)
    if wanted:
        clauses.append("EXISTS (SELECT 1 FROM json_each(m.labels) l WHERE l.value IN "
                       f"({', '.join('?' * len(wanted))}))")
        args.extend(wanted)
    where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
    direction = "DESC" if descending else "ASC"
    order = f"{SORT_COLUMNS[sort_by]} {direction}, m.id {direction}"
    return [_model(row) for row in db.db.execute(f"{_MODEL_SELECT}{where} ORDER BY {order}",
                                                 args).fetchall()]


def update_model(db: StateDB, model_id: int, **fields: Any) -> None:
    """Set some of MODEL_FIELDS; updated_at moves with them."""
    with db.atomic():
        db.db.table("models").update(model_id, {**_encoded(fields), "updated_at": now()})
        db.log_event("model_updated", model_id=model_id, fields=sorted(fields))


def delete_model(db: StateDB, model_id: int) -> list[int]:
    """Remove the model and its versions in one transaction; the version numbers removed."""
    with db.atomic():
        numbers = [n for (n,) in db.db.execute(
            "SELECT version FROM model_versions WHERE model_id = ? ORDER BY version",
            [model_id]).fetchall()]
        name = db.db.execute("SELECT name FROM models WHERE id = ?", [model_id]).fetchone()
        db.db.execute("DELETE FROM model_versions WHERE model_id = ?", [model_id])
        db.db.execute("DELETE FROM models WHERE id = ?", [model_id])
        db.log_event("model_deleted", model_id=model_id, name=name[0] if name else None,
                     versions=numbers)
    return numbers


# -- versions -------------------------------------------------------------------------------

def add_version(db: StateDB, model_id: int, checkpoint_uuid: str, *, name: str = "",
                comment: str = "", notes: str = "", labels: Iterable[str] = (),
                metadata: dict[str, Any] | None = None) -> int:
    """Register the checkpoint as the model's next version; returns its number."""
    at = now()
    with db.atomic():
        (last,) = db.db.execute("SELECT last_version FROM models WHERE id = ?",
                                [model_id]).fetchone()
        number = last + 1
        db.db.table("model_versions").insert(_encoded({
            "model_id": model_id, "version": number, "checkpoint_uuid": checkpoint_uuid,
            "name": name, "comment": comment, "notes": notes, "labels": list(labels),
            "metadata": metadata or {}, "created_at": at, "updated_at": at}))
        db.db.execute("UPDATE models SET last_version = ?, updated_at = ? WHERE id = ?",
                      [number, at, model_id])
        db.log_event("model_version_registered", model_id=model_id, version=number,
                     uuid=checkpoint_uuid)
    return number


def version(db: StateDB, model_id: int, number: int) -> ModelVersion | None:
    row = db.db.execute(f"{_VERSION_SELECT} WHERE model_id = ? AND version = ?",
                        [model_id, number]).fetchone()
    return _version(row) if row else None


def versions(db: StateDB, model_id: int, *, descending: bool = True) -> list[ModelVersion]:
    """The model's versions by number (the newest first unless `descending` is False)."""
    direction = "DESC" if descending else "ASC"
    return [_version(row) for row in db.db.execute(
        f"{_VERSION_SELECT} WHERE model_id = ? ORDER BY version {direction}",
        [model_id]).fetchall()]


def update_version(db: StateDB, model_id: int, number: int, **fields: Any) -> None:
    """Set some of VERSION_FIELDS; updated_at moves with them."""
    at = now()
    with db.atomic():
        sets = _encoded(fields)
        columns = ", ".join(f"{key} = ?" for key in sets)
        db.db.execute(f"UPDATE model_versions SET {columns}, updated_at = ? "
                      "WHERE model_id = ? AND version = ?",
                      [*sets.values(), at, model_id, number])
        db.db.execute("UPDATE models SET updated_at = ? WHERE id = ?", [at, model_id])
        db.log_event("model_version_updated", model_id=model_id, version=number,
                     fields=sorted(fields))


def delete_version(db: StateDB, model_id: int, number: int) -> None:
    with db.atomic():
        row = db.db.execute("SELECT checkpoint_uuid FROM model_versions "
                            "WHERE model_id = ? AND version = ?", [model_id, number]).fetchone()
        db.db.execute("DELETE FROM model_versions WHERE model_id = ? AND version = ?",
                      [model_id, number])
        db.db.execute("UPDATE models SET updated_at = ? WHERE id = ?", [now(), model_id])
        db.log_event("model_version_deleted", model_id=model_id, version=number,
                     uuid=row[0] if row else None)


def registered_checkpoints(db: StateDB, experiment_id: int | None = None) -> set[str]:
    """The uuids of the checkpoints (of one experiment, when given) that a model version
    names: retention and gc keep them until the version is deleted."""
    if experiment_id is None:
        rows = db.db.execute("SELECT DISTINCT checkpoint_uuid FROM model_versions")
    else:
        rows = db.db.execute(
            "SELECT DISTINCT v.checkpoint_uuid FROM model_versions v JOIN checkpoints c "
            "ON c.uuid = v.checkpoint_uuid WHERE c.experiment_id = ?", [experiment_id])
    return {uuid for (uuid,) in rows.fetchall()}
