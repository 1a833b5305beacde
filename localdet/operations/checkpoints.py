"""What users do to checkpoints: describe, download (materialize), list sorted, pick the
best, delete, and change their metadata. `localdet checkpoint export`, `det checkpoint ...`
and the SDK's `Checkpoint` are spellings over these.

    describe_checkpoint(layout, db, "3f2a")            # a unique prefix works
    download_checkpoint(layout, db, "3f2a", Path("out"))
    list_checkpoints(db, experiment_id=1, sort_by="batch_number", order="desc")
    list_checkpoints(db, experiment_id=1)              # best first by the searcher metric
    top_checkpoint(db, experiment_id=1, metric="val_loss", smaller_is_better=True)
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable

from localdet.checkpoints.manifest import files_of
from localdet.checkpoints.storage import checkpoint_store
from localdet.checkpoints.store import StoreError
from localdet.operations.errors import NotFound, OperationError
from localdet.operations.facts import checkpoint_facts
from localdet.paths import Layout
from localdet.records import checkpoint_rows
from localdet.records.db import Checkpoint, Experiment, StateDB
from localdet.records.states import TERMINAL_STATES, CheckpointState

# Determined's CheckpointSortBy, by the names its members carry (lowercase here), and the
# column each sorts on; "searcher_metric" sorts by the experiment's searcher metric.
SORT_ATTRIBUTES = {"uuid": "uuid", "trial_id": "trial_id", "batch_number": "batches_trained",
                   "end_time": "created_at", "state": "state"}
SORTS = (*SORT_ATTRIBUTES, "searcher_metric")
ORDERS = ("asc", "desc")


def _validation_at(db: StateDB, checkpoint: Checkpoint) -> dict[str, Any] | None:
    """The validation metrics recorded at the checkpoint's batch (None: not validated
    there)."""
    rows = [r.metrics for r in db.metrics(checkpoint.trial_id, "validation")
            if r.batches_trained == checkpoint.batches_trained]
    return rows[-1] if rows else None


def _facts(db: StateDB, checkpoint: Checkpoint, experiment: Experiment,
           full: bool = False) -> dict[str, Any]:
    validation = _validation_at(db, checkpoint)
    value = (validation or {}).get(experiment.metric)
    facts = {
        **checkpoint_facts(checkpoint),
        "searcher_metric": experiment.metric,
        "smaller_is_better": experiment.smaller_is_better,
        # A diverged trial's NaN is no score.
        "searcher_metric_value": value if isinstance(value, (int, float))
        and math.isfinite(value) else None,
        "validation_metrics": validation,
        "hparams": db.trial(checkpoint.trial_id).hparams,
        "registered": checkpoint_rows.registrations(db, checkpoint.uuid),
        # As Determined's checkpoints carried it: where it came from, and its storage.
        "experiment_config": experiment.config,
    }
    if full:
        facts["resources"] = {name: entry["size"] for name, entry
                              in checkpoint.manifest.get("files", {}).items()}
    return facts


def describe_checkpoint(layout: Layout, db: StateDB, uuid: str) -> dict[str, Any]:
    """A live checkpoint (a uuid or unique prefix): what `list_checkpoints` shows of it
    (its row, the validation metrics at its batch, its trial's hyperparameters, its
    experiment's config, the model versions that register it: `registered`), and its files
    with their sizes (`resources`)."""
    checkpoint = db.checkpoint(uuid)
    return _facts(db, checkpoint, db.experiment(checkpoint.experiment_id), full=True)


def download_checkpoint(layout: Layout, db: StateDB, uuid: str, path: Path | None = None,
                        *, reuse: bool = True) -> Path:
    """Write the checkpoint's files into `path` (default `checkpoints/<uuid>`, as
    Determined's `Checkpoint.download()`), verified, from the store its experiment keeps it
    in; held against `gc` while copying. With `reuse`, a folder that already holds a
    `metadata.json` is taken as already downloaded, as Determined did; otherwise the folder
    must be missing or empty."""
    # Here, not at the top: only a download needs the reader (and what it imports).
    from localdet.reporting.sqlite_reporter import CheckpointReader

    found = db.checkpoint(uuid)
    destination = Path(path) if path is not None else Path("checkpoints", found.uuid)
    if reuse and (destination / "metadata.json").exists():
        return destination
    try:
        with CheckpointReader(layout).holding(found.uuid) as held:
            checkpoint_store(layout, held).materialize(files_of(held.manifest), destination)
    except StoreError as error:
        raise OperationError(str(error)) from None
    return destination


def _in_scope(db: StateDB, experiment_id: int | None, trial_id: int | None,
              include_deleted: bool) -> list[Checkpoint]:
    if experiment_id is not None:
        db.experiment(experiment_id)  # NotFound, in one sentence
    if trial_id is not None:
        trial = db.trial(trial_id)
        if experiment_id is not None and trial.experiment_id != experiment_id:
            raise NotFound(f"trial {trial_id} is not a trial of experiment {experiment_id}")
    return db.checkpoints(experiment_id, trial_id, include_deleted=include_deleted)


def _sorted(facts: list[dict], key: str, descending: bool) -> list[dict]:
    """Sorted on `key`, the checkpoints without a value last either way."""
    present = [f for f in facts if f.get(key) is not None]
    missing = [f for f in facts if f.get(key) is None]
    return sorted(present, key=lambda f: f[key], reverse=descending) + missing


def list_checkpoints(db: StateDB, experiment_id: int | None = None,
                     trial_id: int | None = None, *, sort_by: str | None = None,
                     metric: str | None = None, order: str | None = None,
                     max_results: int | None = None,
                     include_deleted: bool = False) -> list[dict[str, Any]]:
    """The live checkpoints (with `include_deleted`, those retention deleted too) of an
    experiment, a trial, or all, sorted as Determined's `list_checkpoints` sorts them:

    - `sort_by`: one of SORTS (Determined's CheckpointSortBy, lowercase), or
    - `metric`: a validation metric's name, the value recorded at the checkpoint's batch;
    - neither: by the searcher metric, best first.

    `order` "asc" or "desc"; None: by the experiment's `smaller_is_better` for a metric
    (best first), ascending for the others. Checkpoints without the metric come last."""
    if sort_by is not None and metric is not None:
        raise OperationError("sort checkpoints by an attribute (sort_by) or by a metric, "
                             "not both")
    if sort_by is not None and sort_by not in SORTS:
        raise OperationError(f"cannot sort checkpoints by {sort_by!r}; use one of "
                             f"{', '.join(SORTS)}, or a validation metric's name")
    if order is not None and order not in ORDERS:
        raise OperationError(f"order {order!r} is not 'asc' or 'desc'")
    if max_results is not None and max_results < 1:
        raise OperationError(f"max_results must be at least 1, not {max_results}")
    experiments: dict[int, Experiment] = {}
    facts = []
    for checkpoint in _in_scope(db, experiment_id, trial_id, include_deleted):
        experiment = experiments.get(checkpoint.experiment_id)
        if experiment is None:
            experiment = experiments[checkpoint.experiment_id] = db.experiment(
                checkpoint.experiment_id)
        facts.append(_facts(db, checkpoint, experiment))
    if sort_by in SORT_ATTRIBUTES:
        chosen = _sorted(facts, SORT_ATTRIBUTES[sort_by], order == "desc")
    else:
        for f in facts:
            value = (f["validation_metrics"] or {}).get(metric) if metric else \
                f["searcher_metric_value"]
            f["_sort"] = value if isinstance(value, (int, float)) \
                and math.isfinite(value) else None
        smaller = next(iter(experiments.values())).smaller_is_better if experiments else True
        descending = order == "desc" if order is not None else not smaller
        chosen = _sorted(facts, "_sort", descending)
        for f in chosen:
            del f["_sort"]
    return chosen[:max_results] if max_results is not None else chosen


def top_checkpoint(db: StateDB, experiment_id: int | None = None, trial_id: int | None = None,
                   *, metric: str | None = None,
                   smaller_is_better: bool | None = None) -> dict[str, Any]:
    """The best live checkpoint of an experiment or trial: by the searcher metric, or by
    `metric` (`smaller_is_better` None: the experiment's setting)."""
    if experiment_id is None and trial_id is None:
        raise OperationError("name an experiment or a trial to pick its best checkpoint from")
    order = None if smaller_is_better is None else ("asc" if smaller_is_better else "desc")
    found = list_checkpoints(db, experiment_id, trial_id, metric=metric, order=order,
                             max_results=1)
    if not found:
        where = f"trial {trial_id}" if trial_id is not None else f"experiment {experiment_id}"
        raise NotFound(f"{where} has no checkpoint (kept by its checkpoint_storage settings) "
                       "yet")
    return found[0]


def delete_checkpoint(layout: Layout, db: StateDB, uuid: str) -> dict[str, Any]:
    """Mark a live checkpoint deleted (its row stays, as retention's do); its files go when
    `localdet gc` (or the daemon, after a trial) collects what no checkpoint uses. Refused
    while a model version registers it, and for the checkpoint a trial that has not ended
    would resume from."""
    checkpoint = db.checkpoint(uuid)
    registered = checkpoint_rows.registrations(db, checkpoint.uuid)
    if registered:
        first = registered[0]
        raise OperationError(f"checkpoint {checkpoint.uuid} is registered as version "
                             f"{first['version']} of model '{first['model']}'; delete that "
                             "model version first")
    trial = db.trial(checkpoint.trial_id)
    if trial.latest_checkpoint == checkpoint.uuid and trial.state not in TERMINAL_STATES:
        raise OperationError(f"checkpoint {checkpoint.uuid} is the one trial {trial.id} "
                             f"({trial.state}) resumes from; kill or let the trial end first")
    db.delete_checkpoint(checkpoint.uuid, "deleted by the user")
    return {**checkpoint_facts(checkpoint), "state": CheckpointState.DELETED}


def add_metadata(db: StateDB, uuid: str, metadata: dict[str, Any]) -> dict[str, Any]:
    """Merge `metadata` into the checkpoint's (its keys replace those already there, as
    Determined's `Checkpoint.add_metadata`); returns the metadata now recorded."""
    if not isinstance(metadata, dict):
        raise OperationError("checkpoint metadata must be a JSON object (a dict)")
    checkpoint = db.checkpoint(uuid)
    updated = {**checkpoint.metadata, **metadata}
    checkpoint_rows.set_metadata(db, checkpoint.uuid, updated)
    return updated


def remove_metadata(db: StateDB, uuid: str, keys: Iterable[str]) -> dict[str, Any]:
    """Remove the top-level `keys` from the checkpoint's metadata (absent ones are
    ignored); returns the metadata now recorded."""
    if isinstance(keys, str):
        raise OperationError("give the metadata keys to remove as a list of strings")
    checkpoint = db.checkpoint(uuid)
    updated = {k: v for k, v in checkpoint.metadata.items() if k not in set(keys)}
    checkpoint_rows.set_metadata(db, checkpoint.uuid, updated)
    return updated
