"""Which Keras line this process runs: the one `tf.keras` is."""

from __future__ import annotations

import tensorflow as tf


def keras_line() -> str:
    """"keras2" (tf-keras, or TensorFlow before 2.16) or "keras3"."""
    # TensorFlow before 2.16 has Keras 2 only, without a __version__ of its own.
    version = getattr(tf.keras, "__version__", None) or tf.__version__
    return "keras2" if version.startswith("2.") else "keras3"
