"""One trial, every data form a Determined `TFKerasTrial` could return from its loaders,
picked by the `data_form` hyperparameter (a grid search runs them all):

- arrays: `(x, y)`;  weighted_arrays: `(x, y, sample_weights)`;  dict_inputs: `({name: x}, y)`
- sequence: a `tf.keras.utils.Sequence`;  sequence_adapter: `keras.SequenceAdapter` with
  worker threads;  tf_data: a `tf.data.Dataset` passed through `context.wrap_dataset`.
"""

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

from determined import keras


def load():
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32")
    return (x[:1400], y[:1400].astype("int32")), (x[1400:], y[1400:].astype("int32"))


class Batches(tf.keras.utils.Sequence):
    def __init__(self, x, y, batch_size):
        super().__init__()
        self.x, self.y, self.batch_size = x, y, batch_size

    def __len__(self):
        return int(np.ceil(len(self.x) / self.batch_size))

    def __getitem__(self, index):
        rows = slice(index * self.batch_size, (index + 1) * self.batch_size)
        return self.x[rows], self.y[rows]


class DataFormsTrial(keras.TFKerasTrial):
    def __init__(self, context: keras.TFKerasTrialContext) -> None:
        self.context = context
        self.form = context.get_hparam("data_form")
        self.train, self.validation = load()

    def build_model(self):
        inputs = tf.keras.Input(shape=(64,), name="pixels")
        hidden = tf.keras.layers.Dense(32, activation="relu")(inputs)
        outputs = tf.keras.layers.Dense(10, activation="softmax")(hidden)
        model = self.context.wrap_model(tf.keras.Model(inputs, outputs))
        model.compile(optimizer=self.context.wrap_optimizer(tf.keras.optimizers.Adam(0.01)),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        return model

    def _data(self, x, y) -> keras.InputData:
        batch = self.context.get_per_slot_batch_size()
        if self.form == "arrays":
            return x, y
        if self.form == "weighted_arrays":
            return x, y, np.where(y == 0, 2.0, 1.0).astype("float32")
        if self.form == "dict_inputs":
            return {"pixels": x}, y
        if self.form == "sequence":
            return Batches(x, y, batch)
        if self.form == "sequence_adapter":
            return keras.SequenceAdapter(Batches(x, y, batch), workers=2,
                                         use_multiprocessing=False)
        dataset = tf.data.Dataset.from_tensor_slices((x, y))
        return self.context.wrap_dataset(dataset).batch(batch)

    def build_training_data_loader(self) -> keras.InputData:
        return self._data(*self.train)

    def build_validation_data_loader(self) -> keras.InputData:
        return self._data(*self.validation)
