"""Unseeded `tf.random.normal`, `uniform` and `truncated_normal` inside a `tf.function` (a
custom `train_step` drawing a GAN's noise, say) draw from TensorFlow's global
`tf.random.Generator`, whose state every checkpoint holds, so a resumed trial draws what it
would have drawn had it never stopped.

TensorFlow's own ops keep their position in the op's kernel, out of reach of any checkpoint:
a resumed process would start each op's sequence over and diverge from an uninterrupted run
at its first batch. The values still follow from the trial's seed, with the same
distributions. Eager calls (their seeds come from a generator the checkpoint holds already),
calls with a `seed`, and calls under a `tf.distribute` strategy are TensorFlow's own.

    install()  # once per training process, after the global generator is seeded
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import tensorflow as tf

_DRAWS = ("normal", "uniform", "truncated_normal")


def _from_generator(original: Callable[..., Any], draw: str) -> Callable[..., Any]:
    @functools.wraps(original)
    def random_op(shape: Any, *args: Any, **kwargs: Any) -> Any:
        # TensorFlow's functions take (shape, <two values>, dtype, seed, name); the
        # generator's methods the same less `seed`.
        seed = kwargs.get("seed", args[3] if len(args) > 3 else None)
        generator = _global_generator()
        if (seed is not None or generator is None or tf.executing_eagerly()
                or tf.distribute.has_strategy()):
            return original(shape, *args, **kwargs)
        kwargs.pop("seed", None)
        return getattr(generator, draw)(shape, *(args[:3] + args[4:]), **kwargs)

    random_op._localdet_original = original  # type: ignore[attr-defined]
    return random_op


def _global_generator() -> Any:
    from determined.keras._state import _tf_global_generator

    return _tf_global_generator()


def install() -> None:
    for draw in _DRAWS:
        current = getattr(tf.random, draw)
        if not hasattr(current, "_localdet_original"):
            setattr(tf.random, draw, _from_generator(current, draw))
