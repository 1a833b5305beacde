"""TFKerasTrial: the class users subclass; localdet builds and trains it."""

from __future__ import annotations

import abc
from typing import Any, List

from determined._trial import Trial
from determined.keras._context import TFKerasTrialContext
from determined.keras._types import InputData, TFKerasTrialController


class TFKerasTrial(Trial, abc.ABC):
    """A tf.keras trial: a model, its training and validation data, optional callbacks.

    Example:

        class DigitsTrial(TFKerasTrial):
            def __init__(self, context):
                self.context = context

            def build_model(self):
                model = self.context.wrap_model(tf.keras.Sequential([...]))
                optimizer = self.context.wrap_optimizer(tf.keras.optimizers.Adam(1e-3))
                model.compile(optimizer, "sparse_categorical_crossentropy", ["accuracy"])
                return model

            def build_training_data_loader(self):
                return x_train, y_train          # or a wrapped tf.data.Dataset

            def build_validation_data_loader(self):
                return x_val, y_val
    """

    trial_context_class = TFKerasTrialContext
    trial_controller_class = TFKerasTrialController

    def __init__(self, context: TFKerasTrialContext) -> None:
        self.context = context

    @abc.abstractmethod
    def build_model(self) -> Any:
        """Return a wrapped (`context.wrap_model`) and compiled `tf.keras.Model`."""

    @abc.abstractmethod
    def build_training_data_loader(self) -> InputData:
        """Return `(x, y)`, `(x, y, sample_weights)` or a wrapped `tf.data.Dataset`."""

    @abc.abstractmethod
    def build_validation_data_loader(self) -> InputData:
        """Return `(x, y)`, `(x, y, sample_weights)` or a wrapped `tf.data.Dataset`."""

    def session_config(self) -> Any:
        """The `tf.compat.v1.ConfigProto` for the session; TF 2 eager mode mostly ignores it."""
        import tensorflow as tf

        return tf.compat.v1.ConfigProto(allow_soft_placement=True)

    def keras_callbacks(self) -> List[Any]:
        """Callbacks (`determined.keras.callbacks.Callback`) to run during training."""
        return []
