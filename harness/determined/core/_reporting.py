"""The contract between a training process and the daemon side that records it.

A training process asks who it is (`trial_info`), reports metrics, registers checkpoints and
heartbeats through a `TrialReporter`, and never touches the database or the store itself.
`determined` imports nothing of the daemon side: the daemon side plugs in a
`ReporterFactory` under the entry point group `determined.reporters` (localdet registers one,
`localdet.reporting.factory`, that writes SQLite and the content-addressed store, or reports
over HTTP for a trial on another machine), and `reporter_factory()` finds it:

    reporter = reporter_from_environment()    # a process the launcher started
    reporter.report_training_metrics(100, {"loss": 0.3})

The environment names below are how the launcher tells a process what it runs.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Collection, Dict, Optional, Protocol

# A failed process's last log line starts with this, then JSON: what failed and whether it got
# as far as training, for the daemon to tell a failure that will repeat.
FAILURE_MARK = "[localdet] failure: "

# The environment a launcher gives a training process: every LOCALDET_* name the two sides
# share is here, so neither spells one by hand.
TRIAL_ID_VAR = "LOCALDET_TRIAL_ID"      # the trial (or job) this process runs; set by the launcher
HOME_VAR = "LOCALDET_HOME"              # the state folder: the database and the store
SLOTS_VAR = "LOCALDET_SLOTS"            # the slots this process may use, e.g. "0,1"
ENGINE_VAR = "LOCALDET_ENGINE"          # how it trains on its slots (localdet/config/engines.py)
KERAS_LINE_REASON_VAR = "LOCALDET_KERAS_LINE_REASON"  # why this Keras line (the log says)
MODEL_DIR_VAR = "LOCALDET_MODEL_DIR"    # the model folder when it is not the working directory
TRIAL_DIR_VAR = "LOCALDET_TRIAL_DIR"    # the trial's own folder (logs, TensorBoard files)
TENSORBOARD_DIR_VAR = "LOCALDET_TENSORBOARD_DIR"  # where determined.keras's TensorBoard writes
CONFIG_VAR = "LOCALDET_CONFIG"          # a script run on its own: its experiment config file
RECORD_VAR = "LOCALDET_RECORD"          # a script run on its own: "0" records nothing
# Reporting over HTTP (a trial on another machine, or `localdet daemon --report http`).
REPORT_URL_VAR = "LOCALDET_REPORT_URL"  # report to the daemon there, not into its files
REPORT_TOKEN_VAR = "LOCALDET_REPORT_TOKEN"  # this launch's token for the report server
LAUNCH_VAR = "LOCALDET_LAUNCH"          # which launch of the trial this process is
REPORT_CHECK_PGRP_VAR = "LOCALDET_REPORT_CHECK_PGRP"  # "1": the server checks the process group
REPORT_RETRY_SECONDS_VAR = "LOCALDET_REPORT_RETRY_SECONDS"  # how long to retry the server
# The ranks of a multi-process trial (read by `_distributed_env`).
RANK_VAR = "LOCALDET_RANK"              # this process's rank: 0 .. size-1 (rank 0 is the chief)
SIZE_VAR = "LOCALDET_SIZE"              # how many processes the trial has
CHIEF_ADDR_VAR = "LOCALDET_CHIEF_ADDR"  # "127.0.0.1:PORT": where rank 0 listens for the others
AUTHKEY_VAR = "LOCALDET_DIST_AUTHKEY"   # the key the trial's ranks share
# The disk reserve the daemon holds checkpoints to (localdet/checkpoints/disk_space.py).
MIN_FREE_BYTES_VAR = "LOCALDET_MIN_FREE_BYTES"
MIN_FREE_PERCENT_VAR = "LOCALDET_MIN_FREE_PERCENT"
# Set by a warm process in the trial it forks: when it forked (seconds since the epoch).
FORKED_AT_VAR = "LOCALDET_FORKED_AT"
# "1": the daemon started this trial ahead, while its slot was still busy: it makes its model
# and data, then waits for its launch before its first batch (`await_launch`).
STAGED_VAR = "LOCALDET_STAGED"

REPORTER_GROUP = "determined.reporters"


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
    latest_checkpoint_batches: int = 0  # the batches trained when latest_checkpoint was saved

    @property
    def warm_start_checkpoint(self) -> Optional[str]:
        """The checkpoint a trial without one of its own starts its model from: the config's
        `searcher.source_checkpoint_uuid` (the daemon resolves `source_trial_id` into it
        at submission). Its weights, optimizer state and random generators, not its batch
        count: the trial starts at batch 0, as under Determined. None once the trial has a
        checkpoint of its own (it resumes from that), or without one in the config."""
        if self.latest_checkpoint is not None:
            return None
        searcher = self.config.get("searcher") if isinstance(self.config, dict) else None
        uuid = searcher.get("source_checkpoint_uuid") if isinstance(searcher, dict) else None
        return uuid if isinstance(uuid, str) and uuid else None


class TrialReporter(Protocol):
    def trial_info(self) -> TrialInfo: ...

    def report_training_metrics(self, batches_trained: int, metrics: Dict[str, float]) -> None: ...

    def report_validation_metrics(self, batches_trained: int,
                                  metrics: Dict[str, float]) -> None: ...

    def save_checkpoint(self, directory: Path, batches_trained: int,
                        metadata: Dict[str, Any], uuid: Optional[str] = None) -> str:
        """Take the folder (it is the reporter's from now on), store its files durably, then
        register the checkpoint; returns its uuid (`uuid` when given: the Core API names a
        checkpoint before its files are written). May finish in the background."""
        ...

    def wait_for_checkpoints(self) -> None:
        """Block until every checkpoint saved so far is registered; raise if one failed."""
        ...

    def restore_checkpoint(self, uuid: str, destination: Path,
                           read_in_place: Collection[str] = ()) -> Path:
        """Materialise a checkpoint; its files may be verified while the caller loads them.
        Files named in `read_in_place` may be left out of `destination` where the reporter
        can read them where they are stored: `open_restored` opens every file."""
        ...

    def open_restored(self, name: str) -> BinaryIO:
        """A file of the last restored checkpoint, open for reading (FileNotFoundError: it
        has none of that name); read it before `verify_restored_checkpoint`."""
        ...

    def verify_restored_checkpoint(self) -> None:
        """Raise if a file of the last restored checkpoint was corrupt; the restore is over."""
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

    def record_phase(self, phase: str, started: Optional[float], ended: float,
                     details: Optional[Dict[str, Any]] = None) -> None:
        """Note a phase of this launch's timeline (`localdet status --timeline`): its name,
        its start and end in seconds since the epoch (`started` None: since the launch
        began) and a few facts. Kept and written with the next heartbeat (or report), never
        a write of its own, so it is cheap at every workload boundary."""
        ...

    def heartbeat(self) -> None:
        """Say the trial is alive; also writes the phases noted since the last one."""
        ...


class ReporterFactory(Protocol):
    """What the daemon side plugs in: the entry point in group `determined.reporters` names
    a class, made once per process with no arguments."""

    def from_environment(self) -> TrialReporter:
        """The reporter for the process the launcher started (`LOCALDET_TRIAL_ID` set)."""
        ...

    def for_script(self, script: Path, hparams: Optional[Dict[str, Any]],
                   config_path: Optional[str], record: bool) -> TrialReporter:
        """The reporter for a training script run on its own (laptop mode)."""
        ...

    def checkpoint_batches(self, uuid: str) -> int:
        """The batches trained when the checkpoint was saved."""
        ...

    def checkpoint_metadata(self, uuid: str) -> Dict[str, Any]:
        """The metadata the checkpoint was saved with (`CheckpointContext.get_metadata`)."""
        ...

    def delete_checkpoint(self, uuid: str) -> None:
        """Delete a checkpoint of the running trial (`CheckpointContext.delete`): its record
        stays, marked deleted, and its files go once nothing else uses them."""
        ...

    def load_checkpoint(self, destination: Path, trial_id: Optional[int] = None,
                        uuid: Optional[str] = None) -> Path:
        """Write a checkpoint (a uuid or unique prefix, or a trial's latest) into
        `destination` as a plain, verified folder; for `context.load_checkpoint_model`."""
        ...


@functools.lru_cache(maxsize=1)
def reporter_factory() -> ReporterFactory:
    """The installed daemon side's factory, looked up once per process."""
    from determined._plugin import only_plugin

    return only_plugin(REPORTER_GROUP, "daemon side", "record this run")


def reporter_from_environment() -> TrialReporter:
    """The reporter for a process the localdet launcher started (`LOCALDET_TRIAL_ID` set):
    over HTTP to the daemon when `LOCALDET_REPORT_URL` is set (a trial on another machine),
    else straight into the daemon's SQLite file and store."""
    if not os.environ.get(TRIAL_ID_VAR):
        raise RuntimeError(f"{TRIAL_ID_VAR} is not set: this process was not started by "
                           "localdet; submit the experiment with `localdet submit`")
    reporter = reporter_factory().from_environment()
    if int(os.environ.get(RANK_VAR, "0")) > 0:
        return WorkerReporter(reporter)
    return reporter


def await_launch(reporter: Any) -> None:
    """Where a trial started ahead of its launch (STAGED_VAR) waits for it: its model and
    data made, before its first batch, or before it reports a failure in making them.
    Every other process waited when its reporter was made: this returns at once."""
    wait = getattr(reporter, "await_launch", None)
    if wait is not None:
        wait()


def started_ahead(reporter: Any) -> bool:
    """Whether this process was started ahead of its launch and still waits for it."""
    return bool(getattr(reporter, "started_ahead", False))


def reporter_for_script(script: Path, hparams: Optional[Dict[str, Any]],
                        config_path: Optional[str], record: bool = True) -> TrialReporter:
    """The reporter for a training script run on its own (laptop mode): it records itself
    in localdet's database as an unmanaged experiment with one trial, unless `record` is
    False."""
    return reporter_factory().for_script(script, hparams, config_path, record)


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
                        metadata: Dict[str, Any], uuid: Optional[str] = None) -> str:
        import shutil
        import uuid as uuidlib

        shutil.rmtree(directory, ignore_errors=True)
        return uuid or str(uuidlib.uuid4())

    def wait_for_checkpoints(self) -> None:
        pass

    def restore_checkpoint(self, uuid: str, destination: Path,
                           read_in_place: Collection[str] = ()) -> Path:
        raise RuntimeError("this run records nothing, so it has no checkpoints to restore")

    def open_restored(self, name: str) -> BinaryIO:
        raise RuntimeError("this run records nothing, so it has no checkpoints to restore")

    def verify_restored_checkpoint(self) -> None:
        pass

    def set_target_batches(self, batches: int) -> None:
        self._info.target_batches = batches

    def should_pause(self) -> bool:
        return False

    def report_first_batch(self) -> None:
        pass

    def record_phase(self, phase: str, started: Optional[float], ended: float,
                     details: Optional[Dict[str, Any]] = None) -> None:
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
                        metadata: Dict[str, Any], uuid: Optional[str] = None) -> str:
        raise RuntimeError("only the chief (rank 0) saves checkpoints")

    def restore_checkpoint(self, uuid: str, destination: Path,
                           read_in_place: Collection[str] = ()) -> Path:
        return self._reporter.restore_checkpoint(uuid, destination, read_in_place)

    def open_restored(self, name: str) -> BinaryIO:
        return self._reporter.open_restored(name)

    def verify_restored_checkpoint(self) -> None:
        self._reporter.verify_restored_checkpoint()
