"""The model registry, as Determined's: named models with a description, notes, labels and
metadata, and numbered versions, each naming a checkpoint that retention and `gc` then keep
until the version is deleted. `det model ...`, the SDK's Model/ModelVersion and the
dashboard's registry page all call these.

    create_model(db, "mnist", description="digits")
    register_version(db, "mnist", "3f2a...")          # {"version": 1, "checkpoint": {...}}
    get_version(db, "mnist")                           # the newest version, or None
    list_models(db, sort_by="last_updated_time", order="desc")
    delete_model(db, "mnist")                          # with its versions, as Determined did

A model is named by its name or its id (a string of digits is an id, as Determined read it,
which is why a name may not be only digits). Each function returns plain data and raises
OperationError or NotFound with one sentence.
"""

from __future__ import annotations

import json
import re
import sqlite3
from typing import Any, Iterable

from localdet.operations.errors import NotFound, OperationError
from localdet.operations.facts import checkpoint_facts
from localdet.records import registry
from localdet.records.db import Checkpoint, StateDB

ORDERS = ("asc", "desc")


# -- what a model and a version show ------------------------------------------------------

def model_facts(model: registry.Model) -> dict[str, Any]:
    return {
        "id": model.id,
        "name": model.name,
        "description": model.description,
        "notes": model.notes,
        "labels": model.labels,
        "metadata": model.metadata,
        "archived": model.archived,
        "creation_time": model.created_at,
        "last_updated_time": model.updated_at,
        "num_versions": model.num_versions,
    }


def version_facts(db: StateDB, model: registry.Model,
                  version: registry.ModelVersion) -> dict[str, Any]:
    # Read whatever its state: a registered checkpoint is never deleted, but one
    # registered before that rule (or by hand) shows as DELETED rather than vanishing.
    rows = list(db.db.table("checkpoints").rows_where("uuid = ?", [version.checkpoint_uuid]))
    checkpoint = Checkpoint.from_row(rows[0]) if rows else None
    return {
        "id": version.id,
        "model_id": model.id,
        "model_name": model.name,
        "version": version.version,
        "name": version.name,
        "comment": version.comment,
        "notes": version.notes,
        "labels": version.labels,
        "metadata": version.metadata,
        "creation_time": version.created_at,
        "last_updated_time": version.updated_at,
        "checkpoint_uuid": version.checkpoint_uuid,
        "checkpoint": {**checkpoint_facts(checkpoint),
                       "validation_metrics": _validation_at(db, checkpoint)}
        if checkpoint else None,
    }


def _validation_at(db: StateDB, checkpoint: Checkpoint) -> dict[str, Any] | None:
    """The validation metrics recorded at the checkpoint's batch (what Determined's
    `det model list-versions` shows beside it); None when it was not validated there."""
    row = db.db.execute("SELECT metrics FROM metrics WHERE trial_id = ? AND kind = "
                        "'validation' AND batches_trained = ? ORDER BY id DESC LIMIT 1",
                        [checkpoint.trial_id, checkpoint.batches_trained]).fetchone()
    return json.loads(row[0]) if row else None


# -- checks ------------------------------------------------------------------------------

def _check_name(name: Any) -> str:
    """Determined's rules for a model name, so that a name never reads as an id or a
    path."""
    if not isinstance(name, str) or not name.replace(" ", ""):
        raise OperationError("a model name cannot be blank; give it a name")
    if "  " in name:
        raise OperationError(f"the model name {name!r} has two spaces in a row; use one")
    if "/" in name or "\\" in name:
        raise OperationError(f"the model name {name!r} has a slash; model names cannot")
    if re.fullmatch(r"\d+", name):
        raise OperationError(f"the model name {name!r} is only digits, which names a model "
                             "by its id; add a letter")
    return name


def _labels(labels: Iterable[str] | None) -> list[str]:
    if labels is None:
        return []
    if isinstance(labels, str) or not all(isinstance(x, str) and x for x in labels):
        raise OperationError(f"labels must be a list of non-empty strings, not {labels!r}")
    return list(dict.fromkeys(labels))  # once each, in the order given


