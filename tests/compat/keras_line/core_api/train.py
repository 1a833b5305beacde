"""A script on Determined's Core API with its Keras callback (Determined 0.38's way): code
written for Determined, so it runs under Keras 2 as it did there."""

import numpy as np
import tensorflow as tf

import determined as det
from determined import keras as det_keras

info = det.get_cluster_info()
with det.core.init() as core_context:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    y = rng.normal(size=(64, 2)).astype("float32")
    model = tf.keras.Sequential([tf.keras.Input(shape=(4,)), tf.keras.layers.Dense(2)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss="mse")
    callback = det_keras.DeterminedCallback(
        core_context, checkpoint=info.latest_checkpoint if info else None,
        continue_id=info.trial.trial_id if info else 0, checkpoint_epochs=0)
    model.fit(x, y, batch_size=8, epochs=2, validation_data=(x, y), callbacks=[callback])
