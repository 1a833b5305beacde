"""The digits example, plus a callback that saves the final model's predictions, so a test
can compare them with those of the model loaded from the exported checkpoint."""

import os

import numpy as np
import tensorflow as tf
from model_def import DigitsTrial, load_data


class SavePredictions(tf.keras.callbacks.Callback):
    def on_train_end(self, logs=None):
        _, x_val, _, _ = load_data()
        np.save(os.environ["PREDICTIONS_FILE"], self.model.predict(x_val, verbose=0))


class PredictingTrial(DigitsTrial):
    def keras_callbacks(self):
        return [SavePredictions()]
