"""determined.core: what every training process needs whatever its framework."""

from determined.core._distributed import DistributedContext
from determined.core._reporting import (
    DiscardingReporter,
    TrialInfo,
    TrialReporter,
    reporter_for_script,
    reporter_from_environment,
)

__all__ = ["DiscardingReporter", "DistributedContext", "TrialInfo", "TrialReporter",
           "reporter_for_script", "reporter_from_environment"]
