"""A TFKerasTrial whose model uses a layer from a package outside the folder
(`site/dense_heads`, on `PYTHONPATH`) written against Keras 2's internals. Nothing in this
file is Keras-2-only, yet the trial needs Keras 2: under Keras 3 it trains, then fails at
its first checkpoint."""

import numpy as np
import tensorflow as tf
from dense_heads import DenseHeads

from determined import keras


class HeadsTrial(keras.TFKerasTrial):
    def __init__(self, context):
        self.context = context

    def build_model(self):
        model = self.context.wrap_model(tf.keras.Sequential(
            [tf.keras.Input(shape=(4,)), DenseHeads(3), tf.keras.layers.Dense(2)]))
        model.compile(optimizer=self.context.wrap_optimizer(tf.keras.optimizers.SGD(0.1)),
                      loss="mse")
        return model

    def build_training_data_loader(self):
        rng = np.random.default_rng(0)
        return (rng.normal(size=(64, 4)).astype("float32"),
                rng.normal(size=(64, 2)).astype("float32"))

    def build_validation_data_loader(self):
        return self.build_training_data_loader()
