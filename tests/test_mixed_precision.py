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


@pytest.mark.slow
def test_under_keras_2(tmp_path):
    import os
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
         "not under_keras_2", "--basetemp", str(tmp_path / "keras2")],
        env={**os.environ, "TF_USE_LEGACY_KERAS": "1"}, capture_output=True, text=True,
        timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
