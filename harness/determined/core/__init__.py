"""determined.core: what every training process needs whatever its framework.

Names load on first use, so the daemon side can read the trial/daemon contract
(`determined.core._reporting`) without importing the distributed machinery.
"""

import importlib

# name -> module that defines it
_NAMES = {
    "DistributedContext": "determined.core._distributed",
    "DistributedEnvironment": "determined.core._distributed_env",
    "distributed_environments": "determined.core._distributed_env",
    "read_distributed_environment": "determined.core._distributed_env",
    "DiscardingReporter": "determined.core._reporting",
    "TrialInfo": "determined.core._reporting",
    "TrialReporter": "determined.core._reporting",
    "WorkerReporter": "determined.core._reporting",
    "reporter_for_script": "determined.core._reporting",
    "reporter_from_environment": "determined.core._reporting",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str):
    if name not in _NAMES:
        raise AttributeError(f"module 'determined.core' has no attribute {name!r}")
    value = getattr(importlib.import_module(_NAMES[name]), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__():
    return sorted(set(globals()) | set(_NAMES))
