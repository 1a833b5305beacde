"""`tf.keras.optimizers.Adam(learning_rate=...)`: runs under either line, so Keras 3."""

import tensorflow as tf
from iris_base import IrisBase


class Trial(IrisBase):
    def make_optimizer(self, learning_rate, decay):
        return tf.keras.optimizers.Adam(learning_rate=learning_rate)
