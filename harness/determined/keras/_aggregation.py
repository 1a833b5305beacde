"""`keras._check_if_aggregation_frequency_will_work`, the check Determined exported from
`determined.keras` (0.17 to 0.38) that a model can aggregate gradients over several batches
under Horovod. Determined warned only for subclassed models with their own `train_step` on
TensorFlow 2.2 and 2.3; on every TensorFlow localdet runs (2.4 and later) every model
passes, so the check accepts its arguments and returns None, as Determined's did there."""

from __future__ import annotations

from typing import Any, Optional


def _check_if_aggregation_frequency_will_work(model: Any, aggregation_frequency: Optional[int],
                                              use_horovod: bool = False) -> None:
    if aggregation_frequency is not None and not isinstance(aggregation_frequency, int):
        raise TypeError(f"aggregation_frequency is a {type(aggregation_frequency).__name__}: "
                        "give a whole number of batches")
