"""The local `TrialReporter`: a training process's only door into SQLite and the store.

    reporter = SQLiteReporter.from_environment(trial_id)
    info = reporter.trial_info()
    reporter.report_validation_metrics(500, {"val_accuracy": 0.97})
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import os
import shutil
import time
import uuid as uuidlib
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO, Collection, Dict, Iterator, cast

from determined.core import TrialInfo
from determined.core._reporting import STAGED_VAR
from localdet.checkpoints.disk_space import DiskFull, Reserve
from localdet.checkpoints.hash_worker import HashWorker
from localdet.checkpoints.manifest import build_manifest, files_of
from localdet.checkpoints.storage import CheckpointStore, checkpoint_store, experiment_store
from localdet.checkpoints.store import FileEntry, Store, StoreError
from localdet.config.experiment import length_to_batches
from localdet.paths import Layout
from localdet.records import lifecycle, phases
from localdet.records.db import Checkpoint, NotFound, StateDB, now
from localdet.records.states import TrialState
from localdet.reporting.restore import Restore


class SQLiteReporter:
    def __init__(self, layout: Layout, trial_id: int, db: StateDB | None = None,
                 stores: dict[int, CheckpointStore] | None = None):
        """`db`: an open connection to use (the report server's writer's) instead of one
        of its own; `stores`: experiment id -> its store, made once an experiment."""
        self.layout = layout
        self.trial_id = trial_id
        self.db = StateDB.open(layout.db) if db is None else db
        self._trial = self.db.trial(trial_id)
        # The experiment's checkpoint_storage: localdet's own store, shared_fs or s3.
        experiment_id = self._trial.experiment_id
        store = None if stores is None else stores.get(experiment_id)
        if store is None:
            store = experiment_store(layout, self.db, experiment_id)
            if stores is not None:
                stores[experiment_id] = store
        self.store = store
        self._saver = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        self._pending: Future | None = None
        self._restore: Restore | None = None  # the last restore, until verified
        self._worker: HashWorker | None = None
        self._reserve = Reserve.from_environment()
        self._first_batch_reported = False
        self._phases: list[phases.Row] = []  # noted, written with the next heartbeat
        self._launch: str | None = None  # its trial's started_at, once phases are written
        self._staged_under: int | None = None  # started ahead: its parent's pid, until launched

    @classmethod
    def from_environment(cls, trial_id: int) -> "SQLiteReporter":
        reporter = cls(Layout.from_environment(), trial_id)
        info = reporter.trial_info()
        if (info.latest_checkpoint or info.warm_start_checkpoint) \
                and isinstance(reporter.store, Store):  # S3 checks hashes as it downloads
            reporter._hash_worker()  # started now, beside the imports: ready to restore
        if os.environ.pop(STAGED_VAR, None) == "1":
            reporter._staged_under = os.getppid()  # awaits its launch in await_launch
        else:
            reporter._await_launch_record()
        return reporter

    @property
    def started_ahead(self) -> bool:
        return self._staged_under is not None

    def await_launch(self) -> None:
        """A trial started ahead of its launch (STAGED_VAR) waits here, its model and data
        made, until the daemon launches it: as long as its slot stays busy. The daemon ends
        it if another trial takes the slot; if the daemon itself goes, so does the warm
        process this was forked from (or the daemon, its parent), and it exits."""
        if self._staged_under is None:
            return
        parent, self._staged_under = self._staged_under, None
        self._await_launch_record(None, parent)

    def _await_launch_record(self, seconds: float | None = 30.0,
                             parent: int | None = None) -> None:
        """Train only once the daemon has recorded this process (its group) as the trial's.
        A daemon killed between starting a process and recording it leaves an orphan, and
        the next daemon starts the trial again: the orphan must not train beside it."""
        began = time.monotonic()
        deadline = None if seconds is None else began + seconds
        while True:
            trial = self.db.trial(self.trial_id)
            if trial.state == TrialState.RUNNING and trial.pid == os.getpgrp():
                return
            if parent is not None:
                if os.getppid() != parent:  # an int: no failure of the trial's reported
                    print(f"[localdet] trial {self.trial_id} was started ahead of its launch "
                          "by a daemon that has gone; exiting unlaunched", flush=True)
                    raise SystemExit(1)
                # Its slot's turn: the sooner seen, the less the slot sits idle; after a
                # while, behind a long trial, a tenth of a second is as good.
                time.sleep(0.01 if time.monotonic() - began < 30 else 0.1)
                continue
            if deadline is not None and time.monotonic() > deadline:
                raise SystemExit(
                    f"trial {self.trial_id} is not recorded as running in this process "
                    f"(pid {os.getpgrp()}; recorded: {trial.state}, pid {trial.pid}); exiting "
                    "so that only one process trains it")
            time.sleep(0.05)

    def trial_info(self) -> TrialInfo:
        trial = self.db.trial(self.trial_id)
        experiment = self.db.experiment(trial.experiment_id)
        return TrialInfo(
            experiment_id=experiment.id,
            trial_id=trial.id,
            hparams=trial.hparams,
            seed=trial.seed,
            target_batches=trial.target_batches,
            scheduling_unit=experiment.config["scheduling_unit"],
            validation_period=length_to_batches(experiment.config["min_validation_period"],
                                                experiment.config, "min_validation_period"),
            checkpoint_period=length_to_batches(experiment.config["min_checkpoint_period"],
                                                experiment.config, "min_checkpoint_period"),
            latest_checkpoint=trial.latest_checkpoint,
            config=experiment.config,
            model_dir=Path(experiment.model_dir),
            trial_dir=self.layout.trial_dir(experiment.id, trial.id),
            kind=experiment.kind,
            latest_checkpoint_batches=self._checkpoint_batches(trial.latest_checkpoint),
        )

    def _checkpoint_batches(self, uuid: str | None) -> int:
        if uuid is None:
            return 0
        try:
            return int(self.db.checkpoint(uuid).batches_trained)
        except NotFound:  # deleted meanwhile: the restore says so in its own words
            return 0

    def report_training_metrics(self, batches_trained: int, metrics: Dict[str, float]) -> None:
        self.db.record_metrics(self.trial_id, "training", batches_trained, metrics)

    def report_validation_metrics(self, batches_trained: int, metrics: Dict[str, float]) -> None:
        self.db.record_metrics(self.trial_id, "validation", batches_trained, metrics)

    def save_checkpoint(self, directory: Path, batches_trained: int,
                        metadata: Dict[str, Any], uuid: str | None = None) -> str:
        """Returns the new checkpoint's uuid at once; a background thread moves the files
        into the store and then commits the manifest, so training goes on meanwhile. The
        folder is ours from here on, and deleted once stored."""
        self.wait_for_checkpoints()  # one at a time, and an earlier failure surfaces here
        try:  # below the daemon's reserve nothing is written: the machine needs the rest
            self._reserve.check_before_writing(self.layout.store)
        except DiskFull:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        uuid = uuid or str(uuidlib.uuid4())
        self._pending = self._saver.submit(self._store_and_commit, Path(directory),
                                           batches_trained, metadata, uuid, time.time())
        return uuid

    def _store_and_commit(self, directory: Path, batches_trained: int,
                          metadata: Dict[str, Any], uuid: str, submitted: float) -> None:
        db = StateDB.open(self.layout.db)  # SQLite connections stay in their own thread
        try:
            # Held from the first blob to the commit: until then the blobs (new, or reused
            # from a deleted checkpoint) are referenced by nothing, and the garbage collector
            # must not delete them.
            with self.store.writing():
                files = self.store.put_directory(directory, consume=True)  # durable first
                durable = time.time()
                with db.atomic():  # the timeline's row in the checkpoint's transaction
                    self.commit_checkpoint(db, uuid, batches_trained, files, metadata)
                    self.write_phases(db, [("checkpoint_store", submitted, time.time(), {
                        "uuid": uuid, "batches": batches_trained, "durable": round(durable, 3)})])
        finally:
            db.close()
            shutil.rmtree(directory, ignore_errors=True)

    def commit_checkpoint(self, db: StateDB, uuid: str, batches_trained: int,
                          files: Dict[str, FileEntry], metadata: Dict[str, Any]) -> None:
        """Register a checkpoint whose blobs are already durable in the store (the caller
        holds `store.writing()`); also the report server's commit for remote trials."""
        db.add_checkpoint(build_manifest(
            uuid=uuid, experiment_id=self._trial.experiment_id, trial_id=self.trial_id,
            batches_trained=batches_trained, files=files, metadata=metadata))

    def wait_for_checkpoints(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def restore_checkpoint(self, uuid: str, destination: Path,
                           read_in_place: Collection[str] = ()) -> Path:
        """Hard-link the checkpoint's blobs into `destination` at once; their hashes are
        checked in the background while the caller loads them, and
        `verify_restored_checkpoint` raises if one was corrupt. A file named in
        `read_in_place` that the local store keeps in chunks is not joined into
        `destination`: `open_restored` reads it from its chunks (for a 70 MB `.h5`, 70 MB
        not written and read back)."""
        self.wait_for_checkpoints()
        self._end_restore()
        store = self._store_of(uuid)
        self._restore = Restore.begin(
            store, uuid, lambda u: files_of(self.db.checkpoint(u).manifest), destination,
            read_in_place, self._saver, self._hash_worker() if isinstance(store, Store) else None)
        return self._restore.path

    def open_restored(self, name: str) -> BinaryIO:
        """A file of the last restored checkpoint, open for reading, whether it was written
        into the restore's folder or is read in place."""
        if self._restore is None:
            raise RuntimeError("open_restored before restore_checkpoint")
        return self._restore.open(name)

    def _hash_worker(self) -> HashWorker | None:
        """The process that hashes restored blobs off this one's GIL (`hash_worker`),
        started on first need; closed when this process exits."""
        if self._worker is None:
            self._worker = HashWorker.start()
            if self._worker is not None:
                atexit.register(self._worker.close)
        return self._worker

    def _store_of(self, uuid: str) -> Any:
        """This experiment's store, or for a checkpoint of another experiment (a warm
        start's source, an imported checkpoint) the store that experiment keeps it in."""
        try:
            experiment_id = self.db.checkpoint(uuid).experiment_id
        except NotFound:
            return self.store  # the restore below says it is gone
        if experiment_id == self._trial.experiment_id:
            return self.store
        return experiment_store(self.layout, self.db, experiment_id)

    def verify_restored_checkpoint(self) -> None:
        restore, self._restore = self._restore, None
        bad = restore.finish() if restore is not None else []
        if bad:
            raise StoreError(f"checkpoint files {', '.join(bad)} are corrupt or missing in the "
                             "store; resume from an earlier checkpoint or restart the trial")

    def _end_restore(self) -> None:
        """Let go of the last restore's files read in place (their chunks may be collected)."""
        restore, self._restore = self._restore, None
        if restore is not None:
            restore.close()

    def set_target_batches(self, batches: int) -> None:
        self.db.update_trial(self.trial_id, target_batches=batches)

    def should_pause(self) -> bool:
        """True once a pause was asked; answering it acknowledges it in the same
        transaction (PAUSE -> PAUSING), so a resume that comes after relaunches the trial
        instead of being lost (localdet/records/lifecycle.py)."""
        stop = self.db.trial(self.trial_id).stop_requested
        if stop == lifecycle.PAUSE:  # a plain read first: the write lock only when asked
            with self.db.atomic():
                stop = self.db.trial(self.trial_id).stop_requested
                if stop == lifecycle.PAUSE:
                    self.db.update_trial(self.trial_id,
                                         stop_requested=lifecycle.acknowledge(stop))
        return stop in (lifecycle.PAUSE, lifecycle.PAUSING, lifecycle.REQUEUE)

    def report_first_batch(self) -> None:
        """Record a `trial_first_batch` event with the seconds since this launch: since the
        trial's `started_at`, which the daemon writes with the launch record (the moment of
        its `trial_launched` event) and a script run when it records itself."""
        if self._first_batch_reported:  # once a launch, however many fits it runs
            return
        self._first_batch_reported = True
        started_at = self.db.trial(self.trial_id).started_at
        if started_at is None:  # a trial never launched (a benchmark's in-process run)
            return
        seconds = (datetime.datetime.fromisoformat(now())
                   - datetime.datetime.fromisoformat(started_at)).total_seconds()
        self.db.log_event("trial_first_batch", experiment_id=self._trial.experiment_id,
                          trial_id=self.trial_id, seconds=round(seconds, 3))

    def record_phase(self, phase: str, started: float | None, ended: float,
                     details: Dict[str, Any] | None = None) -> None:
        self._phases.append((phase, started, ended, details))  # type: ignore[arg-type]

    def write_phases(self, db: StateDB, rows: list, launch: str | None = None) -> None:
        """Write phases of the trial's running launch (`launch`, else read: its
        `started_at`; a `started` of None: since the launch began) in the transaction `db`
        holds; nothing for a trial never launched."""
        if not rows:
            return
        launch = launch or db.trial(self.trial_id).started_at
        if launch is None:  # a trial never launched (a benchmark's in-process run)
            return
        began = phases.seconds(launch)
        phases.insert(db, self._trial.experiment_id, self.trial_id, launch,
                      [(phase, began if started is None else started, ended, details)
                       for phase, started, ended, details in rows])

    def heartbeat(self) -> None:
        """The heartbeat, and the phases noted since the last one, in one transaction."""
        noted, self._phases = self._phases, []
        if not noted:
            self.db.update_trial(self.trial_id, heartbeat_at=now())
            return
        if self._launch is None:  # this process's launch: read once
            self._launch = self.db.trial(self.trial_id).started_at
        with self.db.atomic():
            self.write_phases(self.db, noted, self._launch)
            self.db.update_trial(self.trial_id, heartbeat_at=now())


class CheckpointReader:
    """Find and materialise recorded checkpoints, for `context.load_checkpoint_model`:

        path = CheckpointReader(Layout.from_environment()).materialize(
            CheckpointReader(...).resolve(trial_id=7), Path("/tmp/ckpt"))
    """

    def __init__(self, layout: Layout):
        self.layout = layout

    def resolve(self, trial_id: int | None = None, uuid: str | None = None) -> str:
        """The uuid (a unique prefix works) or the latest checkpoint of the trial."""
        if (trial_id is None) == (uuid is None):
            raise ValueError("load_checkpoint_model() needs exactly one of trial_id= or "
                             "checkpoint_uuid=")
        db = StateDB.open(self.layout.db)
        try:
            if uuid is not None:
                return db.checkpoint(uuid).uuid
            latest = db.trial(cast(int, trial_id)).latest_checkpoint  # given, as uuid is not
            if latest is None:
                raise NotFound(f"trial {trial_id} has no checkpoint yet; "
                               f"`localdet status` shows how far it got")
            return latest
        finally:
            db.close()

    @contextlib.contextmanager
    def holding(self, uuid_or_prefix: str) -> Iterator[Checkpoint]:
        """The live checkpoint, held against garbage collection while the block runs:

            with reader.holding("3f2a") as checkpoint:
                ...read its blobs...

        Raises NotFound, or CheckpointDeleted (one sentence) if retention deleted it."""
        db = StateDB.open(self.layout.db)
        try:
            found = db.checkpoint(uuid_or_prefix)
            uuid = found.uuid
            with experiment_store(self.layout, db, found.experiment_id).reading(uuid):
                # Looked up again under the lease: a collector may have deleted it meanwhile.
                yield db.checkpoint(uuid)
        finally:
            db.close()

    def materialize(self, uuid: str, destination: Path) -> Path:
        """Write the checkpoint (a uuid or unique prefix) into `destination` as a plain,
        verified folder."""
        with self.holding(uuid) as checkpoint:
            return checkpoint_store(self.layout, checkpoint).materialize(
                files_of(checkpoint.manifest), destination, link=False, verify=True)
