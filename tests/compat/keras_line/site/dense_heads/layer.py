import tensorflow as tf
from tensorflow import keras


class DenseHeads(keras.layers.Layer):
    """`heads` Dense layers side by side on the same input, their outputs concatenated."""

    def __init__(self, units, heads=2, **kwargs):
        super().__init__(**kwargs)
        self.units, self.heads = units, heads
        self.dense = [keras.layers.Dense(units, name=f"head_{i}") for i in range(heads)]

    def call(self, inputs):
        return tf.concat([layer(inputs) for layer in self.dense], axis=-1)

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.units * self.heads)

    # As keras-multi-head does: its own weights, then its heads'.
    @property
    def trainable_weights(self):
        weights = self._trainable_weights[:]
        for layer in self.dense:
            weights += layer.trainable_weights
        return weights

    @property
    def non_trainable_weights(self):
        weights = self._non_trainable_weights[:]
        for layer in self.dense:
            weights += layer.non_trainable_weights
        return weights

    def get_config(self):
        return {**super().get_config(), "units": self.units, "heads": self.heads}
