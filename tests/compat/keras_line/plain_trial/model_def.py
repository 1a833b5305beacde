"""A plain TFKerasTrial: nothing in it is one Keras line's only. Determined ran it under
Keras 2, and so does localdet."""

import numpy as np
import tensorflow as tf

from determined import keras


class PlainTrial(keras.TFKerasTrial):
    def __init__(self, context):
        self.context = context

    def build_model(self):
        model = self.context.wrap_model(tf.keras.Sequential(
            [tf.keras.Input(shape=(4,)), tf.keras.layers.Dense(2)]))
        model.compile(optimizer=self.context.wrap_optimizer(tf.keras.optimizers.SGD(0.1)),
                      loss="mse")
        return model

    def build_training_data_loader(self):
        rng = np.random.default_rng(0)
        return (rng.normal(size=(64, 4)).astype("float32"),
                rng.normal(size=(64, 2)).astype("float32"))

    def build_validation_data_loader(self):
        return self.build_training_data_loader()
