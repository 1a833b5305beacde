"""What a checkpoint must carry beyond the model's weights for a resumed trial to continue
exactly: every optimizer's state (with the variables it was built on), learning rates,
model variables that are not weights (Keras 3 dropout seed states), and the random-number
generators' states."""

from __future__ import annotations

import contextlib
import random
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

import h5py
import numpy as np
import tensorflow as tf

from determined.keras._graph_mode import read_values, write_values
from determined.keras._weights_file import ordered_weights

H5Source = Union[Path, h5py.File, None]  # a checkpoint's `.h5`: its path, or open


def _keras2_loss_scaled(optimizer: Any) -> Any:
    """The optimizer Keras 2's mixed precision wraps (its LossScaleOptimizer, whose own
    state is the dynamic loss scale), or None."""
    scale = getattr(optimizer, "_loss_scale", None)
    return optimizer.inner_optimizer if hasattr(scale, "_current_loss_scale") else None


def _variables(optimizer: Any) -> List[Any]:
    variables = optimizer.variables
    found = list(variables() if callable(variables) else variables)
    if _keras2_loss_scaled(optimizer) is not None:  # the scale and its count of good steps
        found += [optimizer._loss_scale._current_loss_scale, optimizer._loss_scale._counter]
    return found


def build_optimizer(optimizer: Any, model: Any, var_list: Optional[List[Any]] = None) -> None:
    """Create the optimizer's slot variables now, as its first step would: for `var_list`,
    or all the model's trainable variables."""
    if var_list is None:
        var_list = model.trainable_variables
    inner = _keras2_loss_scaled(optimizer)
    if inner is not None:
        optimizer = inner
    if hasattr(optimizer, "_create_all_weights"):  # Keras 2 legacy optimizers
        optimizer._create_all_weights(var_list)
    elif not (getattr(optimizer, "built", False) or getattr(optimizer, "_built", False)):
        optimizer.build(var_list)


class OptimizerStateError(RuntimeError):
    """An optimizer's saved state does not fit the optimizer that is to resume from it."""


def _legacy_var_key(optimizer: Any) -> Callable[[Any], Any]:
    """The function a Keras 2 legacy optimizer keys its slots by (its module's)."""
    owner = next(c for c in type(optimizer).__mro__ if "_create_all_weights" in vars(c))
    return sys.modules[owner.__module__]._var_key


def _built_on(optimizer: Any) -> Optional[Tuple[Callable[[Any], Any], List[Any]]]:
    """(how to key a variable, the variables the optimizer keeps state for in the order it
    was built on them), or None while it is unbuilt (no per-variable state yet)."""
    inner = _keras2_loss_scaled(optimizer)
    if inner is not None:
        return _built_on(inner)
    if hasattr(optimizer, "_create_all_weights"):  # Keras 2 legacy: slots made per variable
        if not _variables(optimizer):
            return None
        return _legacy_var_key(optimizer), list(optimizer._slots)
    if hasattr(optimizer, "_index_dict"):  # Keras 2's optimizers (2.11 on)
        if not getattr(optimizer, "_built", False):
            return None
        index = optimizer._index_dict
        return optimizer._var_key, sorted(index, key=index.get)
    if getattr(optimizer, "built", False):  # Keras 3
        return id, [id(v) for v in optimizer._trainable_variables]
    return None


def _model_weights(model: Any) -> List[Any]:
    """The model's weights in an order that does not change when layers are frozen or
    unfrozen (a callback fine-tuning a base model): the weights file's."""
    walked, rest = ordered_weights(model)
    return walked + rest


def _optimizer_state(number: int, optimizer: Any, model: Any,
                     in_h5: bool = False) -> Dict[str, Any]:
    """The optimizer's variables, and which of the model's weights (by position) it was
    built on, so a resumed process builds it on the same ones: a GAN's two optimizers each
    train one sub-model, not the whole model. `in_h5`: the checkpoint's `.h5` holds the
    variables already (the compiled optimizer of a model saved whole); only where is kept."""
    built = _built_on(optimizer)
    targets = None
    if built is not None:
        key, keys = built
        position = {key(v): i for i, v in enumerate(_model_weights(model))}
        missing = [k for k in keys if k not in position]
        if missing:
            raise OptimizerStateError(
                f"optimizer {number} ({type(optimizer).__name__}) trains {len(missing)} "
                "variables that are not the model's weights; only variables of the model "
                "given to wrap_model can be checkpointed")
        targets = [position[k] for k in keys]
    if in_h5:
        return {"targets": targets, "in_h5": True}
    return {"targets": targets, "values": read_values(_variables(optimizer))}


def _restore_optimizer(number: int, optimizer: Any, model: Any, saved: Dict[str, Any],
                       h5: H5Source) -> None:
    if saved["targets"] is not None:
        variables = _model_weights(model)
        build_optimizer(optimizer, model, [variables[i] for i in saved["targets"]])
    if saved.get("in_h5"):
        values = _h5_optimizer_values(h5)
        if values is None:
            raise OptimizerStateError(
                f"the state of optimizer {number} ({type(optimizer).__name__}) was saved in "
                "the checkpoint's .h5, which holds none; the checkpoint is damaged")
        saved = {**saved, "values": values}
    current = _variables(optimizer)
    if len(current) != len(saved["values"]):
        raise OptimizerStateError(
            f"the checkpoint holds {len(saved['values'])} variables of optimizer {number} "
            f"({type(optimizer).__name__}) but it has {len(current)}; the trial must build "
            "the same optimizers, in the same order, as the run that saved it")
    write_values(current, saved["values"])  # counts checked


