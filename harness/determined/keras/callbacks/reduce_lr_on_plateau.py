"""`ReduceLROnPlateau`: Keras's learning-rate reduction, decided after each validation, kept
across pauses.

    from determined import keras

    class MyTrial(keras.TFKerasTrial):
        ...
        def keras_callbacks(self):
            return [keras.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.5,
                                                      patience=2)]
"""

from __future__ import annotations

from typing import Any, Dict, Optional, TypeAlias

import tensorflow as tf

from determined.keras.callbacks._validation_driven import ValidationDriven
from determined.keras.callbacks.callback import Callback

_KerasReduceLROnPlateau: TypeAlias = tf.keras.callbacks.ReduceLROnPlateau  # a base class


class ReduceLROnPlateau(ValidationDriven, _KerasReduceLROnPlateau, Callback):
    """Reduce the learning rate when a monitored validation metric has stopped improving.

    Behaves exactly like `tf.keras.callbacks.ReduceLROnPlateau` (of whichever Keras line
    `tf.keras` is: the decision is Keras's own code), except that it decides after every
    validation (`on_test_end`) instead of every `on_epoch_end`, and that its state (wait,
    best value, cooldown, number of validations seen) is saved in checkpoints, so a paused
    and resumed trial reduces the rate exactly where an uninterrupted one would. The rate
    itself lives in the optimizer, which the checkpoint holds. Set `min_validation_period`
    in the experiment config to how often it should look (likely once per epoch). Where
    Keras says "epoch" below, read "validation".

    Also available as `ReduceLRScheduler`, the name Determined's documentation uses.

    Args:
        monitor: Quantity to be monitored, as the validation reports it. Defaults to
            `"val_loss"`.
        factor: Factor by which the learning rate is reduced: `new_lr = lr * factor`.
            Defaults to `0.1`.
        patience: Number of validations with no improvement after which the learning rate
            is reduced. Defaults to `10`.
        verbose: `1` prints a line at each reduction. Defaults to `0`.
        mode: `"min"`, `"max"` or `"auto"` (inferred from the name of `monitor`). Defaults
            to `"auto"`.
        min_delta: Threshold for measuring the new optimum. Defaults to `1e-4`.
        cooldown: Number of validations to wait after a reduction before resuming normal
            operation. Defaults to `0`.
        min_lr: Lower bound on the learning rate. Defaults to `0`.

    Example:

        def keras_callbacks(self):
            return [keras.callbacks.ReduceLROnPlateau(factor=0.2, patience=3, min_lr=1e-5)]
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._start_counting()

    def on_test_end(self, logs: Optional[Dict] = None) -> None:
        # A copy: Keras adds the learning rate to the logs it is given.
        _KerasReduceLROnPlateau.on_epoch_end(self, self.test_end_count, dict(logs or {}))
        self.test_end_count += 1

    def get_state(self) -> Dict[str, Any]:
        return {
            "test_end_count": self.test_end_count,
            "wait": int(self.wait),
            "cooldown_counter": int(self.cooldown_counter),
            "best": None if self.best is None else float(self.best),
        }

    def load_state(self, state: Dict[str, Any]) -> None:
        self.test_end_count = state["test_end_count"]
        self.wait = state["wait"]
        self.cooldown_counter = state["cooldown_counter"]
        if state["best"] is not None:  # None: nothing monitored yet; keep the fresh value
            self.best = state["best"]
        self._resumed = True


#: The name Determined's documentation gives `ReduceLROnPlateau`.
ReduceLRScheduler = ReduceLROnPlateau
