"""A Keras 2 trial in the shape of Determined's iris example, written for localdet.

It classifies scikit-learn's iris flowers with a one-hidden-layer network and uses what
Keras 2-era Determined trials typically used, so it checks that such folders run unchanged:

- the legacy `RMSprop` built with `lr=` and `decay=`, which only Keras 2 has (localdet
  therefore runs this trial under Keras 2 without being told);
- data loaders annotated with `keras.InputData`, the training data a `tf.keras.utils.Sequence`;
- a TensorBoard callback from `keras_callbacks()`.
"""

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_iris
from sklearn.model_selection import train_test_split
from tensorflow.keras.optimizers.legacy import RMSprop

from determined import keras

SPECIES = 3
SEED = 7


def iris_split():
    """Features as float32 and one-hot species, split 80/20 the same way every time."""
    features, species = load_iris(return_X_y=True)
    onehot = tf.keras.utils.to_categorical(species, num_classes=SPECIES)
    return train_test_split(features.astype("float32"), onehot, test_size=0.2,
                            random_state=SEED, stratify=species)


class FlowerBatches(tf.keras.utils.Sequence):
    """Fixed-size batches of (features, one-hot species), in a new order every pass.

    The order depends only on how many passes have ended, so a resumed trial sees the
    same batches an uninterrupted one would.
    """

    def __init__(self, features, targets, batch_size):
        super().__init__()
        self.features, self.targets = features, targets
        self.batch_size = batch_size
        self.passes = 0
        self.order = np.arange(len(features))
        self._reorder()

    def _reorder(self):
        self.order = np.random.default_rng([SEED, self.passes]).permutation(len(self.features))

    def __len__(self):
        return len(self.features) // self.batch_size

    def __getitem__(self, index):
        rows = self.order[index * self.batch_size:(index + 1) * self.batch_size]
        return self.features[rows], self.targets[rows]

    def on_epoch_end(self):
        self.passes += 1
        self._reorder()


class IrisTrial(keras.TFKerasTrial):
    def __init__(self, context: keras.TFKerasTrialContext) -> None:
        self.context = context
        self.x_train, self.x_val, self.y_train, self.y_val = iris_split()

    def build_model(self):
        hidden = self.context.get_hparam("layer1_dense_size")
        model = tf.keras.Sequential([
            tf.keras.layers.Input(shape=(4,)),
            tf.keras.layers.Dense(hidden, activation="relu"),
            tf.keras.layers.Dense(SPECIES, activation="softmax"),
        ])
        model = self.context.wrap_model(model)
        optimizer = self.context.wrap_optimizer(RMSprop(
            lr=self.context.get_hparam("learning_rate"),
            decay=self.context.get_hparam("learning_rate_decay"),
        ))
        model.compile(
            optimizer=optimizer,
            loss="categorical_crossentropy",
            metrics=[tf.keras.metrics.CategoricalAccuracy(name="categorical_accuracy")],
        )
        return model

    def keras_callbacks(self):
        return [keras.callbacks.TensorBoard()]

    def build_training_data_loader(self) -> keras.InputData:
        return FlowerBatches(self.x_train, self.y_train,
                             self.context.get_per_slot_batch_size())

    def build_validation_data_loader(self) -> keras.InputData:
        return self.x_val, self.y_val
