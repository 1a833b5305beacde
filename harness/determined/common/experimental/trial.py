"""A trial, as the SDK hands it out: its facts, checkpoints, metrics and log."""

import enum
from typing import Any, Dict, Iterable, List, Optional, Union

from determined.common.experimental import _backend, _util, checkpoint, metrics
from determined.common.experimental._util import OrderBy


class LogLevel(enum.Enum):
    TRACE = "LOG_LEVEL_TRACE"
    DEBUG = "LOG_LEVEL_DEBUG"
    INFO = "LOG_LEVEL_INFO"
    WARNING = "LOG_LEVEL_WARNING"
    ERROR = "LOG_LEVEL_ERROR"
    CRITICAL = "LOG_LEVEL_CRITICAL"


class TrialState(enum.Enum):
    """A trial's state under Determined's names; localdet's WAITING (trained to its length,
    the searcher deciding) shows as ACTIVE."""

    ACTIVE = "STATE_ACTIVE"
    PAUSED = "STATE_PAUSED"
    STOPPING_CANCELED = "STATE_STOPPING_CANCELED"
    STOPPING_KILLED = "STATE_STOPPING_KILLED"
    STOPPING_COMPLETED = "STATE_STOPPING_COMPLETED"
    STOPPING_ERROR = "STATE_STOPPING_ERROR"
    CANCELED = "STATE_CANCELED"
    COMPLETED = "STATE_COMPLETED"
    ERROR = "STATE_ERROR"
    QUEUED = "STATE_QUEUED"
    PULLING = "STATE_PULLING"
    STARTING = "STATE_STARTING"
    RUNNING = "STATE_RUNNING"


def _trial_state(name: str) -> TrialState:
    return TrialState.ACTIVE if name == "WAITING" else TrialState[name]


class TrialSortBy(enum.Enum):
    """What `Experiment.list_trials(sort_by=...)` sorts on."""

    ID = "SORT_BY_ID"
    START_TIME = "SORT_BY_START_TIME"
    END_TIME = "SORT_BY_END_TIME"
    STATE = "SORT_BY_STATE"
    BEST_VALIDATION_METRIC = "SORT_BY_BEST_VALIDATION_METRIC"
    LATEST_VALIDATION_METRIC = "SORT_BY_LATEST_VALIDATION_METRIC"
    BATCHES_PROCESSED = "SORT_BY_BATCHES_PROCESSED"
    DURATION = "SORT_BY_DURATION"
    RESTARTS = "SORT_BY_RESTARTS"
    CHECKPOINT_SIZE = "SORT_BY_CHECKPOINT_SIZE"
    LOG_RETENTION_DAYS = "SORT_BY_LOG_RETENTION_DAYS"


class TrialOrderBy(enum.Enum):
    """Determined's older name of `OrderBy` for trials."""

    ASCENDING = "ORDER_BY_ASC"
    ASC = "ORDER_BY_ASC"
    DESCENDING = "ORDER_BY_DESC"
    DESC = "ORDER_BY_DESC"


def _trial_metrics(trial_ids: List[int], group: str) -> Iterable[metrics.TrialMetrics]:
    for record in _backend.call("trial.metrics", trial_ids=list(trial_ids), group=group):
        yield metrics.TrialMetrics._from_record(record)


