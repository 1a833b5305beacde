"""What the runners of an unchanged script's `model.fit` (`_unchanged_controller` on
TensorFlow, `_unchanged_backend` on JAX and PyTorch) share with `_unchanged_fit`, which
chooses between them: the fit call's data, read as `context.fit` reads it, and the metrics
that stand in for validation where a fit has no validation data. A module of its own so that
the runners need not import `_unchanged_fit`, which imports them.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from determined.core import TrialReporter


def report_stand_in(reporter: TrialReporter, batches_trained: int,
                    metrics: Dict[str, float]) -> None:
    """A phase runner's validation point without validation data: a phase's reporter
    (`_unchanged_fit.PhaseReporter`) records the training metrics as the searcher's `val_X`;
    another reporter records them as they are."""
    stand_in = getattr(reporter, "report_stand_in_metrics", None)
    if stand_in is not None:
        stand_in(batches_trained, metrics)
    else:
        reporter.report_validation_metrics(batches_trained, metrics)


def fit_data(arguments: Dict[str, Any], fit_args: Any) -> Tuple[Any, Any, Optional[int]]:
    """A fit call's training data (as a loader), validation data (a tuple `(x, y[, w])`, the
    script's own dataset, or None) and batch size, read as the backend's `context.fit` reads
    them (`fit_args`: the module of its `_validation_split` and `_as_loader`)."""
    x, y = arguments.get("x"), arguments.get("y")
    sample_weight = arguments.get("sample_weight")
    validation = arguments.get("validation_data")
    if validation is None and arguments.get("validation_split"):
        (x, y, sample_weight), (vx, vy, vw) = fit_args._validation_split(
            x, y, sample_weight, arguments["validation_split"])
        validation = (vx, vy) if vw is None else (vx, vy, vw)
    train = fit_args._as_loader(x, y, sample_weight, "model.fit()")
    if isinstance(validation, (tuple, list)):
        if not 2 <= len(validation) <= 3:
            raise ValueError("validation_data must be (x, y) or (x, y, sample_weight), a "
                             "dataset or a keras.utils.PyDataset")
        validation = tuple(validation)
    batch_size = arguments.get("batch_size")
    if isinstance(train, tuple) and batch_size is None:
        batch_size = 32  # Keras's default
    return train, validation, batch_size
