"""The local `TrialReporter`: a training process's only door into SQLite and the store.

    reporter = SQLiteReporter.from_environment(trial_id)
    info = reporter.trial_info()
    reporter.report_validation_metrics(500, {"val_accuracy": 0.97})
"""

from __future__ import annotations

import shutil
import uuid as uuidlib
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict

from determined.core import TrialInfo
from localdet.config import length_to_batches
from localdet.db import NotFound, StateDB, now
from localdet.manifest import build_manifest, files_of
from localdet.paths import Layout
from localdet.store import Store, StoreError


class SQLiteReporter:
    def __init__(self, layout: Layout, trial_id: int):
        self.layout = layout
        self.trial_id = trial_id
        self.db = StateDB.open(layout.db)
        self.store = Store(layout.store)
        self._trial = self.db.trial(trial_id)
        self._saver = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        self._pending: Future | None = None
        self._verifying: Future | None = None

    @classmethod
    def from_environment(cls, trial_id: int) -> "SQLiteReporter":
        return cls(Layout.from_environment(), trial_id)

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
        )

    def report_training_metrics(self, batches_trained: int, metrics: Dict[str, float]) -> None:
        self.db.record_metrics(self.trial_id, "training", batches_trained, metrics)

    def report_validation_metrics(self, batches_trained: int, metrics: Dict[str, float]) -> None:
        self.db.record_metrics(self.trial_id, "validation", batches_trained, metrics)

    def save_checkpoint(self, directory: Path, batches_trained: int,
                        metadata: Dict[str, Any]) -> str:
        """Returns the new checkpoint's uuid at once; a background thread moves the files
        into the store and then commits the manifest, so training goes on meanwhile. The
        folder is ours from here on, and deleted once stored."""
        self.wait_for_checkpoints()  # one at a time, and an earlier failure surfaces here
        uuid = str(uuidlib.uuid4())
        self._pending = self._saver.submit(self._store_and_commit, Path(directory),
                                           batches_trained, metadata, uuid)
        return uuid

    def _store_and_commit(self, directory: Path, batches_trained: int,
                          metadata: Dict[str, Any], uuid: str) -> None:
        db = StateDB.open(self.layout.db)  # SQLite connections stay in their own thread
        try:
            files = self.store.put_directory(directory, consume=True)  # durable first
            db.add_checkpoint(build_manifest(
                uuid=uuid, experiment_id=self._trial.experiment_id, trial_id=self.trial_id,
                batches_trained=batches_trained, files=files, metadata=metadata))
        finally:
            db.close()
            shutil.rmtree(directory, ignore_errors=True)

    def wait_for_checkpoints(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def restore_checkpoint(self, uuid: str, destination: Path) -> Path:
        """Hard-link the checkpoint's blobs into `destination` at once; their hashes are
        checked in the background while the caller loads them, and
        `verify_restored_checkpoint` raises if one was corrupt."""
        self.wait_for_checkpoints()
        files = files_of(self.db.checkpoint(uuid).manifest)
        path = self.store.materialize(files, destination, link=True, verify=False)
        self._verifying = self._saver.submit(self.store.verify, files)
        return path

    def verify_restored_checkpoint(self) -> None:
        verifying, self._verifying = self._verifying, None
        bad = verifying.result() if verifying is not None else []
        if bad:
            raise StoreError(f"checkpoint files {', '.join(bad)} are corrupt or missing in the "
                             "store; resume from an earlier checkpoint or restart the trial")

    def set_target_batches(self, batches: int) -> None:
        self.db.update_trial(self.trial_id, target_batches=batches)

    def should_pause(self) -> bool:
        return self.db.trial(self.trial_id).stop_requested == "PAUSE"

    def heartbeat(self) -> None:
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
            latest = db.trial(trial_id).latest_checkpoint
            if latest is None:
                raise NotFound(f"trial {trial_id} has no checkpoint yet; "
                               f"`localdet status` shows how far it got")
            return latest
        finally:
            db.close()

    def materialize(self, uuid: str, destination: Path) -> Path:
        db = StateDB.open(self.layout.db)
        try:
            files = files_of(db.checkpoint(uuid).manifest)
        finally:
            db.close()
        return Store(self.layout.store).materialize(files, destination, link=False, verify=True)
