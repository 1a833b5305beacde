"""Determined ran `RemoteSearchRunner` on the cluster, inside an experiment of its own. There
is no cluster here: it runs as `LocalSearchRunner` does, in the process that calls it,
keeping its state in `searcher_dir` (the current folder by default) so that it resumes the
same way when started again."""

from __future__ import annotations

import pathlib
from typing import Any, Optional, Union

from determined.searcher._search_method import SearchMethod
from determined.searcher._search_runner import LocalSearchRunner


class RemoteSearchRunner(LocalSearchRunner):
    """`RemoteSearchRunner(search_method, context)`: `context` (a Core API context) is taken
    and not needed."""

    def __init__(self, search_method: SearchMethod, context: Any = None,
                 searcher_dir: Optional[Union[str, pathlib.Path]] = None) -> None:
        super().__init__(search_method, searcher_dir=searcher_dir)
        self.context = context
