"""`localdet checkpoint import FOLDER`: a checkpoint folder from outside (one exported from
localdet, or one Determined wrote, of any release) goes into localdet's own store, so that
`searcher.source_checkpoint_uuid` can warm-start trials from it and `localdet checkpoint
export` gives its files back.

Every checkpoint row names an experiment and a trial; an imported one gets its own: an
experiment (runner 'script': the daemon never schedules it, as with a script's own run)
named after the folder, COMPLETED at once, with one COMPLETED trial, whose hyperparameters
are the checkpoint's where its files say. So listing, export, retention (its one checkpoint
is its trial's latest, always kept) and the store's garbage collection treat it as any other.

    imported = import_checkpoint(Layout.from_environment().ensure(), Path("0.13.8-keras"))
    print(imported.uuid)
"""

from __future__ import annotations

import json
import secrets
import uuid as uuidlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localdet.checkpoints.manifest import build_manifest
from localdet.checkpoints.store import Store, StoreError
from localdet.config.experiment import parse_config
from localdet.paths import Layout
from localdet.records.db import StateDB, now
from localdet.records.states import ExperimentState, Runner, TrialState

SEARCHER = "imported"  # the searcher column of an import's experiment: nothing searched


@dataclass(frozen=True)
class Imported:
    uuid: str
    experiment_id: int
    trial_id: int
    batches_trained: int
    files: int
    size_bytes: int


def _json_object(path: Path) -> dict[str, Any]:
    """The JSON object in `path`, or {} where there is none (or it is not an object): an
    imported folder's files are taken as they are, whatever they hold."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _facts(folder: Path) -> tuple[dict[str, Any], dict[str, Any], int]:
    """The checkpoint's metadata, hyperparameters and batches trained, where its files
    (localdet's `metadata.json` and `hparams.json`, Determined's `metadata.json` or
    `load_data.json`) say them."""
    metadata = _json_object(folder / "metadata.json")
    load_data = _json_object(folder / "load_data.json")
    hparams = (_json_object(folder / "hparams.json") or metadata.get("hparams")
               or load_data.get("hparams") or {})
    batches = 0
    for source, key in ((metadata, "batches_trained"), (metadata, "steps_completed"),
                        (metadata, "latest_batch"), (load_data, "steps_completed")):
        value = source.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            batches = value
            break
    return metadata, hparams if isinstance(hparams, dict) else {}, batches


def _metadata(metadata: dict[str, Any], folder: Path) -> dict[str, Any]:
    """The folder's own metadata (`CheckpointContext.get_metadata` reads it), and where the
    checkpoint came from; metadata that is not plain JSON (a NaN) stays in its file only."""
    try:
        json.dumps(metadata, allow_nan=False)
    except ValueError:
        metadata = {}
    return {**metadata, "imported_from": str(folder)}


def import_checkpoint(layout: Layout, folder: Path) -> Imported:
    """Store `folder`'s files and record them as a checkpoint; raises StoreError (a folder
    that is missing or empty, or holds what cannot be stored) having recorded nothing."""
    folder = Path(folder).resolve()
    if not folder.is_dir():
        raise StoreError(f"'{folder}' is not a folder; pass the checkpoint's folder")
    metadata, hparams, batches = _facts(folder)
    config = parse_config({
        "name": f"imported {folder.name}",
        "description": f"checkpoint imported from {folder}",
        "entrypoint_script": "(an imported checkpoint: nothing to run)",
        "hyperparameters": {},
    }).config
    seed = secrets.randbelow(2**31)
    config["reproducibility"]["experiment_seed"] = seed
    store = Store(layout.store)  # the config names no checkpoint_storage: localdet's own
    uuid = str(uuidlib.uuid4())
    with StateDB.open(layout.db) as db, store.writing():
        files = store.put_directory(folder)  # durable before anything refers to them
        if not files:
            raise StoreError(f"'{folder}' holds no files; pass the checkpoint's folder")
        with db.atomic():
            experiment_id = db.create_experiment(
                name=config["name"], description=config["description"], config=config,
                original_config=f"# {config['description']}\n", searcher=SEARCHER,
                metric=config["searcher"]["metric"], smaller_is_better=True,
                experiment_seed=seed, model_dir="", runner=Runner.SCRIPT)
            db.db.table("experiments").update(
                experiment_id, {"model_dir": str(layout.model_dir(experiment_id))})
            trial_id = db.create_trial(experiment_id=experiment_id, request_id=0,
                                       hparams=hparams, seed=seed, target_batches=batches)
            db.add_checkpoint(build_manifest(
                uuid=uuid, experiment_id=experiment_id, trial_id=trial_id,
                batches_trained=batches, files=files, metadata=_metadata(metadata, folder)))
            db.update_trial(trial_id, state=TrialState.COMPLETED, batches_trained=batches,
                            started_at=now())
            db.set_experiment_state(experiment_id, ExperimentState.COMPLETED)
            db.log_event("checkpoint_imported", experiment_id=experiment_id,
                         trial_id=trial_id, uuid=uuid, folder=str(folder))
    return Imported(uuid, experiment_id, trial_id, batches, len(files),
                    sum(entry.size for entry in files.values()))
