"""determined.common.experimental: Determined's older home of the SDK's classes (its
`determined.experimental` re-exports them), served by localdet over its own records:
`Experiment`, `Trial`, `Checkpoint`, `Model`, `ModelVersion`, their enums, the metrics
classes and `Determined`. See `determined.experimental.client`. Its names of a master's
features (`Project`, `Session`, `get_max_retries_config`) refuse, in one sentence, when used.
"""

from typing import Any, List

from determined.common.experimental._util import OrderBy
from determined.common.experimental.checkpoint import Checkpoint
from determined.common.experimental.determined import Determined
from determined.common.experimental.experiment import Experiment, ExperimentReference
from determined.common.experimental.metrics import (
    TrainingMetrics,
    TrialMetrics,
    ValidationMetrics,
)
from determined.common.experimental.model import Model, ModelOrderBy, ModelSortBy, ModelVersion
from determined.common.experimental.trial import Trial, TrialOrderBy, TrialReference, TrialSortBy

__all__ = ["Checkpoint", "Determined", "Experiment", "ExperimentReference", "Model",
           "ModelOrderBy", "ModelSortBy", "ModelVersion", "OrderBy", "TrainingMetrics",
           "Trial", "TrialMetrics", "TrialOrderBy", "TrialReference", "TrialSortBy",
           "ValidationMetrics"]

_REFUSED = {
    "Project": ("projects", "localdet keeps every experiment in one list; use labels"),
    "Session": ("the master's HTTP session", "the SDK reaches localdet's records directly"),
    "get_max_retries_config": ("the master's HTTP retry settings",
                               "the SDK reaches localdet's records directly"),
}


def __getattr__(name: str) -> Any:
    if name in _REFUSED:
        from determined import errors

        what, instead = _REFUSED[name]
        raise errors.refuse(f"determined.common.experimental.{name} ({what})", instead)
    raise AttributeError(f"module 'determined.common.experimental' has no attribute {name!r}")


def __dir__() -> List[str]:
    return sorted([*globals(), *_REFUSED])
