"""A train step's variables made before it is traced (harness/determined/keras/_step_variables.py):
the step is traced once instead of twice, and trains exactly as it did; models whose step is
their own are left as they were. Under both Keras lines (keras2: tests/test_keras_2_line.py)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from determined.keras._line import keras_line
from determined.keras._step_variables import create_before_tracing

pytestmark = pytest.mark.keras2


def built(optimizer) -> bool:
    return bool(getattr(optimizer, "built", False) or getattr(optimizer, "_built", False))


def optimizer_variables(optimizer) -> list:
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


def data() -> tf.data.Dataset:
    rng = np.random.default_rng(0)
    x = rng.random((32, 6, 4), dtype=np.float32)
    y = rng.integers(0, 2, (32, 1)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(8).repeat()


def trained(prepared: bool, steps: int = 3) -> tuple[tf.keras.Model, list[np.ndarray]]:
    tf.keras.utils.set_random_seed(1)
    model = tf.keras.Sequential([tf.keras.Input((6, 4)), tf.keras.layers.LSTM(3),
                                 tf.keras.layers.Dense(1, activation="sigmoid")])
    model.compile(tf.keras.optimizers.Adam(0.01), "binary_crossentropy",
                  metrics=["accuracy"])
    dataset = data()
    if prepared:
        create_before_tracing(model, dataset.element_spec)
        assert built(model.optimizer)
    model.make_train_function()
    iterator = iter(dataset)
    for _ in range(steps):
        logs = model.train_function(iterator)
    state = [*model.get_weights(), *(np.asarray(v) for v in optimizer_variables(model.optimizer)),
             *(np.asarray(logs[k]) for k in sorted(logs))]
    return model, state


def test_made_first_the_step_trains_exactly_as_before():
    (_, before), (model, after) = trained(False), trained(True)
    assert len(before) == len(after)
    for a, b in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)
    if keras_line() == "keras2":  # tf_keras's step is a tf.function (Keras 3's calls one)
        assert model.train_function.experimental_get_tracing_count() == 1


def test_a_model_with_its_own_train_step_is_left_to_its_first_step():
    class OwnStep(tf.keras.Model):  # might apply the optimizer to some variables only
        def train_step(self, data):
            return super().train_step(data)

    inputs = tf.keras.Input((6, 4))
    model = OwnStep(inputs, tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(inputs)))
    model.compile(tf.keras.optimizers.Adam(0.01), "mse")
    create_before_tracing(model, data().element_spec)
    assert not built(model.optimizer)
