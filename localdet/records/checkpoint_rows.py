"""Row-level reads and writes of a checkpoint beyond what the reporters record
(`StateDB.add_checkpoint`, `delete_checkpoint`): its user metadata, changed after the fact,
and the model versions that name it.

    set_metadata(db, uuid, {"stage": "prod"})
    registrations(db, uuid)    # [{"model": "mnist", "model_id": 1, "version": 2}, ...]
"""

from __future__ import annotations

import json
from typing import Any

from localdet.records.db import StateDB


def set_metadata(db: StateDB, uuid: str, metadata: dict[str, Any]) -> None:
    """Replace the checkpoint's metadata (the row's; the manifest keeps what it was saved
    with, as Determined's storage kept its metadata.json)."""
    with db.atomic():
        db.db.execute("UPDATE checkpoints SET metadata = ? WHERE uuid = ?",
                      [json.dumps(metadata), uuid])


def registrations(db: StateDB, uuid: str) -> list[dict[str, Any]]:
    """The model versions that point at the checkpoint, by model name then version."""
    rows = db.db.execute(
        "SELECT m.name, m.id, v.version FROM model_versions v JOIN models m "
        "ON m.id = v.model_id WHERE v.checkpoint_uuid = ? ORDER BY m.name, v.version",
        [uuid]).fetchall()
    return [{"model": name, "model_id": model_id, "version": version}
            for name, model_id, version in rows]
