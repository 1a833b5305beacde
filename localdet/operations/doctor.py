"""`localdet doctor`: the records checked against themselves and against the store, and a
damaged database replaced by its newest good backup.

    report = check(layout)            # report.lines(), report.healthy
    restored = restore(layout)        # restored.lines(); OperationError while a daemon runs

Every chunk of every listed checkpoint's files is read and its hash checked (a chunk that
several checkpoints share, once). The store keeps only blobs (a checkpoint's manifest lives in
its database row, chunk list included), so what a
restored copy does not know shows as stored files no record names: they are listed, not
deleted; `localdet gc` collects them. Checkpoints that the damaged file still lets us read
and the copy lacks are listed by uuid, so nothing is lost unsaid.
"""

from __future__ import annotations

import datetime
import os
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from localdet.checkpoints.manifest import files_of
from localdet.checkpoints.storage import CheckpointStore, open_store
from localdet.checkpoints.store import Store, StoreError
from localdet.operations.errors import OperationError
from localdet.paths import Layout
from localdet.pids import DaemonLock
from localdet.records.backups import backups, copy_database, quick_check
from localdet.records.db import DamagedDatabase, StateDB


@dataclass
class BadCheckpoint:
    uuid: str
    experiment_id: int
    missing: list[str]   # files a blob (chunk) of which is gone
    corrupt: list[str]   # files a blob (chunk) of which no longer hashes to its name


@dataclass
class Report:
    database: str | None = None          # quick_check's finding; None: sound
    checkpoints: int = 0                 # listed checkpoints checked
    bad: list[BadCheckpoint] = field(default_factory=list)
    unreferenced: dict[str, dict[str, int]] = field(default_factory=dict)  # store -> blobs
    unreachable: dict[str, str] = field(default_factory=dict)  # store -> why not checked

    @property
    def healthy(self) -> bool:
        return self.database is None and not self.bad and not self.unreachable

    def lines(self) -> list[str]:
        if self.database is not None:
            return [f"database: damaged ({self.database}); run `localdet doctor --restore` "
                    "to bring back the newest backup"]
        lines = ["database: ok (quick_check)",
                 f"checkpoints: {self.checkpoints} checked, {len(self.bad)} damaged"]
        for bad in self.bad:
            for name in bad.missing:
                lines.append(f"  checkpoint {bad.uuid} (experiment {bad.experiment_id}): "
                             f"{name}: missing from the store")
            for name in bad.corrupt:
                lines.append(f"  checkpoint {bad.uuid} (experiment {bad.experiment_id}): "
                             f"{name}: corrupt (its bytes do not match their hash)")
        for location, why in self.unreachable.items():
            lines.append(f"store {location}: not checked ({why})")
        for location, blobs in self.unreferenced.items():
            if blobs:
                lines.append(f"store {location}: {len(blobs)} file(s), {sum(blobs.values())} "
                             "bytes, named by no kept checkpoint (`localdet gc` deletes them)")
        lines.append("healthy" if self.healthy else "not healthy")
        return lines


def check(layout: Layout) -> Report:
    """Check the database (quick_check), every listed checkpoint's files in its store, and
    the stores for files no kept checkpoint names. Reads only."""
    report = Report()
    if not layout.db.exists():
        raise OperationError(f"no localdet state at {layout.home}; nothing to check")
    report.database = quick_check(layout.db)
    if report.database is not None:
        return report
    with StateDB.open(layout.db) as db:
        stores = _stores(layout, db, report)
        referenced = {sha for _, sha, _ in db.checkpoint_files(deleted=False)}
        sound: dict[str, set[str]] = {}  # store -> chunks found sound: a shared one read once
        for checkpoint in db.checkpoints():
            store = stores.get(checkpoint.experiment_id)
            if store is None:
                continue
            report.checkpoints += 1
            entries = files_of(checkpoint.manifest)
            bad = store.verify(entries, sound.setdefault(store.location, set()))
            if bad:
                missing = [name for name in bad
                           if not all(store.has(sha) for sha, _ in entries[name].blobs)]
                report.bad.append(BadCheckpoint(
                    checkpoint.uuid, checkpoint.experiment_id, missing,
                    [name for name in bad if name not in missing]))
    for store in {s.location: s for s in stores.values()}.values():
        report.unreferenced[store.location] = store.unreferenced(referenced)
    return report


