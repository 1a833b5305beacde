"""The New Keras API's context: what `det.keras.init()` returns.

    context = det.keras.init()
    hparams = context.training.hparams
    x_train, y_train = context.wrap_data(x_train, y_train)
    model.compile(optimizer=context.wrap_optimizer(keras.optimizers.SGD(hparams["lr"])), ...)
    history = context.fit(model, x_train, y_train, batch_size=32,
                          validation_data=(x_val, y_val))

`context.fit` trains through the same runner as a `TFKerasTrial`, so it checkpoints,
reports metrics, obeys pause and resumes exactly; under localdet it trains to the
searcher's length, on its own it honours `epochs` and `initial_epoch`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import tensorflow as tf

from determined.core import DistributedContext, TrialInfo, TrialReporter
from determined.keras import _data, _engine, _sharding
from determined.keras._backend_context import (  # one definition for every backend
    ContextCommon,
    TrainingContext,
    _interactive_verbose,
)
from determined.keras._context import TFKerasTrialContext
from determined.keras._load import load_model_from_checkpoint_path


def _validation_split(x: Any, y: Any, sample_weight: Any, split: float) -> tuple:
    """Keras's rule: the last `split` of the NumPy records, taken before any shuffling."""
    if not 0.0 < split < 1.0:
        raise ValueError(f"validation_split must be between 0 and 1, got {split}")
    arrays = [part for part in (x, y, sample_weight) if part is not None]
    if not all(_data._is_array_like(part) for part in arrays):
        raise ValueError("validation_split works only with NumPy arrays; pass "
                         "validation_data= for a tf.data.Dataset or a Sequence")
    count = len(tf.nest.flatten(_data._as_arrays(x))[0])
    cut = int(count * (1.0 - split))
    if cut in (0, count):
        raise ValueError(f"validation_split={split} of {count} examples leaves an empty "
                         "training or validation set")

    def part(value: Any, piece: slice) -> Any:
        if value is None:
            return None
        return tf.nest.map_structure(lambda a: np.asarray(a)[piece], _data._as_arrays(value))

    train = (part(x, slice(None, cut)), part(y, slice(None, cut)),
             part(sample_weight, slice(None, cut)))
    validation = (part(x, slice(cut, None)), part(y, slice(cut, None)),
                  part(sample_weight, slice(cut, None)))
    return train, validation


def _as_loader(x: Any, y: Any, sample_weight: Any, what: str) -> Any:
    """fit's (x, y, sample_weight) as a data loader the runner accepts."""
    if isinstance(x, tf.data.Dataset) or _data.is_sequence(x):
        if y is not None or sample_weight is not None:
            raise ValueError(f"{what}: y and sample_weight must not be given with a "
                             f"{type(x).__name__}, which yields them itself")
        return x
    if x is None or y is None:
        raise ValueError(f"{what}: pass x and y (NumPy arrays), a tf.data.Dataset or a "
                         "keras.utils.Sequence")
    return (x, y) if sample_weight is None else (x, y, sample_weight)


