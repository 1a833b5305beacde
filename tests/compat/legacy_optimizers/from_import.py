"""`from tensorflow.keras.optimizers import legacy`, then `legacy.Adam(lr=..., decay=...)`."""

from tensorflow.keras.optimizers import legacy

from iris_base import IrisBase


class Trial(IrisBase):
    def make_optimizer(self, learning_rate, decay):
        return legacy.Adam(lr=learning_rate, decay=decay)
