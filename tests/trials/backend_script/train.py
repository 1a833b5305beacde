"""A New Keras API script for any Keras 3 backend (`import keras`, no TensorFlow): a small
classifier on generated data with a Dropout layer (a SeedGenerator) and Adam. At its end it
says whether TensorFlow was imported and the memory it held, for tests/test_backends.py."""

import os
import sys

import keras
import numpy as np

import determined as det
import determined.keras

context = det.keras.init()
hparams = context.training.hparams

data = np.random.default_rng(0)
x = data.normal(size=(256, 8)).astype("float32")
y = (x[:, 0] + x[:, 1] * x[:, 2] > 0).astype("int64")

model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dropout(hparams.get("dropout", 0.2)),
                          keras.layers.Dense(2, activation="softmax")])
optimizer = context.wrap_optimizer(keras.optimizers.Adam(hparams["learning_rate"]))
model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy",
              metrics=["accuracy"])
context.fit(model, x[:192], y[:192], batch_size=hparams.get("batch_size", 16),
            epochs=hparams.get("epochs", 2), validation_data=(x[192:], y[192:]))

import importlib.util  # noqa: E402
import resource  # noqa: E402

try:
    importable = importlib.util.find_spec("tensorflow") is not None
except ImportError:
    importable = False
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
print(f"backend {keras.backend.backend()}; tensorflow importable: {importable}; tensorflow "
      f"imported: {'tensorflow' in sys.modules}; peak RSS {rss} MiB; pid {os.getpid()}",
      flush=True)
