"""determined.core: what every training process needs whatever its framework.

Names load on first use, so the daemon side can read the trial/daemon contract
(`determined.core._reporting`) without importing the distributed machinery.
"""

import importlib

# name -> module that defines it
_NAMES = {
    # Determined's Core API (`det.core.init()` and its contexts)
    "init": "determined.core._context",
    "Context": "determined.core._context",
    "_dummy_init": "determined.core._context",
    "TrainContext": "determined.core._train",
    "DummyTrainContext": "determined.core._train",
    "EarlyExitReason": "determined.core._train",
    "TensorboardMode": "determined.core._train",
    "CheckpointContext": "determined.core._checkpoint",
    "DummyCheckpointContext": "determined.core._checkpoint",
    "DownloadMode": "determined.core._checkpoint",
    "PreemptContext": "determined.core._preempt",
    "DummyPreemptContext": "determined.core._preempt",
    "PreemptMode": "determined.core._preempt",
    "SearcherContext": "determined.core._searcher",
    "SearcherContextMissing": "determined.core._searcher",
    "DummySearcherContext": "determined.core._searcher",
    "SearcherOperation": "determined.core._searcher",
    "DummySearcherOperation": "determined.core._searcher",
    "SearcherMode": "determined.core._searcher",
    "Unit": "determined.core._searcher",
    "_parse_searcher_max_length": "determined.core._searcher",
    "_parse_searcher_units": "determined.core._searcher",
    "ProfilerContext": "determined.core._profiler",
    "DummyProfilerContext": "determined.core._profiler",
    "ExperimentalCoreContext": "determined.core._experimental",
    "DummyExperimentalCoreContext": "determined.core._experimental",
    "DummyDistributedContext": "determined.core._distributed",
    # Determined's runner internals: three served, the rest refused at use
    "_run_on_rank_0_and_broadcast": "determined.core._runner_internals",
    "_install_stacktrace_on_sigusr1": "determined.core._runner_internals",
    "_get_storage_manager": "determined.core._runner_internals",
    "_MetricsContext": "determined.core._runner_internals",
    "_DummyMetricsContext": "determined.core._runner_internals",
    "_Heartbeat": "determined.core._runner_internals",
    "_ManagedTrialHeartbeat": "determined.core._runner_internals",
    "_UnmanagedTrialHeartbeat": "determined.core._runner_internals",
    "_LogShipper": "determined.core._runner_internals",
    "_ManagedTrialLogShipper": "determined.core._runner_internals",
    "_UnmanagedTrialLogShipper": "determined.core._runner_internals",
    "_PreemptionWatcher": "determined.core._runner_internals",
    "_run_prepare": "determined.core._runner_internals",
    # localdet's own: the distributed environment and the trial/daemon contract
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
