"""The iris trial that every entry module here shares; it names no optimizer, so it says
nothing about the Keras line. Each entry module subclasses it with an optimizer spelled the
way some Determined user spelled it."""

import tensorflow as tf
from sklearn.datasets import load_iris
from sklearn.model_selection import train_test_split

from determined import keras


class IrisBase(keras.TFKerasTrial):
    def __init__(self, context: keras.TFKerasTrialContext) -> None:
        self.context = context
        x, y = load_iris(return_X_y=True)
        y = tf.keras.utils.to_categorical(y, 3)
        self.x_train, self.x_val, self.y_train, self.y_val = train_test_split(
            x.astype("float32"), y, test_size=0.2, random_state=0)

    def make_optimizer(self, learning_rate: float, decay: float):
        raise NotImplementedError

    def build_model(self):
        model = tf.keras.Sequential([
            tf.keras.layers.Dense(8, activation="relu", input_shape=(4,)),
            tf.keras.layers.Dense(3, activation="softmax"),
        ])
        model = self.context.wrap_model(model)
        optimizer = self.context.wrap_optimizer(self.make_optimizer(
            self.context.get_hparam("learning_rate"), self.context.get_hparam("decay")))
        model.compile(optimizer=optimizer, loss="categorical_crossentropy",
                      metrics=[tf.keras.metrics.CategoricalAccuracy(name="accuracy")])
        return model

    def build_training_data_loader(self) -> keras.InputData:
        return self.x_train, self.y_train

    def build_validation_data_loader(self) -> keras.InputData:
        return self.x_val, self.y_val
