"""The one narrow interface between a training process and localdet's state.

A training process asks who it is (`trial_info`), reports metrics, registers checkpoints and
heartbeats through a `TrialReporter`, and never touches the database or the store itself.
The local implementation (`localdet.reporting.SQLiteReporter`) writes SQLite and the
content-addressed store; a networked one can replace it without touching the Keras code.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Protocol


@dataclass
class TrialInfo:
    experiment_id: int
    trial_id: int
    hparams: Dict[str, Any]
    seed: int
    target_batches: int      # train until this many batches, then validate and checkpoint
    scheduling_unit: int     # batches per workload: training metrics are averaged over one
    validation_period: int   # validate every this many batches (0: only at the end)
    checkpoint_period: int   # checkpoint every this many batches (0: only at the end)
    latest_checkpoint: Optional[str]
    config: Dict[str, Any]   # the validated experiment config, defaults filled
    model_dir: Path          # the snapshot of the submitted model folder
    trial_dir: Path          # the trial's own folder (logs, TensorBoard files)
    kind: str = "experiment" # "job": a batch job's process, which has no training


class TrialReporter(Protocol):
    def trial_info(self) -> TrialInfo: ...

    def report_training_metrics(self, batches_trained: int, metrics: Dict[str, float]) -> None: ...

    def report_validation_metrics(self, batches_trained: int, metrics: Dict[str, float]) -> None: ...

    def save_checkpoint(self, directory: Path, batches_trained: int,
                        metadata: Dict[str, Any]) -> str:
        """Take the folder (it is the reporter's from now on), store its files durably, then
        register the checkpoint; returns its uuid. May finish in the background."""
        ...

    def wait_for_checkpoints(self) -> None:
        """Block until every checkpoint saved so far is registered; raise if one failed."""
        ...

    def restore_checkpoint(self, uuid: str, destination: Path) -> Path:
        """Materialise a checkpoint; its files may be verified while the caller loads them."""
        ...

    def verify_restored_checkpoint(self) -> None:
        """Raise if a file of the last restored checkpoint was corrupt."""
        ...

    def set_target_batches(self, batches: int) -> None:
        """Record the length a script chose (`context.fit(epochs=...)`) when the searcher
        set none."""
        ...

    def should_pause(self) -> bool:
        """Whether the user asked this trial to checkpoint and stop (`localdet pause`)."""
        ...

    def report_first_batch(self) -> None:
        """Record that this launch's first training batch just ended (called once, by the
        chief), so a slow start (heavy imports, data loading) shows in `localdet status`."""
        ...

    def heartbeat(self) -> None: ...


def reporter_from_environment() -> TrialReporter:
    """The reporter for a process the localdet launcher started (`LOCALDET_TRIAL_ID` set):
    over HTTP to the daemon when `LOCALDET_REPORT_URL` is set (a trial on another machine),
    else straight into the daemon's SQLite file and store."""
    trial_id = os.environ.get("LOCALDET_TRIAL_ID")
    if not trial_id:
        raise RuntimeError("LOCALDET_TRIAL_ID is not set: this process was not started by "
                           "localdet; submit the experiment with `localdet submit`")
    # The only imports of localdet by a trial.
    if os.environ.get("LOCALDET_REPORT_URL"):
        from localdet.remote_reporter import HTTPReporter

        reporter: TrialReporter = HTTPReporter.from_environment()
    else:
        from localdet.reporting import SQLiteReporter

        reporter = SQLiteReporter.from_environment(int(trial_id))
    if int(os.environ.get("LOCALDET_RANK", "0")) > 0:
        return WorkerReporter(reporter)
    return reporter


def reporter_for_script(script: Path, hparams: Optional[Dict[str, Any]],
                        config_path: Optional[str], record: bool = True) -> TrialReporter:
    """The reporter for a training script run on its own (laptop mode): it records itself
    in localdet's database as an unmanaged experiment with one trial, unless `record` is
    False."""
    from localdet.unmanaged import script_run_reporter

    return script_run_reporter(script, hparams, config_path, record)


class DiscardingReporter:
    """A reporter that records nothing: a script run with recording switched off
    (`det.keras.init(record=False)` or `LOCALDET_RECORD=0`)."""

    def __init__(self, info: TrialInfo):
        self._info = info

    def trial_info(self) -> TrialInfo:
        return self._info

    def report_training_metrics(self, batches_trained: int, metrics: Dict[str, float]) -> None:
        pass

    def report_validation_metrics(self, batches_trained: int, metrics: Dict[str, float]) -> None:
        pass

    def save_checkpoint(self, directory: Path, batches_trained: int,
                        metadata: Dict[str, Any]) -> str:
        import shutil
        import uuid

        shutil.rmtree(directory, ignore_errors=True)
        return str(uuid.uuid4())

    def wait_for_checkpoints(self) -> None:
        pass

    def restore_checkpoint(self, uuid: str, destination: Path) -> Path:
        raise RuntimeError("this run records nothing, so it has no checkpoints to restore")

    def verify_restored_checkpoint(self) -> None:
        pass

    def set_target_batches(self, batches: int) -> None:
        self._info.target_batches = batches

    def should_pause(self) -> bool:
        return False

    def report_first_batch(self) -> None:
        pass

    def heartbeat(self) -> None:
        pass


class WorkerReporter(DiscardingReporter):
    """The reporter of a rank other than the chief in a multi-process trial: it reads (the
    trial, checkpoints to restore) and records nothing, as only the chief records; the
    chief's pause decision reaches it by broadcast."""

    def __init__(self, reporter: TrialReporter):
        super().__init__(reporter.trial_info())
        self._reporter = reporter

    def save_checkpoint(self, directory: Path, batches_trained: int,
                        metadata: Dict[str, Any]) -> str:
        raise RuntimeError("only the chief (rank 0) saves checkpoints")

    def restore_checkpoint(self, uuid: str, destination: Path) -> Path:
        return self._reporter.restore_checkpoint(uuid, destination)

    def verify_restored_checkpoint(self) -> None:
        self._reporter.verify_restored_checkpoint()
