"""`det.core.init()`: Determined's Core API, for any training loop.

    import determined as det

    with det.core.init() as core_context:
        info = det.get_cluster_info()          # None off localdet
        ...train, core_context.train.report_training_metrics(steps, {...})
        with core_context.checkpoint.store_path({"steps_completed": steps}) as (path, _):
            save(path)
        if core_context.preempt.should_preempt():
            return

In a process localdet started (a trial), the context records metrics and checkpoints as
any trial's, `should_preempt()` answers `localdet pause` and the searcher's length, and a
resumed trial finds `info.latest_checkpoint`. Anywhere else it is Determined's off-cluster
context: metrics go to the log and checkpoints to plain folders (see `_checkpoint`).
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import random
import sys
import types
from typing import Any, Dict, Literal, Optional, Union

from determined.core._checkpoint import CheckpointContext, DummyCheckpointContext
from determined.core._distributed import DistributedContext
from determined.core._experimental import ExperimentalCoreContext
from determined.core._length import TrialLength
from determined.core._preempt import DummyPreemptContext, PreemptContext, PreemptMode
from determined.core._profiler import ProfilerContext
from determined.core._reporting import TRIAL_ID_VAR, TrialReporter
from determined.core._searcher import (
    DummySearcherContext,
    SearcherContext,
    SearcherContextMissing,
    _parse_searcher_units,
    length_in_units,
)
from determined.core._train import (
    DummyTrainContext,
    EarlyExitReason,
    TensorboardMode,
    TrainContext,
)

logger = logging.getLogger("determined.core")


class Context:
    """What `det.core.init()` returns: `.distributed`, `.train`, `.checkpoint`, `.preempt`,
    `.searcher`, `.info` (the ClusterInfo, None off localdet), `.experimental` and
    `.profiler`. Use it as `with det.core.init() as core_context:`."""

    def __init__(self, checkpoint: CheckpointContext,
                 distributed: Optional[DistributedContext] = None,
                 preempt: Optional[PreemptContext] = None, train: Optional[TrainContext] = None,
                 searcher: Optional[SearcherContext] = None, info: Optional[Any] = None,
                 experimental: Optional[ExperimentalCoreContext] = None,
                 profiler: Optional[ProfilerContext] = None,
                 _reporter: Optional[TrialReporter] = None,
                 _length: Optional[TrialLength] = None) -> None:
        self.checkpoint = checkpoint
        self.distributed = distributed or DistributedContext()
        self.preempt = preempt or DummyPreemptContext(self.distributed)
        self.train = train or DummyTrainContext()
        self.searcher = searcher or SearcherContextMissing()
        self.info = info
        self.experimental = experimental or ExperimentalCoreContext()
        self.profiler = profiler or ProfilerContext()
        self._reporter = _reporter
        self._length = _length or TrialLength(None, 0)
        self._started = False

    def start(self) -> None:
        if not self._started:
            self._started = True
            self.preempt.start()

    def __enter__(self) -> "Context":
        self.start()
        return self

    def alert(self, title: Optional[str] = None, description: Optional[str] = None,
              level: Optional[Literal["warn", "info", "debug", "error"]] = "info") -> None:
        """Determined sent webhooks; here the alert is a line in the trial's log."""
        print(f"[alert {level}] {title or ''}: {description or ''}", flush=True)

    def close(self, exc_type: Optional[type] = None, exc_val: Optional[BaseException] = None,
              exc_tb: Optional[types.TracebackType] = None) -> None:
        clean = exc_val is None or (isinstance(exc_val, SystemExit) and exc_val.code in (0, None))
        try:
            if self._reporter is not None and self.distributed.rank == 0:
                self._reporter.wait_for_checkpoints()  # recorded before the process ends
                if clean and not self.preempt._preempted \
                        and self.train._early_exit is None:
                    self._length.finished()
        finally:
            self.profiler._close()
            self.preempt.close()
            self.distributed.close()

    def __exit__(self, exc_type: Optional[type], exc_val: Optional[BaseException],
                 exc_tb: Optional[types.TracebackType]) -> None:
        self.close(exc_type, exc_val, exc_tb)
        if exc_val is None and self.train._early_exit == EarlyExitReason.INVALID_HP \
                and self._reporter is not None:
            # Told as a trial class's InvalidHP is: the daemon ends the trial without
            # restarts and the search goes on.
            from determined.core._reporting import FAILURE_MARK

            message = "InvalidHP: the trial reported report_early_exit(INVALID_HP)"
            print(FAILURE_MARK + json.dumps({"signature": message, "message": message,
                                             "stage": "training", "trained": None}),
                  file=sys.stderr, flush=True)
            raise SystemExit(1)


def searcher_sets_length(config: Dict[str, Any]) -> bool:
    """Whether the searcher says how long the trial trains (`max_length`, `max_time`, ASHA's
    rungs); otherwise the script's own loop does."""
    searcher = config.get("searcher") or {}
    return searcher.get("max_length") is not None or searcher.get("max_time") is not None \
        or searcher.get("name") in ("adaptive_asha", "custom")


def _seed(seed: int) -> None:
    """The trial's seed for the generators the script already uses, as localdet seeds every
    trial (TensorFlow only if the script imported it: a plain Python loop stays light)."""
    random.seed(seed)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(seed % 2**32)
    if "tensorflow" in sys.modules:
        sys.modules["tensorflow"].keras.utils.set_random_seed(seed % 2**32)


def _default_storage() -> pathlib.Path:
    """Where Determined kept off-cluster checkpoints: the user data folder `determined`."""
    if sys.platform == "darwin":
        return pathlib.Path.home() / "Library" / "Application Support" / "determined"
    base = os.environ.get("XDG_DATA_HOME") or str(pathlib.Path.home() / ".local" / "share")
    return pathlib.Path(base) / "determined"


