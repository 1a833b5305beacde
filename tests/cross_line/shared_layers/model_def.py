"""A TFKerasTrial of one group of tests/cross_line/shared_layers/layer_models.py's models,
written for Keras 2: it names a layer only Keras 2 has, so under Keras 3 this module does not
import and a downstream load must read the model from the checkpoint's `.h5`."""

import layer_models
import tensorflow as tf

from determined import keras

# Keras 2 only (Keras 3 dropped feature columns): this module imports under Keras 2 alone.
FEATURE_LAYER = tf.keras.layers.DenseFeatures


class SharedLayersTrial(keras.TFKerasTrial):
    def __init__(self, context: keras.TFKerasTrialContext) -> None:
        self.context = context
        self.group = context.get_hparam("group")

    def build_model(self):
        model = self.context.wrap_model(layer_models.build(self.group))
        model.compile(optimizer=self.context.wrap_optimizer(tf.keras.optimizers.Adam(0.01)),
                      loss="mse", metrics=["mae"])
        return model

    def _dataset(self, seed: int):
        x, y = layer_models.data(self.group, 32, seed)
        dataset = tf.data.Dataset.from_tensor_slices((x, y))
        return dataset.batch(self.context.get_per_slot_batch_size())

    def build_training_data_loader(self) -> keras.InputData:
        return self._dataset(seed=0)

    def build_validation_data_loader(self) -> keras.InputData:
        return self._dataset(seed=1)
