"""`Callback`: a Keras callback with the hooks a Determined trial adds.

    from pathlib import Path
    from determined import keras

    class Notes(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.validations = 0

        def on_test_end(self, logs=None):
            self.validations += 1

        def on_checkpoint_end(self, checkpoint_dir):
            Path(checkpoint_dir, "notes.txt").write_text(f"{self.validations} validations")

        def get_state(self):
            return {"validations": self.validations}

        def load_state(self, state):
            self.validations = state["validations"]
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import tensorflow as tf


class Callback(tf.keras.callbacks.Callback):
    """A `tf.keras.callbacks.Callback` that can also keep state across pause and resume and
    act on checkpoints and workloads.

    Training under Determined differs from `model.fit` in three ways:

    - `on_epoch_end` is called every `records_per_epoch` records of the experiment config,
      not at the end of a pass over the data, and always with EMPTY logs: training and
      validation are not scheduled around epochs, so no metrics can be promised there.
    - Validation metrics arrive in `on_test_end(logs)`, prefixed with `val_`
      (`{"val_loss": 0.31, "val_accuracy": 0.9}`), after every validation.
    - Keras callbacks keep no state across a pause; Determined's do, through `get_state`
      and `load_state`. That is why the stock `tf.keras` `EarlyStopping` and
      `ReduceLROnPlateau` do not work right here: use `determined.keras.callbacks`'s
      `EarlyStopping` and `ReduceLROnPlateau` (also named `ReduceLRScheduler`), which
      decide on each `on_test_end` (how often: `min_validation_period`) and survive pauses.

    The order of calls in a `TFKerasTrial`, as Determined makes them. A trial runs in one
    or more processes (one, plus one after each pause or restart); in each process:

    1. `set_model`, then `on_train_begin` once; then, only if the process resumes from a
       checkpoint, `load_state` with what `get_state` returned. `load_state` comes AFTER
       `on_train_begin`, so whatever `on_train_begin` resets, the saved state wins.
    2. Training goes in workloads. Right before the first batch of a workload,
       `on_epoch_begin(epoch)` if that batch starts an epoch, then
       `on_train_workload_begin`. Nothing begins that trains no batch: a process that
       pauses or ends at an epoch's or workload's end never begins the next one.
    3. After the last batch of an epoch: `on_epoch_end(epoch, {})`. After the last batch of
       a workload (after `on_epoch_end` when both end there): `on_train_workload_end`.
       Without `records_per_epoch`, `on_epoch_begin(0)` comes once, before the trial's
       first batch, and no epoch ever ends. A resumed process continues the epoch the
       pause interrupted: no second `on_epoch_begin` for it.
    4. After a workload's end, when due: a validation (`on_test_begin`, the
       `on_test_batch_*` hooks, then `on_test_end` with the `val_` metrics), then a
       checkpoint. A checkpoint first collects every `get_state`, then writes the files,
       then calls `on_checkpoint_end(checkpoint_dir)` (on the chief process only). A pause
       checkpoints where training stopped. At the end of the trial's length (or a stop
       request) a checkpoint that is not yet written comes before a validation that is
       not yet made.
    5. `on_train_end` last, once per process: at the trial's end, and also at every pause.

    Setting `self.model.stop_training = True` (or `context.set_stop_requested(True)`)
    stops the trial at the end of the current workload, through step 4 and 5.
    """

    def get_state(self) -> Any:
        """A picklable object representing this callback's state, saved in every checkpoint.

        When the trial continues from that checkpoint, a fresh instance of this callback
        receives the same object through `load_state`, right after `on_train_begin`.
        """
        return None

    def load_state(self, state: Any) -> None:
        """Restore what `get_state` returned when the checkpoint was written.

        Called on a resumed trial right after `on_train_begin`, before any batch,
        validation or checkpoint of that process.
        """

    def on_checkpoint_end(self, checkpoint_dir: str) -> None:
        """Called after a checkpoint is written; files added to `checkpoint_dir` are kept.

        Args:
            checkpoint_dir: The checkpoint's folder; anything written there becomes part
                of the checkpoint.
        """

    def on_train_workload_begin(self, total_batches_trained: int,
                                batches_requested: Optional[int], logs: Dict) -> None:
        """Called before a chunk of training of at most `scheduling_unit` batches.

        Args:
            total_batches_trained: Batches trained at the start of the workload.
            batches_requested: Batches the workload is expected to train.
            logs: Always an empty dict.
        """

    def on_train_workload_end(self, total_batches_trained: int, logs: Dict) -> None:
        """Called after a chunk of training.

        Args:
            total_batches_trained: Batches trained at the end of the workload.
            logs: The training metrics averaged over the workload, e.g.
                `{"loss": 0.52, "accuracy": 0.81}`.
        """
