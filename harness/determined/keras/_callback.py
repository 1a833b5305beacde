"""Determined 0.38's Keras callbacks for a plain `model.fit` under `det.core.init()`.

    info = det.get_cluster_info()
    distributed, strategy = det.core.DistributedContext.from_tf_config()
    with det.core.init(distributed=distributed) as core_context:
        with strategy.scope():
            model = build_and_compile()
        model.fit(x, y, epochs=20, validation_data=(vx, vy), callbacks=[
            det.keras.DeterminedCallback(core_context, checkpoint=info.latest_checkpoint,
                                         continue_id=info.trial.trial_id),
            det.keras.TensorBoard(core_context, histogram_freq=1)])

`DeterminedCallback` reports training metrics (each epoch, or every N batches) and
validation metrics (each validation) under Keras's names (never `val_` ones: a validation's
own logs name them without it), with `epochs` and `batches` added and Keras's `batch` and
`size` left out, as Determined's did; checkpoints every `checkpoint_epochs` epochs and
whenever training ends or is preempted; and checks `should_preempt()` at each epoch's end:
`localdet pause` and the searcher's length stop the fit there, after a checkpoint. Its
status (`core_context.train.set_status`) goes training, validating, checkpointing,
restoring, finishing. With `verbose=1` Keras's progress bars give way to progress lines
that read well in a log (at most every 10% of an epoch or a validation).
Given a checkpoint, it loads the model's weights and optimizer state before the first
batch; if the checkpoint was saved under the same `continue_id`, training goes on from the
epoch after it, with the random generators as they were (a paused trial ends as if never
paused, data order included when the data is not shuffled per epoch); otherwise only the
weights are taken (a warm start, from epoch 0). Under Keras 3 a subclassed model not built
yet (its layers make their weights on its first call) is built from the first batch's spec
and loaded before that batch trains; a model never called itself (a GAN whose `train_step`
calls its sub-models) is saved and loaded with the weights that exist; and the optimizers it
holds beside its compiled one (a GAN's two) resume as they were.

A checkpoint holds the weights at `model_checkpoint`, as `save_model` writes them: under
Keras 2, TensorFlow's weight format with the optimizer in it, which
`model.load_weights(path / "model_checkpoint")` reads, as Determined documented; under
Keras 3, which reads and writes weights only by a file's suffix,
`model_checkpoint.weights.h5` (`model.load_weights(path / "model_checkpoint.weights.h5")`)
plus the optimizer's variables in `model_checkpoint.optimizer.npz`. Beside them
`callback_state` (epoch, batches, continue_id, the epochs' lengths, the random generators),
`metadata.json` (`steps_completed`) and, under localdet, the model folder as `code/`
(Determined also copied the working directory there off its cluster; that copy is not
made here). Subclass and override `save_model`/`load_model` to save another way: they are
called with the model, the path of `model_checkpoint` and `core_context.distributed`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import shutil
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, TypeAlias, Union

import numpy as np
import tensorflow as tf

from determined.keras import _state, _unbuilt

logger = logging.getLogger("determined.keras")

_Callback: TypeAlias = tf.keras.callbacks.Callback
# A base class: Keras adds its own progress bars to a fit only when no callback is one.
_ProgbarLogger: TypeAlias = tf.keras.callbacks.ProgbarLogger
_KerasTensorBoard: TypeAlias = tf.keras.callbacks.TensorBoard  # a base class

MODEL_CHECKPOINT = "model_checkpoint"
CALLBACK_STATE = "callback_state"
KERAS3_SUFFIX = ".weights.h5"


def _plain_logs(logs: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    return {k: v for k, v in (logs or {}).items() if k not in ("batch", "size")}


class _ResumeAt:
    """Keras 2's hook for the epoch a fit starts at (what BackupAndRestore sets)."""

    def __init__(self, epoch: int):
        self.epoch = epoch

    def maybe_load_initial_counters_from_ckpt(self, *_: Any, **__: Any) -> Tuple[int, int]:
        return self.epoch, 0

    def maybe_load_initial_epoch_from_ckpt(self, *_: Any, **__: Any) -> int:
        return self.epoch


