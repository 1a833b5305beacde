"""Keras 3 weight files for DeterminedCallback's models that are not built, which Keras 3
refuses to save or load (Keras 2's TensorFlow format saves what exists and restores into
variables made later): a subclassed model whose layers make their weights on its first call,
built here from the first batch's spec before its weights are loaded; and a model never
called itself (a GAN whose `train_step` calls its sub-models), whose weights all exist.
Optimizers a model holds beside its compiled one (a GAN's) are found here too: a checkpoint
keeps which weights each was built on, so that a resumed one is built on the same."""

from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, List, Optional

from determined.keras import _state


class UnbuiltModelError(ValueError):
    """A checkpoint's weights cannot be loaded into a model that cannot be built."""


def sub_layers_built(model: Any) -> bool:
    """Whether every layer inside the model is built (whatever the model itself is)."""
    flatten = getattr(model, "_flatten_layers", None)
    return flatten is None or all(getattr(layer, "built", True)
                                  for layer in flatten(include_self=False))


def loadable(model: Any) -> bool:
    """Whether Keras 3 can load the model's weights now, counted as built where need be."""
    return bool(getattr(model, "built", True)) or sub_layers_built(model)


@contextlib.contextmanager
def counted_as_built(model: Any) -> Iterator[None]:
    """The model counted as built for Keras's weight files, and as it was after: a model
    whose `call` never ran still builds itself on its first call, as it would have."""
    if getattr(model, "built", True):
        yield
        return
    model.built = True
    try:
        yield
    finally:
        model.built = False


def build_from(model: Any, iterator: Any) -> None:
    """Build the model and its compiled loss, metrics and optimizer as `fit` would on its
    first batch, symbolically from the batch's spec (nothing is trained)."""
    spec = getattr(iterator, "element_spec", None)
    build = getattr(model, "_symbolic_build", None)
    if spec is None or build is None:
        raise UnbuiltModelError(
            "DeterminedCallback cannot load the checkpoint into a model that is not built: "
            "build the model before fit (call it on a batch or call model.build)")
    try:
        build(data_batch=spec)
    except Exception as error:
        raise UnbuiltModelError(
            f"DeterminedCallback cannot load the checkpoint into a model that is not built, "
            f"and building it from the first batch failed ({error}): build the model "
            f"before fit (call it on a batch or call model.build)") from error


def other_optimizers(model: Any) -> List[Any]:
    """The Keras 3 optimizers the model holds as attributes, its compiled one excepted, in
    the order of their names (the same in every process)."""
    from keras import optimizers

    compiled = getattr(model, "optimizer", None)
    seen = {id(compiled)}
    found = []
    for name in sorted(vars(model)):
        value = vars(model)[name]
        if isinstance(value, optimizers.Optimizer) and id(value) not in seen:
            seen.add(id(value))
            found.append(value)
    return found


def build_saved_optimizers(model: Any, state: Optional[Dict[str, Any]],
                           optimizers: List[Any]) -> None:
    """Build each optimizer on the weights it was built on when saved, so that Keras reads
    its variables from the weights file (it skips an unbuilt optimizer's, with a warning)."""
    if not state or not optimizers or len(state.get("optimizers", [])) != len(optimizers):
        return  # none saved, or other ones: restoring the state says so
    weights = _state._model_weights(model)
    for optimizer, saved in zip(optimizers, state["optimizers"], strict=True):
        targets = saved.get("targets")
        if targets is not None and max(targets, default=-1) < len(weights):
            _state.build_optimizer(optimizer, model, [weights[i] for i in targets])
