"""`core_context.train`: metrics, progress and TensorBoard files of a Core API trial.

    core_context.train.report_training_metrics(steps_completed=100, metrics={"loss": 0.3})
    core_context.train.report_validation_metrics(steps_completed=100, metrics={"acc": 0.9})
    core_context.train.report_metrics("validation", 100, {"acc": 0.9})   # 0.37's form
    core_context.train.report_progress(0.25)

Metrics are recorded as any trial's (`localdet metrics`, the dashboard, the searcher reads
the validations); only the chief (rank 0) reports, as in Determined. Values must be numbers:
others (text, lists) are left out with a warning. Groups other than "training" and
"validation" are written to the trial's log only.

Keras names a validation's metrics `loss`, `accuracy` in the validation's own logs (what
DeterminedCallback reports, as Determined's did) and `val_loss`, `val_accuracy` in the
epoch's; configs name the searcher metric either way (Determined's own iris example says
`val_categorical_accuracy`). So a validation that lacks the searcher metric under the
config's name but has it under the other one records it under both.
"""

from __future__ import annotations

import enum
import logging
import math
import numbers
import pathlib
from typing import Any, Callable, Dict, List, Optional

from determined.core._distributed import DistributedContext
from determined.core._length import TrialLength
from determined.core._reporting import TrialReporter

logger = logging.getLogger("determined.core")

TRAINING, VALIDATION = "training", "validation"


class EarlyExitReason(enum.Enum):
    INVALID_HP = "EXITED_REASON_INVALID_HP"
    USER_REQUESTED_STOP = "EXITED_REASON_USER_REQUESTED_STOP"


class TensorboardMode(enum.Enum):
    """AUTO: reported metrics also reach TensorBoard (`localdet tensorboard` writes them from
    the records). MANUAL: the same here; `upload_tensorboard_files()` may be called, and
    does nothing, since the trial's TensorBoard folder is already where TensorBoard reads."""

    AUTO = "AUTO"
    MANUAL = "MANUAL"


def _numbers(metrics: Dict[str, Any], where: str) -> Dict[str, float]:
    """The metrics as floats (NumPy and TensorFlow scalars included); the rest left out
    with one warning naming them."""
    kept: Dict[str, float] = {}
    dropped: List[str] = []
    for name, value in metrics.items():
        if hasattr(value, "numpy"):  # a TensorFlow scalar
            value = value.numpy()
        if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:  # a NumPy scalar
            value = value.item()
        if isinstance(value, numbers.Real):
            kept[str(name)] = float(value)
        elif value is None:
            raise ValueError(f"{where}: metric {name!r} is None; report a number")
        else:
            dropped.append(str(name))
    if dropped:
        logger.warning("%s: metrics %s are not numbers and were not recorded", where,
                       ", ".join(sorted(dropped)))
    return kept


def _with_searcher_metric(values: Dict[str, float], metric: Optional[str]) -> Dict[str, float]:
    """`values`, with the searcher metric under the config's name when the validation has
    it only under Keras's other name for it (with or without `val_`)."""
    if not metric or metric in values:
        return values
    other = metric[len("val_"):] if metric.startswith("val_") else f"val_{metric}"
    return {**values, metric: values[other]} if other in values else values


