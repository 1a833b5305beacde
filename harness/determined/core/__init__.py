"""determined.core: what every training process needs whatever its framework."""

from determined.core._distributed import DistributedContext
from determined.core._distributed_env import (
    DistributedEnvironment,
    distributed_environments,
    read_distributed_environment,
)
from determined.core._reporting import (
    DiscardingReporter,
    TrialInfo,
    TrialReporter,
    WorkerReporter,
    reporter_for_script,
    reporter_from_environment,
)

__all__ = ["DiscardingReporter", "DistributedContext", "DistributedEnvironment", "TrialInfo",
           "TrialReporter", "WorkerReporter", "distributed_environments",
           "read_distributed_environment", "reporter_for_script", "reporter_from_environment"]
