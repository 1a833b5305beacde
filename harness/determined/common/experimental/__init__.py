"""determined.common.experimental: Determined's older home of the SDK's classes (its
`determined.experimental` re-exports them), served by localdet over its own records:
`Experiment`, `Trial`, `Checkpoint`, `Model`, `ModelVersion`, their enums, the metrics
classes and `Determined`. See `determined.experimental.client`."""

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
