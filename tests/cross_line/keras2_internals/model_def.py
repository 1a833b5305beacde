"""Two trials whose code runs only under Keras 2, for tests/test_cross_line.py.

`HeadsTrial` uses a layer written against Keras 2's internals, as third-party packages of
Keras 2's time were (keras-multi-head's `MultiHead` keeps its sub-layers' weights in
`self._trainable_weights`, which Keras 3 layers do not have). `LegacyTrial` is a plain
model whose code names Keras 2's legacy optimizer (Keras 3 refuses it). Both compile with
a loss and metrics given as objects with arguments.
"""

import copy

import numpy as np
import tensorflow as tf

from determined import keras


def make_data(seed: int, rows: int):
    """Three classes, decided by the signs of two sums of the inputs."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 6)).astype("float32")
    y = ((x[:, :3].sum(axis=1) > 0).astype("int64") + (x[:, 3:].sum(axis=1) > 0.5))
    return x, y.astype("int64")


class Heads(tf.keras.layers.Wrapper):
    """The wrapped layer, several times side by side, outputs concatenated."""

    def __init__(self, layer, heads=2, **kwargs):
        super().__init__(layer, **kwargs)
        self.heads = heads
        self.copies = []

    def build(self, input_shape=None):
        self.copies = [copy.deepcopy(self.layer) for _ in range(self.heads)]
        for index, head in enumerate(self.copies):
            head._name = f"{self.name}_head_{index}"
            with tf.name_scope(head.name):
                head.build(input_shape)
        self.built = True

    @property
    def trainable_weights(self):
        # Keras 2's own list, then the copies' (Keras 3 layers have no _trainable_weights).
        return self._trainable_weights + [w for h in self.copies for w in h.trainable_weights]

    @property
    def non_trainable_weights(self):
        return self._non_trainable_weights + \
            [w for h in self.copies for w in h.non_trainable_weights]

    def call(self, inputs):
        return tf.concat([head(inputs) for head in self.copies], axis=-1)

    def compute_output_shape(self, input_shape):
        single = self.layer.compute_output_shape(input_shape)
        return single[:-1] + (single[-1] * self.heads,)

    def get_config(self):
        return {**super().get_config(), "heads": self.heads}


class _Trial(keras.TFKerasTrial):
    def __init__(self, context: keras.TFKerasTrialContext) -> None:
        self.context = context
        self.train = make_data(seed=0, rows=256)
        self.validation = make_data(seed=1, rows=64)

    def compile(self, model):
        model = self.context.wrap_model(model)
        optimizer = self.context.wrap_optimizer(
            self.optimizer(self.context.get_hparam("learning_rate")))
        model.compile(
            optimizer=optimizer,
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["acc", tf.keras.metrics.SparseTopKCategoricalAccuracy(k=2, name="top2"),
                     tf.keras.metrics.SparseCategoricalCrossentropy(from_logits=True,
                                                                    name="xent")])
        return model

    def build_training_data_loader(self) -> keras.InputData:
        return self.train

    def build_validation_data_loader(self) -> keras.InputData:
        return self.validation


class HeadsTrial(_Trial):
    def optimizer(self, learning_rate):
        return tf.keras.optimizers.Adam(learning_rate=learning_rate)

    def build_model(self):
        return self.compile(tf.keras.Sequential([
            tf.keras.Input(shape=(6,)), Heads(tf.keras.layers.Dense(4, activation="relu")),
            tf.keras.layers.Dense(3)]))


class LegacyTrial(_Trial):
    def optimizer(self, learning_rate):
        return tf.keras.optimizers.legacy.Adam(lr=learning_rate)

    def build_model(self):
        return self.compile(tf.keras.Sequential([
            tf.keras.Input(shape=(6,)), tf.keras.layers.Dense(8, activation="relu"),
            tf.keras.layers.Dense(3)]))
