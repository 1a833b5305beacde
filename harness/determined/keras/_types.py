"""The type names Determined's Keras API annotated loaders with (`keras.InputData`,
`keras.ArrayLike`), for user code that still names them, and the classes of Determined's
runner and Native API, which refuse with one sentence when made."""

from __future__ import annotations

from typing import Any, Dict, List, Union

import numpy as np
import tensorflow as tf

from determined.keras._sequence import SequenceAdapter

# What a model takes as `x`: one array, one per input, or one per named input.
ArrayLike = Union[np.ndarray, List[np.ndarray], Dict[str, np.ndarray]]

# What build_training_data_loader / build_validation_data_loader may return.
InputData = Union[tf.keras.utils.Sequence, tf.data.Dataset, SequenceAdapter, tuple]


class TFKerasTrialController:
    """Determined's driver of a TFKerasTrial; localdet's runner drives trials itself."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from determined import errors

        raise errors.refuse("determined.keras.TFKerasTrialController", "localdet's runner "
                            "drives the trial; run it with `localdet run CONFIG MODEL_DIR`")


class TFKerasNativeContext:
    """Determined 0.17.0's context of the Native API (`det.experimental.create`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from determined import errors

        raise errors.refuse("determined.keras.TFKerasNativeContext", "Determined 0.17.0's "
                            "Native API is not served; write a TFKerasTrial or a script with "
                            "det.keras.init()")
