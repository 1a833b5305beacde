"""Deleting an experiment: its rows, its folder (model folder snapshot, trial logs,
TensorBoard files) and every stored checkpoint blob that no other checkpoint uses.

    delete_experiment(layout, db, 3)   # {"experiment_id": 3, "rows": {...}, "blobs_deleted": 5}
    finish_pending(layout, db)         # what interrupted deletions left (`localdet gc` runs it)

Refused, in one sentence, while the experiment or one of its trials has not ended, while a
model version names one of its checkpoints, while an experiment not ended warm-starts from
one, and while a reader holds one (a download or export).

A crash at any point leaves the experiment either whole or gone, never a record naming a
missing blob, because the steps run in this order:

1. its rows go in one transaction (`records.catalog.remove_experiment_rows`), which also
   writes down what is left to remove (`experiment_deletions`: its checkpoint storage and
   its blobs' hashes); before that commit nothing was touched, after it nothing names the
   experiment's files;
2. its folders are removed;
3. its blobs that no live checkpoint names are deleted, under the store's sweeping lease
   (`checkpoints.gc.delete_unused_blobs`: not while a checkpoint is being written, since a
   writer may be reusing one);
4. the pending row is removed.

Steps 2-4 may be cut short or repeated: each removes only what is still there, and the next
deletion or `localdet gc` runs them again for every pending row.
"""

from __future__ import annotations

import shutil
from typing import Any

from localdet.checkpoints.gc import delete_unused_blobs
from localdet.checkpoints.storage import open_store, storage_section
from localdet.checkpoints.store import Lease, StoreError
from localdet.checkpoints.warm_start import warm_start_sources
from localdet.operations.errors import OperationError
from localdet.paths import Layout
from localdet.records import catalog
from localdet.records.db import StateDB
from localdet.records.states import TERMINAL_STATES

# How long a deletion waits for a checkpoint being written (by another experiment's trial)
# before leaving its blobs to the next `localdet gc`.
WRITER_WAIT_SECONDS = 10.0


def folders(layout: Layout, experiment_id: int) -> list:
    """What an experiment keeps on disk outside the store: its folder (model folder
    snapshot, trial logs and TensorBoard files) and the TensorBoard export of
    `localdet tensorboard` (localdet/ui/tensorboard_export.py writes it there)."""
    return [layout.experiment_dir(experiment_id), layout.home / "tensorboard" / str(experiment_id)]


def _refusal(db: StateDB, experiment_id: int) -> str | None:
    experiment = db.experiment(experiment_id)  # NotFound: one sentence already
    what = f"{experiment.kind} {experiment_id}"
    live = [t.id for t in db.trials(experiment_id) if t.state not in TERMINAL_STATES]
    if experiment.state not in TERMINAL_STATES or live:
        trials = f" ({len(live)} of its trials have not ended)" if live else ""
        return (f"{what} is {experiment.state}{trials}; kill it first and delete it once "
                "it has ended")
    registered = catalog.registered_checkpoints(db, experiment_id)
    if registered:
        uuid, model, version = registered[0]
        more = f" (and {len(registered) - 1} more)" if len(registered) > 1 else ""
        return (f"checkpoint {uuid} of {what} is version {version} of model '{model}'{more}; "
                "delete those model versions first")
    own = {c.uuid for c in db.checkpoints(experiment_id)}
    sources = own & warm_start_sources(db)
    if sources:
        uuid = sorted(sources)[0]
        user = db.db.execute(
            "SELECT id FROM experiments WHERE json_extract(config, "
            "'$.searcher.source_checkpoint_uuid') = ? ORDER BY id LIMIT 1", [uuid]).fetchone()
        return (f"experiment {user[0] if user else '?'} warm-starts its trials from checkpoint "
                f"{uuid} of {what} and has not ended; delete {what} once it has")
    return None


