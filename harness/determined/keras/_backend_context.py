"""What `det.keras.init()` returns on Keras's JAX and PyTorch backends: the New Keras API's
context (`_keras_context.KerasContext` on TensorFlow) with the same methods, training through
`_backend_fit` and importing no TensorFlow.

    context = det.keras.init()
    model.compile(optimizer=context.wrap_optimizer(keras.optimizers.Adam(1e-3)), ...)
    history = context.fit(model, x, y, batch_size=32, validation_data=(x_val, y_val))
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np

from determined.core import DistributedContext, TrialInfo, TrialReporter
from determined.core._reporting import reporter_factory
from determined.keras import _backend_checkpoint, _backend_data, _backend_fit
from determined.keras._backend import backend


class JobHasNoTrainingError(RuntimeError):
    """A batch job touched `context.training` or trained."""


class Hyperparameters(dict):
    """`context.training.hparams`: a dict whose missing keys say where values come from."""

    def __missing__(self, name: str) -> Any:
        known = ", ".join(sorted(self)) or "none"
        raise KeyError(f"hyperparameter '{name}' is not set (set: {known}); add it to the "
                       "experiment config's hyperparameters, or when running the script "
                       "on its own pass det.keras.init(hparams={...}) or set LOCALDET_CONFIG")


class TrainingContext:
    """`context.training`: what only a training run has."""

    def __init__(self, info: TrialInfo):
        self.hparams = Hyperparameters(info.hparams)
        self.trial_id = info.trial_id
        self.experiment_id = info.experiment_id
        self.seed = info.seed


def _interactive_verbose(verbose: Any) -> int:
    if verbose == "auto":
        verbose = 1
    if verbose == 1 and not sys.stdout.isatty():
        return 2
    return int(verbose)


def _validation_split(x: Any, y: Any, sample_weight: Any, split: float) -> tuple:
    """Keras's rule: the last `split` of the NumPy records, taken before any shuffling."""
    if not 0.0 < split < 1.0:
        raise ValueError(f"validation_split must be between 0 and 1, got {split}")
    parts = [part for part in (x, y, sample_weight) if part is not None]
    if not all(_backend_data.is_array_like(part) for part in parts):
        raise ValueError("validation_split works only with NumPy arrays; pass "
                         "validation_data= for other data")
    count = _backend_data.records(_backend_data.as_arrays(x))
    cut = int(count * (1.0 - split))
    if cut in (0, count):
        raise ValueError(f"validation_split={split} of {count} examples leaves an empty "
                         "training or validation set")

    def part(value: Any, piece: slice) -> Any:
        return _backend_data._map(lambda a: np.asarray(a)[piece], value)

    train = tuple(part(v, slice(None, cut)) for v in (x, y, sample_weight))
    validation = tuple(part(v, slice(cut, None)) for v in (x, y, sample_weight))
    return train, validation


def _as_loader(x: Any, y: Any, sample_weight: Any, what: str) -> Any:
    if _backend_data.is_array_like(x):
        if y is None:
            raise ValueError(f"{what}: pass x and y (NumPy arrays), a keras.utils.PyDataset "
                             "or an iterable of batches")
        return (x, y) if sample_weight is None else (x, y, sample_weight)
    if x is None:
        raise ValueError(f"{what}: pass x and y (NumPy arrays), a keras.utils.PyDataset or "
                         "an iterable of batches")
    if y is not None or sample_weight is not None:
        raise ValueError(f"{what}: y and sample_weight must not be given with a "
                         f"{type(x).__name__}, which yields them itself")
    return x


class ContextCommon:
    """What the New Keras API's context does alike on every backend: `training`,
    `config_data`, `evaluate`, `predict` and `load_checkpoint_model`. A subclass sets
    `_info`, `_reporter`, `_training`, `_batches_trained` and `distributed`, and says how a
    checkpoint's folder becomes a model (`_load_model`)."""

    _info: TrialInfo
    _reporter: TrialReporter
    _training: Optional[TrainingContext]
    _batches_trained: int
    distributed: DistributedContext

    @property
    def training(self) -> TrainingContext:
        if self._training is None:
            raise JobHasNoTrainingError(
                "context.training is not available: jobs have no training context (no "
                "hyperparameters, no fit); read your settings from context.config_data")
        return self._training

    @property
    def config_data(self) -> Dict[str, Any]:
        """The config's `data` section: any settings of your own."""
        return dict(self._info.config.get("data") or {})

    def evaluate(self, model: Any, *args: Any, **kwargs: Any) -> Any:
        """`model.evaluate`; in a training run its results are also recorded beside the
        validation metrics, as test_<name> (by the chief)."""
        return_dict = kwargs.pop("return_dict", False)
        results = model.evaluate(*args, return_dict=True, **kwargs)
        if self._training is not None and self.distributed.rank == 0:
            self._reporter.report_validation_metrics(
                self._batches_trained,
                {f"test_{k}": float(v) for k, v in results.items() if np.ndim(v) == 0})
        if return_dict:
            return results
        # Keras's own order without return_dict: the loss, then the compiled metrics.
        names = sorted(results, key=lambda name: name != "loss")
        values = [results[name] for name in names]
        return values[0] if len(values) == 1 else values

    def predict(self, model: Any, *args: Any, **kwargs: Any) -> Any:
        """`model.predict`, for batch inference."""
        return model.predict(*args, **kwargs)

    def load_checkpoint_model(self, trial_id: Optional[int] = None,
                              checkpoint_uuid: Optional[str] = None) -> Any:
        """Load a Keras model (architecture and weights) from the latest checkpoint of a
        trial, or from one checkpoint (a unique uuid prefix works)."""
        scratch = Path(tempfile.mkdtemp(prefix="localdet-load-"))
        try:
            folder = reporter_factory().load_checkpoint(scratch / "checkpoint",
                                                        trial_id=trial_id, uuid=checkpoint_uuid)
            return self._load_model(folder)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _load_model(self, folder: Path) -> Any:
        raise NotImplementedError