class Trial:
    """A trial, usually from `client.get_trial(id)` or `Experiment.list_trials()`.

    Attributes:
        id: its id.
        experiment_id: its experiment's id.
        hparams: its hyperparameters.
        state: a `TrialState`.
        summary_metrics: {"avg_metrics": ..., "validation_metrics": ...}: per metric name,
            its count, last, min, max and sum over the reports.
    """

    # `Experiment`, set by its module: it imports this one (its listings make Trials), so
    # this one cannot import it back.
    _experiment_class: Any = None

    def __init__(self, trial_id: int, session: Any = None) -> None:
        self.id = trial_id
        self._session = session  # accepted for Determined's signature; no master here
        self.experiment_id: Optional[int] = None
        self.hparams: Optional[Dict[str, Any]] = None
        self.summary_metrics: Optional[Dict[str, Any]] = None
        self.state: Optional[TrialState] = None

    def _hydrate(self, facts: Dict[str, Any]) -> None:
        self.experiment_id = facts["experiment_id"]
        self.hparams = facts["hparams"]
        self.state = _trial_state(facts["state"])
        self.summary_metrics = facts.get("summary_metrics")

    @classmethod
    def _from_facts(cls, facts: Dict[str, Any]) -> "Trial":
        trial = cls(facts["id"])
        trial._hydrate(facts)
        return trial

    def reload(self) -> None:
        """Read its facts again."""
        self._hydrate(_backend.call("trial.get", trial_id=self.id))

    def iter_logs(self, follow: bool = False, *, head: Optional[int] = None,
                  tail: Optional[int] = None, container_ids: Optional[List[str]] = None,
                  rank_ids: Optional[List[int]] = None, stdtypes: Optional[List[str]] = None,
                  min_level: Optional[LogLevel] = None,
                  timestamp_before: Optional[Union[str, int]] = None,
                  timestamp_after: Optional[Union[str, int]] = None,
                  sources: Optional[List[str]] = None,
                  search_text: Optional[str] = None) -> Iterable[str]:
        """The lines of the trial's log (`head`: the first N, `tail`: the last N,
        `search_text`: only lines containing it). With `follow`, the lines so far, then
        each new one until the trial ends. The filters by container, rank, stream, level,
        time and source are accepted and apply to nothing: the log is one file."""
        if head is not None and head < 0:
            raise ValueError(f"head must be non-negative, got {head}")
        if tail is not None and tail < 0:
            raise ValueError(f"tail must be non-negative, got {tail}")
        if follow and (head is not None or tail is not None):
            raise ValueError("follow cannot be combined with head or tail")
        lines: List[str] = _backend.call("trial.logs", trial_id=self.id, head=head, tail=tail)
        seen = len(lines)
        for line in lines:
            if search_text is None or search_text in line:
                yield line
        while follow:
            import time

            ended = _backend.call("trial.get", trial_id=self.id)["state"] in (
                "COMPLETED", "CANCELED", "ERROR", "PAUSED")
            lines = _backend.call("trial.logs", trial_id=self.id, head=None, tail=None)
            for line in lines[seen:]:
                if search_text is None or search_text in line:
                    yield line
            seen = len(lines)
            if ended:
                return
            time.sleep(1.0)

    def logs(self, *args: Any, **kwargs: Any) -> Iterable[str]:
        """Determined's older name of `iter_logs`."""
        _util.deprecated("Trial.logs()", "Trial.iter_logs()")
        return self.iter_logs(*args, **kwargs)

    def kill(self) -> None:
        """Stop the trial at once, without a checkpoint."""
        _backend.call("trial.kill", trial_id=self.id)

    def list_checkpoints(self, sort_by: Optional[Union[str, checkpoint.CheckpointSortBy]] = None,
                         order_by: Optional[OrderBy] = None,
                         max_results: Optional[int] = None) -> List[checkpoint.Checkpoint]:
        """The trial's live checkpoints, sorted by `sort_by` (a `CheckpointSortBy` or a
        validation metric's name) in `order_by` order (both or neither; neither: by the
        searcher metric, best first), at most `max_results`."""
        arguments = checkpoint._checkpoint._sort_arguments(sort_by, order_by)
        found = _backend.call("checkpoint.list", trial_id=self.id, max_results=max_results,
                              **arguments)
        return [checkpoint.Checkpoint._from_facts(f) for f in found]

    def top_checkpoint(self, sort_by: Optional[str] = None,
                       smaller_is_better: Optional[bool] = None) -> checkpoint.Checkpoint:
        """The trial's best checkpoint: by the searcher metric, or by the validation metric
        `sort_by` (`smaller_is_better` None: the experiment's setting)."""
        _util.deprecated("Trial.top_checkpoint()", "Trial.list_checkpoints(max_results=1)")
        return self._best(sort_by, smaller_is_better)

    def _best(self, sort_by: Optional[str], smaller_is_better: Optional[bool]
              ) -> checkpoint.Checkpoint:
        # As Determined: smaller_is_better applies to a named metric only.
        order = None if sort_by is None or smaller_is_better is None else (
            "asc" if smaller_is_better else "desc")
        found = _backend.call("checkpoint.list", trial_id=self.id, metric=sort_by,
                              order=order, max_results=1)
        if not found:
            raise ValueError(f"trial {self.id} has no checkpoint (kept by its "
                             "checkpoint_storage settings) yet.")
        return checkpoint.Checkpoint._from_facts(found[0])

    def select_checkpoint(self, latest: bool = False, best: bool = False,
                          uuid: Optional[str] = None, sort_by: Optional[str] = None,
                          smaller_is_better: Optional[bool] = None) -> checkpoint.Checkpoint:
        """Exactly one of: the `latest` checkpoint, the `best` (as `top_checkpoint`), or
        the one with `uuid`."""
        _util.deprecated("Trial.select_checkpoint()", "Trial.list_checkpoints()")
        if sum([int(latest), int(best), int(uuid is not None)]) != 1:
            raise AssertionError("Exactly one of latest, best, or uuid must be set")
        if (sort_by is None) != (smaller_is_better is None):
            raise AssertionError("sort_by and smaller_is_better must be set together")
        if sort_by is not None and not best:
            raise AssertionError("sort_by and smaller_is_better can only be used with best")
        if uuid is not None:
            return checkpoint.Checkpoint._from_facts(_backend.call("checkpoint.get", uuid=uuid))
        if latest:
            found = self.list_checkpoints(checkpoint.CheckpointSortBy.BATCH_NUMBER,
                                          OrderBy.DESC, max_results=1)
            if not found:
                raise ValueError(f"trial {self.id} has no checkpoint yet.")
            return found[0]
        return self._best(sort_by, smaller_is_better)

    def get_checkpoints(self, sort_by: Optional[Union[str, checkpoint.CheckpointSortBy]] = None,
                        order_by: Optional[OrderBy] = None) -> List[checkpoint.Checkpoint]:
        _util.deprecated("Trial.get_checkpoints()", "Trial.list_checkpoints()")
        return self.list_checkpoints(sort_by, order_by)

    def iter_metrics(self, group: str) -> Iterable[metrics.TrialMetrics]:
        """The trial's metric reports of `group`, oldest first: "training" or "validation",
        or the system metrics localdet's daemon sampled while it ran: "system" (every metric
        of a sample), or Determined's profiler groups "cpu", "memory", "disk", "gpu" (their
        part of it). A system report's `steps_completed` is the trial's batches when it was
        sampled."""
        return _trial_metrics([self.id], group)

    def stream_metrics(self, group: str) -> Iterable[metrics.TrialMetrics]:
        _util.deprecated("Trial.stream_metrics()", "Trial.iter_metrics()")
        return self.iter_metrics(group)

    def stream_training_metrics(self) -> Iterable[metrics.TrainingMetrics]:
        _util.deprecated("Trial.stream_training_metrics()", "Trial.iter_metrics('training')")
        return _legacy_metrics([self.id], metrics.TrainingMetrics)

    def stream_validation_metrics(self) -> Iterable[metrics.ValidationMetrics]:
        _util.deprecated("Trial.stream_validation_metrics()",
                         "Trial.iter_metrics('validation')")
        return _legacy_metrics([self.id], metrics.ValidationMetrics)

    def get_experiment(self) -> Any:
        """The trial's `Experiment`."""
        if self.experiment_id is None:
            self.reload()
        return self._experiment_class._from_facts(
            _backend.call("experiment.get", experiment_id=self.experiment_id))

    def __repr__(self) -> str:
        return f"Trial(id={self.id})"


def _legacy_metrics(trial_ids: List[int], cls: Any) -> Iterable[Any]:
    group = "training" if cls is metrics.TrainingMetrics else "validation"
    for m in _trial_metrics(trial_ids, group):
        yield cls(trial_id=m.trial_id, trial_run_id=m.trial_run_id,
                  steps_completed=m.steps_completed, end_time=m.end_time, metrics=m.metrics)


class TrialReference(Trial):
    """Determined's older name of `Trial`."""

    def __init__(self, trial_id: int, session: Any = None) -> None:
        _util.deprecated("TrialReference", "Trial")
        super().__init__(trial_id, session)
