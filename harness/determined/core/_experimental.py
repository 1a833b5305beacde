"""`core_context.experimental`: Determined's lineage records (which checkpoint or model
version a task used). Accepted so that code calling it runs; localdet has no model registry,
so nothing is recorded."""

from __future__ import annotations

from typing import Any


class ExperimentalCoreContext:
    def report_task_using_checkpoint(self, checkpoint: Any) -> None:
        """Accepted: not recorded."""

    def report_task_using_model_version(self, model_version: Any) -> None:
        """Accepted: not recorded."""


DummyExperimentalCoreContext = ExperimentalCoreContext