class BackendKerasContext(ContextCommon):
    """`det.keras.init()`'s context on a non-TensorFlow backend; see the module docstring."""

    def __init__(self, info: TrialInfo, reporter: TrialReporter,
                 distributed: Optional[DistributedContext] = None, *, managed: bool = False):
        self._info = info
        self._reporter = reporter
        self._managed = managed
        self.distributed = distributed or DistributedContext.from_environment()
        if self.distributed.size > 1:
            raise _backend_fit.BackendTrialError(
                f"this trial runs {self.distributed.size} processes, but on Keras's "
                f"{backend()} backend a trial trains in one process (its slots through "
                "keras.distribution); set resources.engine: auto")
        self._training = TrainingContext(info) if info.kind != "job" else None
        self._optimizers: List[Any] = []
        self._batches_trained = 0
        self.checkpoint_metadata: Dict[str, Any] = {}

    def wrap_data(self, *data: Any) -> Any:
        """One process reads all the data (several devices split each batch), so the data
        comes back as it was given."""
        if not data:
            raise TypeError("context.wrap_data() needs the data to wrap")
        return data[0] if len(data) == 1 else tuple(data)

    def wrap_optimizer(self, optimizer: Any) -> Any:
        """Track an optimizer so its state is checkpointed (wrap each one you use)."""
        if not any(optimizer is o for o in self._optimizers):
            self._optimizers.append(optimizer)
        return optimizer

    def fit(self, model: Any, x: Any = None, y: Any = None, batch_size: Optional[int] = None,
            epochs: int = 1, verbose: Any = "auto", callbacks: Optional[List[Any]] = None,
            validation_split: float = 0.0, validation_data: Any = None, shuffle: bool = True,
            class_weight: Optional[Dict[int, float]] = None, sample_weight: Any = None,
            initial_epoch: int = 0, steps_per_epoch: Optional[int] = None,
            validation_steps: Optional[int] = None, validation_batch_size: Optional[int] = None,
            validation_freq: int = 1, x_val: Any = None, y_val: Any = None,
            workers: Optional[int] = None, use_multiprocessing: Optional[bool] = None,
            max_queue_size: Optional[int] = None) -> Any:
        """`model.fit` that checkpoints, reports metrics and obeys pause; returns Keras's
        `History`. As on TensorFlow: validation data is required, and under localdet the
        searcher's length wins over `epochs`."""
        import keras

        _ = self.training
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
        if isinstance(validation_data, (tuple, list)):
            if not 2 <= len(validation_data) <= 3:
                raise ValueError("validation_data must be (x, y) or (x, y, sample_weight), a "
                                 "keras.utils.PyDataset or an iterable of batches")
            validation = tuple(validation_data)
        else:
            validation = validation_data
        if isinstance(train, tuple) and batch_size is None:
            batch_size = 32  # Keras's default
        history = keras.callbacks.History()
        options = _backend_fit.FitOptions(
            epochs=epochs, initial_epoch=initial_epoch, steps_per_epoch=steps_per_epoch,
            validation_freq=validation_freq, validation_batch_size=validation_batch_size,
            validation_steps=validation_steps, shuffle=shuffle, class_weight=class_weight,
            verbose=_interactive_verbose(verbose), history=history)
        runner = _backend_fit.BackendFit(self._info, self._reporter, model, train, validation,
                                         list(callbacks or []), self._optimizers,
                                         self.checkpoint_metadata, batch_size, options)
        runner.run()
        self._reporter.heartbeat()
        self._batches_trained = runner.batches_trained
        if runner.paused and self._managed:
            sys.exit(0)  # paused: the checkpoint is stored; the rest runs on resume
        return history

    def _load_model(self, folder: Path) -> Any:
        return _backend_checkpoint.load_model(folder)
