"""A regression trial whose model needs its own code to be rebuilt: a custom layer, a custom
loss and a custom metric, next to built-in metrics named by string ("mse", "mae").

Written the way Determined users wrote TFKerasTrials: hyperparameters read through
`context.env.hparams`, loaders annotated `-> keras.InputData`. Runs under either Keras line.
"""

import numpy as np
import tensorflow as tf

from determined import keras


def make_data(seed: int, rows: int):
    """y = 3 * sum(x) - 1, plus a little noise: learnable in a few dozen batches."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 4)).astype("float32")
    y = (3.0 * x.sum(axis=1, keepdims=True) - 1.0
         + 0.05 * rng.normal(size=(rows, 1))).astype("float32")
    return x, y


class LearnedScale(tf.keras.layers.Layer):
    """Multiplies its input by one trainable scalar."""

    def __init__(self, initial: float = 1.0, **kwargs):
        super().__init__(**kwargs)
        self.initial = initial

    def build(self, input_shape):
        self.scale = self.add_weight(name="scale", shape=(),
                                     initializer=tf.keras.initializers.Constant(self.initial))

    def call(self, inputs):
        return inputs * self.scale

    def get_config(self):
        return {**super().get_config(), "initial": self.initial}


def soft_l1(y_true, y_pred):
    """A smooth absolute error: sqrt(1 + e^2) - 1."""
    error = y_true - y_pred
    return tf.reduce_mean(tf.sqrt(1.0 + tf.square(error)) - 1.0, axis=-1)


class WithinHalf(tf.keras.metrics.Metric):
    """The share of predictions within 0.5 of the target."""

    def __init__(self, name="within_half", **kwargs):
        super().__init__(name=name, **kwargs)
        self.hits = self.add_weight(name="hits", initializer="zeros")
        self.count = self.add_weight(name="count", initializer="zeros")

    def update_state(self, y_true, y_pred, sample_weight=None):
        close = tf.cast(tf.abs(y_true - y_pred) < 0.5, tf.float32)
        self.hits.assign_add(tf.reduce_sum(close))
        self.count.assign_add(tf.cast(tf.size(close), tf.float32))

    def result(self):
        return self.hits / tf.maximum(self.count, 1.0)

    def reset_state(self):
        self.hits.assign(0.0)
        self.count.assign(0.0)


class CustomObjectsTrial(keras.TFKerasTrial):
    def __init__(self, context: keras.TFKerasTrialContext) -> None:
        self.context = context
        self.hparams = context.env.hparams
        self.train = make_data(seed=0, rows=512)
        self.validation = make_data(seed=1, rows=128)

    def build_model(self) -> tf.keras.Model:
        inputs = tf.keras.Input(shape=(4,))
        hidden = tf.keras.layers.Dense(self.hparams["hidden"], activation="relu")(inputs)
        outputs = LearnedScale(initial=0.5)(tf.keras.layers.Dense(1)(hidden))
        model = self.context.wrap_model(tf.keras.Model(inputs, outputs))
        optimizer = self.context.wrap_optimizer(
            tf.keras.optimizers.Adam(learning_rate=self.hparams["learning_rate"]))
        model.compile(optimizer=optimizer, loss=soft_l1,
                      metrics=["mse", "mae", WithinHalf()])
        return model

    def build_training_data_loader(self) -> keras.InputData:
        return self.train

    def build_validation_data_loader(self) -> keras.InputData:
        return self.validation
