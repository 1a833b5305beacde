"""Determined's custom search methods (0.19 to 0.37): subclass `SearchMethod`, answer each
searcher event with operations (`Create`, `ValidateAfter`, `Close`, `Progress`, `Shutdown`),
and run it with `LocalSearchRunner(method, searcher_dir=...).run(config, model_dir=...)`,
which creates a `searcher.name: custom` experiment and carries the method's operations to it
through the SDK's records backend (`determined.common.experimental._backend`)."""

from determined.searcher._remote_search_runner import RemoteSearchRunner
from determined.searcher._search_method import (
    Close,
    Create,
    ExitedReason,
    Operation,
    Progress,
    SearcherState,
    SearchMethod,
    Shutdown,
    ValidateAfter,
)
from determined.searcher._search_runner import LocalSearchRunner, SearchRunner

__all__ = [
    "Close",
    "Create",
    "ExitedReason",
    "LocalSearchRunner",
    "Operation",
    "Progress",
    "RemoteSearchRunner",
    "SearchMethod",
    "SearchRunner",
    "SearcherState",
    "Shutdown",
    "ValidateAfter",
]
