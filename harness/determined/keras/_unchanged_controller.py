"""The runner of one `model.fit` of an unchanged script (`_unchanged_fit`): the controller
`context.fit` uses, for a fit that may have no validation data.

Keras trains such a fit without validating; localdet still needs a validation point at
each validation boundary (the searcher reads it), so there the training metrics stand in,
under their own History names (`loss`, `accuracy`: a search over such a script sets
`searcher.metric: loss`).
"""

from __future__ import annotations

from typing import Any, Dict

from determined.keras._trial_controller import FitOptions, TrialController
from determined.keras._unchanged_phase import report_stand_in


class ScriptController(TrialController):
    _latest_logs: Dict[str, Any] = {}

    def end_workload(self, logs: Dict[str, Any]) -> None:
        self._latest_logs = logs
        super().end_workload(logs)

    def _epoch_logs(self, fit: FitOptions, logs: Dict[str, Any],
                    always: bool = False) -> Dict[str, float]:
        self._latest_logs = logs
        return super()._epoch_logs(fit, logs, always)

    def validate(self) -> Dict[str, float]:
        if self.validation_loader is not None:
            return super().validate()
        metrics = self.engine.training_metrics(self._latest_logs) if self._latest_logs else {}
        if self.is_chief and metrics:
            report_stand_in(self.reporter, self.batches_trained, metrics)
        self.last_validation = self.batches_trained
        self.last_validation_metrics = {}  # the epoch's History row keeps its own
        return {}
