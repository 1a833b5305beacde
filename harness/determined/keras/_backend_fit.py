"""`context.fit` on Keras's JAX and PyTorch backends: the trial's loop through Keras's
backend-neutral API alone (`train_on_batch`, `evaluate`, `keras.callbacks.CallbackList`), so
that a trial imports no TensorFlow unless its own code does.

It keeps the TensorFlow runner's contract (`_trial_controller`): train to the searcher's length
(or the script's epochs), end a workload every `scheduling_unit` batches and wherever a
validation or checkpoint is due, report training metrics averaged over each workload, validate
at Keras's epoch ends, checkpoint at the end, on a pause and by period, and resume exactly:
the batches by position (`_backend_data`), the weights, optimizers, SeedGenerator states and
generators from the checkpoint (`_backend_checkpoint`).

Several devices of one machine (`resources.slots_per_trial` > 1) train in this one process
through `keras.distribution.DataParallel` (set in `prepare_process`, before the model is
built); on CPU, JAX is given that many host devices.
"""

from __future__ import annotations

import functools
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np

from determined.core import TrialInfo, TrialReporter
from determined.core._reporting import SLOTS_VAR, TENSORBOARD_DIR_VAR
from determined.keras import _backend_checkpoint, _backend_data
from determined.keras._backend import backend, keep_tensorflow_unloaded

UNTIL_THE_DATA_ENDS = 2 ** 62


class BackendTrialError(Exception):
    """The trial's code did something this runner cannot run; the message says what."""


def _slots() -> int:
    slots = os.environ.get(SLOTS_VAR, "")
    return len([s for s in slots.split(",") if s.strip()]) or 1


def _seed(seed: int) -> None:
    """Python's, NumPy's, Keras's and the backend's generators, from the trial's seed."""
    import keras

    keras.utils.set_random_seed(seed)  # TensorFlow's part only where it is loaded


def _distribute(slots: int) -> str:
    """Data parallel over `slots` devices of this process; what the trial log says."""
    if backend() == "jax" and "--xla_force_host_platform_device_count" not in \
            os.environ.get("XLA_FLAGS", ""):
        # CPU slots: as many host devices (read when JAX first starts its CPU backend).
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   f" --xla_force_host_platform_device_count={slots}").strip()
    import keras

    try:
        devices = keras.distribution.list_devices("gpu")
    except RuntimeError:  # JAX without a GPU backend
        devices = []
    devices = devices or keras.distribution.list_devices()
    if len(devices) < slots:
        raise BackendTrialError(f"the trial was given {slots} slots but Keras's {backend()} "
                                f"backend sees {len(devices)} device(s): {devices}")
    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices[:slots]))
    return f"{slots} slots in this process: keras.distribution.DataParallel over " + \
        ", ".join(devices[:slots])


def _compilation_cache(info: TrialInfo) -> None:
    """JAX's persistent compilation cache beside the experiment's trial folders, unless the
    user chose one (JAX_COMPILATION_CACHE_DIR): a resumed launch, and a search's trials of one
    shape, load the XLA programs the first launch compiled instead of compiling them again
    (tests/backend_checks.py: its 8 fits of one model took 186 s without it, 55 s with it)."""
    if backend() != "jax" or os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return
    import jax

    jax.config.update("jax_compilation_cache_dir", str(info.trial_dir.parent / ".jax-cache"))
    if not os.environ.get("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"):
        # A small model's steps compile in well under JAX's default threshold of 1 s each.
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def prepare_process(info: TrialInfo) -> None:
    """Folders, TensorBoard's place, seeded generators and the devices, before the model is
    built."""
    info.trial_dir.mkdir(parents=True, exist_ok=True)
    os.environ[TENSORBOARD_DIR_VAR] = str(info.trial_dir / "tensorboard")
    keep_tensorflow_unloaded()
    _compilation_cache(info)
    if _slots() > 1:
        if backend() != "jax":
            raise BackendTrialError(
                f"resources.slots_per_trial is {_slots()} but several slots train on Keras's "
                "JAX or TensorFlow backend only here; set KERAS_BACKEND=jax or "
                "resources.slots_per_trial: 1")
        print(f"[trial {info.trial_id}] {_distribute(_slots())}", flush=True)
    _seed(info.seed)


