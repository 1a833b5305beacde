"""The rows `det e continue` changes: an ended (or paused) single-trial experiment becomes
ACTIVE again, its trial QUEUED to train on from a checkpoint to a new target, in one
transaction. The states it may leave are `states.EXPERIMENT_CONTINUATIONS` and
`states.TRIAL_CONTINUATIONS`, the one way out of a final state; whether to continue, and to
what, is `localdet.operations.lineage`'s.

    reopen(db, experiment_id=3, trial_id=5, config=config, target_batches=400,
           resume_from="3f2a...", runner="daemon", checkpoint="3f2a...", batches=200,
           overrides={"searcher.max_length.batches": 400})

A daemon then launches the trial as it launches a resumed one (from `latest_checkpoint`).
The search learns of it from the searcher event `trial_continued` (search/driver.py), and
`experiment_continued` (with the payload given) is what `describe` lists.
"""

from __future__ import annotations

import json
from typing import Any

from localdet.records.db import StateDB
from localdet.records.states import check_experiment_continuation, check_trial_continuation

CONTINUED_EVENT = "experiment_continued"
SEARCHER_EVENT = "trial_continued"


def reopen(db: StateDB, *, experiment_id: int, trial_id: int, config: dict[str, Any],
           target_batches: int, resume_from: str | None, runner: str,
           **payload: Any) -> None:
    """Raises IllegalTransition (nothing written) when the experiment or the trial is in a
    state a continuation cannot leave, and NotFound when `resume_from` is no longer a live
    checkpoint (both read in the write transaction: current)."""
    with db.atomic():
        experiment = db.experiment(experiment_id)
        trial = db.trial(trial_id)
        experiment_state = check_experiment_continuation(experiment_id, experiment.state)
        trial_state = check_trial_continuation(trial_id, trial.state)
        if resume_from is not None:
            db.checkpoint(resume_from)  # NotFound (CheckpointDeleted) if gc took it meanwhile
        db.db.table("experiments").update(experiment_id, {
            "state": experiment_state, "ended_at": None, "error": None,
            "config": json.dumps(config), "runner": runner})
        db.log_event("experiment_state", experiment_id=experiment_id, state=experiment_state,
                     error=None)
        # Its restarts start again, as Determined's continue zeroed them.
        db.db.table("trials").update(trial_id, {
            "state": trial_state, "target_batches": target_batches, "restarts": 0,
            "ended_at": None, "error": None, "stop_requested": None,
            "latest_checkpoint": resume_from})
        db.log_event("trial_state", experiment_id=experiment_id, trial_id=trial_id,
                     state=trial_state, error=None)
        db.add_searcher_event(experiment_id, SEARCHER_EVENT, request_id=trial.request_id,
                              length=target_batches)
        db.log_event(CONTINUED_EVENT, experiment_id=experiment_id, trial_id=trial_id,
                     **payload)