def _storage_path(checkpoint_storage: Optional[Union[str, Dict[str, Any]]]) -> pathlib.Path:
    if checkpoint_storage is None:
        return _default_storage()
    if isinstance(checkpoint_storage, str):
        if "://" in checkpoint_storage and not checkpoint_storage.startswith("file://"):
            raise ValueError(f"core.init(checkpoint_storage={checkpoint_storage!r}): off "
                             "localdet only a folder path is served; give a path")
        return pathlib.Path(checkpoint_storage.removeprefix("file://")).expanduser()
    if isinstance(checkpoint_storage, dict):
        if checkpoint_storage.get("type") == "shared_fs" and "host_path" in checkpoint_storage:
            return pathlib.Path(checkpoint_storage["host_path"],
                                checkpoint_storage.get("storage_path") or "")
        raise ValueError(f"core.init(checkpoint_storage=...): off localdet only a folder path "
                         f"or a shared_fs mapping is served, got type "
                         f"{checkpoint_storage.get('type')!r}")
    raise TypeError("checkpoint_storage must be a string, a dictionary, or None")


def _dummy_init(*, distributed: Optional[DistributedContext] = None,
                checkpoint_storage: Optional[Union[str, Dict[str, Any]]] = None,
                tensorboard_path: Optional[pathlib.Path] = None,
                preempt_mode: PreemptMode = PreemptMode.WorkersAskChief,
                storage_manager: Any = None) -> Context:
    """The off-cluster context (Determined's local test mode). `storage_manager` (a
    determined.common.storage manager) takes the place of `checkpoint_storage`."""
    distributed = distributed or DistributedContext()
    if storage_manager is None:
        storage_manager = _storage_path(checkpoint_storage)
        logger.info("not under localdet: checkpoints are stored in %s", storage_manager)
    return Context(checkpoint=DummyCheckpointContext(distributed, storage_manager),
                   distributed=distributed,
                   preempt=DummyPreemptContext(distributed, preempt_mode),
                   train=DummyTrainContext(pathlib.Path(tensorboard_path)
                                           if tensorboard_path else None),
                   searcher=DummySearcherContext(distributed))


def init(*, distributed: Optional[DistributedContext] = None,
         checkpoint_storage: Optional[Union[str, Dict[str, Any]]] = None,
         preempt_mode: PreemptMode = PreemptMode.WorkersAskChief,
         tensorboard_mode: TensorboardMode = TensorboardMode.AUTO,
         async_checkpointing: bool = True, storage_manager: Any = None) -> Context:
    """The Core API context; see the module docstring.

    Args:
        distributed: the trial's `DistributedContext` (from `from_tf_config()`,
            `from_horovod(hvd)`, ...); default: the one localdet's launcher describes
            (rank 0 of 1 off localdet).
        checkpoint_storage: off localdet, the folder checkpoints go to; under localdet the
            experiment's `checkpoint_storage` is used and this is ignored with a warning.
        preempt_mode: how ranks call `should_preempt()` (`PreemptMode`).
        tensorboard_mode: accepted; either way the trial's TensorBoard folder is read in
            place (`TensorboardMode`).
        async_checkpointing: accepted; checkpoints are always stored in the background and
            recorded before the context closes.
        storage_manager: Determined 0.18-0.2x's argument (a determined.common.storage
            manager): off localdet checkpoints go there; under localdet it is ignored with
            a warning (the experiment's checkpoint_storage is used).
    """
    if not os.environ.get(TRIAL_ID_VAR):
        return _dummy_init(distributed=distributed, checkpoint_storage=checkpoint_storage,
                           preempt_mode=preempt_mode, storage_manager=storage_manager)
    if storage_manager is not None:
        logger.warning("core.init(storage_manager=...) is ignored under localdet: "
                       "checkpoints go to the experiment's checkpoint_storage")
    import determined as det
    from determined._info import process_reporter

    info = det.get_cluster_info()
    reporter = process_reporter()
    trial = reporter.trial_info()
    from determined import _old_releases

    _old_releases.install(trial.config)  # what the script's TensorFlow and NumPy allowed
    if checkpoint_storage is not None:
        logger.warning("core.init(checkpoint_storage=...) is ignored under localdet: "
                       "checkpoints go to the experiment's checkpoint_storage")
    distributed = distributed or DistributedContext.from_environment()
    chief = distributed.rank == 0
    trial.trial_dir.mkdir(parents=True, exist_ok=True)
    _seed(trial.seed)
    length = TrialLength(reporter if chief else None, trial.target_batches,
                         searched=searcher_sets_length(trial.config),
                         time_metric=(trial.config.get("searcher") or {}).get("time_metric"))
    if info is not None and info.trial is not None:  # a resumed trial starts where it was
        length.last_steps = info.trial.steps_completed
    train = TrainContext(reporter if chief else None, distributed, length,
                         tensorboard_path=trial.trial_dir / "tensorboard",
                         tensorboard_mode=tensorboard_mode,
                         searcher_metric=(trial.config.get("searcher") or {}).get("metric"))
    if length.searched:
        searcher: SearcherContext = SearcherContext(
            distributed, length_in_units(trial.target_batches, trial.config),
            _parse_searcher_units(trial.config), train,
            (trial.config.get("searcher") or {}).get("metric"), trial.target_batches)
    else:
        searcher = SearcherContextMissing()
    return Context(
        checkpoint=CheckpointContext(reporter, distributed, length, scratch=trial.trial_dir),
        distributed=distributed,
        preempt=PreemptContext(reporter if chief else None, distributed, length, preempt_mode),
        train=train, searcher=searcher, info=info, _reporter=reporter, _length=length)