class _Steps:
    """Training steps one batch at a time through the model's own train function, as Keras's
    `fit` runs them: the compiled metrics accumulate until `reset_metrics` (at a workload's
    end), where `train_on_batch` would reset them every batch. PyTorch's trainer, and the
    base of JAX's."""

    def __init__(self, model: Any, class_weight: Optional[Dict[int, float]]):
        self.model, self.class_weight = model, class_weight
        self._built = False

    def _batch(self, x: Any, y: Any, weight: Any) -> tuple:
        if self.class_weight is not None and weight is None:
            # keras.src: checked against keras 3.15 (pyproject's bound <3.16)
            from keras.src.trainers.data_adapters import data_adapter_utils

            weight = data_adapter_utils.class_weight_to_sample_weights(y, self.class_weight)
        return (x, y, weight)

    def _build(self, data: tuple) -> None:
        if not self._built:
            self.model._symbolic_build(data_batch=data)
            self.model.make_train_function()
            if hasattr(self.model, "train"):  # PyTorch: the module in training mode
                self.model.train()
            self._built = True

    def __call__(self, x: Any, y: Any, weight: Any) -> Dict[str, Any]:
        data = self._batch(x, y, weight)
        self._build(data)
        return self.model.train_function([data])

    def sync(self) -> None:
        """Make the model's variables current (before validating, checkpointing, resetting
        metrics)."""

    def reset_metrics(self) -> None:
        self.sync()
        self.model.reset_metrics()


class _JaxSteps(_Steps):
    """JAX: the state (weights, optimizer, metrics) stays on the devices from step to step and
    is written back into the model's variables only when something reads them, as in
    Keras's JAX `fit` (its callbacks' `self.model` syncs it too)."""

    _state: Any = None

    def __call__(self, x: Any, y: Any, weight: Any) -> Dict[str, Any]:
        model = self.model
        data = (x, y, weight) if self.class_weight is None else self._batch(x, y, weight)
        if self._transfer:
            # keras.src: checked against keras 3.15 (pyproject's bound <3.16)
            from keras.src.backend.jax.trainer import _distribute_data

            data = _distribute_data(data)
        if not self._built:
            self._build(data)
        if self._state is None or getattr(model, "_jax_state_synced", True):
            self._state = model._get_jax_state(
                trainable_variables=True, non_trainable_variables=True,
                optimizer_variables=True, metrics_variables=True, purge_model_variables=True)
            model._jax_state_synced = False
        logs, self._state = model.train_function(self._state, iter([data]))
        trainable, non_trainable, optimizer, metrics = self._state
        self._set_state(model, "_jax_state", {
            "trainable_variables": trainable, "non_trainable_variables": non_trainable,
            "optimizer_variables": optimizer, "metrics_variables": metrics})
        return logs

    @functools.cached_property
    def _set_state(self) -> Any:
        """How the step stores the state where `jax_state_sync` reads it. Keras's fit sets it
        through `Layer.__setattr__`, whose tracker wraps the dict and its lists (about 600
        Python calls, two thirds of a step's, counted over digits' conv net) though nothing
        in them is ever tracked; set plainly, except where Flax NNX manages attributes."""
        # keras.src: checked against keras 3.15 (pyproject's bound <3.16)
        from keras.src.backend.config import is_nnx_enabled

        return setattr if is_nnx_enabled() else object.__setattr__

    def sync(self) -> None:
        self.model.jax_state_sync()

    @functools.cached_property
    def _transfer(self) -> bool:
        """Whether batches are put on the devices before the step, as Keras's JAX `fit` does
        under a distribution or off the CPU; on the CPU without one it hands the step NumPy
        arrays (a `device_put` per array and step cost a fifth of a small model's epoch)."""
        import jax
        import keras

        return keras.distribution.distribution() is not None or jax.default_backend() != "cpu"


def _steps(model: Any, class_weight: Optional[Dict[int, float]]) -> _Steps:
    return (_JaxSteps if backend() == "jax" else _Steps)(model, class_weight)


@dataclass
class FitOptions:
    epochs: int = 1
    initial_epoch: int = 0
    steps_per_epoch: Optional[int] = None
    validation_freq: int = 1
    validation_batch_size: Optional[int] = None
    validation_steps: Optional[int] = None
    shuffle: bool = True
    class_weight: Optional[Dict[int, float]] = None
    verbose: int = 2
    history: Any = None


