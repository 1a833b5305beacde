"""An order-checking callback: a small state machine over Determined's callback contract
(see `determined.keras.callbacks.Callback`). It raises at the first call that breaks the
contract, and at the trial's end checks every count against the schedule the experiment
config implies. Its counters travel through get_state/load_state, so the counts cover
every process of a paused and resumed trial."""

from __future__ import annotations

import math
from typing import Any, Dict, Optional

from determined import keras


class ContractBroken(AssertionError):
    pass


class Schedule:
    """What the experiment config makes a trial do, in batches."""

    def __init__(self, target: int, scheduling_unit: int, validation_period: int,
                 checkpoint_period: int, batches_per_epoch: int):
        self.target = target
        self.batches_per_epoch = batches_per_epoch
        self.validations = {b for b in range(1, target + 1)
                            if b % validation_period == 0} | {target}
        self.periodic_checkpoints = {b for b in range(1, target + 1)
                                     if b % checkpoint_period == 0} | {target}
        self.boundaries = [b for b in range(1, target + 1)
                           if b % scheduling_unit == 0 or b % validation_period == 0
                           or b % checkpoint_period == 0 or b == target]
        self.epochs_begun = math.ceil(target / batches_per_epoch)
        self.epochs_ended = target // batches_per_epoch


class OrderCheck(keras.callbacks.Callback):
    def __init__(self, schedule: Schedule):
        super().__init__()
        self.schedule = schedule
        # Saved across pauses.
        self.saved: Dict[str, Any] = {
            "batches": 0, "processes": 0, "epochs_begun": 0, "epochs_ended": 0,
            "in_epoch": False, "epoch_batches": 0, "workloads": 0, "validations": [],
            "checkpoints": [], "loaded": 0,
        }
        # This process only.
        self.last = "created"
        self.in_workload = False
        self.in_test = False
        self.workload_end_at: Optional[int] = None
        self.state_taken_at: Optional[int] = None
        self.ended = False

    # -- helpers --------------------------------------------------------------------
    def _fail(self, hook: str, why: str) -> None:
        raise ContractBroken(f"callback contract broken at {hook} (after {self.last}, "
                             f"batch {self.saved['batches']}): {why}")

    def _require(self, hook: str, condition: bool, why: str) -> None:
        if not condition:
            self._fail(hook, why)

    def _enter(self, hook: str) -> None:
        self._require(hook, self.last != "created" or hook == "on_train_begin",
                      "on_train_begin must come first")
        self._require(hook, not self.ended, "nothing may follow on_train_end")
        self.last = hook

    # -- the hooks --------------------------------------------------------------------
    def on_train_begin(self, logs=None):
        self._require("on_train_begin", self.last == "created", "on_train_begin twice")
        self._enter("on_train_begin")
        self.saved["processes"] += 1

    def load_state(self, state):
        self._require("load_state", self.last == "on_train_begin",
                      "load_state must come right after on_train_begin")
        self.saved = dict(state)
        self.saved["processes"] += 1  # this process's on_train_begin
        self.saved["loaded"] += 1
        self.last = "load_state"

    def get_state(self):
        self._require("get_state", not self.in_workload and not self.in_test,
                      "a checkpoint inside a workload or a validation")
        self.state_taken_at = self.saved["batches"]
        # The checkpoint being written is counted in the state it holds.
        self.saved["checkpoints"] = self.saved["checkpoints"] + [self.saved["batches"]]
        return dict(self.saved)

    def on_epoch_begin(self, epoch, logs=None):
        self._enter("on_epoch_begin")
        self._require("on_epoch_begin", not self.saved["in_epoch"], "an epoch began twice")
        self._require("on_epoch_begin", not self.in_workload,
                      "an epoch must begin before the workload that trains its first batch")
        self._require("on_epoch_begin", epoch == self.saved["epochs_ended"],
                      f"epoch {epoch} began, expected {self.saved['epochs_ended']}")
        self.saved["in_epoch"] = True
        self.saved["epoch_batches"] = 0
        self.saved["epochs_begun"] += 1

    def on_train_workload_begin(self, total_batches_trained, batches_requested, logs):
        self._enter("on_train_workload_begin")
        self._require("on_train_workload_begin", not self.in_workload, "nested workloads")
        self._require("on_train_workload_begin", self.saved["in_epoch"],
                      "a workload began outside an epoch")
        self._require("on_train_workload_begin",
                      total_batches_trained == self.saved["batches"],
                      f"total_batches_trained {total_batches_trained}")
        end = total_batches_trained + batches_requested
        self._require("on_train_workload_begin", end in self.schedule.boundaries,
                      f"a workload of {batches_requested} batches ends off the schedule")
        self.in_workload = True
        self.workload_end_at = end

    def on_train_batch_begin(self, batch, logs=None):
        self._enter("on_train_batch_begin")
        self._require("on_train_batch_begin", self.in_workload, "a batch outside a workload")

    def on_train_batch_end(self, batch, logs=None):
        self._require("on_train_batch_end", self.last == "on_train_batch_begin",
                      "a batch ended that never began")
        self._enter("on_train_batch_end")
        self.saved["batches"] += 1
        self.saved["epoch_batches"] += 1

    def on_epoch_end(self, epoch, logs=None):
        self._enter("on_epoch_end")
        self._require("on_epoch_end", self.in_workload and self.saved["in_epoch"],
                      "an epoch ended outside a workload or an epoch")
        self._require("on_epoch_end", not logs, "Determined's on_epoch_end logs are empty")
        self._require("on_epoch_end",
                      self.saved["batches"] % self.schedule.batches_per_epoch == 0,
                      "an epoch ended between records_per_epoch marks")
        self.saved["in_epoch"] = False
        self.saved["epochs_ended"] += 1

    def on_train_workload_end(self, total_batches_trained, logs):
        self._enter("on_train_workload_end")
        self._require("on_train_workload_end", self.in_workload, "no workload to end")
        self._require("on_train_workload_end",
                      total_batches_trained == self.saved["batches"] == self.workload_end_at,
                      f"the workload ended at {total_batches_trained}, expected "
                      f"{self.workload_end_at}")
        self._require("on_train_workload_end", "loss" in logs, f"training metrics {logs}")
        self.in_workload = False
        self.saved["workloads"] += 1

    def on_test_begin(self, logs=None):
        self._enter("on_test_begin")
        self._require("on_test_begin", not self.in_workload and not self.in_test,
                      "a validation inside a workload or a validation")
        self.in_test = True

    def on_test_end(self, logs=None):
        self._enter("on_test_end")
        self._require("on_test_end", self.in_test, "on_test_end without on_test_begin")
        self._require("on_test_end", logs and all(k.startswith("val_") for k in logs),
                      f"validation metrics {logs}")
        self._require("on_test_end", self.saved["batches"] in self.schedule.validations,
                      "a validation off the schedule")
        self._require("on_test_end", self.saved["batches"] not in self.saved["validations"],
                      "two validations at the same batch")
        self.in_test = False
        self.saved["validations"] = self.saved["validations"] + [self.saved["batches"]]

    def on_checkpoint_end(self, checkpoint_dir):
        self._enter("on_checkpoint_end")
        self._require("on_checkpoint_end", self.state_taken_at == self.saved["batches"],
                      "on_checkpoint_end without the checkpoint's get_state before it")
        self.state_taken_at = None

    def on_train_end(self, logs=None):
        self._require("on_train_end", not self.in_workload,
                      "on_train_end inside a workload (a workload began and trained nothing)")
        self._require("on_train_end", not self.in_test, "on_train_end inside a validation")
        if self.saved["in_epoch"]:
            self._require("on_train_end", self.saved["epoch_batches"] > 0,
                          "an epoch began and trained nothing")
        self._enter("on_train_end")
        self.ended = True
        checkpoints = self.saved["checkpoints"]
        self._require("on_train_end", checkpoints and checkpoints[-1] == self.saved["batches"],
                      "the process ended without a checkpoint where it stopped")
        if self.saved["batches"] == self.schedule.target:
            self._check_counts()

    def _check_counts(self) -> None:
        s, saved = self.schedule, self.saved
        pauses = saved["processes"] - 1

        def equal(what, got, expected):
            self._require("on_train_end", got == expected,
                          f"{what}: {got}, the schedule implies {expected}")

        equal("loaded states", saved["loaded"], pauses)
        equal("workloads", saved["workloads"], len(s.boundaries))
        equal("epochs begun", saved["epochs_begun"], s.epochs_begun)
        equal("epochs ended", saved["epochs_ended"], s.epochs_ended)
        equal("validations", saved["validations"], sorted(s.validations))
        checkpoints = saved["checkpoints"]
        equal("repeated checkpoints", len(checkpoints), len(set(checkpoints)))
        self._require("on_train_end", s.periodic_checkpoints <= set(checkpoints),
                      f"checkpoints {checkpoints} miss {sorted(s.periodic_checkpoints)}")
        extra = set(checkpoints) - s.periodic_checkpoints
        self._require("on_train_end", len(extra) <= pauses and extra <= set(s.boundaries),
                      f"checkpoints {sorted(extra)} beyond the schedule and {pauses} pauses")
        print(f"callback contract held: {saved['processes']} processes, "
              f"{saved['workloads']} workloads, {len(checkpoints)} checkpoints", flush=True)
