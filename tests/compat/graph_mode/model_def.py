"""A TensorFlow 1-style trial: eager execution off at import, a graph-mode (v1) Keras 2 model,
a legacy optimizer with state (momentum), NumPy loaders with sample weights."""

import numpy as np
import tensorflow as tf

from determined import keras

tf.compat.v1.disable_eager_execution()
tf.compat.v1.disable_v2_behavior()


def _data(rows: int, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 4)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], "float32") + 0.25).astype("float32")
    return x, y, np.linspace(0.5, 1.5, rows).astype("float32")


class GraphModeTrial(keras.TFKerasTrial):
    def __init__(self, context: keras.TFKerasTrialContext):
        self.context = context

    def build_model(self):
        model = self.context.wrap_model(tf.keras.Sequential([
            tf.keras.layers.Dense(8, activation="tanh", input_shape=(4,)),
            tf.keras.layers.Dense(1)]))
        optimizer = tf.keras.optimizers.legacy.SGD(learning_rate=0.02, momentum=0.9)
        model.compile(optimizer=self.context.wrap_optimizer(optimizer), loss="mse",
                      metrics=["mae"])
        return model

    def build_training_data_loader(self):
        return _data(40, 0)  # 5 batches of 8 a pass: batches shuffled anew every pass

    def build_validation_data_loader(self):
        return _data(20, 1)[:2]  # the last batch short