class BackendFit:
    """Trains one `context.fit` to its length on a non-TensorFlow backend."""

    def __init__(self, info: TrialInfo, reporter: TrialReporter, model: Any, train: Any,
                 validation: Any, callbacks: List[Any], optimizers: List[Any],
                 checkpoint_metadata: Dict[str, Any], batch_size: Optional[int],
                 fit: FitOptions):
        import keras

        if not isinstance(model, keras.Model):
            raise BackendTrialError(f"context.fit() got {type(model).__name__}; it needs a "
                                    "keras.Model")
        if getattr(model, "optimizer", None) is None:
            raise BackendTrialError("context.fit() needs a compiled model: call "
                                    "model.compile(...) first")
        self.info, self.reporter, self.model = info, reporter, model
        self.train, self.validation = train, validation
        self.user_callbacks = list(callbacks)
        self.optimizers = list(optimizers)
        if not any(o is model.optimizer for o in self.optimizers):
            self.optimizers.insert(0, model.optimizer)
        self.checkpoint_metadata = checkpoint_metadata
        self.batch_size = batch_size
        self.fit = fit
        self.target = info.target_batches
        self.batches_trained = 0
        self.epochs_completed = fit.initial_epoch
        self.last_validation = -1
        self.last_checkpoint = -1
        self.last_validation_metrics: Dict[str, float] = {}
        self.paused = False
        self.stop_requested = False
        self._workload_began_at = 0
        self._last_mark = time.time()
        self.steps = _steps(model, fit.class_weight)
        self._validation_callbacks: Any = []  # held open during `run` (see there)

    def _note(self, phase: str, started: float, details: Optional[Dict[str, Any]] = None
              ) -> None:
        ended = time.time()
        self.reporter.record_phase(phase, started, ended, details)
        self._last_mark = ended

    # -- length -------------------------------------------------------------------------
    def _per_epoch(self, batches: _backend_data.Batches) -> int:
        if self.fit.steps_per_epoch:
            return self.fit.steps_per_epoch
        records = int(self.info.config.get("records_per_epoch") or 0)
        if records and self.batch_size:
            return max(1, math.ceil(records / self.batch_size))
        return batches.per_pass or 0

    @staticmethod
    def _due(batches_trained: int, period: int) -> bool:
        return period > 0 and batches_trained % period == 0

    def _call(self, hook: str, *args: Any) -> None:
        for callback in self.user_callbacks:
            if hasattr(callback, hook):
                getattr(callback, hook)(*args)

    # -- the loop -----------------------------------------------------------------------
    def run(self) -> None:
        import keras

        began = time.time()
        state = None
        if self.info.latest_checkpoint:
            state = self._restore(self.info.latest_checkpoint, counters=True)
        elif self.info.warm_start_checkpoint:
            self._restore(self.info.warm_start_checkpoint, counters=False)
        batches = _backend_data.training_batches(self.train, self.batch_size, self.info.seed,
                                                 self.batches_trained, self.fit.shuffle)
        per_epoch = self._per_epoch(batches)
        if not self.target:
            if not per_epoch:
                raise BackendTrialError(
                    "context.fit() cannot count epochs over data of unknown length; pass "
                    "steps_per_epoch=, or set searcher.max_length in the experiment config")
            self.target = max(0, self.fit.epochs - self.fit.initial_epoch) * per_epoch
            self.reporter.set_target_batches(self.target)
        self._note("data_ready", began)
        epochs = (self.fit.initial_epoch + math.ceil(self.target / per_epoch)
                  if per_epoch else 1)
        callbacks = keras.callbacks.CallbackList(
            self.user_callbacks + [self.fit.history], add_history=False,
            add_progbar=bool(self.fit.verbose), model=self.model, verbose=self.fit.verbose,
            epochs=epochs, steps=per_epoch or None)
        self.model.stop_training = False
        callbacks.on_train_begin()
        if state:  # after on_train_begin, which resets Keras's own callbacks
            for callback, saved in zip(self.user_callbacks, state["callbacks"], strict=True):
                if saved is not None and hasattr(callback, "load_state"):
                    callback.load_state(saved)
        # One callback list for every validation of the fit, its begin/end block held open
        # as Keras's fit holds its own around its evaluations: a list made per `evaluate`
        # starts and joins a thread pool each time (a millisecond of a small model's epoch).
        held = keras.callbacks.CallbackList([], add_history=False, add_progbar=False,
                                            model=self.model)
        held.on_train_begin()
        self._validation_callbacks = held
        try:
            if self.batches_trained < self.target:
                self._train(callbacks, iter(batches), per_epoch)
            if not self.paused:
                self._finish()
            self.steps.sync()  # the script's model holds what was trained
            callbacks.on_train_end()
        finally:
            held.on_train_end()
            self._validation_callbacks = []
            self.reporter.wait_for_checkpoints()
            self._note("end", self._last_mark, {"batches": self.batches_trained,
                                                "paused": self.paused})

    def _train(self, callbacks: Any, batches: Any, per_epoch: int) -> None:
        self.steps = _steps(self.model, self.fit.class_weight)
        self.model.reset_metrics()
        want_epoch_begin = True  # a resumed fit is inside an epoch all the same
        want_workload_begin = True
        first_batch = True
        logs: Dict[str, Any] = {}
        workload_t = time.time()
        boundary = self._next_boundary()
        # A step does no more Python than Keras's fit does (a small model's step on a CPU is
        # mostly Python): the workload's end is worked out at its start, not at every batch.
        steps, on_batch_begin, on_batch_end = (
            self.steps, callbacks.on_train_batch_begin, callbacks.on_train_batch_end)
        while self.batches_trained < self.target:
            if want_epoch_begin:
                callbacks.on_epoch_begin(self.epochs_completed)
                want_epoch_begin = False
            if want_workload_begin:
                self._workload_began_at = self.batches_trained
                workload_t = time.time()
                boundary = self._next_boundary()
                self._call("on_train_workload_begin", self.batches_trained,
                           boundary - self.batches_trained, {})
                want_workload_begin = False
            step = self.batches_trained % per_epoch if per_epoch else self.batches_trained
            on_batch_begin(step)
            logs = steps(*next(batches))
            on_batch_end(step, logs)
            self.batches_trained += 1
            if first_batch:
                first_batch = False
                self.reporter.report_first_batch()
                self._note("first_batch", self._last_mark, {"batches": self.batches_trained})
            if per_epoch and self.batches_trained % per_epoch == 0:
                callbacks.on_epoch_end(self.epochs_completed, self._epoch_logs(logs))
                self.epochs_completed += 1
                want_epoch_begin = True
            if self.model.stop_training:  # a callback's stop: the trial stops here
                self.model.stop_training = False
                self.stop_requested = True
            if self.batches_trained >= boundary or self.stop_requested:
                self._end_workload(logs, workload_t)
                want_workload_begin = True
                if self.paused or self.stop_requested:
                    break
        if not self.paused and per_epoch and self.batches_trained % per_epoch:
            # Training ended inside an epoch: that partial epoch still gets its History row.
            callbacks.on_epoch_end(self.epochs_completed, self._epoch_logs(logs, always=True))

    def _next_boundary(self) -> int:
        """Where the workload that starts now ends: the next batch count that is a multiple
        of the scheduling unit, the validation period or the checkpoint period, or the
        target; the next batch once a stop was asked."""
        following = self.batches_trained + 1
        if self.stop_requested:
            return following
        periods = (self.info.scheduling_unit, self.info.validation_period,
                   self.info.checkpoint_period)
        return max(following, min([self.target] + [(self.batches_trained // period + 1) * period
                                                   for period in periods if period > 0]))

    def _epoch_logs(self, logs: Dict[str, Any], always: bool = False) -> Dict[str, float]:
        epoch_logs = _metrics(logs)
        number = self.epochs_completed + 1
        if always or number % max(1, self.fit.validation_freq) == 0:
            if self.last_validation != self.batches_trained:
                self.validate()
            epoch_logs.update(self.last_validation_metrics)
        return epoch_logs

    def _end_workload(self, logs: Dict[str, Any], workload_t: float) -> None:
        batches_trained = self.batches_trained
        self._note("training", max(workload_t, self._last_mark),
                   {"batches": [self._workload_began_at, batches_trained]})
        metrics = _metrics(logs)
        self.reporter.report_training_metrics(batches_trained, metrics)
        length = "" if self.target == UNTIL_THE_DATA_ENDS else f"/{self.target}"
        print(f"[trial {self.info.trial_id}] batches {batches_trained}{length} "
              + " ".join(f"{k}={v:.4g}" for k, v in metrics.items()), flush=True)
        self._call("on_train_workload_end", batches_trained, metrics)
        finished = batches_trained >= self.target or self.stop_requested
        if self._due(batches_trained, self.info.validation_period) \
                and self.last_validation != batches_trained:
            self.validate()
        self.paused = not finished and self.reporter.should_pause()
        if finished or self.paused or self._due(batches_trained, self.info.checkpoint_period):
            self.checkpoint()
        self.steps.reset_metrics()  # the next workload averages from zero
        self.reporter.heartbeat()
        if self.paused:
            print(f"[trial {self.info.trial_id}] paused at {batches_trained} batches",
                  flush=True)

    def _finish(self) -> None:
        if self.last_checkpoint != self.batches_trained:
            self.checkpoint()
        if self.last_validation != self.batches_trained:
            self.validate()

    def validate(self) -> Dict[str, float]:
        began = time.time()
        self.steps.sync()
        results = _backend_data.evaluate(
            self.model, self.validation, self._validation_batch_size,
            self.fit.validation_steps, self._validation_callbacks, self._evaluation_batches)
        metrics = {f"val_{k}": v for k, v in results.items()}
        self._call("on_test_end", dict(metrics))
        self.reporter.report_validation_metrics(self.batches_trained, metrics)
        print(f"[trial {self.info.trial_id}] validation at {self.batches_trained} "
              + " ".join(f"{k}={v:.4g}" for k, v in metrics.items()), flush=True)
        self.last_validation = self.batches_trained
        self.last_validation_metrics = metrics
        self._note("validation", began, {"batches": self.batches_trained})
        return metrics

    @property
    def _validation_batch_size(self) -> Optional[int]:
        return self.fit.validation_batch_size or self.batch_size

    @functools.cached_property
    def _evaluation_batches(self) -> Any:
        """Made at the first validation (the model compiled by then), kept for the fit."""
        return _backend_data.evaluation_batches(self.model, self.validation,
                                                self._validation_batch_size,
                                                self.fit.validation_steps)

    # -- checkpoints --------------------------------------------------------------------
    def checkpoint(self) -> str:
        import keras

        paused = time.time()
        self.steps.sync()
        directory = Path(tempfile.mkdtemp(dir=self.info.trial_dir, prefix=".checkpoint-"))
        try:
            trial_state = {
                "batches_trained": self.batches_trained,
                "epochs_completed": self.epochs_completed,
                "last_validation": self.last_validation,
                "callbacks": [c.get_state() if hasattr(c, "get_state") else None
                              for c in self.user_callbacks],
            }
            weights = _backend_checkpoint.write(directory, self.model, self.optimizers,
                                                trial_state, self.info.model_dir,
                                                self.info.config, self.info.hparams)
            self._call("on_checkpoint_end", str(directory))
            metadata = {
                **self.checkpoint_metadata,
                "experiment_id": self.info.experiment_id,
                "trial_id": self.info.trial_id,
                "batches_trained": self.batches_trained,
                "keras_line": "keras3",
                "keras_backend": backend(),
                "keras_version": keras.__version__,
                **weights,
                "format": "localdet-keras-checkpoint/1",
            }
            (directory / "metadata.json").write_text(_json(metadata))
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        uuid = self.reporter.save_checkpoint(directory, self.batches_trained, metadata)
        self._note("checkpoint", paused, {"uuid": uuid, "batches": self.batches_trained})
        self.last_checkpoint = self.batches_trained
        print(f"[trial {self.info.trial_id}] checkpoint {uuid} at {self.batches_trained}",
              flush=True)
        return uuid

    def _restore(self, uuid: str, counters: bool) -> Optional[Dict[str, Any]]:
        restoring = time.time()
        scratch = Path(tempfile.mkdtemp(dir=self.info.trial_dir, prefix=".restore-"))
        try:
            directory = self.reporter.restore_checkpoint(uuid, scratch / "checkpoint")
            if _backend_checkpoint.model_file(directory) is None:
                raise BackendTrialError(
                    f"checkpoint {uuid} was written on Keras's TensorFlow backend; a trial on "
                    f"KERAS_BACKEND={backend()} resumes only from its own backend's "
                    "checkpoints (set KERAS_BACKEND=tensorflow to continue it)")
            try:
                state = _backend_checkpoint.read(directory, self.model, self.optimizers)
            except BaseException:
                self.reporter.verify_restored_checkpoint()  # a corrupt file explains it better
                raise
            self.reporter.verify_restored_checkpoint()
        except _backend_checkpoint.BackendCheckpointError as error:
            raise BackendTrialError(f"checkpoint {uuid} does not fit this trial: {error}") \
                from None
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        self._note("restore", restoring, {"uuid": uuid})
        if not counters:  # a warm start: another trial's weights, this trial's batch 0
            return None
        self.batches_trained = state["batches_trained"]
        self.epochs_completed = state["epochs_completed"]
        self.last_validation = state["last_validation"]
        self.last_checkpoint = self.batches_trained
        print(f"[trial {self.info.trial_id}] restored checkpoint {uuid} at "
              f"{self.batches_trained} batches", flush=True)
        return state


def _metrics(logs: Dict[str, Any]) -> Dict[str, float]:
    return {k: float(v) for k, v in logs.items() if np.ndim(v) == 0}


def _json(value: Any) -> str:
    import json

    return json.dumps(value, indent=2, default=str)