def delete_experiment(layout: Layout, db: StateDB, experiment_id: int) -> dict[str, Any]:
    """Delete the experiment (or job) and everything it stored; raises OperationError saying
    why not, or NotFound. Returns what was removed."""
    finished = finish_pending(layout, db)  # an earlier deletion's leftovers first
    refusal = _refusal(db, experiment_id)
    if refusal:
        raise OperationError(refusal)
    experiment = db.experiment(experiment_id)
    storage = dict(storage_section(experiment.config))
    try:  # a shared_fs mount or an S3 bucket out of reach: refused, nothing touched
        store = open_store(layout, experiment.config)
        leases = _take_leases(store, [c.uuid for c in db.checkpoints(experiment_id)])
    except StoreError as error:
        raise OperationError(str(error)) from None
    committed = False
    try:
        with db.atomic():
            # Again under the write lock: nothing (a `det e continue`, a registration) has
            # revived or claimed it since the first look.
            refusal = _refusal(db, experiment_id)
            if refusal:
                raise OperationError(refusal)
            blobs = {sha for deleted in (False, True) for _, sha, _ in
                     db.checkpoint_files(deleted=deleted, experiment_id=experiment_id)}
            rows = remove_rows(db, experiment_id, {"storage": storage,
                                                   "blobs": sorted(blobs)})
        committed = True
    finally:
        for lease in leases:
            # Nobody can read a deleted checkpoint: its lease file goes with it.
            lease.release(remove=committed)
    result = clean_up(layout, db, {"experiment_id": experiment_id, "storage": storage,
                                   "blobs": sorted(blobs)})
    return {"experiment_id": experiment_id, "rows": rows, **result,
            "earlier_deletions_finished": finished}


def _take_leases(store: Any, uuids: list[str]) -> list[Any]:
    """Every checkpoint's lease, exclusively and without waiting (as retention takes them),
    so that no reader is cut off mid-download; OperationError if one is held."""
    leases: list[Lease | Any] = []
    try:
        for uuid in uuids:
            lease = store.try_exclusive(uuid)
            if lease is None:
                raise OperationError(f"checkpoint {uuid} is being read (a download or "
                                     "export); delete the experiment once that has finished")
            leases.append(lease)
    except BaseException:
        for taken in leases:
            taken.release()
        raise
    return leases


# -- the steps (module functions, so that tests/sdk_cli/test_deletion.py can cut each short)

def remove_rows(db: StateDB, experiment_id: int, pending: dict[str, Any]) -> dict[str, int]:
    return catalog.remove_experiment_rows(db, experiment_id, pending=pending)


def remove_folders(layout: Layout, experiment_id: int) -> list[str]:
    removed = []
    for folder in folders(layout, experiment_id):
        if not (folder.exists() or folder.is_symlink()):
            continue
        if folder.is_symlink() or not folder.is_dir():
            folder.unlink(missing_ok=True)
        else:
            for _ in range(3):  # another process finishing the same cleanup removes files too
                try:
                    shutil.rmtree(folder)
                    break
                except FileNotFoundError:
                    if not folder.exists():
                        break
        removed.append(str(folder))
    return removed


def free_blobs(layout: Layout, db: StateDB, storage: dict[str, Any],
               blobs: list[str]) -> dict[str, int] | None:
    store = open_store(layout, {"checkpoint_storage": storage})
    present = {sha for sha in blobs if store.has(sha)}
    if not present:
        return {}
    return delete_unused_blobs(db, store, present, writer_wait_seconds=WRITER_WAIT_SECONDS)


def finish(db: StateDB, experiment_id: int) -> None:
    catalog.finish_deletion(db, experiment_id)


def clean_up(layout: Layout, db: StateDB, pending: dict[str, Any]) -> dict[str, Any]:
    """Steps 2-4 for one deleted experiment (`catalog.pending_deletions` row)."""
    experiment_id = pending["experiment_id"]
    removed = remove_folders(layout, experiment_id)
    try:
        gone = free_blobs(layout, db, pending["storage"], pending["blobs"])
    except StoreError as error:  # a mount or bucket out of reach: the next gc tries again
        return {"folders": removed, "blobs_deleted": 0, "bytes_freed": 0,
                "blobs_deferred": True, "blobs_error": str(error)}
    if gone is not None:
        finish(db, experiment_id)
    return {"folders": removed, "blobs_deleted": len(gone or {}),
            "bytes_freed": sum((gone or {}).values()), "blobs_deferred": gone is None}


def finish_pending(layout: Layout, db: StateDB) -> list[int]:
    """Finish every interrupted (or deferred) deletion; returns the experiment ids whose
    cleanup is now complete."""
    done = []
    for pending in catalog.pending_deletions(db):
        if not clean_up(layout, db, pending)["blobs_deferred"]:
            done.append(pending["experiment_id"])
    return done
