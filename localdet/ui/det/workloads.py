"""A trial's recorded steps as Determined's `describe` showed its workloads: one row per
batch count, with the training and validation metrics and the checkpoint taken there."""

from __future__ import annotations

from typing import Any


def workloads(db: Any, trial_id: int) -> list[dict]:
    """A trial's recorded steps, one per batch count: training and validation metrics and
    the checkpoint taken there, as Determined's describe condensed its workloads."""
    steps: dict[int, dict] = {}
    for row in db.metrics(trial_id):
        step = steps.setdefault(row.batches_trained, {"batches": row.batches_trained})
        step[row.kind] = row.metrics
        step[f"{row.kind}_time"] = row.recorded_at
    for checkpoint in db.checkpoints(trial_id=trial_id, include_deleted=True):
        step = steps.setdefault(checkpoint.batches_trained,
                                {"batches": checkpoint.batches_trained})
        step["checkpoint"] = checkpoint
    return [steps[b] for b in sorted(steps)]
