"""The digits example with an optional pause after every batch (hparam `batch_sleep`), so
that a test can act between two of its checkpoints."""

import time

import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from determined import keras


class Sleep(tf.keras.callbacks.Callback):
    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(self.seconds)


class SlowDigitsTrial(keras.TFKerasTrial):
    def __init__(self, context: keras.TFKerasTrialContext) -> None:
        self.context = context
        x, y = load_digits(return_X_y=True)
        self.x_train, self.x_val, self.y_train, self.y_val = train_test_split(
            (x / 16.0).astype("float32"), y.astype("int32"), test_size=0.2, random_state=0)

    def build_model(self):
        model = self.context.wrap_model(tf.keras.Sequential([
            tf.keras.Input(shape=(64,)),
            tf.keras.layers.Dense(self.context.get_hparam("hidden_units"), activation="relu"),
            tf.keras.layers.Dense(10, activation="softmax"),
        ]))
        optimizer = self.context.wrap_optimizer(
            tf.keras.optimizers.SGD(learning_rate=self.context.get_hparam("learning_rate")))
        model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"])
        return model

    def keras_callbacks(self):
        seconds = self.context.get_hparam("batch_sleep")
        return [Sleep(seconds)] if seconds else []

    def build_training_data_loader(self):
        return self.x_train, self.y_train

    def build_validation_data_loader(self):
        return self.x_val, self.y_val
