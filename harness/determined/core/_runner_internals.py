"""Internals of Determined's trial runner that `determined.core` exported (underscore names),
defined so that code naming them imports. The three that need no master work as Determined's
did; the others (its master connection, metrics plumbing and preemption polling) refuse with
one sentence at use: localdet's daemon does that work outside the trial's process."""

from __future__ import annotations

import signal
import sys
import threading
import traceback
from typing import Any, Callable, Dict, Optional, TypeVar, Union

from determined._runner_internals import _refusing_class, _refusing_function
from determined.core._distributed import DistributedContext

T = TypeVar("T")


def _run_on_rank_0_and_broadcast(func: Callable[[], T],
                                 distributed: Optional[DistributedContext] = None) -> T:
    """Rank 0 (or the only process, without `distributed`) calls `func`; every rank gets its
    result."""
    result = func() if distributed is None or distributed.rank == 0 else None
    if distributed is not None:
        result = distributed.broadcast(result)
    return result  # type: ignore[return-value]  # rank 0's T, broadcast


def _install_stacktrace_on_sigusr1() -> None:
    """From now on `kill -USR1 <pid>` prints where the main thread is to stderr, then runs
    the handler that was there before. Does nothing off the main thread (only it may set
    signal handlers) or where there is no SIGUSR1."""
    if not hasattr(signal, "SIGUSR1") or threading.current_thread() is not \
            threading.main_thread():
        return
    previous: Any = None

    def print_stack(signum: int, frame: Any) -> None:
        traceback.print_stack(frame, file=sys.stderr)
        if callable(previous):
            previous(signum, frame)

    previous = signal.signal(signal.SIGUSR1, print_stack)


def _get_storage_manager(checkpoint_storage: Optional[Union[str, Dict[str, Any]]]) -> Any:
    """The `determined.common.storage` manager of a `checkpoint_storage` setting as
    `det.core.init` takes it: a folder path string, a storage config mapping, or None."""
    from determined.common import storage

    if checkpoint_storage is None:
        return None
    if isinstance(checkpoint_storage, str):
        return storage.from_string(checkpoint_storage)
    if isinstance(checkpoint_storage, dict):
        if checkpoint_storage.get("type") == "shared_fs":  # as Determined ruled
            raise ValueError("a shared_fs checkpoint storage cannot be given as a mapping "
                             "here: give its folder as a string")
        return storage.build(checkpoint_storage, container_path=None)
    raise TypeError("checkpoint_storage must be a string, a dictionary, or None")


def _refused(name: str, instead: str) -> type:
    return _refusing_class(name, instead, owner="det.core", module=__name__)


_METRICS = "core_context.train reports metrics (report_training_metrics and the like)"
_HEARTBEAT = ("there is no master to keep a heartbeat with; the localdet daemon watches the "
              "trial's processes itself")
_LOGS = ("there is no master to ship logs to; a trial's output goes to its log, which "
         "`localdet logs` reads")

_MetricsContext = _refused("_MetricsContext", _METRICS)
_DummyMetricsContext = _refused("_DummyMetricsContext", _METRICS)
_Heartbeat = _refused("_Heartbeat", _HEARTBEAT)
_ManagedTrialHeartbeat = _refused("_ManagedTrialHeartbeat", _HEARTBEAT)
_UnmanagedTrialHeartbeat = _refused("_UnmanagedTrialHeartbeat", _HEARTBEAT)
_LogShipper = _refused("_LogShipper", _LOGS)
_ManagedTrialLogShipper = _refused("_ManagedTrialLogShipper", _LOGS)
_UnmanagedTrialLogShipper = _refused("_UnmanagedTrialLogShipper", _LOGS)
_PreemptionWatcher = _refused(
    "_PreemptionWatcher", "call core_context.preempt.should_preempt(), which localdet pause "
    "and the searcher's length answer")
_run_prepare = _refusing_function(
    "_run_prepare", "there is no master to prepare a run with; det.core.init() sets up "
    "reporting to the localdet daemon", owner="det.core")