class _Progress:
    """Progress lines for a log instead of Keras's bars: one at the start and then at most
    one per 10% of the epoch or validation, once its length is known."""

    def __init__(self) -> None:
        self.done = 0
        self.total: Optional[int] = None
        self._shown = -1  # the last tenth a line was printed for

    def start(self, total: Optional[int]) -> None:
        self.done, self.total, self._shown = 0, total, -1

    def step(self) -> bool:
        """Count a batch; whether a line is due."""
        self.done += 1
        return self.due()

    def due(self) -> bool:
        if not self.total:
            return False
        tenth = min(10, self.done * 10 // self.total)
        if tenth <= self._shown:
            return False
        self._shown = tenth
        return True

    def line(self, what: str, trained: int, logs: Optional[Dict[str, Any]]) -> str:
        percent = 100 * self.done // self.total if self.total else 0
        metrics = _plain_logs(logs)
        return (f"{what}: {percent}% ({self.done}/{self.total} batches), {trained} batches "
                f"trained" + (f": {metrics}" if metrics else ""))


class DeterminedCallback(_ProgbarLogger):
    """Tracking, checkpoints, pause and resume for `model.fit`; see the module docstring.

    Args:
        core_context: what `det.core.init()` returned.
        checkpoint: a checkpoint's storage id to start from (`info.latest_checkpoint`), or
            None.
        continue_id: saved with each checkpoint; the same id on load continues training
            where it stopped, another one only loads the weights (`info.trial.trial_id`).
        train_metrics_report_period: "epoch" (default) or a number of batches between
            training-metric reports.
        checkpoint_epochs: checkpoint every this many epochs (default 1; 0: only when
            training ends or is preempted).

    Do not combine it with `BackupAndRestore` or `ModelCheckpoint`. `fit`'s
    `initial_epoch` is overridden when a checkpoint continues the same run.
    """

    def __init__(self, core_context: Any, checkpoint: Optional[str],
                 continue_id: Union[int, str], *,
                 train_metrics_report_period: Union[int, str] = "epoch",
                 checkpoint_epochs: int = 1) -> None:
        # A progress-bar logger only so that Keras adds none of its own: none of its
        # behaviour is wanted, so only the plain callback's set-up runs.
        _Callback.__init__(self)
        if train_metrics_report_period != "epoch" and (
                not isinstance(train_metrics_report_period, int)
                or train_metrics_report_period < 1):
            raise ValueError(f"train_metrics_report_period must be 'epoch' or a positive "
                             f"number of batches, got {train_metrics_report_period!r}")
        self._core = core_context
        self._checkpoint = checkpoint
        self._continue_id = continue_id
        self._report_period = train_metrics_report_period
        self._checkpoint_epochs = int(checkpoint_epochs)
        self._is_chief = core_context.distributed.rank == 0
        self._is_verbose = False  # set_params says
        self._steps_completed = 0
        self._epoch = -1
        self._last_train_epoch = -1
        self._last_ckpt_epoch = -1
        # Batches per epoch and per validation, as the last ones had (for progress lines).
        self._training_length: Optional[int] = None
        self._validation_length: Optional[int] = None
        self._training = _Progress()
        self._validating = _Progress()
        self._restored: Optional[contextlib.ExitStack] = None
        self._generators: Optional[Dict[str, Any]] = None  # restored before the first batch
        # The fit's own train function while the first call of ours loads the checkpoint
        # into a model that only the first batch builds.
        self._deferred: Optional[Any] = None

    # -- saving and loading the model: override to change how ----------------------------
    def save_model(self, model: Any, path: str, distributed: Any) -> None:
        """Save the model (weights and optimizer state) at `path`. Every rank calls it: a
        multi-worker strategy needs every worker to save; only the chief's copy is kept."""
        if distributed.rank != 0:
            scratch = tempfile.mkdtemp(prefix="save-worker-model-")
            try:
                self._save_weights(model, os.path.join(scratch, MODEL_CHECKPOINT))
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            return
        self._save_weights(model, path)

    def load_model(self, model: Any, path: str, distributed: Any) -> None:
        """Load what `save_model` saved at `path` into `model`."""
        if not is_keras3_model(model):
            model.load_weights(path)
            return
        with _unbuilt.counted_as_built(model):
            model.load_weights(path + KERAS3_SUFFIX)
        optimizer_file = Path(path + ".optimizer.npz")
        if optimizer_file.exists() and getattr(model, "optimizer", None) is not None:
            with np.load(optimizer_file) as saved:
                values = [saved[f"arr_{i}"] for i in range(len(saved.files))]
            variables = _state._variables(model.optimizer)
            if len(variables) != len(values):  # saved built (a GAN's compiled one may not be)
                _state.build_optimizer(model.optimizer, model)
                variables = _state._variables(model.optimizer)
            if len(variables) != len(values):
                raise RuntimeError(f"the checkpoint holds {len(values)} optimizer variables "
                                   f"but the optimizer has {len(variables)}; was it changed?")
            for variable, value in zip(variables, values, strict=True):
                variable.assign(value)

    @staticmethod
    def _save_weights(model: Any, path: str) -> None:
        if not is_keras3_model(model):
            model.save_weights(path)  # TensorFlow's format: the optimizer is in it
            return
        with _unbuilt.counted_as_built(model):  # a GAN's: its sub-models' weights all exist
            model.save_weights(path + KERAS3_SUFFIX)
        optimizer = getattr(model, "optimizer", None)
        if optimizer is not None and _state._variables(optimizer):
            np.savez(path + ".optimizer.npz",
                     *[np.asarray(v.numpy()) for v in _state._variables(optimizer)])

    # -- what the progress-bar logger would do, none of which is wanted ------------------
    def set_params(self, params: Dict[str, Any]) -> None:
        _Callback.set_params(self, params)
        self._is_verbose = params.get("verbose", 0) not in (0, None)

    def on_predict_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        pass

    def on_predict_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        pass

    def on_predict_end(self, logs: Optional[Dict[str, Any]] = None) -> None:
        pass

    # Keras 2 calls batch hooks only on callbacks that ask for them.
    def _implements_train_batch_hooks(self) -> bool:
        return True

    def _implements_test_batch_hooks(self) -> bool:
        return self._is_verbose

    def _implements_predict_batch_hooks(self) -> bool:
        return False

    # -- Keras's hooks ----------------------------------------------------------------------
    def on_train_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        self._restored = self._load(self._checkpoint)
        self._checkpoint = None  # a second fit with this callback goes on from here

    def on_epoch_begin(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self._epoch = epoch
        if self._deferred is None:  # else after the weights, at the first batch
            self._restore_generators()  # after Keras set up the epoch's data
        if not self._is_chief:
            return
        self._core.train.set_status("training")
        if self._is_verbose:
            self._training.start((self.params or {}).get("steps") or self._training_length)
            if self._training.due():
                print(self._training.line(f"epoch {epoch + 1}", self._steps_completed, None),
                      flush=True)

    def on_train_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self._steps_completed += 1
        if self._restored is not None:  # the checkpoint's files were read by now
            self._restored.close()
            self._restored = None
        if not self._is_chief:
            return
        if isinstance(self._report_period, int) \
                and self._steps_completed % self._report_period == 0:
            self._report("training", _plain_logs(logs))
        if self._training.step() and self._is_verbose:
            print(self._training.line(f"epoch {self._epoch + 1}", self._steps_completed,
                                      logs), flush=True)

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        if self._is_chief and self._report_period == "epoch":
            self._report("training", {k: v for k, v in _plain_logs(logs).items()
                                      if not k.startswith("val_")}, epochs=epoch + 1)
        epochs = (self.params or {}).get("epochs")
        if self._is_chief and epochs:
            self._core.train.report_progress(min(1.0, (epoch + 1) / epochs))
        self._last_train_epoch = epoch
        if self._checkpoint_epochs > 0 and (epoch + 1) % self._checkpoint_epochs == 0:
            self._save(epoch)
        # After the checkpoint: a preempted fit whose epoch is saved needs no second one.
        if self._core.preempt.should_preempt():
            self.model.stop_training = True
        if self._is_chief:
            self._training_length = self._training.done or self._training_length

    def on_test_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        if not self._is_chief:
            return
        self._core.train.set_status("validating")
        if self._is_verbose:
            self._validating.start(self._validation_length)
            if self._validating.due():
                print(self._validating.line("validation", self._steps_completed, None),
                      flush=True)

    def on_test_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        if self._is_chief and self._is_verbose and self._validating.step():
            print(self._validating.line("validation", self._steps_completed, logs),
                  flush=True)

    def on_test_end(self, logs: Optional[Dict[str, Any]] = None) -> None:
        if not self._is_chief:
            return
        self._report("validation", _plain_logs(logs))
        self._validation_length = self._validating.done or self._validation_length

    def on_train_end(self, logs: Optional[Dict[str, Any]] = None) -> None:
        if self._last_train_epoch > self._last_ckpt_epoch:
            self._save(self._last_train_epoch)
        if self._deferred is not None:  # no batch ran
            self.model.train_function, self._deferred = self._deferred, None
        if self._restored is not None:
            self._restored.close()
            self._restored = None
        # Leave no resume hook behind for a later fit of the same model.
        if getattr(self.model, "_training_state", None).__class__ is _ResumeAt:
            self.model._training_state = None
        if getattr(self.model, "_initial_epoch", None) is not None:
            self.model._initial_epoch = None
        if self._is_chief:
            self._core.train.set_status("finishing")

    # -- reporting, checkpoints ---------------------------------------------------------
    def _report(self, group: str, metrics: Dict[str, Any],
                epochs: Optional[int] = None) -> None:
        metrics.setdefault("epochs", self._epoch + 1 if epochs is None else epochs)
        metrics.setdefault("batches", self._steps_completed)
        self._core.train.report_metrics(group, self._steps_completed, metrics)

    def _save(self, epoch: int) -> None:
        if self._is_chief:
            self._core.train.set_status("checkpointing")
        metadata = {"steps_completed": self._steps_completed}
        with self._core.checkpoint.store_path(metadata, shard=True) as (path, _):
            self.save_model(self.model, str(path / MODEL_CHECKPOINT), self._core.distributed)
            if self._is_chief:
                state = {"epoch": epoch, "steps_completed": self._steps_completed,
                         "continue_id": self._continue_id,
                         "training_length": self._training_length,
                         "validation_length": self._validation_length,
                         "generators": _state.capture(self.model, self._optimizers())}
                with open(path / CALLBACK_STATE, "wb") as handle:
                    pickle.dump(state, handle)
                model_dir = _model_dir()
                if model_dir is not None:  # the model folder, as every trial checkpoint has
                    shutil.copytree(model_dir, path / "code",
                                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        self._last_ckpt_epoch = epoch

    def _load(self, checkpoint: Optional[str]) -> Optional[contextlib.ExitStack]:
        if checkpoint is None:
            return None
        if self._is_chief:
            self._core.train.set_status("restoring")
        with contextlib.ExitStack() as stack:
            path = stack.enter_context(self._core.checkpoint.restore_path(checkpoint))
            state = None
            if (path / CALLBACK_STATE).exists():
                with open(path / CALLBACK_STATE, "rb") as handle:
                    state = pickle.load(handle)
                self._continue(state)
            weights = str(path / MODEL_CHECKPOINT)
            if not is_keras3_model(self.model) or _unbuilt.loadable(self.model):
                self._load_weights(weights, state)
            else:
                self._defer_load(weights, state)
            # Kept until the first batch: Keras 2 reads the optimizer's part then.
            return stack.pop_all()
        return None  # not reached: the block returns or raises

    def _load_weights(self, path: str, state: Optional[Dict[str, Any]]) -> None:
        generators = (state or {}).get("generators")
        _unbuilt.build_saved_optimizers(self.model, generators, self._optimizers())
        self.load_model(self.model, path, self._core.distributed)

    def _defer_load(self, path: str, state: Optional[Dict[str, Any]]) -> None:
        """Load at the first batch: Keras 3 loads weights only into variables that exist,
        and a subclassed model's layers make theirs on its first call, inside the first
        training step. So that step's first call builds the model from the batch's spec,
        loads and restores, and only then trains."""
        model = self.model
        if getattr(model, "train_function", None) is None:
            model.make_train_function()
        train = self._deferred = model.train_function

        def load_then_train(iterator: Any) -> Any:
            model.train_function, self._deferred = train, None
            _unbuilt.build_from(model, iterator)
            self._load_weights(path, state)
            self._restore_generators()
            return train(iterator)

        model.train_function = load_then_train

    def _optimizers(self) -> List[Any]:
        """The optimizers whose state the callback state keeps: under Keras 3 those beside
        the compiled one (Keras 2's weights file holds every one)."""
        return _unbuilt.other_optimizers(self.model) if is_keras3_model(self.model) else []

    def _restore_generators(self) -> None:
        state, self._generators = self._generators, None
        if state is None:
            return
        optimizers = self._optimizers()
        if len(state.get("optimizers", [])) != len(optimizers):
            if state.get("optimizers"):
                logger.warning("the checkpoint holds %d optimizers beside the compiled one "
                               "but the model has %d: their states were not restored",
                               len(state["optimizers"]), len(optimizers))
            state, optimizers = {**state, "optimizers": [], "learning_rates": []}, []
        try:
            _state.restore(state, self.model, optimizers)
        except (ValueError, _state.OptimizerStateError) as error:  # another model's state
            logger.warning("the random generators' and optimizers' states were not restored "
                           "(%s): the resumed run may differ", error)

    def _continue(self, state: Dict[str, Any]) -> None:
        if state.get("continue_id") != self._continue_id:
            logger.info("checkpoint saved under continue_id %r, not %r: its weights are "
                        "loaded and training starts at epoch 0", state.get("continue_id"),
                        self._continue_id)
            return
        self._steps_completed = int(state["steps_completed"])
        self._training_length = state.get("training_length")
        self._validation_length = state.get("validation_length")
        start = int(state["epoch"]) + 1
        self._last_train_epoch = self._last_ckpt_epoch = start - 1
        self._generators = state.get("generators")
        if not is_keras3_model(self.model):
            self.model._training_state = _ResumeAt(start)
        else:
            self.model._initial_epoch = start


def is_keras3_model(model: Any) -> bool:
    """Whether `model` is a Keras 3 model. Its own line, not the process's, decides how it
    is saved and resumed: a script's `import keras` is Keras 3 in a process on the Keras 2
    line unless the launch made `keras` tf_keras (a warm process does, a cold one cannot
    before the script runs)."""
    # keras.src: checked against keras 3.15 (pyproject's bound <3.16)
    return any(c.__module__.startswith("keras.src.trainers") for c in type(model).__mro__)


def weights_only_refusal(folder: Path) -> Optional[str]:
    """One sentence for a loader given a DeterminedCallback checkpoint, which holds the
    model's weights but not the model; None for any other folder."""
    if (folder / f"{MODEL_CHECKPOINT}.index").is_file():
        weights, line = folder / MODEL_CHECKPOINT, "Keras 2"
    elif (folder / f"{MODEL_CHECKPOINT}{KERAS3_SUFFIX}").is_file():
        weights, line = folder / f"{MODEL_CHECKPOINT}{KERAS3_SUFFIX}", "Keras 3"
    else:
        return None
    return (f"'{folder}' is a DeterminedCallback checkpoint, which holds the model's weights "
            f"({line}) but not the model: build the model in your code and read them with "
            f"model.load_weights('{weights}')")


def _model_dir() -> Optional[Path]:
    """The trial's model folder under localdet (None off it, where the core context may be
    anything, a test's mock included)."""
    from determined import _info

    if _info.get_cluster_info() is None:
        return None
    return Path(_info.process_reporter().trial_info().model_dir)


class TensorBoard(_KerasTensorBoard):
    """Keras's TensorBoard callback, writing into the trial's TensorBoard folder
    (`core_context.train.get_tensorboard_path()`, which `localdet tensorboard EXP` reads);
    a `log_dir` given is then ignored with a warning. Off localdet, where the context has
    no such folder, it writes to `log_dir` as Keras's does.

        det.keras.TensorBoard(core_context, update_freq="batch", histogram_freq=1)
    """

    def __init__(self, core_context: Any, *args: Any, **kwargs: Any) -> None:
        path = core_context.train.get_tensorboard_path()
        if path:
            if "log_dir" in kwargs:
                logger.warning("det.keras.TensorBoard: log_dir=%s is ignored; events go to "
                               "%s", kwargs.pop("log_dir"), path)
            elif args:
                logger.warning("det.keras.TensorBoard: log_dir=%s is ignored; events go to "
                               "%s", args[0], path)
                args = args[1:]
            args = (str(path), *args)
        super().__init__(*args, **kwargs)
