"""Failures that will repeat: a trial that fails the same way at the same point on two
launches in a row is not restarted again (its `max_restarts` would only repeat it), and a
sibling that then fails the same way ends at once.

"The same point" is before training its first batch (at import or setup), or, once training
has begun, the same phase (a checkpoint, a validation, training itself) after the same number
of batches: a trial whose first checkpoint fails retrains to it on every restart and fails
there again. A trial class's runner says where it failed (its failure mark); a script cannot,
so a script that fails after training keeps its restarts.

Each failed launch is recorded as a `trial_failed` event with its signature (the exception's
message line, read from the launch's part of the log: the trial runner's failure mark, or a
script's last traceback), the stage it failed in, whether it trained a batch, and the phase
and batches where it failed; a trial ended that way adds `trial_failed_fast`. The daemon
decides from these events, so a daemon restarted in between decides the same.
"""

from __future__ import annotations

import dataclasses

from localdet.paths import Layout
from localdet.processes import launcher
from localdet.records.db import StateDB, Trial

SAME_WAY = "every trial failed the same way before training"
# Where a sibling's failure says the same of this trial: the points that come whatever the
# data (a checkpoint, a validation), unlike a batch of training.
BOUNDARIES = ("checkpoint", "validation")


def events(db: StateDB, experiment_id: int, trial_id: int | None,
           kinds: tuple[str, ...]) -> list[dict]:
    return db.events(experiment_id, kinds=kinds, trial_id=trial_id)


def record(db: StateDB, layout: Layout, trial: Trial) -> launcher.Failure | None:
    """Read how the trial's latest launch failed from its part of the log, and record it
    as a `trial_failed` event; None when the log shows no exception."""
    launch = events(db, trial.experiment_id, trial.id, ("trial_launched",))[-1:]
    offset = launch[0]["payload"].get("log_offset", 0) if launch else 0
    log = layout.trial_log(trial.experiment_id, trial.id)
    failure = launcher.failure(log, offset)
    if failure is None:
        return None
    if failure.trained is None:
        # A script, or a resumed trial: its records say only whether it ever trained.
        failure = dataclasses.replace(failure, trained=trial.batches_trained > 0
                                      or trial.latest_checkpoint is not None)
    db.log_event("trial_failed", experiment_id=trial.experiment_id, trial_id=trial.id,
                 signature=failure.signature, stage=failure.stage, trained=failure.trained,
                 phase=failure.phase, batches=failure.batches)
    return failure


def repeats(db: StateDB, trial: Trial, failure: launcher.Failure) -> bool:
    """Whether the failure `record` just recorded will repeat: this trial's previous launch
    failed the same way at the same point, or a sibling already failed fast with it."""
    history = events(db, trial.experiment_id, trial.id, ("trial_launched", "trial_failed"))
    current = history[-1]["payload"] if history and history[-1]["kind"] == "trial_failed" \
        else {}
    fast = events(db, trial.experiment_id, None, ("trial_failed_fast",))
    if failure.trained:
        if current.get("phase") is None or current.get("batches") is None:
            return False  # it cannot say where it failed: it keeps its restarts
        if current["phase"] in BOUNDARIES and any(
                e["payload"]["signature"] == failure.signature
                and e["payload"].get("phase") == current["phase"] for e in fast):
            return True
    elif any(e["payload"]["signature"] == failure.signature for e in fast):
        return True
    # Two launches in a row: launched, failed (previous), launched, failed (this one).
    if [e["kind"] for e in history[-4:]] != ["trial_launched", "trial_failed"] * 2:
        return False
    previous = history[-3]["payload"]
    if previous["signature"] != failure.signature:
        return False
    if not failure.trained:
        return not previous["trained"]
    return bool(previous["trained"]) and (previous.get("phase"), previous.get("batches")) == (
        current["phase"], current["batches"])


def point_of(db: StateDB, trial: Trial) -> tuple[str, int] | None:
    """(phase, batches) of the trial's latest recorded failure, if it failed in training."""
    failed = events(db, trial.experiment_id, trial.id, ("trial_failed",))[-1:]
    if not failed or failed[0]["payload"].get("phase") is None:
        return None
    payload = failed[0]["payload"]
    return payload["phase"], payload.get("batches") or 0


def invalid_hparams(failure: launcher.Failure) -> bool:
    """The trial raised `determined.InvalidHP`: its hyperparameters cannot work, so no
    restart can help (a trial class reports the bare name, a script's traceback the full
    one)."""
    return failure.signature.split(":", 1)[0] in ("InvalidHP", "determined.errors.InvalidHP")


def import_failure_for_all(db: StateDB, experiment_id: int, failure: launcher.Failure) -> bool:
    """A failure at import is the model folder's, hence every trial's: unless one trial of
    the experiment got past it and trained."""
    return failure.stage == "import" and not any(
        t.batches_trained > 0 or t.latest_checkpoint for t in db.trials(experiment_id))


def experiment_error(db: StateDB, experiment_id: int, failed: list[Trial]) -> str | None:
    """One line when every failed trial last failed the same way before training (failed
    fast, or used up its restarts); else the first failed trial's error."""
    last: dict[int, str | None] = {}
    for event in events(db, experiment_id, None, ("trial_failed", "trial_failed_fast")):
        payload = event["payload"]
        trained = event["kind"] == "trial_failed" and payload["trained"]
        last[event["trial_id"]] = None if trained else payload["signature"]
    signatures = {last.get(t.id) for t in failed}
    if failed and len(signatures) == 1 and None not in signatures:
        return f"{SAME_WAY}: {signatures.pop()}"
    return failed[0].error if failed else None
