"""A TFKerasTrial written for Keras 3: its layer computes with `keras.ops`, which only Keras
3 has, so it runs under Keras 3 although it is a trial class."""

import keras
import numpy as np
import tensorflow as tf

from determined import keras as det_keras


class SoftSign(keras.layers.Layer):
    def call(self, inputs):
        return inputs / (1.0 + keras.ops.abs(inputs))


class Keras3Trial(det_keras.TFKerasTrial):
    def __init__(self, context):
        self.context = context

    def build_model(self):
        model = self.context.wrap_model(tf.keras.Sequential(
            [tf.keras.Input(shape=(4,)), tf.keras.layers.Dense(3), SoftSign(),
             tf.keras.layers.Dense(2)]))
        model.compile(optimizer=self.context.wrap_optimizer(tf.keras.optimizers.SGD(0.1)),
                      loss="mse")
        return model

    def build_training_data_loader(self):
        rng = np.random.default_rng(0)
        return (rng.normal(size=(64, 4)).astype("float32"),
                rng.normal(size=(64, 2)).astype("float32"))

    def build_validation_data_loader(self):
        return self.build_training_data_loader()
