"""The process's random generators as one picklable value: `keras.get_rng_state()` and
`keras.set_rng_state(state)`, as Determined exported them from `determined.keras` (0.31 to
0.38) and wrote them into its Keras checkpoints (`rng_state.pkl`).

The state is a dict with Determined's keys, so a state pickled by Determined loads here and
the other way round: `np_rng_state` (NumPy's global generator), `random_rng_state` (Python's
`random`), and TensorFlow's global generator as `tf2_rng_global_algorithm` and
`tf2_rng_global_state` (eager TensorFlow) or `tf_rng_global_seed` (graph mode)."""

from __future__ import annotations

import random
from typing import Any, Dict

import numpy as np
import tensorflow as tf


def get_rng_state() -> Dict[str, Any]:
    """The state of NumPy's, Python's and TensorFlow's global random generators."""
    state: Dict[str, Any] = {"np_rng_state": np.random.get_state(),
                             "random_rng_state": random.getstate()}
    if tf.executing_eagerly():
        generator = tf.random.get_global_generator()
        state["tf2_rng_global_algorithm"] = generator.algorithm
        state["tf2_rng_global_state"] = generator.state.numpy()
    else:
        state["tf_rng_global_seed"] = tf.compat.v1.random.get_seed(0)[0]
    return state


def set_rng_state(rng_state: Dict[str, Any]) -> None:
    """Put back what `get_rng_state()` returned: the generators then draw what they drew
    after it was taken."""
    np.random.set_state(rng_state["np_rng_state"])
    random.setstate(rng_state["random_rng_state"])
    if rng_state.get("tf_rng_global_seed") is not None:
        tf.compat.v1.random.set_random_seed(rng_state["tf_rng_global_seed"])
    if "tf2_rng_global_algorithm" in rng_state and "tf2_rng_global_state" in rng_state:
        generator = tf.random.Generator.from_state(
            np.asarray(rng_state["tf2_rng_global_state"]),
            rng_state["tf2_rng_global_algorithm"])
        tf.random.set_global_generator(generator)
