"""A script on localdet's New Keras API (`det.keras.init()`, `context.fit`): written for
this TensorFlow, so it runs under Keras 3."""

import numpy as np
from tensorflow import keras

import determined as det

context = det.keras.init()
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 4)).astype("float32")
y = rng.normal(size=(64, 2)).astype("float32")
model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(2)])
model.compile(optimizer=context.wrap_optimizer(keras.optimizers.SGD(0.1)), loss="mse")
context.fit(model, x, y, batch_size=8, epochs=1, validation_data=(x, y))
