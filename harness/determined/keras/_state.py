"""What a checkpoint must carry beyond the `.h5` for a resumed trial to continue exactly:
optimizer slots read back from the `.h5`, learning rates, model variables that are not
weights (Keras 3 dropout seed states), and the random-number generators' states."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Dict, List

import h5py
import numpy as np
import tensorflow as tf


def _variables(optimizer: Any) -> List[Any]:
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


def build_optimizer(optimizer: Any, model: Any) -> None:
    """Create the optimizer's slot variables now, as its first step would."""
    if hasattr(optimizer, "_create_all_weights"):  # Keras 2 legacy optimizers
        optimizer._create_all_weights(model.trainable_variables)
    elif not (getattr(optimizer, "built", False) or getattr(optimizer, "_built", False)):
        optimizer.build(model.trainable_variables)


def restore_optimizer_from_h5(optimizer: Any, model: Any, h5_path: Path) -> None:
    """Assign the optimizer state Keras wrote into the `.h5` (`optimizer_weights`)."""
    with h5py.File(h5_path, "r") as h5:
        if "optimizer_weights" not in h5:
            return
        group = h5["optimizer_weights"]
        names = [n.decode() if isinstance(n, bytes) else n for n in group.attrs["weight_names"]]
        values = [np.asarray(group[name]) for name in names]
    build_optimizer(optimizer, model)
    variables = _variables(optimizer)
    if len(variables) != len(values):
        raise RuntimeError(f"the checkpoint holds {len(values)} optimizer variables but the "
                           f"optimizer has {len(variables)}; was the optimizer changed?")
    for variable, value in zip(variables, values, strict=True):  # counts checked above
        variable.assign(value)


def _learning_rate(optimizer: Any) -> Any:
    rate = getattr(optimizer, "learning_rate", None)
    return rate if isinstance(rate, tf.Variable) else None


def _non_weight_variables(model: Any) -> List[Any]:
    weights = {id(w) for w in model.weights}
    return [v for v in model.variables if id(v) not in weights]


def _layer_generators(model: Any) -> List[Any]:
    """Keras 2 layers' own `tf.random.Generator`s (dropout and the like): their states are
    not model variables, so a checkpoint must carry them separately."""
    if not hasattr(model, "_flatten_layers"):
        return []
    generators = []
    for layer in model._flatten_layers(include_self=False, recursive=True):
        rng = getattr(layer, "_random_generator", None)
        if rng is None or not hasattr(rng, "_maybe_init"):
            continue
        rng._maybe_init()  # created lazily on first use; a resumed model has not used it yet
        if getattr(rng, "_generator", None) is not None:
            generators.append(rng._generator)
    return generators


def _keras3_global_seed_generator(create: bool = False) -> Any:
    """Keras 3's generator behind `keras.random` calls without a seed, or None. It is made
    on first use and draws its seed from Python's `random` then."""
    try:
        from keras.src.backend.common import global_state
        from keras.src.random import seed_generator
    except ImportError:
        return None
    if create:
        return seed_generator.global_seed_generator()
    return global_state.get_global_attribute("global_seed_generator")


def _eager_op_seeds() -> Any:
    """The `random.Random` TensorFlow draws an op seed from for every eager random op
    given no seed of its own (`tf.random.uniform(shape)` after `tf.random.set_seed`)."""
    from tensorflow.python.eager import context

    return getattr(context.context(), "_rng", None)


def seed_tf_global_generator(seed: int) -> None:
    """Make TensorFlow's global `tf.random.Generator` from the trial's seed. Made on first
    use, it would start from a non-deterministic state that no rerun could repeat."""
    tf.random.set_global_generator(tf.random.Generator.from_seed(seed))


def _tf_global_generator() -> Any:
    """TensorFlow's global `tf.random.Generator` if one was made, else None: asking
    TensorFlow for it would make one from a non-deterministic state (and raises under op
    determinism)."""
    from tensorflow.python.ops import stateful_random_ops

    return getattr(stateful_random_ops, "global_generator", None)


def capture(model: Any, optimizers: List[Any]) -> Dict[str, Any]:
    """Everything beyond the `.h5`, as plain picklable values."""
    generator = _tf_global_generator()
    keras_seed = _keras3_global_seed_generator()
    return {
        "python_random": random.getstate(),
        "tf_op_seeds": None if _eager_op_seeds() is None else _eager_op_seeds().getstate(),
        "numpy_random": np.random.get_state(),
        "tf_global_generator": None if generator is None else generator.state.numpy(),
        "keras_global_seed": None if keras_seed is None else keras_seed.state.numpy(),
        "model_variables": [v.numpy() for v in _non_weight_variables(model)],
        "layer_generators": [g.state.numpy() for g in _layer_generators(model)],
        "learning_rates": [None if _learning_rate(o) is None else _learning_rate(o).numpy()
                           for o in optimizers],
        # Optimizers other than the compiled one are not in the .h5.
        "other_optimizers": [[v.numpy() for v in _variables(o)]
                             for o in optimizers if o is not model.optimizer],
    }


def restore(state: Dict[str, Any], model: Any, optimizers: List[Any]) -> None:
    # A generator the checkpointed process had already made must exist here too, or it
    # would be made on first use after the resume and draw from `random` then (Keras 3's
    # global seed generator): made first, before `random` gets its state back.
    if state["keras_global_seed"] is not None:
        _keras3_global_seed_generator(create=True).state.assign(state["keras_global_seed"])
    if state["tf_global_generator"] is not None:
        if _tf_global_generator() is None:
            seed_tf_global_generator(0)
        tf.random.get_global_generator().reset(state["tf_global_generator"])
    random.setstate(state["python_random"])
    np.random.set_state(state["numpy_random"])
    op_seeds = _eager_op_seeds()
    if state.get("tf_op_seeds") is not None and op_seeds is not None:
        op_seeds.setstate(state["tf_op_seeds"])
    # Each list was captured by position from the same model and optimizers (capture()):
    # a length that differs is a different model, not a state to restore in part.
    for variable, value in zip(_non_weight_variables(model), state["model_variables"],
                               strict=True):
        variable.assign(value)
    for generator, value in zip(_layer_generators(model), state["layer_generators"],
                                strict=True):
        generator.reset(value)
    for optimizer, rate in zip(optimizers, state["learning_rates"], strict=True):
        if rate is not None and _learning_rate(optimizer) is not None:
            _learning_rate(optimizer).assign(rate)
    others = [o for o in optimizers if o is not model.optimizer]
    for optimizer, values in zip(others, state["other_optimizers"], strict=True):
        build_optimizer(optimizer, model)
        for variable, value in zip(_variables(optimizer), values, strict=True):
            variable.assign(value)
