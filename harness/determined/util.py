"""determined.util: the helpers of Determined's `det.util` that trial code used."""

from __future__ import annotations

import json
from typing import Any, Tuple, cast


def calculate_batch_sizes(hparams: dict, slots_per_trial: int,
                          trialname: str = "trial") -> Tuple[int, int]:
    """(per-slot batch size, global batch size) for the `global_batch_size` hyperparameter
    split over `slots_per_trial` slots."""
    if "global_batch_size" not in hparams:
        raise ValueError(f"{trialname} needs a 'global_batch_size' hyperparameter in the "
                         "experiment config")
    global_batch_size = int(hparams["global_batch_size"])
    if global_batch_size < slots_per_trial:
        raise ValueError(f"global_batch_size ({global_batch_size}) must be at least "
                         f"resources.slots_per_trial ({slots_per_trial})")
    per_slot = global_batch_size // slots_per_trial
    return per_slot, per_slot * slots_per_trial


def is_overridden(method: Any, base_class: type) -> bool:
    """Whether a bound method comes from a subclass rather than `base_class`."""
    name = getattr(method, "__name__", None)
    # A method has a name; anything else fails in getattr as before.
    return getattr(method, "__func__", method) is not getattr(base_class, cast(str, name), None)


def json_encode(obj: Any, indent: Any = None, sort_keys: bool = False) -> str:
    """JSON that also writes NumPy scalars and arrays."""
    def default(value: Any) -> Any:
        if hasattr(value, "tolist"):
            return value.tolist()
        raise TypeError(f"{type(value).__name__} is not JSON serialisable")

    return json.dumps(obj, indent=indent, sort_keys=sort_keys, default=default)
