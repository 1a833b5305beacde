"""Runs a TFKerasTrial: builds it, trains it to the searcher's length in its own loop, and at
workload boundaries reports metrics, validates, checkpoints and obeys pause requests.

A workload ends every `scheduling_unit` batches and wherever a validation or checkpoint is
due; training metrics are averaged over each workload. A checkpoint holds everything a
resumed trial needs to continue exactly as if it had never stopped (`_trial_checkpoints`
writes and reads it); restoring one is here, where the data stream is then set up again.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import tensorflow as tf

from determined.core import TrialInfo, TrialReporter
from determined.core._reporting import TENSORBOARD_DIR_VAR, await_launch, started_ahead
from determined.keras import (
    _data,
    _engine,
    _graph_mode,
    _graph_random,
    _open_h5,
    _sharding,
    _state,
    _weights_file,
)
from determined.keras._context import TFKerasTrialContext
from determined.keras._line import keras_line
from determined.keras._step_variables import create_before_tracing
from determined.keras._trial_checkpoints import MODEL_FILENAME, TrialCheckpoints, saves_whole
from determined.keras._warm_start import WarmStartError, start_from

log = logging.getLogger("determined.keras")
# The length of a context.fit over data of unknown length, until its last epoch ends.
UNTIL_THE_DATA_ENDS = 2 ** 62
GRAPH_MODE_NEEDS_KERAS_2 = ("the trial disables eager execution, which Keras 3 cannot run; "
                            "set TF_USE_LEGACY_KERAS=1 in environment.environment_variables")


class TrialError(Exception):
    """The user's trial code did something localdet cannot run; the message says what."""


class _ValidationHooks(tf.keras.callbacks.Callback):
    """Passes `evaluate`'s hooks to the user's callbacks, except `on_test_end`: the runner
    calls that itself with the `val_`-prefixed metrics, as Determined did."""

    def __init__(self, callbacks: List[Any]):
        super().__init__()
        self._callbacks = callbacks

    def on_test_begin(self, logs=None):
        for callback in self._callbacks:
            callback.on_test_begin(logs)

    def on_test_batch_begin(self, batch, logs=None):
        for callback in self._callbacks:
            callback.on_test_batch_begin(batch, logs)

    def on_test_batch_end(self, batch, logs=None):
        for callback in self._callbacks:
            callback.on_test_batch_end(batch, logs)


@dataclass
class FitOptions:
    """What `context.fit` adds to a run: Keras's epochs, validation at epoch ends, and the
    `History` it returns. Epochs count passes over the training data (or
    `steps_per_epoch` batches); they set the length only when the searcher sets none."""

    epochs: int = 1
    initial_epoch: int = 0
    steps_per_epoch: Optional[int] = None
    validation_freq: int = 1
    validation_batch_size: Optional[int] = None
    history: Any = None


def _traced(function: Any) -> Any:
    """The traced function of an iterator that a Keras train or test function runs: Keras
    2's is one; Keras 3's TensorFlow trainer wraps one (`multi_step_on_iterator`) in a
    Python function. None where it is neither (run_eagerly, another Keras version's form)."""
    if hasattr(function, "get_concrete_function"):
        return function
    names = getattr(getattr(function, "__code__", None), "co_freevars", ())
    cells = dict(zip(names, getattr(function, "__closure__", None) or (), strict=False))
    cell = cells.get("multi_step_on_iterator")
    inner = cell.cell_contents if cell is not None else None
    return inner if hasattr(inner, "get_concrete_function") else None


def prepare_process(info: TrialInfo) -> None:
    """What every training process needs before the model is built: folders, TensorBoard's
    place, and seeded random generators."""
    info.trial_dir.mkdir(parents=True, exist_ok=True)
    os.environ[TENSORBOARD_DIR_VAR] = str(info.trial_dir / "tensorboard")
    if _graph_mode.active() and keras_line() != "keras2":
        raise TrialError(GRAPH_MODE_NEEDS_KERAS_2)
    try:  # before anything starts TensorFlow's runtime: it may add logical devices
        engine = _engine.start(keras_line())
    except _engine.EngineError as error:
        raise TrialError(str(error)) from None
    if engine.describe():
        print(f"[trial {info.trial_id}] {engine.describe()}", flush=True)
    if keras_line() == "keras2":
        # Keras 2 dropout otherwise draws from stateful ops whose state no checkpoint
        # can hold; generator-backed layers keep it in variables.
        tf.keras.backend.experimental.enable_tf_random_generator()
    tf.keras.utils.set_random_seed(info.seed)  # Python, NumPy and TensorFlow
    if _graph_mode.active():  # its random ops draw from the graph's seed, set just now
        return
    _state.seed_tf_global_generator(info.seed)
    # A custom train_step's unseeded tf.random draws come from that generator, so resume.
    _graph_random.install()


