"""A small digits trial that can be held mid-training: while the file named by $FUZZ_HOLD
exists, it waits after its fifth batch (having written `$FUZZ_HOLD.held`), so that a test can
act while it is surely training. Waiting changes nothing it computes."""

import os
import time

import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from determined import keras


class Hold(tf.keras.callbacks.Callback):
    def __init__(self, path: str):
        super().__init__()
        self.path, self.batches = path, 0

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1
        if self.batches == 5 and os.path.exists(self.path):
            with open(f"{self.path}.held", "w"):
                pass
            while os.path.exists(self.path):
                time.sleep(0.05)


class HeldTrial(keras.TFKerasTrial):
    def __init__(self, context: keras.TFKerasTrialContext) -> None:
        self.context = context
        x, y = load_digits(return_X_y=True)
        self.x_train, self.x_val, self.y_train, self.y_val = train_test_split(
            (x / 16.0).astype("float32"), y.astype("int32"), test_size=0.2, random_state=0)

    def build_model(self):
        model = self.context.wrap_model(tf.keras.Sequential([
            tf.keras.Input(shape=(64,)),
            tf.keras.layers.Dense(16, activation="relu"),
            tf.keras.layers.Dense(10, activation="softmax"),
        ]))
        optimizer = self.context.wrap_optimizer(tf.keras.optimizers.Adam(learning_rate=0.01))
        model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"])
        return model

    def keras_callbacks(self):
        return [Hold(os.environ["FUZZ_HOLD"])]

    def build_training_data_loader(self):
        return self.x_train, self.y_train

    def build_validation_data_loader(self):
        return self.x_val, self.y_val
