"""A trial under mixed precision (`mixed_float16`: its optimizer wrapped in a
LossScaleOptimizer, whose dynamic loss scale is state of its own) pauses and resumes bit for
bit like a straight run, in either Keras line (keras.io's mixed-precision examples under
TFKerasTrial failed to resume: the checkpoint held the wrapped optimizer's variables and the
resumed, unbuilt wrapper had none)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from test_exact_resume import BIT_FOR_BIT, DropoutTrial, op_determinism, run

pytestmark = pytest.mark.keras2  # and again under Keras 2 (tests/test_keras_2_line.py)

__all__ = ["op_determinism"]  # the fixture, used here too


class MixedPrecisionTrial(DropoutTrial):
    def build_model(self):
        tf.keras.mixed_precision.set_global_policy("mixed_float16")
        model = self.context.wrap_model(tf.keras.Sequential([
            tf.keras.Input(shape=(64,)), tf.keras.layers.Dense(32, activation="relu"),
            tf.keras.layers.Dropout(0.3),
            tf.keras.layers.Dense(10, activation="softmax", dtype="float32")]))
        model.compile(optimizer=self.context.wrap_optimizer(tf.keras.optimizers.Adam(0.01)),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        return model


@pytest.fixture
def mixed_precision():
    yield
    tf.keras.mixed_precision.set_global_policy("float32")  # other tests run in float32


def test_a_mixed_precision_trial_resumes_bit_for_bit(tmp_path, mixed_precision):
    _, straight, straight_metrics = run(MixedPrecisionTrial, tmp_path / "straight", target=30,
                                        **BIT_FOR_BIT)
    controller, paused, paused_metrics = run(MixedPrecisionTrial, tmp_path / "paused",
                                             target=30, pause_at=(7, 21), **BIT_FOR_BIT)
    assert "LossScaleOptimizer" in type(controller.model.optimizer).__name__
    for a, b in zip(straight, paused, strict=True):
        np.testing.assert_array_equal(a, b)
    assert paused_metrics == straight_metrics