def _metadata(metadata: dict[str, Any] | None) -> dict[str, Any]:
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise OperationError(f"metadata must be a dictionary, not {type(metadata).__name__}")
    try:
        json.dumps(metadata, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise OperationError(f"metadata must be JSON data (strings, numbers, lists and "
                             f"dictionaries): {error}") from None
    return metadata


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise OperationError(f"{what} must be text, not {type(value).__name__}")
    return value


def _model(db: StateDB, name_or_id: str | int) -> registry.Model:
    text = str(name_or_id)
    model = registry.model_by_id(db, int(text)) if re.fullmatch(r"\d+", text) else \
        registry.model_by_name(db, text)
    if model is None:
        raise NotFound(f"there is no model {text!r}; `det model list` lists them")
    return model


def _editable(model: registry.Model) -> registry.Model:
    if model.archived:
        raise OperationError(f"model {model.name!r} is archived and cannot be changed; "
                             f"unarchive it first (`det model unarchive {model.name}`)")
    return model


def _version(db: StateDB, model: registry.Model, number: int) -> registry.ModelVersion:
    found = registry.version(db, model.id, number)
    if found is None:
        raise NotFound(f"model {model.name!r} has no version {number}; `det model "
                       f"list-versions {model.name}` lists them")
    return found


def _order(order: str) -> bool:
    """Whether `order` ("asc" or "desc") is descending."""
    if str(order).lower() not in ORDERS:
        raise OperationError(f"order must be asc or desc, not {order!r}")
    return str(order).lower() == "desc"


# -- models ------------------------------------------------------------------------------

def create_model(db: StateDB, name: str, description: str = "",
                 metadata: dict[str, Any] | None = None, labels: Iterable[str] | None = None,
                 notes: str = "") -> dict[str, Any]:
    name = _check_name(name)
    try:
        model_id = registry.create_model(
            db, name, description=_text(description or "", "a description"),
            notes=_text(notes or "", "notes"), labels=_labels(labels),
            metadata=_metadata(metadata))
    except sqlite3.IntegrityError:
        raise OperationError(f"a model named {name!r} already exists; pick another name "
                             "(names are case-sensitive)") from None
    return get_model(db, model_id)


def get_model(db: StateDB, name_or_id: str | int) -> dict[str, Any]:
    return model_facts(_model(db, name_or_id))


def list_models(db: StateDB, *, archived: bool | None = False, name: str | None = None,
                labels: Iterable[str] = (), sort_by: str = "name",
                order: str = "asc") -> list[dict[str, Any]]:
    """The models (archived=False: not archived ones, the default listing; True: only
    archived ones; None: all), sorted by `sort_by` (Determined's ModelSortBy: name,
    description, creation_time, last_updated_time, num_versions), then by id."""
    key = str(sort_by).lower()
    if key not in registry.SORT_COLUMNS:
        raise OperationError(f"models can be sorted by {', '.join(registry.SORT_COLUMNS)}, "
                             f"not {sort_by!r}")
    return [model_facts(m) for m in registry.models(
        db, archived=archived, name=name, labels=_labels(list(labels)), sort_by=key,
        descending=_order(order))]


def update_model(db: StateDB, name_or_id: str | int, **fields: Any) -> dict[str, Any]:
    """Change the model's name, description, notes, labels or metadata (each replaced
    whole, as Determined's PatchModel did)."""
    model = _editable(_model(db, name_or_id))
    unknown = sorted(set(fields) - set(registry.MODEL_FIELDS) - {"archived"})
    if unknown or "archived" in fields:
        what = ", ".join(unknown) or "archived"
        raise OperationError(f"a model's {what} cannot be set this way; it has name, "
                             "description, notes, labels and metadata (archive_model and "
                             "unarchive_model archive it)")
    checked: dict[str, Any] = {}
    for key, value in fields.items():
        if key == "name":
            checked[key] = _check_name(value)
        elif key == "labels":
            checked[key] = _labels(value)
        elif key == "metadata":
            checked[key] = _metadata(value)
        else:
            checked[key] = _text(value, f"a model's {key}")
    if checked:
        try:
            registry.update_model(db, model.id, **checked)
        except sqlite3.IntegrityError:
            raise OperationError(f"a model named {checked['name']!r} already exists; pick "
                                 "another name") from None
    return get_model(db, model.id)


def archive_model(db: StateDB, name_or_id: str | int) -> dict[str, Any]:
    """Archived: left out of the default listing, no new versions; everything kept."""
    model = _model(db, name_or_id)
    if not model.archived:
        registry.update_model(db, model.id, archived=True)
    return get_model(db, model.id)


def unarchive_model(db: StateDB, name_or_id: str | int) -> dict[str, Any]:
    model = _model(db, name_or_id)
    if model.archived:
        registry.update_model(db, model.id, archived=False)
    return get_model(db, model.id)


def delete_model(db: StateDB, name_or_id: str | int) -> dict[str, Any]:
    """Delete the model and its versions, as Determined did; their checkpoints stay, and
    retention may delete them from then on. Returns what was deleted."""
    model = _model(db, name_or_id)
    numbers = registry.delete_model(db, model.id)
    return {"id": model.id, "name": model.name, "versions": numbers}


# -- versions ----------------------------------------------------------------------------

def register_version(db: StateDB, name_or_id: str | int, checkpoint_uuid: str,
                     name: str = "", comment: str = "", labels: Iterable[str] | None = None,
                     metadata: dict[str, Any] | None = None, notes: str = "") -> dict[str, Any]:
    """Register the checkpoint (its uuid, or a prefix naming one) as the model's next
    version."""
    model = _model(db, name_or_id)
    if model.archived:
        raise OperationError(f"model {model.name!r} is archived and cannot register new "
                             f"versions; unarchive it first (`det model unarchive "
                             f"{model.name}`)")
    fields: dict[str, Any] = {"name": _text(name or "", "a version's name"),
              "comment": _text(comment or "", "a version's comment"),
              "notes": _text(notes or "", "a version's notes"),
              "labels": _labels(labels), "metadata": _metadata(metadata)}
    # One transaction: gc cannot mark the checkpoint deleted between the look-up and the
    # registration (it decides in a write transaction of its own).
    with db.atomic():
        uuid = db.checkpoint(str(checkpoint_uuid)).uuid  # NotFound / CheckpointDeleted
        number = registry.add_version(db, model.id, uuid, **fields)
    return version_facts(db, model, _version(db, model, number))


def get_version(db: StateDB, model: str | int, version: int = -1) -> dict[str, Any] | None:
    """Version `version` of the model; -1: its newest, or None when it has none (as
    Determined's Model.get_version)."""
    found = _model(db, model)
    if version == -1:
        newest = registry.versions(db, found.id, descending=True)
        return version_facts(db, found, newest[0]) if newest else None
    return version_facts(db, found, _version(db, found, int(version)))


def list_versions(db: StateDB, model: str | int, order: str = "desc") -> list[dict[str, Any]]:
    """The model's versions by number, the newest first by default (as Determined)."""
    found = _model(db, model)
    return [version_facts(db, found, v)
            for v in registry.versions(db, found.id, descending=_order(order))]


def update_version(db: StateDB, model: str | int, version: int,
                   **fields: Any) -> dict[str, Any]:
    """Change a version's name, comment, notes, labels or metadata (each replaced whole);
    its number and checkpoint stay."""
    found = _editable(_model(db, model))
    _version(db, found, int(version))
    unknown = sorted(set(fields) - set(registry.VERSION_FIELDS))
    if unknown:
        raise OperationError(f"a model version's {', '.join(unknown)} cannot be set; it has "
                             "name, comment, notes, labels and metadata")
    checked = {key: _labels(value) if key == "labels" else _metadata(value)
               if key == "metadata" else _text(value, f"a version's {key}")
               for key, value in fields.items()}
    if checked:
        registry.update_version(db, found.id, int(version), **checked)
    return get_version(db, found.id, int(version)) or {}


def delete_version(db: StateDB, model: str | int, version: int) -> dict[str, Any]:
    """Delete the version (its number is never given again); its checkpoint stays, and
    retention may delete it from then on unless another version names it."""
    found = _model(db, model)
    facts = version_facts(db, found, _version(db, found, int(version)))
    registry.delete_version(db, found.id, int(version))
    return facts