@contextlib.contextmanager
def _opened(h5: H5Source) -> Iterator[Optional[h5py.File]]:
    """The `.h5` open for reading (None where there is no such file)."""
    if h5 is None or isinstance(h5, h5py.File):
        yield h5
    elif not Path(h5).is_file():
        yield None
    else:
        with h5py.File(h5, "r") as opened:
            yield opened


def _h5_optimizer_values(source: H5Source) -> Optional[List[np.ndarray]]:
    """The optimizer variables Keras wrote into an `.h5` (`optimizer_weights`), in order;
    None where it wrote none."""
    with _opened(source) as h5:
        if h5 is None or "optimizer_weights" not in h5:
            return None
        group = h5["optimizer_weights"]
        names = [n.decode() if isinstance(n, bytes) else n for n in group.attrs["weight_names"]]
        return [np.asarray(group[name]) for name in names]


def h5_holds_optimizer(h5_path: Path, optimizer: Any) -> bool:
    """Whether the `.h5` holds as many optimizer variables as `optimizer` has (read from its
    index, not its values): then a checkpoint need not keep them a second time."""
    with h5py.File(h5_path, "r") as h5:
        group = h5.get("optimizer_weights")
        return group is not None and \
            len(group.attrs.get("weight_names", ())) == len(_variables(optimizer)) > 0


def restore_optimizer_from_h5(optimizer: Any, model: Any, h5: H5Source) -> None:
    """Assign the optimizer state Keras wrote into the `.h5` (`optimizer_weights`)."""
    values = _h5_optimizer_values(h5)
    if values is None:
        return
    build_optimizer(optimizer, model)
    variables = _variables(optimizer)
    if len(variables) != len(values):
        raise RuntimeError(f"the checkpoint holds {len(values)} optimizer variables but the "
                           f"optimizer has {len(variables)}; was the optimizer changed?")
    write_values(variables, values)  # counts checked above


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
        # keras.src: checked against keras 3.15 (pyproject's bound <3.16)
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
    # tensorflow.python: checked against tensorflow 2.21 (pyproject's bound <2.22)
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
    # tensorflow.python: checked against tensorflow 2.21 (pyproject's bound <2.22)
    from tensorflow.python.ops import stateful_random_ops

    return getattr(stateful_random_ops, "global_generator", None)


def capture(model: Any, optimizers: List[Any], in_h5: Any = None) -> Dict[str, Any]:
    """Everything beyond the model's weights, as plain picklable values. `in_h5`: the
    optimizer whose variables the checkpoint's `.h5` holds (not kept twice)."""
    generator = _tf_global_generator()
    keras_seed = _keras3_global_seed_generator()
    return {
        "python_random": random.getstate(),
        "tf_op_seeds": None if _eager_op_seeds() is None else _eager_op_seeds().getstate(),
        "numpy_random": np.random.get_state(),
        "tf_global_generator": None if generator is None else generator.state.numpy(),
        "keras_global_seed": None if keras_seed is None else keras_seed.state.numpy(),
        "model_variables": read_values(_non_weight_variables(model)),
        "layer_generators": [g.state.numpy() for g in _layer_generators(model)],
        "learning_rates": [None if _learning_rate(o) is None
                           else read_values([_learning_rate(o)])[0] for o in optimizers],
        # Every optimizer, the compiled one too: a model saved as weights alone has no
        # optimizer in its file. (Checkpoints before this held "other_optimizers" only.)
        "optimizers": [_optimizer_state(n, o, model, in_h5=o is in_h5)
                       for n, o in enumerate(optimizers)],
    }


def restore(state: Dict[str, Any], model: Any, optimizers: List[Any],
            h5: H5Source = None) -> None:
    """`h5`: the checkpoint's `.h5` (a path, or open), for an optimizer whose variables are
    in it."""
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
    write_values(_non_weight_variables(model), state["model_variables"])
    for generator, value in zip(_layer_generators(model), state["layer_generators"],
                                strict=True):
        generator.reset(value)
    for optimizer, rate in zip(optimizers, state["learning_rates"], strict=True):
        if rate is not None and _learning_rate(optimizer) is not None:
            write_values([_learning_rate(optimizer)], [rate])
    if "optimizers" in state:
        if len(optimizers) != len(state["optimizers"]):
            raise OptimizerStateError(
                f"the checkpoint holds {len(state['optimizers'])} optimizers but the trial "
                f"has {len(optimizers)}; it must wrap the same optimizers as the run that "
                "saved it")
        for number, (optimizer, saved) in enumerate(zip(optimizers, state["optimizers"],
                                                         strict=True)):
            _restore_optimizer(number, optimizer, model, saved, h5)
        return
    # An older checkpoint: the compiled optimizer came from the .h5 (the caller read it).
    others = [o for o in optimizers if o is not model.optimizer]
    for optimizer, values in zip(others, state["other_optimizers"], strict=True):
        build_optimizer(optimizer, model)
        write_values(_variables(optimizer), values)


def holds_every_optimizer(state: Dict[str, Any]) -> bool:
    """Whether `capture` saved every optimizer (else the compiled one is in the `.h5`)."""
    return "optimizers" in state
