"""`from tensorflow.keras.optimizers import legacy`, then `legacy.Adam(lr=..., decay=...)`."""

from iris_base import IrisBase
from tensorflow.keras.optimizers import legacy


class Trial(IrisBase):
    def make_optimizer(self, learning_rate, decay):
        return legacy.Adam(lr=learning_rate, decay=decay)
