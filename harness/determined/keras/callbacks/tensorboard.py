"""`TensorBoard`: Keras's TensorBoard callback, writing into the trial's TensorBoard folder.

    from determined import keras

    class MyTrial(keras.TFKerasTrial):
        ...
        def keras_callbacks(self):
            return [keras.callbacks.TensorBoard(histogram_freq=1)]

Then `tensorboard --logdir <the trial's folder>/tensorboard`.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from typing import Any, Dict, Optional, TypeAlias

import tensorflow as tf

from determined.core._reporting import TENSORBOARD_DIR_VAR
from determined.keras.callbacks.callback import Callback

FALLBACK_DIR = "tensorboard"

_KerasTensorBoard: TypeAlias = tf.keras.callbacks.TensorBoard  # a base class
log = logging.getLogger("determined.keras")


def trial_tensorboard_dir() -> str:
    """The trial's TensorBoard folder: `$LOCALDET_TENSORBOARD_DIR`, set by the trial runner,
    or `./tensorboard` outside one."""
    return os.environ.get(TENSORBOARD_DIR_VAR) or FALLBACK_DIR


class TensorBoard(_KerasTensorBoard, Callback):
    """`tf.keras.callbacks.TensorBoard`, writing into the trial's TensorBoard folder.

    Args: those of `tf.keras.callbacks.TensorBoard`, except that `log_dir` is ignored
    (with a warning): events always go to `$LOCALDET_TENSORBOARD_DIR`, which the trial
    runner sets to the trial's folder (`./tensorboard` when it is unset). Needs the
    `tensorboard` package, which TensorFlow does not install.

    Training is not organised in epochs here, so the scalars Keras writes per epoch are
    written at the end of each workload (training metrics) and each validation
    (validation metrics), under Keras's names (`train/epoch_loss`,
    `validation/epoch_loss`, ...) with the number of batches trained as their step.
    Histograms and embeddings (`histogram_freq`, `embeddings_freq`) follow the trial's
    epochs (`records_per_epoch`), and batch-level scalars (`update_freq`) continue across
    pauses under Keras 3.

    Example:

        def keras_callbacks(self):
            return [keras.callbacks.TensorBoard(update_freq=100, histogram_freq=1)]
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if importlib.util.find_spec("tensorboard") is None:
            raise ImportError("determined.keras.callbacks.TensorBoard needs the `tensorboard` "
                              "package, which TensorFlow does not install: "
                              "pip install tensorboard")
        given = kwargs.pop("log_dir", None)
        if args:
            given, args = args[0], args[1:]
        log_dir = trial_tensorboard_dir()
        if given is not None:
            log.warning("determined.keras.callbacks.TensorBoard ignores log_dir=%r; events "
                        "are written to the trial's TensorBoard folder %s", str(given), log_dir)
        super().__init__(log_dir, *args, **kwargs)
        self.batches_trained = 0
        self._model_set: Optional[Any] = None

    def set_model(self, model: Any) -> None:
        # Each validation's `evaluate` sets the model again; Keras would then open new event
        # files and write the model summary again.
        if model is self._model_set:
            return
        self._model_set = model
        super().set_model(model)

    def on_train_begin(self, logs: Optional[Dict] = None) -> None:
        super().on_train_begin(logs)
        self._global_train_batch = self.batches_trained

    def on_train_end(self, logs: Optional[Dict] = None) -> None:
        super().on_train_end(logs)  # closes the writers
        self._writers: Dict[str, Any] = {}  # a validation after training opens new ones

    def on_train_workload_begin(self, total_batches_trained: int,
                                batches_requested: Optional[int], logs: Dict) -> None:
        self.batches_trained = total_batches_trained
        if self.write_steps_per_second:
            _KerasTensorBoard.on_epoch_begin(self, 0)  # starts Keras's steps-per-second clock

    def on_train_workload_end(self, total_batches_trained: int, logs: Dict) -> None:
        self.batches_trained = total_batches_trained
        with tf.summary.record_if(True):
            self._log_epoch_metrics(total_batches_trained, dict(logs))
        self._train_writer.flush()

    def on_test_end(self, logs: Optional[Dict] = None) -> None:
        logs = dict(logs or {})
        # Keras's own evaluation_<name>_vs_iterations, under the names `evaluate` gives.
        super().on_test_end({name.removeprefix("val_"): v for name, v in logs.items()})
        # The runner's validation metrics come `val_`-prefixed (a plain `fit` writes its
        # own per-epoch ones instead): the validation counterpart of each workload's.
        validation = {name[4:]: v for name, v in logs.items() if name.startswith("val_")}
        if validation:
            with tf.summary.record_if(True), self._val_writer.as_default():
                for name, value in validation.items():
                    tf.summary.scalar(f"epoch_{name}", value, step=self.batches_trained)
            self._val_writer.flush()

    def get_state(self) -> Dict[str, Any]:
        return {"batches_trained": self.batches_trained}

    def load_state(self, state: Dict[str, Any]) -> None:
        self.batches_trained = state["batches_trained"]
