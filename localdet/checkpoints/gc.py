"""Checkpoint garbage collection: apply retention (`localdet.checkpoints.retention`) to
experiments, mark the checkpoints it does not keep DELETED (their rows stay: history is never
lost), then delete the blobs that no live checkpoint refers to any more.

    report = collect(Layout.from_environment(), db, experiment_id=3)
    print(report.summary())      # "deleted 2 checkpoints, freed 6 blobs (48.1 MB)"

Safe to call often and from several processes at once (the daemon after each trial, and
`localdet gc`):

- Deciding and marking happen in one write transaction, on what is recorded at that moment;
  a second collector waits for it and then finds nothing left to do.
- A checkpoint is marked DELETED only while the collector holds its lease exclusively
  (taken without waiting); one a reader holds (`Store.reading`) is skipped this round and
  reported. Readers look a checkpoint up *after* taking its lease, so they either hold it
  before the collector (and it is skipped) or find it DELETED.
- A checkpoint a model version names (`localdet.records.registry`) is kept whatever the
  retention settings, until the version (or its model) is deleted; registering one looks
  it up in a write transaction, so it is either kept or found DELETED, never half of each.
- Blobs are deleted only while no checkpoint is being written (`Store.try_sweeping`, never
  waited for by default): a writer's blobs are referenced by nothing until its manifest
  commits, and it may be reusing a blob of a deleted checkpoint. While one is, blob deletion
  is left to the next collection (`GcReport.blobs_deferred`).
- A full collection (no experiment named) also deletes orphan blobs and temporary files that
  no manifest names, but only those older than `GRACE_SECONDS`: a writer that does not take
  the writers lock, or one that crashed, leaves them.
- Each experiment's checkpoints live in the store its `checkpoint_storage` names
  (`localdet.checkpoints.storage`): localdet's own, a `shared_fs` one (the same locks, on the shared
  mount) or `s3`, where objects stand in for the locks and no blob younger than the grace
  period is deleted (`localdet.checkpoints.s3_leases` says why that is safe). Retention and blob
  deletion run per store; a blob counts as live if a live checkpoint of *any* store names
  it, which at worst keeps a blob longer than needed, never deletes one in use. A full
  collection sweeps localdet's own store and every store an experiment names.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Collection

from localdet.checkpoints.retention import CheckpointRef, checkpoints_to_keep
from localdet.checkpoints.s3_store import S3Store
from localdet.checkpoints.storage import CheckpointStore, open_store
from localdet.checkpoints.store import Lease, Store
from localdet.checkpoints.warm_start import warm_start_sources
from localdet.config.typed import CheckpointStorage
from localdet.paths import Layout
from localdet.records.db import StateDB
from localdet.records.registry import registered_checkpoints
from localdet.records.states import CheckpointState

if TYPE_CHECKING:
    from localdet.checkpoints.s3_leases import S3Lease

# An unreferenced blob younger than this may still be in flight (put before its manifest
# commits) from a writer outside the writers lock; left alone by the orphan sweep.
GRACE_SECONDS = 24 * 3600


@dataclass(frozen=True)
class Deleted:
    uuid: str
    experiment_id: int
    trial_id: int
    batches_trained: int


@dataclass
class GcReport:
    """What a collection did (or, with `dry_run`, would do)."""

    dry_run: bool = False
    deleted: list[Deleted] = field(default_factory=list)  # checkpoints marked DELETED
    held: list[str] = field(default_factory=list)         # skipped: a reader holds them
    blobs: list[str] = field(default_factory=list)        # sha256 of the blobs deleted
    bytes_freed: int = 0
    blobs_deferred: bool = False  # a checkpoint was being written: no blob was deleted

    @property
    def blobs_deleted(self) -> int:
        return len(self.blobs)

    def summary(self) -> str:
        """One line: ``deleted 2 checkpoints, freed 6 blobs (48.1 MB)``."""
        def plural(n: int, what: str) -> str:
            return f"{n} {what}{'' if n == 1 else 's'}"

        size = f"{self.bytes_freed / 1e6:.1f} MB"
        if self.dry_run:
            line = (f"would delete {plural(len(self.deleted), 'checkpoint')} and free "
                    f"{plural(self.blobs_deleted, 'blob')} ({size}); nothing was deleted")
        else:
            line = (f"deleted {plural(len(self.deleted), 'checkpoint')}, freed "
                    f"{plural(self.blobs_deleted, 'blob')} ({size})")
        if self.held:
            line += (f"; skipped {plural(len(self.held), 'checkpoint')} held by a reader "
                     f"({', '.join(self.held)}), to be collected once it is released")
        if self.blobs_deferred:
            line += "; blob deletion deferred: a checkpoint is being written"
        return line


def collect(layout: Layout, db: StateDB, experiment_id: int | None = None,
            dry_run: bool = False, *, grace_seconds: float = GRACE_SECONDS,
            writer_wait_seconds: float = 0.0, trial_ids: Collection[int] | None = None,
            free_blobs: bool = True) -> GcReport:
    """Apply retention to one experiment (or all), then delete unreferenced blobs.

    Never waits for a reader; waits up to `writer_wait_seconds` for checkpoint writers to
    finish before deleting blobs (0: defer at once). With `dry_run`, changes nothing and
    reports what it would delete. Must not be called inside a transaction of `db`.

    `trial_ids` (with `experiment_id`): retention looks only at these trials' checkpoints,
    in time proportional to them (the daemon's, after they exit: a trial's own rules depend
    only on its checkpoints and state, so the others' are decided already), unless the
    experiment keeps its best (`save_experiment_best`), which depends on every trial.
    `free_blobs` False leaves the blobs of what it deleted to a later collection."""
    if db.db.conn.in_transaction:
        raise RuntimeError("gc.collect() must not run inside a database transaction: it "
                           "commits before releasing its leases")
    report = GcReport(dry_run=dry_run)
    experiments = [db.experiment(experiment_id)] if experiment_id is not None else \
        db.experiments()
    stores: dict[str, tuple[CheckpointStore, list[int]]] = {}
    if experiment_id is None:  # its orphans are swept even when no experiment uses it
        own = Store(layout.store)
        stores[own.location] = (own, [])
    for experiment in experiments:
        store = open_store(layout, experiment.config, grace_seconds=grace_seconds)
        stores.setdefault(store.location, (store, []))[1].append(experiment.id)
    for store, ids in stores.values():
        for eid in ids:
            _retain(db, store, eid, dry_run, report, trial_ids)
    for store, ids in stores.values() if free_blobs else ():
        _free_blobs(db, store, ids, experiment_id is None, dry_run, grace_seconds,
                    writer_wait_seconds, report)
    return report


# -- retention ----------------------------------------------------------------------------

def _doomed(db: StateDB, experiment_id: int, trial_ids: Collection[int] | None = None
            ) -> tuple[list[CheckpointRef], str]:
    """The live checkpoints of the experiment (of these trials only, when given and the
    experiment's best is not kept) that retention does not keep, oldest first, and the
    settings that decided it."""
    experiment = db.experiment(experiment_id)
    only, args = "", []
    if trial_ids is not None and not CheckpointStorage.of(experiment.config).save_experiment_best:
        args = sorted(set(trial_ids))
        only = f" AND trial_id IN ({', '.join('?' for _ in args)})"
    live = [CheckpointRef(*row) for row in db.db.execute(
        "SELECT uuid, trial_id, batches_trained FROM checkpoints "
        "WHERE experiment_id = ? AND state = ?" + only,
        [experiment_id, CheckpointState.COMPLETED, *args]).fetchall()]
    if not live:
        return [], ""
    trials = db.db.execute("SELECT id, state, latest_checkpoint FROM trials "
                           "WHERE experiment_id = ?" + only.replace("trial_id", "id"),
                           [experiment_id, *args]).fetchall()
    validations = {(trial_id, batches): json.loads(metrics) for trial_id, batches, metrics in
                   db.db.execute(
                       "SELECT m.trial_id, m.batches_trained, m.metrics FROM metrics m "
                       "JOIN checkpoints c ON c.trial_id = m.trial_id "
                       "AND c.batches_trained = m.batches_trained "
                       "WHERE c.experiment_id = ? AND c.state = ? AND m.kind = 'validation'"
                       + only.replace("trial_id", "c.trial_id"),
                       [experiment_id, CheckpointState.COMPLETED, *args]).fetchall()}
    keep = checkpoints_to_keep(
        experiment.config, experiment.metric, experiment.smaller_is_better, live, validations,
        trial_states={t[0]: t[1] for t in trials}, resume_from={t[0]: t[2] for t in trials})
    keep |= warm_start_sources(db)  # a running experiment's trials may still start from one
    if only:  # until its model version is deleted
        uuids = [c.uuid for c in live]
        keep |= {uuid for (uuid,) in db.db.execute(
            "SELECT checkpoint_uuid FROM model_versions WHERE checkpoint_uuid IN "
            f"({', '.join('?' for _ in uuids)})", uuids).fetchall()}
    else:
        keep |= registered_checkpoints(db, experiment_id)
    doomed = sorted((c for c in live if c.uuid not in keep),
                    key=lambda c: (c.trial_id, c.batches_trained, c.uuid))
    return doomed, CheckpointStorage.of(experiment.config).describe()


def _retain(db: StateDB, store: CheckpointStore, experiment_id: int, dry_run: bool,
            report: GcReport, trial_ids: Collection[int] | None = None) -> None:
    doomed, _ = _doomed(db, experiment_id, trial_ids)  # read-only first: most calls end here
    if not doomed:
        return
    if dry_run:
        for c in doomed:
            lease = store.try_exclusive(c.uuid)
            if lease is None:
                report.held.append(c.uuid)
            else:
                lease.release()
                report.deleted.append(Deleted(c.uuid, experiment_id, c.trial_id,
                                              c.batches_trained))
        return
    leases: list[Lease | S3Lease] = []
    committed = False
    try:
        with db.atomic():
            doomed, settings = _doomed(db, experiment_id, trial_ids)  # again, under the lock
            for c in doomed:
                lease = store.try_exclusive(c.uuid)
                if lease is None:
                    report.held.append(c.uuid)
                    continue
                leases.append(lease)
                if db.delete_checkpoint(c.uuid, reason=f"retention ({settings})"):
                    report.deleted.append(Deleted(c.uuid, experiment_id, c.trial_id,
                                                  c.batches_trained))
        committed = True
    finally:
        # Only after the commit: a reader waiting on one of these leases then finds the
        # checkpoint DELETED. Nobody can read a deleted checkpoint, so its lease file goes.
        for lease in leases:
            lease.release(remove=committed)


# -- blobs ----------------------------------------------------------------------------------

def _free_blobs(db: StateDB, store: CheckpointStore, experiment_ids: list[int], full: bool,
                dry_run: bool, grace_seconds: float, writer_wait_seconds: float,
                report: GcReport) -> None:
    """Delete the blobs of `store` that the deleted checkpoints of `experiment_ids` (the
    experiments whose checkpoints go there) leave unused; with `full`, also its orphans."""
    would_go = {d.uuid for d in report.deleted} if dry_run else set()

    def live_hashes() -> set[str]:
        return {sha for uuid, sha, _ in db.checkpoint_files(deleted=False)
                if uuid not in would_go}

    # Blobs of deleted checkpoints (of these experiments) still stored. DELETED is final, so
    # these stay candidates; only whether a live checkpoint also uses them can change.
    candidates: dict[str, int] = {}
    for experiment_id in experiment_ids:
        candidates.update({sha: size for _, sha, size in db.checkpoint_files(
            deleted=True, experiment_id=experiment_id)})
        if would_go:
            candidates.update({sha: size for uuid, sha, size in db.checkpoint_files(
                deleted=False, experiment_id=experiment_id) if uuid in would_go})
    # S3 looks them up several at once: a request each, and they add up over deleted checkpoints.
    present = store.present(candidates) if isinstance(store, S3Store) else \
        {sha for sha in candidates if store.has(sha)}
    candidates = {sha: size for sha, size in candidates.items() if sha in present}
    if candidates:
        live = live_hashes()
        candidates = {sha: size for sha, size in candidates.items() if sha not in live}
    if not candidates and not full:
        return  # the cheap, common case: nothing of this experiment's is left to free
    if dry_run:
        found = dict(candidates)
        if full:
            found.update(store.unreferenced(live_hashes() | set(found),
                                            min_age_seconds=grace_seconds))
        report.blobs = sorted({*report.blobs, *found})
        report.bytes_freed += sum(found.values())
        return
    sweep = _try_sweeping(store, writer_wait_seconds)
    if sweep is None:
        report.blobs_deferred = True
        return
    with sweep:
        # Read again under the writers lock: every checkpoint written so far is committed,
        # and none is being written, so what no live manifest names is garbage.
        live = live_hashes()
        gone = store.delete_blobs(set(candidates) - live)
        if full:
            orphans = store.unreferenced(live, min_age_seconds=grace_seconds)
            gone.update(store.delete_blobs(set(orphans), min_age_seconds=grace_seconds))
            store.delete_temporary(min_age_seconds=grace_seconds)
    report.blobs = sorted({*report.blobs, *gone})
    report.bytes_freed += sum(gone.values())


def _try_sweeping(store: CheckpointStore, wait_seconds: float) -> Lease | S3Lease | None:
    deadline = time.monotonic() + wait_seconds
    while True:
        lease = store.try_sweeping()
        if lease is not None or time.monotonic() >= deadline:
            return lease
        time.sleep(0.05)


def delete_unused_blobs(db: StateDB, store: CheckpointStore, hashes: set[str], *,
                        writer_wait_seconds: float = 0.0) -> dict[str, int] | None:
    """Delete those of `hashes` that no live checkpoint (of any store) names, under the same
    sweeping lease as a collection; returns sha256 -> bytes freed, or None when a checkpoint
    was being written all along (nothing deleted: try again later). For blobs whose rows are
    gone altogether, such as a deleted experiment's (`localdet.operations.deletion`)."""
    sweep = _try_sweeping(store, writer_wait_seconds)
    if sweep is None:
        return None
    with sweep:
        # Read under the writers lock, as _free_blobs does: a blob no committed manifest
        # names is then used by nothing.
        live = {sha for _, sha, _ in db.checkpoint_files(deleted=False)}
        return store.delete_blobs(set(hashes) - live)
