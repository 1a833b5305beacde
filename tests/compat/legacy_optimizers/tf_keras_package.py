"""`import tf_keras as tfk`: Keras 2 by its own package name, through an alias."""

import tf_keras as tfk
from iris_base import IrisBase


class Trial(IrisBase):
    def make_optimizer(self, learning_rate, decay):
        return tfk.optimizers.Adam(learning_rate=learning_rate)
