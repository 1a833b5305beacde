"""Warm starts: `searcher.source_checkpoint_uuid` and `searcher.source_trial_id`, as
Determined read them. Every trial of the experiment starts its model from that checkpoint
(its weights, optimizer state and random generators; not its batch count: the trial starts
at batch 0), until it has a checkpoint of its own.

The source is resolved once, when the experiment is recorded, as Determined resolved it when
it created the experiment: `source_trial_id` means that trial's latest checkpoint then, and a
uuid prefix the one checkpoint it names. The full uuid is written into the stored config's
`searcher.source_checkpoint_uuid` (`source_trial_id` stays as written), which is where a
trial process finds it (`determined.core.TrialInfo.warm_start_checkpoint`):

    notes = resolve(db, config)     # raises WarmStartError naming what to fix
    kept = warm_start_sources(db)   # retention keeps these while their experiments run
"""

from __future__ import annotations

from typing import Any

from localdet.records.db import CheckpointDeleted, NotFound, StateDB
from localdet.records.states import TERMINAL_STATES

UUID_KEY, TRIAL_KEY = "source_checkpoint_uuid", "source_trial_id"


class WarmStartError(ValueError):
    """The config names a warm-start source that does not exist; the message says which."""


def requested(config: dict[str, Any]) -> bool:
    searcher = config.get("searcher") or {}
    return searcher.get(UUID_KEY) is not None or searcher.get(TRIAL_KEY) is not None


def resolve(db: StateDB, config: dict[str, Any]) -> list[str]:
    """Put the full uuid of the experiment's warm-start checkpoint into
    `config["searcher"]["source_checkpoint_uuid"]`; returns notes for the user (none but
    when both keys are set). Raises WarmStartError when the source does not exist."""
    searcher = config.get("searcher") or {}
    trial_id, uuid = searcher.get(TRIAL_KEY), searcher.get(UUID_KEY)
    notes: list[str] = []
    if trial_id is not None:
        if uuid is not None:  # Determined took the trial then, and said nothing
            notes.append(f"searcher.{TRIAL_KEY} and searcher.{UUID_KEY} are both set; the "
                         f"latest checkpoint of trial {trial_id} is used, as Determined did")
        searcher[UUID_KEY] = latest_of_trial(db, trial_id)
    elif uuid is not None:
        searcher[UUID_KEY] = named(db, str(uuid))
    return notes


def latest_of_trial(db: StateDB, trial_id: int) -> str:
    try:
        trial = db.trial(trial_id)
    except NotFound:
        raise WarmStartError(f"searcher.{TRIAL_KEY} is {trial_id} but there is no trial "
                             f"{trial_id}; `localdet status EXPERIMENT` lists the trials") \
            from None
    checkpoints = db.checkpoints(trial_id=trial.id)
    if not checkpoints:
        raise WarmStartError(f"searcher.{TRIAL_KEY} is {trial_id} but trial {trial_id} has no "
                             "checkpoint to start from; name a trial that has one, or a "
                             f"checkpoint with searcher.{UUID_KEY}")
    # The newest by batches, as Determined's latest checkpoint of a trial.
    return max(checkpoints, key=lambda c: (c.batches_trained, c.created_at)).uuid


def named(db: StateDB, uuid: str) -> str:
    try:
        return db.checkpoint(uuid).uuid
    except NotFound as error:  # CheckpointDeleted too: its message names the retention
        extra = "" if isinstance(error, CheckpointDeleted) else \
            " (`localdet checkpoint import FOLDER` adds one from a folder)"
        raise WarmStartError(f"searcher.{UUID_KEY}: {error}{extra}") from None


def warm_start_sources(db: StateDB) -> set[str]:
    """The checkpoints that experiments not yet ended start their trials from: retention
    keeps them, since a trial may still be (re)launched from one."""
    terminal = sorted(TERMINAL_STATES)
    rows = db.db.execute(
        "SELECT json_extract(config, '$.searcher.source_checkpoint_uuid') FROM experiments "
        f"WHERE state NOT IN ({', '.join('?' * len(terminal))}) "
        "AND json_extract(config, '$.searcher.source_checkpoint_uuid') IS NOT NULL",
        terminal).fetchall()
    return {row[0] for row in rows}

