"""`from keras.optimizers.legacy import SGD`: the standalone `keras` package, which was
Keras 2 where Determined ran (TensorFlow up to 2.15)."""

from iris_base import IrisBase
from keras.optimizers.legacy import SGD


class Trial(IrisBase):
    def make_optimizer(self, learning_rate, decay):
        return SGD(lr=learning_rate, momentum=0.9, decay=decay)
