"""Checkpoint manifests: what a checkpoint is, as committed to SQLite.

    files = store.put_directory(ckpt_dir)
    manifest = build_manifest(uuid=str(uuid.uuid4()), experiment_id=1, trial_id=3,
                              batches_trained=500, files=files, metadata={"framework": "keras"})
    # ... store json.dumps(manifest) in SQLite; later:
    validate_manifest(manifest)
    store.materialize(files_of(manifest), export_dir)
"""
from __future__ import annotations

import functools
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from localdet.checkpoints.store import FileEntry
from localdet.paths import state_formats_dir

MANIFEST_FORMAT = 1
SCHEMA_NAME = "checkpoint_manifest.schema.json"


def schema_path() -> Path:
    return state_formats_dir() / SCHEMA_NAME


@functools.lru_cache(maxsize=1)
def _validator() -> Draft202012Validator:
    schema = json.loads(schema_path().read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def _utc_now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def build_manifest(*, uuid: str, experiment_id: int, trial_id: int, batches_trained: int,
                   files: Mapping[str, FileEntry], metadata: Mapping[str, Any],
                   created_at: str | None = None) -> dict[str, Any]:
    """Assemble and validate a manifest; raises ValueError if any field is unacceptable.

        build_manifest(uuid="0b6f...", experiment_id=1, trial_id=2, batches_trained=100,
                       files={"metadata.json": FileEntry("ab12...", 57)}, metadata={})
    """
    try:
        # A JSON round trip both proves the metadata can be stored and detaches it
        # from the caller's (mutable) objects.
        metadata_copy = json.loads(json.dumps(metadata, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise ValueError(f"checkpoint metadata must be plain JSON: {e}") from None
    manifest = {
        "format": MANIFEST_FORMAT,
        "uuid": uuid,
        "experiment_id": experiment_id,
        "trial_id": trial_id,
        "batches_trained": batches_trained,
        "created_at": created_at if created_at is not None else _utc_now_iso(),
        "metadata": metadata_copy,
        "files": {name: _file_json(e) for name, e in sorted(files.items())},
        "size_bytes": sum(e.size for e in files.values()),
    }
    validate_manifest(manifest)
    return manifest


def _file_json(entry: FileEntry) -> dict[str, Any]:
    found: dict[str, Any] = {"sha256": entry.sha256, "size": entry.size}
    if entry.chunks:
        found["chunks"] = [[sha256, size] for sha256, size in entry.chunks]
    return found


def _dotted(path: Any) -> str:
    return ".".join(str(part) for part in path)


def validate_manifest(manifest: Mapping[str, Any]) -> None:
    """Raise ValueError naming the offending field (``files.model.h5.sha256``) if invalid."""
    error = best_match(_validator().iter_errors(manifest))
    if error is not None:
        where, message = _dotted(error.absolute_path), error.message
        if "propertyNames" in error.schema_path:
            # The schema's regex would mean little to a user; say what is wrong with the key.
            where = _dotted([*error.absolute_path, error.instance])
            message = ("file names must be relative POSIX paths without '.', '..', "
                       "empty segments, backslashes or NUL")
        at = f" at {where}" if where else ""
        raise ValueError(f"checkpoint manifest is invalid{at}: {message}")
    total = sum(entry["size"] for entry in manifest["files"].values())
    if manifest["size_bytes"] != total:
        raise ValueError(f"checkpoint manifest is invalid at size_bytes: {manifest['size_bytes']} "
                         f"is not the sum of the file sizes ({total})")
    for name, entry in manifest["files"].items():
        if "chunks" in entry and sum(size for _, size in entry["chunks"]) != entry["size"]:
            raise ValueError(f"checkpoint manifest is invalid at files.{name}.chunks: the "
                             f"chunk sizes do not add up to the file's size ({entry['size']})")


def files_of(manifest: Mapping[str, Any]) -> dict[str, FileEntry]:
    """``{"code/model_def.py": FileEntry(sha256, size, chunks), ...}`` from a manifest."""
    return {name: FileEntry(sha256=entry["sha256"], size=entry["size"],
                            chunks=tuple((sha256, size) for sha256, size
                                         in entry.get("chunks", ())))
            for name, entry in manifest["files"].items()}