class KerasContext(ContextCommon):
    """What `det.keras.init()` returns; see the module docstring."""

    def __init__(self, info: TrialInfo, reporter: TrialReporter,
                 distributed: Optional[DistributedContext] = None, *, managed: bool = False):
        self._info = info
        self._reporter = reporter
        self._managed = managed  # started by localdet (daemon, `localdet run`, a job)
        self.distributed = distributed or _engine.current().distributed
        # The TFKerasTrial context carries what the runner reads (fit settings, wrapped
        # optimizers and datasets, stop requests), so both APIs share one runner.
        self._trial_context = TFKerasTrialContext(info, self.distributed)
        self._training = TrainingContext(info) if info.kind != "job" else None
        self._batches_trained = 0

    # -- wrappers -----------------------------------------------------------------------
    def wrap_data(self, *data: Any) -> Any:
        """Shard data by rank, both training and validation: NumPy arrays (`x, y[, w]`),
        a keras.utils.Sequence (PyDataset) or a tf.data.Dataset (best wrapped early, as
        `Dataset.shard` reads and drops the other ranks' elements)."""
        if not data:
            raise TypeError("context.wrap_data() needs the data to wrap")
        wrapped = []
        for item in data:
            if isinstance(item, tf.data.Dataset):
                wrapped.append(self._trial_context.wrap_dataset(item))
            else:
                wrapped.append(_sharding.shard_one(item, self.distributed.rank,
                                                   self.distributed.size))
        return wrapped[0] if len(wrapped) == 1 else tuple(wrapped)

    def wrap_optimizer(self, optimizer: Any) -> Any:
        """Track an optimizer so its state is checkpointed (wrap each one you use)."""
        return self._trial_context.wrap_optimizer(optimizer)

    # -- training -----------------------------------------------------------------------
    def fit(self, model: Any, x: Any = None, y: Any = None, batch_size: Optional[int] = None,
            epochs: int = 1, verbose: Any = "auto", callbacks: Optional[List[Any]] = None,
            validation_split: float = 0.0, validation_data: Any = None, shuffle: bool = True,
            class_weight: Optional[Dict[int, float]] = None, sample_weight: Any = None,
            initial_epoch: int = 0, steps_per_epoch: Optional[int] = None,
            validation_steps: Optional[int] = None, validation_batch_size: Optional[int] = None,
            validation_freq: int = 1, x_val: Any = None, y_val: Any = None,
            workers: Optional[int] = None, use_multiprocessing: Optional[bool] = None,
            max_queue_size: Optional[int] = None) -> Any:
        """`model.fit` that checkpoints, reports metrics and obeys pause; returns the Keras
        `History` (`history.history["val_loss"]` holds one value per epoch).

        Validation data is required: `validation_data=`, `validation_split=` or `x_val=`
        with `y_val=`. Under localdet, `epochs` and `initial_epoch` are ignored when the
        experiment's searcher sets a length, and the run resumes from its latest
        checkpoint; a run paused (`localdet pause`) checkpoints and ends the process.
        """
        from determined.keras._trial_controller import FitOptions, TrialController

        _ = self.training  # a job has no training; say so before anything else
        if validation_data is None and x_val is not None:
            if y_val is None:
                raise ValueError("context.fit(): x_val needs y_val")
            validation_data = (x_val, y_val)
        if validation_data is None and validation_split:
            (x, y, sample_weight), (vx, vy, vw) = _validation_split(
                x, y, sample_weight, validation_split)
            validation_data = (vx, vy) if vw is None else (vx, vy, vw)
        if validation_data is None:
            raise ValueError("context.fit() needs validation data: pass validation_data=(x, y), "
                             "validation_split=0.1, or x_val= and y_val=")
        train = _as_loader(x, y, sample_weight, "context.fit()")
        if isinstance(validation_data, (tuple, list)) and not isinstance(
                validation_data, tf.data.Dataset):
            if not 2 <= len(validation_data) <= 3:
                raise ValueError("validation_data must be (x, y) or (x, y, sample_weight), a "
                                 "tf.data.Dataset or a keras.utils.Sequence")
            val_x, val_y, val_weight = [*validation_data, None, None][:3]
            validation = _as_loader(val_x, val_y, val_weight, what="validation_data")
        else:
            validation = validation_data
        numpy_data = isinstance(train, tuple)
        if numpy_data and batch_size is None:
            batch_size = 32  # Keras's default
        context = self._trial_context
        context.fit_config = {"verbose": _interactive_verbose(verbose), "shuffle": shuffle,
                              "class_weight": class_weight,
                              "validation_steps": validation_steps}
        context.configure_fit(workers=workers, use_multiprocessing=use_multiprocessing,
                              max_queue_size=max_queue_size)
        context.wrap_model(model)
        history = tf.keras.callbacks.History()
        options = FitOptions(epochs=epochs, initial_epoch=initial_epoch,
                             steps_per_epoch=steps_per_epoch, validation_freq=validation_freq,
                             validation_batch_size=validation_batch_size, history=history)
        controller = TrialController(self._info, self._reporter, context, model, train,
                                     validation, list(callbacks or []),
                                     batch_size=batch_size or None, fit=options)
        controller.run()
        self._reporter.heartbeat()  # writes the fit's last timeline phases (its end)
        self._batches_trained = controller.batches_trained
        if controller.paused and self._managed:
            # Paused: the checkpoint is stored; the rest of the script runs on resume.
            sys.exit(0)
        return history

    def _load_model(self, folder: Path) -> Any:
        return load_model_from_checkpoint_path(str(folder))
