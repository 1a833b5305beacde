"""A stand-in for a third-party layer package written against Keras 2's internals, as
keras-multi-head's `MultiHead` is: its layer lists its weights through Keras 2's private
`_trainable_weights`, which Keras 3's layers do not have. It sits outside any model folder
and is found on `PYTHONPATH` (tests/test_keras_line.py)."""

from .layer import DenseHeads

__all__ = ["DenseHeads"]
