"""`tf.keras.optimizers.Adam(learning_rate=...)`: runs under either line, so a trial
class's rule decides: Keras 2, as under Determined."""

import tensorflow as tf
from iris_base import IrisBase


class Trial(IrisBase):
    def make_optimizer(self, learning_rate, decay):
        return tf.keras.optimizers.Adam(learning_rate=learning_rate)
