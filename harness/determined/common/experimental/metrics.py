"""What a trial reported, as the SDK hands it out (`Trial.iter_metrics`,
`client.iter_trials_metrics`)."""

import dataclasses
import datetime
from typing import Any, Dict, List, Optional


@dataclasses.dataclass
class TrialMetrics:
    """One metrics report of a trial.

    Attributes:
        trial_id: the trial that reported it.
        trial_run_id: which run of the trial (1, then one more per restart or resume).
        steps_completed: batches trained when it was reported.
        end_time: when it was recorded.
        metrics: the reported values, by name.
        group: "training" or "validation".
        batch_metrics: unused (None).
    """

    trial_id: int
    trial_run_id: int
    steps_completed: int
    end_time: datetime.datetime
    metrics: Dict[str, Any]
    group: str
    batch_metrics: Optional[List[Dict[str, Any]]] = None

    @property
    def total_batches(self) -> int:
        """The older name of `steps_completed`."""
        return self.steps_completed

    @total_batches.setter
    def total_batches(self, value: int) -> None:
        self.steps_completed = value

    @classmethod
    def _from_record(cls, record: Dict[str, Any]) -> "TrialMetrics":
        return cls(trial_id=record["trial_id"], trial_run_id=record.get("trial_run_id", 1),
                   steps_completed=record["batches_trained"],
                   end_time=datetime.datetime.fromisoformat(record["recorded_at"]),
                   metrics=record["metrics"], group=record["group"])


class TrainingMetrics(TrialMetrics):
    """A training report (Determined's older class; `TrialMetrics` with group
    "training")."""

    def __init__(self, total_batches: Optional[int] = None, **kwargs: Any) -> None:
        if total_batches is not None:
            kwargs["steps_completed"] = total_batches
        kwargs["group"] = "training"
        super().__init__(**kwargs)


class ValidationMetrics(TrialMetrics):
    """A validation report (Determined's older class; `TrialMetrics` with group
    "validation")."""

    def __init__(self, total_batches: Optional[int] = None, **kwargs: Any) -> None:
        if total_batches is not None:
            kwargs["steps_completed"] = total_batches
        kwargs["group"] = "validation"
        super().__init__(**kwargs)
