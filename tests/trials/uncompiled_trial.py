"""A trial whose build_model forgets to compile: localdet must say so in one sentence."""

import tensorflow as tf
from model_def import DigitsTrial


class UncompiledTrial(DigitsTrial):
    def build_model(self):
        return self.context.wrap_model(tf.keras.Sequential([
            tf.keras.Input(shape=(64,)), tf.keras.layers.Dense(10)]))