def _stores(layout: Layout, db: StateDB, report: Report) -> dict[int, CheckpointStore]:
    """Each experiment's store (localdet's own store always among them); one that cannot
    be reached is said in `report.unreachable`."""
    own = Store(layout.store)
    stores: dict[int, CheckpointStore] = {-1: own}
    by_location: dict[str, CheckpointStore] = {own.location: own}
    for experiment in db.experiments():
        try:
            store = open_store(layout, experiment.config)
        except StoreError as error:
            report.unreachable[str(experiment.config.get("checkpoint_storage"))] = str(error)
            continue
        stores[experiment.id] = by_location.setdefault(store.location, store)
    return stores


@dataclass
class Restored:
    damaged: Path            # where the damaged file was moved
    backup: Path             # the copy brought back
    skipped: list[Path]      # newer copies that failed their check
    unknown_checkpoints: list[str]  # read from the damaged file, absent from the copy
    unreferenced: dict[str, dict[str, int]]  # store -> blobs the restored records don't name

    def lines(self) -> list[str]:
        lines = [f"moved the damaged records aside to {self.damaged} (kept)"]
        lines += [f"skipped the backup {path}: it fails its check" for path in self.skipped]
        lines.append(f"restored {self.backup}")
        if self.unknown_checkpoints:
            lines.append(f"{len(self.unknown_checkpoints)} checkpoint(s) recorded after this "
                         "backup are not in the restored records (their rows are in the "
                         f"damaged file): {', '.join(self.unknown_checkpoints)}")
        for location, blobs in self.unreferenced.items():
            if blobs:
                lines.append(
                    f"store {location}: {len(blobs)} file(s), {sum(blobs.values())} bytes, "
                    "are named by no checkpoint the restored records know (written after "
                    "the backup, or of deleted checkpoints); they are kept until "
                    "`localdet gc` collects them: copy them out of the store first if you "
                    "need them")
        return lines


def restore(layout: Layout) -> Restored:
    """Move the damaged database aside and bring back the newest backup that passes its
    check; say what the store holds that the copy does not know."""
    holder = DaemonLock.holder(layout.daemon_lock)
    if holder is not None:
        raise OperationError(f"a localdet daemon (pid {holder}) is running on {layout.home}; "
                             "stop it before restoring its records")
    skipped: list[Path] = []
    chosen: Path | None = None
    for copy in backups(layout.db):
        if quick_check(copy) is None:
            chosen = copy
            break
        skipped.append(copy)
    if chosen is None:
        raise OperationError(f"no sound backup of the records under {layout.home / 'backups'}; "
                             f"move {layout.db} aside to start afresh")
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    damaged = layout.db.with_name(f"{layout.db.name}.damaged-{stamp}")
    before = _checkpoint_uuids(layout.db)
    # The write-ahead log and its index belong to the damaged file: left beside the
    # restored one, SQLite would replay the damaged file's last commits onto it.
    for suffix in ("", "-wal", "-shm"):
        part = Path(f"{layout.db}{suffix}")
        if part.exists():
            os.replace(part, Path(f"{damaged}{suffix}"))
    partial = layout.db.with_name(layout.db.name + ".restoring")
    src = sqlite3.connect(chosen)
    try:
        copy_database(src, partial)
    finally:
        src.close()
    os.replace(partial, layout.db)
    report = Report()
    try:
        with StateDB.open(layout.db) as db:
            known = {c.uuid for c in db.checkpoints(include_deleted=True)}
            stores = _stores(layout, db, report)
            referenced = {sha for _, sha, _ in db.checkpoint_files(deleted=False)}
    except DamagedDatabase as error:  # it passed quick_check: not expected
        raise OperationError(str(error)) from None
    unreferenced = {store.location: store.unreferenced(referenced)
                    for store in {s.location: s for s in stores.values()}.values()}
    return Restored(damaged, chosen, skipped, sorted(before - known), unreferenced)


def _checkpoint_uuids(path: Path) -> set[str]:
    """The checkpoint uuids a damaged file still lets us read (none if it cannot)."""
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return {uuid for (uuid,) in conn.execute("SELECT uuid FROM checkpoints")}
        finally:
            conn.close()
    except sqlite3.DatabaseError:  # damaged where the checkpoints are: nothing to add
        return set()
