"""determined.keras.callbacks: Keras callbacks with the hooks a Determined trial adds, and
Determined's stateful versions of Keras's `EarlyStopping`, `ReduceLROnPlateau` and
`TensorBoard`.

    from pathlib import Path
    from determined import keras

    class Saver(keras.callbacks.Callback):
        def on_checkpoint_end(self, checkpoint_dir):
            Path(checkpoint_dir, "notes.txt").write_text("saved")

    class MyTrial(keras.TFKerasTrial):
        ...
        def keras_callbacks(self):
            return [Saver(), keras.callbacks.EarlyStopping(patience=3),
                    keras.callbacks.TensorBoard()]

How the trial runner drives the callbacks `keras_callbacks()` returns (the contract these
classes are written for):

- Training runs in the runner's own loop. The callbacks get `set_model(model)` with the
  trial's model, `on_train_begin`, `on_train_batch_begin/end` and `on_train_end` through a
  `tf.keras.callbacks.CallbackList`. `on_train_end` ends every run of the process, a pause
  included, not only the trial's last batch.
- `on_epoch_begin(epoch, {})` / `on_epoch_end(epoch, {})` every `records_per_epoch`
  records, epochs counted from 0 over the whole trial (across pauses), with EMPTY logs,
  as Determined did.
- `on_train_workload_begin(total_batches_trained, batches_requested, {})` and
  `on_train_workload_end(total_batches_trained, logs)` around each chunk of training;
  `logs` are the workload's averaged training metrics (`{"loss": .., "accuracy": ..}`).
- Validation: `model.evaluate(...)` shows the callbacks `on_test_begin` and
  `on_test_batch_begin/end`; then the runner itself calls `on_test_end(logs)` once, with
  the validation metrics prefixed with `val_` (`{"val_loss": 0.3, "val_accuracy": 0.9}`).
  `EarlyStopping` and `ReduceLROnPlateau` decide there.
- `on_checkpoint_end(checkpoint_dir)` after each checkpoint is written; files added to the
  folder become part of the checkpoint.
- `get_state()` on every callback that has it whenever a checkpoint is written. On resume
  the runner builds the callbacks afresh from `keras_callbacks()`, calls `set_model`, then
  `load_state(state)` with the exact object `get_state` returned, BEFORE `on_train_begin`
  (which therefore must not reset what `load_state` restored).
- `$LOCALDET_TENSORBOARD_DIR` names the trial's TensorBoard folder; the runner sets it
  before building the trial.
"""

import logging

from determined.keras.callbacks._internals import (
    _DeterminedHistory,
    _DeterminedProfiler,
    _MultiplexerBase,
    _PolyLogs,
    _tf_keras_callback_get_state,
    _tf_keras_callback_load_state,
)
from determined.keras.callbacks.callback import Callback
from determined.keras.callbacks.early_stopping import EarlyStopping
from determined.keras.callbacks.progress import DeterminedProgress
from determined.keras.callbacks.reduce_lr_on_plateau import ReduceLROnPlateau, ReduceLRScheduler
from determined.keras.callbacks.tensorboard import TensorBoard

# Determined's name for the progress callback, and the module's logger (0.26.4 on).
_DeterminedProgress = DeterminedProgress
logger = logging.getLogger("determined.keras")

__all__ = ["Callback", "DeterminedProgress", "EarlyStopping", "ReduceLROnPlateau",
           "ReduceLRScheduler", "TensorBoard", "logger", "_DeterminedProgress",
           "_DeterminedHistory", "_DeterminedProfiler", "_MultiplexerBase", "_PolyLogs",
           "_tf_keras_callback_get_state", "_tf_keras_callback_load_state"]