def _apply_session_config(config: Any) -> None:
    if config is None:
        return
    tf.config.set_soft_device_placement(config.allow_soft_placement)
    try:  # only possible before TensorFlow has run anything
        if config.intra_op_parallelism_threads:
            tf.config.threading.set_intra_op_parallelism_threads(
                config.intra_op_parallelism_threads)
        if config.inter_op_parallelism_threads:
            tf.config.threading.set_inter_op_parallelism_threads(
                config.inter_op_parallelism_threads)
    except RuntimeError as error:
        log.warning("session_config threading not applied: %s", error)


class TrialController(TrialCheckpoints):
    """Trains one trial's model to its length. Built from a `TFKerasTrial` class
    (`for_trial_class`) or from what `context.fit` was given (`fit`)."""

    def __init__(self, info: TrialInfo, reporter: TrialReporter, context: TFKerasTrialContext,
                 model: Any, train_loader: Any, validation_loader: Any,
                 callbacks: List[Any], *, batch_size: Optional[int] = None,
                 fit: Optional[FitOptions] = None):
        self.info = info
        self.reporter = reporter
        self.context = context
        self.model = model
        self.train_loader = train_loader
        self.validation_loader = validation_loader
        self.user_callbacks = list(callbacks)
        self.explicit_batch_size = batch_size
        self.fit = fit
        self.engine = _engine.current()
        self.distributed = context.distributed
        # With several processes only the chief (rank 0) records: metrics, checkpoints, the
        # length, heartbeats; its decisions (pause, stop) are broadcast to the others.
        self.is_chief = self.distributed.rank == 0
        self.target = info.target_batches
        self.scheduling_unit = info.scheduling_unit
        self.validation_period = info.validation_period
        self.checkpoint_period = info.checkpoint_period
        self.last_validation = -1
        self.last_validation_metrics: Dict[str, float] = {}
        self.last_checkpoint = -1
        self.batches_trained = 0
        self.epochs_completed = fit.initial_epoch if fit else 0
        self.paused = False
        self.train_stream: Optional[_data.TrainingStream] = None
        # Set at the first checkpoint that found the pipeline's iterator cannot be saved.
        self.position_only = False
        # context.fit over data of unknown length: an epoch is one pass, ended by the data.
        self.epochs_end_with_data = False
        self.epoch_start_batch = 0
        self._counted_pass = 0  # on several processes: batches in one pass, counted once
        self._workload_began_at = 0
        self._restore_dir: Optional[Path] = None
        # Eager execution disabled by the trial's code: batches go through Keras's session.
        self.graph_mode = _graph_mode.active()
        self._graph_step: Optional[_graph_mode.TrainStep] = None
        # The launch's timeline (reporter.record_phase): when the data's set-up began (its
        # loaders, in for_trial_class), and when the last phase noted ended.
        self._data_began: Optional[float] = None
        self._last_mark = time.time()
        self._train_function_made: Optional[float] = None
        self._workload_t = self._last_mark
        self._check_model()
        self._check_loaders()

    @classmethod
    def for_trial_class(cls, trial_class: type, info: TrialInfo,
                        reporter: TrialReporter) -> "TrialController":
        began = time.time()
        prepare_process(info)
        context = TFKerasTrialContext(info)
        trial = trial_class(context)
        _apply_session_config(trial.session_config())
        model = trial.build_model()
        if isinstance(model, tf.keras.Model) and not any(model is m for m in context.models):
            raise TrialError("build_model() must wrap the model with "
                             "self.context.wrap_model(model) before compiling it")
        callbacks = list(trial.keras_callbacks() or [])
        built = time.time()
        reporter.record_phase("model_built", began, built, None)
        controller = cls(info, reporter, context, model, trial.build_training_data_loader(),
                         trial.build_validation_data_loader(), callbacks)
        controller._data_began = built  # data_ready ends once its streams are made too
        return controller

    def _note(self, phase: str, started: float, details: Optional[Dict[str, Any]] = None
              ) -> float:
        """Note a phase of this launch's timeline from `started` to now (a rank other than
        the chief's reporter records nothing); returns now."""
        ended = time.time()
        self.reporter.record_phase(phase, started, ended, details)
        self._last_mark = ended
        return ended

    # -- set-up -------------------------------------------------------------------------
    def _check_model(self) -> None:
        where = "context.fit()" if self.fit else "build_model()"
        if not isinstance(self.model, tf.keras.Model):
            raise TrialError(f"{where} got {type(self.model).__name__}; it needs a "
                             "tf.keras.Model")
        if getattr(self.model, "optimizer", None) is None:
            raise TrialError(f"{where} needs a compiled model: call model.compile(...) "
                             "first")
        if self.graph_mode:
            self._check_graph_mode()

    def _check_graph_mode(self) -> None:
        if keras_line() != "keras2":
            raise TrialError(GRAPH_MODE_NEEDS_KERAS_2)
        if self.distributed.size > 1:
            raise TrialError("a trial that disables eager execution trains on one slot here; "
                             "set resources.slots_per_trial to 1, or remove "
                             "disable_eager_execution()")
        if not saves_whole(self.model):
            raise TrialError("a subclassed model cannot be checkpointed with eager execution "
                             "disabled; build a Functional or Sequential model, or remove "
                             "disable_eager_execution()")

    def _check_loaders(self) -> None:
        for name, loader in (("training", self.train_loader),
                             ("validation", self.validation_loader)):
            if isinstance(loader, tf.data.Dataset) and not self._wrapped_upstream(loader):
                log.warning("the %s tf.data.Dataset was not wrapped with "
                            "context.wrap_dataset(); it will not be sharded across slots", name)

    def _wrapped_upstream(self, dataset: Any) -> bool:
        """Whether `dataset` or one it was made from (`wrap_dataset(d).batch(n)`, as
        Determined's examples wrote it) was wrapped."""
        pending, seen = [dataset], set()
        while pending:
            current = pending.pop()
            if id(current) in seen:
                continue
            seen.add(id(current))
            if self.context.is_wrapped_dataset(current):
                return True
            inputs = getattr(current, "_inputs", None)
            pending.extend(inputs() if callable(inputs) else [])
        return False

    def _batch_size(self) -> int:
        """The per-slot batch size, needed only to batch NumPy data."""
        if self.explicit_batch_size:
            return self.explicit_batch_size
        if "global_batch_size" in self.info.hparams:
            size = self.distributed.size
            if self.context.get_global_batch_size() % size:
                raise TrialError(f"global_batch_size {self.context.get_global_batch_size()} "
                                 f"does not split evenly over {size} processes; make it a "
                                 "multiple of resources.slots_per_trial")
            return self.context.get_per_slot_batch_size()
        if all(isinstance(loader, tf.data.Dataset) or _data.is_sequence(loader)
               for loader in (self.train_loader, self.validation_loader)
               if loader is not None):
            return 0
        raise TrialError("NumPy data loaders need a 'global_batch_size' hyperparameter "
                         "to batch the data; add it to the experiment config")

    def _optimizers(self) -> List[Any]:
        optimizers = list(self.context.optimizers)
        if not any(o is self.model.optimizer for o in optimizers):
            optimizers.insert(0, self.model.optimizer)
        return optimizers

    def _batches_per_epoch(self) -> int:
        if self.fit and self.fit.steps_per_epoch:
            return self.fit.steps_per_epoch
        records = int(self.info.config.get("records_per_epoch") or 0)
        if records and self.explicit_batch_size:
            global_batch = self.explicit_batch_size * self.context.distributed.size
            return max(1, math.ceil(records / global_batch))
        if records and "global_batch_size" in self.info.hparams:
            return max(1, math.ceil(records / self.context.get_global_batch_size()))
        if self._counted_pass:
            return self._counted_pass
        return (self.train_stream.batches_per_pass or 0) if self.train_stream else 0

    def _read_pass_by_pass(self) -> bool:
        """context.fit given epochs and no length, over a tf.data.Dataset of unknown length
        (a generator, a filter): as in Keras, an epoch ends where the data does. On several
        processes, whose passes must end together, one pass is counted instead (the
        shortest rank's) and stands for every epoch's length."""
        if not self.fit or self.target or self._batches_per_epoch() \
                or not _data.has_unknown_length(self.train_loader):
            return False
        if self.distributed.size == 1:
            return True
        self._counted_pass = min(self.distributed.allgather(
            _engine.count_batches(self._training_part())))
        return False

    def _set_length_from_epochs(self, fit: FitOptions) -> None:
        """The searcher set no length: train the epochs `context.fit` was given."""
        per_epoch = self._batches_per_epoch()
        if not per_epoch:
            raise TrialError("context.fit() cannot count epochs over endless data (a repeated "
                             "dataset, a PyDataset without a length); pass steps_per_epoch=, "
                             "or set searcher.max_length in the experiment config")
        self.target = max(0, fit.epochs - fit.initial_epoch) * per_epoch
        if self.is_chief:
            self.reporter.set_target_batches(self.target)

    # -- the loop -----------------------------------------------------------------------
    def run(self) -> None:
        """Train to the target, step by step, on one iterator over the training stream.

        Our own loop rather than `model.fit`: it owns the data iterator (so its position can
        be checkpointed), ends workloads anywhere, and reads metrics only at boundaries, so
        the steps between run as fast as in a bare `fit`.
        """
        began = self._data_began or time.time()
        restoring = time.time()
        state = self._restore(self.info.latest_checkpoint) if self.info.latest_checkpoint else None
        if state is None and self.info.warm_start_checkpoint:
            self._warm_start(self.info.warm_start_checkpoint)
        if self.info.latest_checkpoint or self.info.warm_start_checkpoint:
            self._note("restore", restoring, {"uuid": self.info.latest_checkpoint
                                              or self.info.warm_start_checkpoint})
        fit_config = self.context.fit_config
        workers = {key: fit_config.get(key)
                   for key in ("workers", "use_multiprocessing", "max_queue_size")}
        self.epochs_end_with_data = self._read_pass_by_pass()
        # A checkpoint without the iterator's own (its pipeline has a stateful op) resumes
        # by position, as does every stream on several slots (a distributed iterator
        # cannot be checkpointed) and in graph mode (its v1 iterator has none).
        by_position = state is not None and not state["iterator_checkpoint"]
        self.position_only = by_position
        if by_position and isinstance(self.train_loader, tf.data.Dataset) \
                and self.engine.iterator_checkpoints and not self.graph_mode:
            print(f"[trial {self.info.trial_id}] the training data resumes by position: its "
                  f"pipeline is rebuilt and read up to where training stopped", flush=True)
        self.train_stream = _data.training_stream(
            self._training_part(), self._batch_size(), self.info.seed,
            start_batch=self.batches_trained - (
                self.epoch_start_batch if self.epochs_end_with_data else 0),
            shuffle=fit_config.get("shuffle", True),
            part=(self.distributed.rank, self.distributed.size),
            tf_data_resume=("iterator" if self.engine.iterator_checkpoints
                            and not self.graph_mode and not by_position else "skip"),
            repeat=not self.epochs_end_with_data, **workers)
        validation_batch_size = (self.fit and self.fit.validation_batch_size) or self._batch_size()
        # No validation data: a script's own fit may have none (_unchanged_controller).
        self.validation_data: Any = None if self.validation_loader is None else \
            _data.validation_stream(self.validation_loader, validation_batch_size, **workers)
        if self.graph_mode and self.validation_data is not None:
            self.validation_data = _graph_mode.Batches(self.validation_data)
        if self.epochs_end_with_data:
            self.target = UNTIL_THE_DATA_ENDS
        elif self.fit and not self.target:
            self._set_length_from_epochs(self.fit)
        self._note("data_ready", began)
        try:
            self._train(state, self.train_stream)
        finally:
            ending = self._last_mark
            self.train_stream.close()
            _data.close_workers()
            self.reporter.wait_for_checkpoints()
            if self._restore_dir is not None:
                shutil.rmtree(self._restore_dir, ignore_errors=True)
            self._note("end", ending, {"batches": self.batches_trained,
                                       "paused": self.paused})

    def _warm_start(self, uuid: str) -> None:
        """A trial with no checkpoint of its own starts from searcher.source_checkpoint_uuid:
        its weights, optimizer and generator states; at batch 0 (`_warm_start`)."""
        try:
            start_from(uuid, self.reporter, self.model, self._optimizers(),
                       self.info.trial_dir, self.info.trial_id)
        except WarmStartError as error:
            raise TrialError(str(error)) from None

    def _training_part(self) -> Any:
        """The training data as this rank reads it: NumPy arrays whole (the stream takes
        this rank's rows of every global batch), a bare Sequence's every size-th batch."""
        loader, size = self.train_loader, self.distributed.size
        if size == 1:
            return loader
        if isinstance(loader, tuple):
            return _sharding.whole(loader)
        if _data.is_sequence(loader) and not isinstance(
                loader, (_sharding.ShardedSequence, _data.SequenceAdapter)):
            return _sharding.ShardedSequence(loader, self.distributed.rank, size)
        return loader

    def _agreed(self, value: Any) -> Any:
        """The chief's value, on every rank."""
        return self.distributed.broadcast(value) if self.distributed.size > 1 else value

    def _finish(self) -> None:
        # Whatever ended training (the length, a stop request, a restart with nothing left
        # to train), the trial ends checkpointed and validated where it stopped; at the end
        # of its length Determined checkpoints before it validates.
        if self.last_checkpoint != self.batches_trained:
            self.checkpoint()
        if self.last_validation != self.batches_trained:
            self.validate()

    def _weighed(self, dataset: Any) -> Any:
        class_weight = self.context.fit_config.get("class_weight")
        return _data.with_class_weight(dataset, class_weight) if class_weight else dataset

    def _train(self, state: Optional[Dict[str, Any]], stream: _data.TrainingStream) -> None:
        dataset = self._weighed(stream.dataset)
        try:
            self.engine.prepare(self.model, dataset)
        except _engine.EngineError as error:
            raise TrialError(str(error)) from None
        if type(self.engine) is _engine.Single and not self.graph_mode:
            create_before_tracing(self.model, dataset.element_spec)  # one trace, not two
        self.iterator = (_graph_mode.Batches(dataset) if self.graph_mode
                         else self.engine.training_iterator(dataset))
        if state and stream.position_in_iterator:
            tf.train.Checkpoint(iterator=self.iterator).read(
                state["iterator_checkpoint"]).assert_consumed()
        if started_ahead(self.reporter) and not self.graph_mode:
            self._trace_ahead()
        await_launch(self.reporter)  # a trial started ahead waits here for its slot
        self._last_mark = time.time()
        remaining = self.target - self.batches_trained
        per_epoch = self._batches_per_epoch()
        verbose = self.context.fit_config.get("verbose", 0)
        if self.fit:  # Keras's own epochs: the progress bar and History count them
            if self.epochs_end_with_data:
                epochs = self.fit.epochs
            else:
                epochs = (self.fit.initial_epoch + math.ceil(self.target / per_epoch)
                          if per_epoch else 1)
            callbacks = tf.keras.callbacks.CallbackList(
                self.user_callbacks + [self.fit.history], add_history=False,
                add_progbar=bool(verbose), model=self.model, verbose=verbose, epochs=epochs,
                steps=per_epoch or None)
        else:
            callbacks = tf.keras.callbacks.CallbackList(
                self.user_callbacks, add_history=True, add_progbar=bool(verbose),
                model=self.model, verbose=verbose, epochs=1, steps=max(remaining, 0))
        self.model.stop_training = False
        callbacks.on_train_begin()
        # Saved callback states go in only now: Keras's own callbacks reset themselves in
        # on_train_begin, and it must not undo a resumed trial's state (Determined's order).
        if state:
            self._load_callback_states(state["callbacks"])
        if remaining > 0:
            self._train_batches(callbacks, per_epoch)
        if not self.paused:
            self._finish()
        callbacks.on_train_end()

    def _trace_ahead(self) -> None:
        """Trace the train and test steps while the slot is busy (a trial started ahead),
        so that its first batch and first validation only run them (a few tenths of a
        second each: a short trial's largest cost but for its batches)."""
        began = time.time()
        self.model.make_train_function()
        functions = [(self.model.train_function, self.iterator)]
        if isinstance(self.validation_data, tf.data.Dataset):
            self.model.make_test_function()
            functions.append((self.model.test_function, iter(self.validation_data)))
        for function, iterator in functions:
            traced = _traced(function)
            if traced is not None:
                traced.get_concrete_function(iterator)
        self._note("steps_traced", began)

    def _load_callback_states(self, saved_states: List[Any]) -> None:
        # One state per user callback, saved by position: the same callbacks must restore.
        for callback, saved in zip(self.user_callbacks, saved_states, strict=True):
            if saved is not None and hasattr(callback, "load_state"):
                callback.load_state(saved)

    def _train_batches(self, callbacks: Any, per_epoch: int) -> None:
        """The batches up to the target, a pause or a stop. An epoch and a workload begin
        only when their first batch is about to train (epoch first), so none begins that
        trains nothing; an epoch ends after its last batch, before that workload's end."""
        train_step: Any
        if self.graph_mode:
            train_step = self._graph_step = _graph_mode.TrainStep(self.model)
        else:
            self.model.make_train_function()
            train_step = self.model.train_function
        self._train_function_made = time.time()
        self._reset_metrics()
        if self.fit:
            # A resumed fit is inside an epoch that began in another process; Keras's own
            # callbacks (the progress bar) need its on_epoch_begin all the same.
            want_epoch_begin = bool(per_epoch) or self.epochs_end_with_data
        elif per_epoch:  # every records_per_epoch; mid-epoch, the epoch began before the pause
            want_epoch_begin = self.batches_trained % per_epoch == 0
        else:  # no records_per_epoch: one epoch that never ends
            want_epoch_begin = self.batches_trained == 0
        want_workload_begin = True
        # This launch's first batch is reported once, then the check is one local flag.
        first_batch = True
        step = 0
        logs: Dict[str, Any] = {}
        while self.batches_trained < self.target:
            if want_epoch_begin:
                callbacks.on_epoch_begin(self.epochs_completed)
                want_epoch_begin = False
            if want_workload_begin:
                self._begin_workload()
                want_workload_begin = False
            if self.epochs_end_with_data:
                batch = self.batches_trained - self.epoch_start_batch
            else:
                batch = self.batches_trained % per_epoch if self.fit and per_epoch else step
            callbacks.on_train_batch_begin(batch)
            try:
                logs = train_step(self.iterator)
            except tf.errors.OutOfRangeError:
                if not self.epochs_end_with_data:
                    raise
                if self._data_ended(callbacks, logs):
                    break
                want_epoch_begin = True
                continue
            callbacks.on_train_batch_end(batch, logs)
            if first_batch:
                first_batch = False
                self._first_batch_ended(logs)
            step += 1
            self.batches_trained += 1
            if per_epoch and self.batches_trained % per_epoch == 0:
                # Determined calls on_epoch_end every records_per_epoch, with empty logs;
                # context.fit, like Keras, with the epoch's metrics and validation.
                epoch_logs = self._epoch_logs(self.fit, logs) if self.fit else {}
                callbacks.on_epoch_end(self.epochs_completed, epoch_logs)
                self.epochs_completed += 1
                want_epoch_begin = True
            if self.model.stop_training:
                # As under Determined, a callback's stop_training is a stop request: the
                # workload ends (at once on one process; at its boundary on several, where
                # the ranks agree) and the trial stops there.
                self.model.stop_training = False
                self.context.set_stop_requested(True)
            if self.is_boundary(self.batches_trained):
                self.end_workload(logs)
                want_workload_begin = True
                if self.paused or self.model.stop_training:
                    break
        if self.fit and not self.paused and per_epoch and self.batches_trained % per_epoch:
            # Training ended inside an epoch: that partial epoch still gets its History row.
            callbacks.on_epoch_end(self.epochs_completed,
                                   self._epoch_logs(self.fit, logs, always=True))

    def _data_ended(self, callbacks: Any, logs: Dict[str, Any]) -> bool:
        """A pass over data of unknown length ended: so does the epoch, as in Keras. True
        when it was the last epoch (the trial's length is now known); else the next pass
        begins."""
        assert self.fit is not None and self.train_stream is not None
        if self.batches_trained == self.epoch_start_batch:
            raise TrialError("the training data ended before its first batch of an epoch; "
                             "check that its pipeline yields data on every pass (a generator "
                             "function, not a generator object already used up)")
        callbacks.on_epoch_end(self.epochs_completed, self._epoch_logs(self.fit, logs))
        self.epochs_completed += 1
        self.epoch_start_batch = self.batches_trained
        if self.epochs_completed >= self.fit.epochs:
            self.target = self.batches_trained
            if self.is_chief:
                self.reporter.set_target_batches(self.target)
            if self._workload_began_at < self.batches_trained:  # else it trained nothing
                self.end_workload(logs)
            return True
        assert self.train_stream.each_pass is not None
        self.iterator = self.engine.training_iterator(
            self._weighed(self.train_stream.each_pass))
        return False

    def _first_batch_ended(self, logs: Dict[str, Any]) -> None:
        """Tell the reporter when this launch's first batch ended (the chief alone records),
        so a slow start (heavy imports, data loading in `__init__`) is visible."""
        if self.is_chief:
            # The step may still be running on a GPU: its results mark its true end.
            tf.nest.map_structure(np.asarray, logs)
            self.reporter.report_first_batch()
        self._note("first_batch", self._last_mark, {
            "train_function": round(self._train_function_made or 0, 3),
            "batches": self.batches_trained + 1})

    def _epoch_logs(self, fit: FitOptions, logs: Dict[str, Any],
                    always: bool = False) -> Dict[str, float]:
        """An epoch's end as `model.fit` reports it: training metrics, plus validation
        metrics every `validation_freq` epochs."""
        epoch_logs = self.engine.training_metrics(logs)
        number = self.epochs_completed + 1
        if always or number % max(1, fit.validation_freq) == 0:
            if self.last_validation != self.batches_trained:
                self.validate()
            epoch_logs.update(self.last_validation_metrics)
        return epoch_logs

    def is_boundary(self, batches_trained: int) -> bool:
        # Several ranks agree on a stop request only at a workload's end (where the chief's
        # is broadcast); ending a workload on one rank alone would leave the others waiting.
        return (batches_trained % self.scheduling_unit == 0
                or batches_trained >= self.target
                or self._due(batches_trained, self.validation_period)
                or self._due(batches_trained, self.checkpoint_period)
                or (self.distributed.size == 1 and self.context.get_stop_requested()))

    def _next_boundary(self) -> int:
        following = self.batches_trained + 1
        while not self.is_boundary(following) and following < self.target:
            following += 1
        return following

    @staticmethod
    def _due(batches_trained: int, period: int) -> bool:
        return period > 0 and batches_trained % period == 0

    def _call(self, hook: str, *args: Any) -> None:
        for callback in self.user_callbacks:
            if hasattr(callback, hook):
                getattr(callback, hook)(*args)

    def _begin_workload(self) -> None:
        self._workload_began_at = self.batches_trained
        self._workload_t = time.time()  # its training phase begins (or at the first batch's end)
        self._call("on_train_workload_begin", self.batches_trained,
                   self._next_boundary() - self.batches_trained, {})

    def end_workload(self, logs: Dict[str, Any]) -> None:
        batches_trained = self.batches_trained
        self._note("training", max(self._workload_t, self._last_mark),
                   {"batches": [self._workload_began_at, batches_trained]})
        metrics = self.engine.training_metrics(logs)
        if self.is_chief:
            self.reporter.report_training_metrics(batches_trained, metrics)
            length = "" if self.target == UNTIL_THE_DATA_ENDS else f"/{self.target}"
            print(f"[trial {self.info.trial_id}] batches {batches_trained}{length} "
                  + " ".join(f"{k}={v:.4g}" for k, v in metrics.items()), flush=True)
        self._call("on_train_workload_end", batches_trained, metrics)
        stop = self._agreed(self.context.get_stop_requested())
        self.context.set_stop_requested(stop)
        finished = batches_trained >= self.target or stop
        # Determined's order: a validation due by its period, then a checkpoint due (by its
        # period, a pause or the end); an end of training not due a validation checkpoints
        # first (_finish then validates).
        if (self._due(batches_trained, self.validation_period)
                and self.last_validation != batches_trained):
            self.validate()
        self.paused = self._agreed(not finished and self.reporter.should_pause())
        if finished or self.paused or self._due(batches_trained, self.checkpoint_period):
            self.checkpoint()
        # Validation shares the compiled metrics; the next workload averages from zero.
        self._reset_metrics()
        self.reporter.heartbeat()
        if stop:
            self.model.stop_training = True
        if self.paused:
            print(f"[trial {self.info.trial_id}] paused at {batches_trained} batches", flush=True)

    def _reset_metrics(self) -> None:
        self.model.reset_metrics()
        if self._graph_step is not None:
            self._graph_step.reset()

    def validate(self) -> Dict[str, float]:
        began = time.time()
        steps = self.context.fit_config.get("validation_steps")
        hooks = [_ValidationHooks(self.user_callbacks)] if self.user_callbacks else []
        if self.graph_mode:
            results = _graph_mode.evaluate(self.model, self.validation_data, steps, hooks)
        else:
            results = self.engine.evaluate(self.model, self.validation_data, steps, hooks)
        metrics = {f"val_{k}": v for k, v in results.items()}
        self._call("on_test_end", dict(metrics))
        if self.is_chief:
            self.reporter.report_validation_metrics(self.batches_trained, metrics)
            print(f"[trial {self.info.trial_id}] validation at {self.batches_trained} "
                  + " ".join(f"{k}={v:.4g}" for k, v in metrics.items()), flush=True)
        self.last_validation = self.batches_trained
        self.last_validation_metrics = metrics
        self._note("validation", began, {"batches": self.batches_trained})
        return metrics

    # -- checkpoints (writing and loading: TrialCheckpoints) -----------------------------
    def _restore(self, uuid: str) -> Dict[str, Any]:
        """Load a checkpoint; returns the saved trial state for the parts that can only be
        applied once training is set up (data iterator, callbacks)."""
        # Kept until training starts: the data iterator is restored from files in it.
        self._restore_dir = Path(tempfile.mkdtemp(dir=self.info.trial_dir, prefix=".restore-"))
        # The model's .h5 is read where the store keeps it, not joined into a file first.
        in_place = (MODEL_FILENAME,) if _open_h5.loads_open_h5() else ()
        directory = self.reporter.restore_checkpoint(uuid, self._restore_dir / "checkpoint",
                                                     in_place)
        try:
            try:
                state = self._load_restored(directory)
            except BaseException:
                # A corrupt file explains a failed load better than the loader's error.
                self.reporter.verify_restored_checkpoint()
                raise
            # The files' hashes were checked while they loaded; nothing trains on a bad one.
            self.reporter.verify_restored_checkpoint()
        except (_weights_file.WeightsMismatch, _state.OptimizerStateError) as error:
            raise TrialError(f"checkpoint {uuid} does not fit this trial: {error}") from None
        self.batches_trained = state["batches_trained"]
        self.epochs_completed = state["epochs_completed"]
        self.last_validation = state["last_validation"]
        self.last_checkpoint = self.batches_trained
        self.epoch_start_batch = state.get("epoch_start_batch", 0)
        if state["iterator_checkpoint"]:
            state["iterator_checkpoint"] = str(directory / state["iterator_checkpoint"])
        print(f"[trial {self.info.trial_id}] restored checkpoint {uuid} at "
              f"{self.batches_trained} batches", flush=True)
        if self.graph_mode:
            print(f"[trial {self.info.trial_id}] note: {_graph_mode.RANDOM_OPS_NOTE}",
                  flush=True)
        return state
