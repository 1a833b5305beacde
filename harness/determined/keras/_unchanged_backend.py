"""One `model.fit` of an unchanged script on Keras's JAX or PyTorch backend: the phase
`_unchanged_fit` hands over, trained by `context.fit`'s backend runner (`_backend_fit`),
which imports no TensorFlow; `_unchanged_controller` is its TensorFlow counterpart.

As there, a fit without validation data still has a validation point at each validation
boundary (the searcher reads it): the training metrics stand in, under their History names.
"""

from __future__ import annotations

from typing import Any, Dict

from determined.core import TrialInfo, TrialReporter
from determined.keras import _backend_context as fit_args
from determined.keras._backend_fit import BackendFit, FitOptions, _metrics
from determined.keras._unchanged_phase import fit_data, report_stand_in


class ScriptBackendFit(BackendFit):
    """`BackendFit` for a fit that may have no validation data."""

    _latest: Dict[str, float] = {}

    def _end_workload(self, logs: Dict[str, Any], workload_t: float) -> None:
        self._latest = _metrics(logs)
        super()._end_workload(logs, workload_t)

    def _epoch_logs(self, logs: Dict[str, Any], always: bool = False) -> Dict[str, float]:
        self._latest = _metrics(logs)
        return super()._epoch_logs(logs, always)

    def validate(self) -> Dict[str, float]:
        if self.validation is not None:
            return super().validate()
        if self._latest:
            report_stand_in(self.reporter, self.batches_trained, dict(self._latest))
        self.last_validation = self.batches_trained
        self.last_validation_metrics = {}  # the epoch's History row keeps its own
        return {}


def run_phase(info: TrialInfo, reporter: TrialReporter, model: Any,
              arguments: Dict[str, Any], history: Any) -> ScriptBackendFit:
    """Train one phase (the fit call's `arguments` by name) into Keras's `history`; returns
    the runner (`batches_trained`, `paused`)."""
    train, validation, batch_size = fit_data(arguments, fit_args)
    options = FitOptions(
        epochs=arguments.get("epochs", 1) or 1,
        initial_epoch=arguments.get("initial_epoch", 0) or 0,
        steps_per_epoch=arguments.get("steps_per_epoch"),
        validation_freq=arguments.get("validation_freq", 1) or 1,
        validation_batch_size=arguments.get("validation_batch_size"),
        validation_steps=arguments.get("validation_steps"),
        shuffle=arguments.get("shuffle", True),
        class_weight=arguments.get("class_weight"),
        verbose=fit_args._interactive_verbose(arguments.get("verbose", "auto")),
        history=history)
    # The model's optimizer is checkpointed (BackendFit adds it); the script wraps none.
    runner = ScriptBackendFit(info, reporter, model, train, validation,
                              list(arguments.get("callbacks") or []), [], {},
                              batch_size or None, options)
    runner.run()
    reporter.heartbeat()  # writes the phase's last timeline phases (its end)
    return runner
