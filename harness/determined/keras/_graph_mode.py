"""Training a trial whose code turned eager execution off (`tf.compat.v1.disable_eager_execution()`
or `disable_v2_behavior()` at import, as TensorFlow 1-era code and Determined's own test
trials did). Keras 2 then builds graph-mode (v1) models: they cannot take an eagerly iterated
`tf.data` iterator, so the controller reads each batch as NumPy through a v1 iterator run in
Keras's session and feeds it to `train_on_batch` / `test_on_batch`, as Determined's TF 1
trials were fed. The batches are the same stream the eager path trains on.

    if active(): step = TrainStep(model); logs = step(Batches(stream.dataset))
    metrics = evaluate(model, validation_batches, steps, callbacks)

What graph mode cannot give here: random ops in the graph (dropout, random augmentation)
keep their position inside TensorFlow's kernels, so a resumed trial draws other numbers
than an uninterrupted one (the controller says so when it resumes); a trial on several
slots is refused (the multi-process engines exchange eager values).
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import numpy as np
import tensorflow as tf

RANDOM_OPS_NOTE = ("with eager execution disabled, random ops in the model's graph (dropout, "
                   "random augmentation) start their sequences over in a resumed process and "
                   "draw other numbers than an uninterrupted run; weights, optimizer state and "
                   "data order are restored exactly")


def active() -> bool:
    """Whether the process runs TensorFlow 1-style graphs (eager execution disabled)."""
    return not tf.compat.v1.executing_eagerly_outside_functions()


@contextlib.contextmanager
def eager_kept() -> Iterator[None]:
    """While a trial's code is imported to rebuild its model outside training (the
    checkpoint loader), its `disable_eager_execution()` / `disable_v2_behavior()` do nothing
    in an eager process: the model is built in the caller's mode, as an eager one, rather
    than switching the caller's whole process to graph mode."""
    if active():
        yield
        return
    v1 = tf.compat.v1
    saved = {name: getattr(v1, name) for name in _DISABLERS}
    for name in _DISABLERS:
        setattr(v1, name, _kept_eager)
    try:
        yield
    finally:
        for name, function in saved.items():
            setattr(v1, name, function)


_DISABLERS = ("disable_eager_execution", "disable_v2_behavior")


def _kept_eager() -> None:
    pass


def session() -> Any:
    """Keras's session, in which the model's variables live."""
    return tf.compat.v1.keras.backend.get_session()


def read_values(variables: List[Any]) -> List[np.ndarray]:
    """The variables' values as NumPy, eagerly or from Keras's session."""
    if not active():
        return [np.asarray(v.numpy()) for v in variables]
    return [np.asarray(value) for value in tf.keras.backend.batch_get_value(list(variables))]


def write_values(variables: List[Any], values: List[Any]) -> None:
    """Assign `values` to `variables`, eagerly or in Keras's session."""
    if not active():
        for variable, value in zip(variables, values, strict=True):
            variable.assign(value)
        return
    tf.keras.backend.batch_set_value(list(zip(variables, values, strict=True)))


class Batches:
    """A `tf.data.Dataset`'s elements as NumPy, read through a v1 iterator in Keras's
    session; `restart()` begins a new pass (for validation data)."""

    def __init__(self, dataset: tf.data.Dataset):
        self._iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
        self._next = self._iterator.get_next()
        self._started = False

    def restart(self) -> None:
        session().run(self._iterator.initializer)
        self._started = True

    def __iter__(self) -> "Batches":
        return self

    def __next__(self) -> Any:
        if not self._started:
            self.restart()
        try:
            return session().run(self._next)
        except tf.errors.OutOfRangeError:
            raise StopIteration from None


def _split(batch: Any) -> tuple:
    """(x, y, sample_weight) of a batch as the data streams give it."""
    if isinstance(batch, tuple) and len(batch) in (2, 3):
        return (batch + (None,))[:3]
    if isinstance(batch, tuple) and len(batch) == 1:
        return batch[0], None, None
    return batch, None, None


def _rows(x: Any) -> int:
    return len(tf.nest.flatten(x)[0])


def _outputs(model: Any, values: Any) -> Dict[str, float]:
    values = values if isinstance(values, list) else [values]
    return dict(zip(model.metrics_names, (float(v) for v in values), strict=True))


class TrainStep:
    """One training batch per call, like `model.train_function(iterator)`: returns the
    logs, metrics averaged since the last `reset()` (the v1 model's total loss is per
    batch; averaged here by rows, as Keras 2 averages it eagerly)."""

    def __init__(self, model: Any):
        self.model = model
        self.reset()

    def reset(self) -> None:
        self._loss_sum = 0.0
        self._rows = 0

    def __call__(self, batches: Batches) -> Dict[str, float]:
        x, y, sample_weight = _split(next(batches))
        logs = _outputs(self.model, self.model.train_on_batch(
            x, y, sample_weight=sample_weight, reset_metrics=False))
        rows = _rows(x)
        self._loss_sum += logs["loss"] * rows
        self._rows += rows
        logs["loss"] = self._loss_sum / self._rows
        return logs


def evaluate(model: Any, batches: Batches, steps: Optional[int],
             callbacks: List[Any]) -> Dict[str, float]:
    """One pass over the validation batches (`steps` of them at most), as `model.evaluate`
    does it eagerly: the loss averaged by rows, the compiled metrics accumulated."""
    hooks = tf.keras.callbacks.CallbackList(callbacks, model=model)
    model.reset_metrics()
    hooks.on_test_begin()
    batches.restart()
    loss_sum, rows, logs = 0.0, 0, {}
    for step, batch in enumerate(batches):
        if steps is not None and step >= steps:
            break
        hooks.on_test_batch_begin(step)
        x, y, sample_weight = _split(batch)
        with warnings.catch_warnings():  # v1's advice to TF 2 code, on building the step
            warnings.filterwarnings("ignore", message=".*state_updates")
            outputs = model.test_on_batch(x, y, sample_weight=sample_weight,
                                          reset_metrics=False)
        logs = _outputs(model, outputs)
        loss_sum += logs["loss"] * _rows(x)
        rows += _rows(x)
        logs["loss"] = loss_sum / rows
        hooks.on_test_batch_end(step, logs)
    hooks.on_test_end(logs)
    return logs


def portable_h5(h5_path: Path) -> None:
    """Make a graph-mode model's `.h5` architecture read as an eager one's: Keras 2 writes
    its graph-mode (TensorFlow 1) initializers with a `dtype` argument that Keras 3's, and
    Keras 2's own eager ones, do not take; the layer's dtype decides anyway."""
    from determined.keras._saved_architecture import rewrite_architecture

    rewrite_architecture(h5_path, _drop_initializer_dtypes)


def _drop_initializer_dtypes(value: Any) -> bool:
    changed = False
    if isinstance(value, dict):
        for key, item in value.items():
            if (key.endswith("initializer") and isinstance(item, dict)
                    and isinstance(item.get("config"), dict) and "dtype" in item["config"]):
                del item["config"]["dtype"]
                changed = True
            changed = _drop_initializer_dtypes(item) or changed
    elif isinstance(value, list):
        for item in value:
            changed = _drop_initializer_dtypes(item) or changed
    return changed
