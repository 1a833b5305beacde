"""`localdet gc --rechunk`: turn files stored whole (by localdet before it chunked files, or
uploaded by a remote trial) into content-defined chunks, so that what they share with other
checkpoints is stored once.

    report = rechunk(layout, db)
    print(report.summary())   # "rechunked 8 files of 4 checkpoints; the stores went from ..."

Without it, whole-file blobs keep working: a file without chunks is read as its one blob.

Crash-safe and idempotent, on the same leases as `localdet.checkpoints.gc`:

- A checkpoint's chunks are stored (durable) under `store.writing()`, so no collector deletes
  them before the manifest that names them commits.
- The manifest is rewritten in one transaction while the checkpoint's lease is held
  exclusively (a checkpoint a reader holds is skipped this round, as gc skips it), and only
  if the row is still live and unchanged: a reader either read the old manifest before (and
  holds the lease) or reads the new one after.
- Only then, under the collector's sweeping lease, go the whole-file blobs that no live
  checkpoint names any more: those whose files now have chunks. Killed anywhere, a run
  leaves either the old manifest with its blob or the new one with its chunks; chunks stored
  for a manifest never rewritten are orphans that the next run reuses (or gc's orphan sweep
  deletes), and whole blobs left behind are deleted by the next run.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from localdet.checkpoints.chunking import MIN_SIZE
from localdet.checkpoints.gc import delete_unused_blobs
from localdet.checkpoints.manifest import build_manifest, files_of
from localdet.checkpoints.storage import CheckpointStore, open_store
from localdet.checkpoints.store import CorruptBlobError, FileEntry, MissingBlobError, Store
from localdet.paths import Layout
from localdet.records.db import Checkpoint, StateDB
from localdet.records.states import CheckpointState


@dataclass
class RechunkReport:
    files: int = 0
    checkpoints: int = 0
    held: list[str] = field(default_factory=list)  # skipped: a reader held them
    stored_before: int = 0   # bytes of blobs in the stores before
    stored_after: int = 0
    deferred: bool = False   # a checkpoint was being written: the old blobs are still there

    def summary(self) -> str:
        saved = self.stored_before - self.stored_after
        line = (f"rechunked {self.files} file{'' if self.files == 1 else 's'} of "
                f"{self.checkpoints} checkpoint{'' if self.checkpoints == 1 else 's'}; the "
                f"stores went from {self.stored_before / 1e6:.1f} MB to "
                f"{self.stored_after / 1e6:.1f} MB ({saved / 1e6:.1f} MB saved)")
        if self.held:
            line += (f"; skipped {len(self.held)} checkpoint(s) held by a reader "
                     f"({', '.join(self.held)}): run it again once they are released")
        if self.deferred:
            line += ("; the whole-file blobs were not deleted, a checkpoint was being "
                     "written: run it again")
        return line


def stored_bytes(store: CheckpointStore) -> int:
    """The bytes of every blob in the store."""
    if isinstance(store, Store):
        total = 0
        for blob in store.objects.glob("??/*"):
            try:
                total += blob.stat().st_size
            except FileNotFoundError:
                continue
        return total
    return sum(item["Size"] for item, _ in store._list(f"{store.prefix}objects/"))


def rechunk(layout: Layout, db: StateDB, *, writer_wait_seconds: float = 10.0) -> RechunkReport:
    """Chunk every live checkpoint's whole-file blobs in every store, then delete the blobs
    no live checkpoint names any more (see the module's docstring)."""
    report = RechunkReport()
    stores: dict[str, tuple[CheckpointStore, list[int]]] = {}
    own = Store(layout.store)
    stores[own.location] = (own, [])
    for experiment in db.experiments():
        store = open_store(layout, experiment.config)
        stores.setdefault(store.location, (store, []))[1].append(experiment.id)
    for store, experiment_ids in stores.values():
        report.stored_before += stored_bytes(store)
        for experiment_id in experiment_ids:
            for checkpoint in db.checkpoints(experiment_id=experiment_id):
                _rechunk_checkpoint(db, store, checkpoint, report)
        whole = {entry.sha256 for experiment_id in experiment_ids
                 for checkpoint in db.checkpoints(experiment_id=experiment_id)
                 for entry in files_of(checkpoint.manifest).values() if entry.chunks}
        if whole and delete_unused_blobs(db, store, whole,
                                         writer_wait_seconds=writer_wait_seconds) is None:
            report.deferred = True
        report.stored_after += stored_bytes(store)
    return report


def _rechunk_checkpoint(db: StateDB, store: CheckpointStore, checkpoint: Checkpoint,
                        report: RechunkReport) -> None:
    files = files_of(checkpoint.manifest)
    # A file shorter than a chunk's minimum would be one chunk: itself.
    todo = [name for name, entry in files.items() if not entry.chunks and entry.size > MIN_SIZE]
    if not todo:
        return
    with store.writing():  # from the first chunk to the commit
        new: dict[str, FileEntry] = dict(files)
        for name in todo:
            try:
                new[name] = store.rechunk(files[name], name)
            except (MissingBlobError, CorruptBlobError):
                continue  # left as it is: `localdet doctor` names it
        changed = [name for name in todo if new[name].chunks]
        if not changed:
            return
        lease = store.try_exclusive(checkpoint.uuid)
        if lease is None:
            report.held.append(checkpoint.uuid)
            return
        try:
            if _commit(db, checkpoint, new):
                report.files += len(changed)
                report.checkpoints += 1
        finally:
            lease.release()


def _commit(db: StateDB, checkpoint: Checkpoint, files: dict[str, FileEntry]) -> bool:
    """Rewrite the checkpoint's manifest with `files`, if it is still live and unchanged."""
    old: dict[str, Any] = checkpoint.manifest
    manifest = build_manifest(
        uuid=old["uuid"], experiment_id=old["experiment_id"], trial_id=old["trial_id"],
        batches_trained=old["batches_trained"], files=files, metadata=old["metadata"],
        created_at=old["created_at"])
    with db.atomic():
        row = db.db.execute("SELECT manifest FROM checkpoints WHERE uuid = ? AND state = ?",
                            [checkpoint.uuid, CheckpointState.COMPLETED]).fetchone()
        if row is None or json.loads(row[0]) != old:
            return False  # deleted, or rechunked by another run meanwhile
        db.db.execute("UPDATE checkpoints SET manifest = ? WHERE uuid = ?",
                      [json.dumps(manifest), checkpoint.uuid])
    return True
