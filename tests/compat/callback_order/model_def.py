"""A small digits TFKerasTrial whose only callback checks Determined's callback contract
(order_check.py). `batch_sleep` slows each batch so that a test can pause it."""

import time

import tensorflow as tf
from order_check import OrderCheck, Schedule
from sklearn.datasets import load_digits

from determined import keras


class Sleep(tf.keras.callbacks.Callback):
    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(self.seconds)


class CallbackOrderTrial(keras.TFKerasTrial):
    def __init__(self, context):
        self.context = context
        x, y = load_digits(return_X_y=True)
        self.x, self.y = (x / 16.0).astype("float32"), y.astype("int32")

    def build_model(self):
        model = self.context.wrap_model(tf.keras.Sequential([
            tf.keras.Input(shape=(64,)),
            tf.keras.layers.Dense(16, activation="relu"),
            tf.keras.layers.Dense(10, activation="softmax")]))
        model.compile(optimizer=self.context.wrap_optimizer(tf.keras.optimizers.SGD(0.05)),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        return model

    def keras_callbacks(self):
        config = self.context.get_experiment_config()
        batch = self.context.get_global_batch_size()
        schedule = Schedule(
            target=config["searcher"]["max_length"]["batches"],
            scheduling_unit=config["scheduling_unit"],
            validation_period=config["min_validation_period"]["batches"],
            checkpoint_period=config["min_checkpoint_period"]["batches"],
            batches_per_epoch=config["records_per_epoch"] // batch)
        seconds = self.context.get_hparam("batch_sleep")
        return [OrderCheck(schedule)] + ([Sleep(seconds)] if seconds else [])

    def build_training_data_loader(self):
        return self.x[:1200], self.y[:1200]

    def build_validation_data_loader(self):
        return self.x[1200:], self.y[1200:]
