"""`EarlyStopping`: Keras's early stopping, decided after each validation, kept across pauses.

    from determined import keras

    class MyTrial(keras.TFKerasTrial):
        ...
        def keras_callbacks(self):
            return [keras.callbacks.EarlyStopping(monitor="val_loss", patience=3,
                                                  restore_best_weights=True)]
"""

from __future__ import annotations

from typing import Any, Dict, Optional, TypeAlias

import numpy as np
import tensorflow as tf

from determined.keras.callbacks._validation_driven import ValidationDriven
from determined.keras.callbacks.callback import Callback

_KerasEarlyStopping: TypeAlias = tf.keras.callbacks.EarlyStopping  # a base class


class EarlyStopping(ValidationDriven, _KerasEarlyStopping, Callback):
    """Stop training when a monitored validation metric has stopped improving.

    Behaves exactly like `tf.keras.callbacks.EarlyStopping` (of whichever Keras line
    `tf.keras` is: the decision is Keras's own code), except that it decides after every
    validation (`on_test_end`) instead of every `on_epoch_end`, and that its state (wait,
    best value, best weights, number of validations seen) is saved in checkpoints, so a
    paused and resumed trial stops exactly where an uninterrupted one would. Set
    `min_validation_period` in the experiment config to how often it should look (likely
    once per epoch). Where Keras says "epoch" below, read "validation": the validations of
    the whole trial are numbered 0, 1, 2, ...

    One difference from Keras 3, forced by pauses: with `restore_best_weights=True` the
    best weights are put back when this callback stops training (as Keras did up to 2.10),
    not in `on_train_end`, which also ends every pause. A trial that runs to its full
    length without being stopped keeps its last weights.

    Args:
        monitor: Quantity to be monitored, as the validation reports it. Defaults to
            `"val_loss"`.
        min_delta: Minimum change in the monitored quantity to qualify as an improvement.
            Defaults to `0`.
        patience: Number of validations with no improvement after which training is
            stopped. Defaults to `0`.
        verbose: `1` prints a line when it stops training and restores weights. Defaults
            to `0`.
        mode: `"min"`, `"max"` or `"auto"` (inferred from the name of `monitor`). Defaults
            to `"auto"`.
        baseline: Baseline value for the monitored quantity: training stops if the model
            does not improve on it within `patience` validations. Defaults to `None`.
        restore_best_weights: Whether to put back the weights of the best validation when
            stopping. Defaults to `False`.
        start_from_epoch: Number of validations to ignore before starting to monitor.
            Defaults to `0`.

    Example:

        def keras_callbacks(self):
            return [keras.callbacks.EarlyStopping(monitor="val_accuracy", mode="max",
                                                  patience=5, min_delta=0.001)]
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Keras only sets `best` (Keras 2) and `best_epoch` in on_train_begin; start from
        # the same fresh state here so a validation before training decides correctly.
        _KerasEarlyStopping.on_train_begin(self)
        self._start_counting()

    def on_test_end(self, logs: Optional[Dict] = None) -> None:
        validation = self.test_end_count
        _KerasEarlyStopping.on_epoch_end(self, validation, dict(logs or {}))
        self.test_end_count += 1
        if self.stopped_epoch == validation and validation > 0:
            self._stopped(validation)

    def on_train_end(self, logs: Optional[Dict] = None) -> None:
        """Does nothing: it also ends every pause (see the class docstring)."""

    def _stopped(self, validation: int) -> None:
        if self.verbose > 0:
            print(f"Validation {validation + 1}: early stopping", flush=True)
        if self.restore_best_weights and self.best_weights is not None:
            if self.verbose > 0:
                print("Restoring model weights from the end of the best validation: "
                      f"{self.best_epoch + 1}.", flush=True)
            self.model.set_weights(self.best_weights)

    def get_state(self) -> Dict[str, Any]:
        return {
            "test_end_count": self.test_end_count,
            "wait": int(self.wait),
            "stopped_epoch": int(self.stopped_epoch),
            "best": None if self.best is None else float(self.best),
            "best_epoch": int(self.best_epoch),
            "best_weights": (None if self.best_weights is None
                             else [np.array(w) for w in self.best_weights]),
        }

    def load_state(self, state: Dict[str, Any]) -> None:
        self.test_end_count = state["test_end_count"]
        self.wait = state["wait"]
        self.stopped_epoch = state["stopped_epoch"]
        if state["best"] is not None:  # None: nothing monitored yet; keep the fresh value
            self.best = state["best"]
        self.best_epoch = state["best_epoch"]
        self.best_weights = state["best_weights"]
        self._resumed = True
