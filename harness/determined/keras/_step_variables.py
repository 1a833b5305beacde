"""The variables a model's first train step would create (its optimizer's slots, its compiled
loss's and metrics' trackers), created before the step is traced.

A `tf.function` that creates variables while it is traced is traced a second time (the first
trace only lifts their initializers out). tf_keras creates these in the first step, and so
does Keras 3 with no distribution strategy (its `fit` builds them first only under one), so
every trial traced its train step twice: 0.2 s of the digits example's start-up, 0.7 s of a
small recurrent model's (a third of its first batch). Created first, from zeros shaped like
the training data, they are the same variables with the same values; the step is traced
once.

    create_before_tracing(model, dataset.element_spec)   # then model.make_train_function()

Only for a built model whose train step, loss and metrics are Keras's own, with a current
(not legacy) optimizer: a custom `train_step` may apply the compiled optimizer to some of the
variables only (a GAN's), a legacy optimizer makes slots only for the variables that got a
gradient, and building those otherwise would change what their checkpoints hold. Anything
else, or anything that fails here, is left to the first step, as before.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from determined.keras._line import keras_line
from determined.keras._state import build_optimizer


def create_before_tracing(model: Any, element_spec: Any) -> None:
    if not _keras_own_step(model):
        return
    try:
        batch = tf.nest.map_structure(_zeros, element_spec)
        if keras_line() == "keras3":
            model._symbolic_build(data_batch=batch)  # what fit does under a strategy
        else:
            _create_keras2(model, batch)
    except Exception:  # noqa: BLE001  (shapes it cannot mirror: the first step makes them)
        pass


def _keras_own_step(model: Any) -> bool:
    base = tf.keras.Model
    optimizer = getattr(model, "optimizer", None)
    return (optimizer is not None and getattr(model, "built", False)
            and not hasattr(optimizer, "_create_all_weights")  # legacy (Keras 2)
            and all(getattr(type(model), name, None) is getattr(base, name, None)
                    for name in ("train_step", "compute_loss", "compute_metrics")))


def _zeros(spec: Any) -> Any:
    return tf.zeros([1 if d is None else d for d in spec.shape], spec.dtype)


def _create_keras2(model: Any, batch: Any) -> None:
    """tf_keras's train step builds the compiled loss and metrics from its first batch's
    targets and predictions: the same structures, of zeros (a functional model's outputs
    say what its predictions look like; a subclassed one's are only known from a call)."""
    outputs = getattr(model, "_nested_outputs", None)
    if outputs is None:
        return
    _, y, _ = tf.keras.utils.unpack_x_y_sample_weight(batch)
    if y is None:
        return
    y_pred = tf.nest.map_structure(_zeros, outputs)
    if not model.compiled_loss.built:
        model.compiled_loss.build(y_pred)
    if not model.compiled_metrics.built:
        model.compiled_metrics.build(y_pred, y)
    build_optimizer(model.optimizer, model)