class TrainContext:
    """`core_context.train`; see the module docstring."""

    def __init__(self, reporter: Optional[TrialReporter], distributed: DistributedContext,
                 length: TrialLength, tensorboard_path: Optional[pathlib.Path] = None,
                 tensorboard_mode: TensorboardMode = TensorboardMode.AUTO,
                 searcher_metric: Optional[str] = None) -> None:
        self._reporter = reporter  # None: off-cluster, nothing recorded
        self._searcher_metric = searcher_metric
        self._distributed = distributed
        self._length = length
        self._tensorboard_path = tensorboard_path
        self._tensorboard_mode = TensorboardMode(tensorboard_mode)
        self._metadata: Dict[str, Any] = {}
        self._status = ""
        self._early_exit: Optional[EarlyExitReason] = None
        self._first_reported = False

    # -- metrics ----------------------------------------------------------------------
    def report_training_metrics(self, steps_completed: int, metrics: Dict[str, Any],
                                batch_metrics: Optional[List[Dict[str, Any]]] = None) -> None:
        """Record training metrics at `steps_completed` batches (`batch_metrics`, per-batch
        values Determined kept apart, are not recorded)."""
        self.report_metrics(TRAINING, steps_completed, metrics)

    def report_validation_metrics(self, steps_completed: int, metrics: Dict[str, Any]) -> None:
        """Record validation metrics at `steps_completed` batches; the searcher reads its
        metric from them."""
        self.report_metrics(VALIDATION, steps_completed, metrics)

    def report_metrics(self, group: str, steps_completed: int, metrics: Dict[str, Any]) -> None:
        """Record `metrics` of `group` ("training" or "validation"; any other group goes to
        the trial's log) at `steps_completed` batches."""
        if "." in group:
            raise ValueError(f"metric group {group!r} must not contain '.'")
        if isinstance(steps_completed, bool) or not isinstance(steps_completed, numbers.Integral) \
                or steps_completed < 0:
            raise ValueError(f"steps_completed must be a whole number of batches >= 0, got "
                             f"{steps_completed!r}")
        where = f"report_metrics({group!r}, {steps_completed})"
        values = _numbers(metrics, where)
        logger.info("%s: %s", where, values)
        if group == VALIDATION:
            values = _with_searcher_metric(values, self._searcher_metric)
            self._length.validated(int(steps_completed), values)
        else:
            self._length.steps(int(steps_completed))
        if self._reporter is None:
            return
        if group == TRAINING:
            self._reporter.report_training_metrics(int(steps_completed), values)
            if not self._first_reported:  # the Start column: time to the first batch
                self._first_reported = True
                self._reporter.report_first_batch()
        elif group == VALIDATION:
            self._reporter.report_validation_metrics(int(steps_completed), values)
        else:
            print(f"[metrics] {group} at {steps_completed} batches: {values}", flush=True)

    # -- progress and status -------------------------------------------------------------
    def report_progress(self, progress: float) -> None:
        """The fraction of its training the trial has done (0 to 1); without a searcher
        length it is also the trial's estimate of its own length."""
        if not 0 <= progress <= 1 or math.isnan(progress):
            raise ValueError(f"progress must be between 0 and 1, got {progress}")
        self._length.progress(float(progress))

    def set_status(self, status: str) -> None:
        """A short note of what the trial is doing (Determined's web UI showed it)."""
        self._status = str(status)
        logger.debug("status: %s", status)

    def report_early_exit(self, reason: EarlyExitReason) -> None:
        """INVALID_HP ends the trial as errored, without restarts, while its search goes on
        (as raising `det.InvalidHP` does), once the `core.init()` block ends."""
        self._early_exit = EarlyExitReason(reason)
        logger.info("report_early_exit(%s)", self._early_exit.name)

    def get_experiment_best_validation(self) -> Optional[float]:
        """The best searcher metric of the experiment so far; not tracked for trial code
        here, so None (as Determined answered before any validation)."""
        return None

    def set_metadata(self, metadata: Dict[str, Any]) -> Dict[str, Any]:
        """Run metadata (Determined 0.37): kept for this process only."""
        self._metadata = dict(metadata)
        return dict(self._metadata)

    def get_metadata(self) -> Dict[str, Any]:
        return dict(self._metadata)

    # -- TensorBoard ----------------------------------------------------------------------
    def get_tensorboard_path(self) -> Optional[pathlib.Path]:
        """The trial's TensorBoard folder (`localdet tensorboard EXP` reads it); None off
        the daemon unless `core.init(tensorboard_path=...)` gave one."""
        if self._tensorboard_path is not None:
            self._tensorboard_path.mkdir(parents=True, exist_ok=True)
        return self._tensorboard_path

    def upload_tensorboard_files(
            self, selector: Callable[[pathlib.Path], bool] = lambda _: True,
            mangler: Callable[[pathlib.Path, int], pathlib.Path] = lambda p, __: p) -> None:
        """Nothing to upload: the files are already in the trial's folder, where TensorBoard
        reads them. As in Determined, only MANUAL mode may call it."""
        if self._tensorboard_mode == TensorboardMode.AUTO:
            raise RuntimeError("upload_tensorboard_files() can only be used with "
                               "core.init(tensorboard_mode=core.TensorboardMode.MANUAL)")


class DummyTrainContext(TrainContext):
    """The train context off-cluster (what `core.init()` gives outside localdet): metrics go
    to the log only."""

    def __init__(self, tensorboard_path: Optional[pathlib.Path] = None) -> None:
        super().__init__(None, DistributedContext(), TrialLength(None, 0), tensorboard_path)
