"""`tf.keras.optimizers.legacy.RMSprop(lr=..., decay=...)`, spelled out in full."""

import tensorflow as tf
from iris_base import IrisBase


class Trial(IrisBase):
    def make_optimizer(self, learning_rate, decay):
        return tf.keras.optimizers.legacy.RMSprop(lr=learning_rate, decay=decay)
