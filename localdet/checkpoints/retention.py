"""Which checkpoints an experiment keeps: Determined's `checkpoint_storage` rules, as a pure
function of plain data (no database, no store).

A checkpoint is kept if any rule keeps it (the defaults are the schema's, filled in by
`config.typed.CheckpointStorage`):

- ``save_trial_latest`` (default 1): each trial's N latest checkpoints (most batches);
- ``save_trial_best`` (default 1): each trial's N best checkpoints;
- ``save_experiment_best`` (default 0): the experiment's N best checkpoints;
- the latest checkpoint of a trial that is not in a terminal state (QUEUED, RUNNING, PAUSED,
  WAITING, ...), whatever the settings: the trial resumes from it.

Beyond these rules, `localdet.checkpoints.gc` keeps what other records still need: a
running experiment's warm-start source, and a checkpoint a model version names (until the
version is deleted).

"Best" ranks checkpoints by the searcher metric in the validation recorded at the same
(trial, batches_trained) as the checkpoint; a checkpoint without such a validation, or whose
value is missing, not a number or NaN, is never "best" (only "latest" can keep it). Ties are
broken deterministically: on an equal metric the checkpoint with more batches ranks first, then
the smaller uuid; on equal batches ("latest") the smaller uuid ranks first.

Example:

    keep = checkpoints_to_keep(
        {"checkpoint_storage": {"save_trial_best": 1, "save_trial_latest": 1}},
        metric="val_loss", smaller_is_better=True,
        checkpoints=[CheckpointRef("a1...", trial_id=1, batches_trained=100),
                     CheckpointRef("b2...", trial_id=1, batches_trained=200),
                     CheckpointRef("c3...", trial_id=1, batches_trained=300)],
        validations={(1, 100): {"val_loss": 0.2}, (1, 200): {"val_loss": 0.5}},
        trial_states={1: "COMPLETED"})
    assert keep == {"a1...", "c3..."}    # the best (0.2) and the latest (300 batches)

`checkpoints` may hold any objects with `uuid`, `trial_id` and `batches_trained` attributes
(`localdet.records.db.Checkpoint` rows work as they are).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Protocol

from localdet.config.typed import CheckpointStorage, ExperimentConfig
from localdet.records.states import TERMINAL_STATES


class _Checkpoint(Protocol):
    # Read-only: a frozen CheckpointRef is one too.
    @property
    def uuid(self) -> str: ...
    @property
    def trial_id(self) -> int: ...
    @property
    def batches_trained(self) -> int: ...


@dataclass(frozen=True)
class CheckpointRef:
    """What retention needs to know of a checkpoint."""

    uuid: str
    trial_id: int
    batches_trained: int


Config = ExperimentConfig | CheckpointStorage | Mapping[str, Any]


def _score(metrics: Mapping[str, Any] | None, metric: str) -> float | None:
    if not metrics or not metric:
        return None
    value = metrics.get(metric)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None  # a diverged trial's NaN is never best


def checkpoints_to_keep(config: Config, metric: str, smaller_is_better: bool,
                        checkpoints: Iterable[_Checkpoint],
                        validations: Mapping[tuple[int, int], Mapping[str, Any]],
                        trial_states: Mapping[int, str],
                        resume_from: Mapping[int, str | None] | None = None) -> set[str]:
    """The uuids of `checkpoints` that the experiment keeps.

    Args:
        config: the experiment config, typed or a dict (or its `checkpoint_storage`
            section).
        metric, smaller_is_better: the searcher metric and its direction.
        checkpoints: the experiment's live checkpoints.
        validations: ``{(trial_id, batches_trained): {"val_loss": 0.2, ...}}``.
        trial_states: ``{trial_id: "COMPLETED"}``; a trial missing here counts as not ended.
        resume_from: ``{trial_id: uuid}`` (`trials.latest_checkpoint`), also kept while the
            trial is not in a terminal state.
    """
    settings = CheckpointStorage.of(config)
    checkpoints = list(checkpoints)
    by_trial: dict[int, list[_Checkpoint]] = {}
    for checkpoint in checkpoints:
        by_trial.setdefault(checkpoint.trial_id, []).append(checkpoint)

    def latest_first(c: _Checkpoint) -> tuple:
        return (-c.batches_trained, c.uuid)

    sign = 1.0 if smaller_is_better else -1.0
    scores: dict[str, float] = {}  # uuid -> score, of the checkpoints that have one
    for c in checkpoints:
        score = _score(validations.get((c.trial_id, c.batches_trained)), metric)
        if score is not None:
            scores[c.uuid] = score

    def best_first(c: _Checkpoint) -> tuple:
        return (sign * scores[c.uuid], -c.batches_trained, c.uuid)

    def best(candidates: list[_Checkpoint], n: int) -> list[_Checkpoint]:
        scored = [c for c in candidates if c.uuid in scores]
        return sorted(scored, key=best_first)[:n] if n > 0 else []

    keep: set[str] = set()
    for trial_id, own in by_trial.items():
        ordered = sorted(own, key=latest_first)
        keep.update(c.uuid for c in ordered[:settings.save_trial_latest])
        keep.update(c.uuid for c in best(own, settings.save_trial_best))
        if trial_states.get(trial_id) not in TERMINAL_STATES:
            keep.add(ordered[0].uuid)  # it resumes from its latest checkpoint
    uuids = {c.uuid for c in checkpoints}
    for trial_id, resumes in (resume_from or {}).items():
        if resumes in uuids and trial_states.get(trial_id) not in TERMINAL_STATES:
            keep.add(resumes)
    keep.update(c.uuid for c in best(checkpoints, settings.save_experiment_best))
    return keep
