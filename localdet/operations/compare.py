"""Experiments side by side: each experiment's best trial (by its own searcher metric), its
hyperparameters, its validation metrics where the searcher metric was best, how far it
trained, and its validation curve of the searcher metric. What `localdet compare 3 7` and
the dashboard's compare page show.

    found = compare(db, [3, 7])
    found["experiments"][0]
    # {"id": 3, "name": "mnist", "metric": "val_loss", "best_trial": 12, "best_metric": 0.08,
    #  "best_batches": 900, "batches": 1000, "hparams": {"lr": 0.01, ...},
    #  "validation": {"val_loss": 0.08, "val_accuracy": 0.97},
    #  "curve": [[100, 0.5], ..., [1000, 0.09]], ...}
    found["hyperparameters"], found["metrics"]   # the union of names, for the rows

An experiment without a validated trial is still a column, its best trial None.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from localdet.operations.errors import OperationError
from localdet.operations.facts import experiment_facts, flat_hparams
from localdet.records.db import Experiment, StateDB
from localdet.records.states import ExperimentKind


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)


def _ids(experiment_ids: Iterable[int]) -> list[int]:
    ids = list(dict.fromkeys(int(i) for i in experiment_ids))  # repeats once, in order
    if len(ids) < 2:
        shown = f"only {ids[0]}" if ids else "none"
        raise OperationError(f"comparing needs two or more experiments ({shown} given); "
                             "name them, e.g. `localdet compare 3 7`")
    return ids


def best_trial(db: StateDB, experiment: Experiment) -> dict[str, Any]:
    """One experiment's column: its best trial's facts and curve."""
    facts = experiment_facts(db, experiment)
    column: dict[str, Any] = {
        key: facts[key] for key in ("id", "name", "state", "searcher", "metric",
                                    "smaller_is_better", "best_trial", "best_metric")}
    column.update(num_trials=len(facts["trials"]), hparams={}, validation={}, curve=[],
                  best_batches=None, batches=None)
    trial = next((t for t in facts["trials"] if t["id"] == facts["best_trial"]), None)
    if trial is None:
        return column
    rows = [(row.batches_trained, row.metrics) for row in db.metrics(trial["id"], "validation")]
    curve = [(batches, metrics[experiment.metric]) for batches, metrics in rows
             if _finite(metrics.get(experiment.metric))]
    better = min if experiment.smaller_is_better else max
    at = better(range(len(curve)), key=lambda i: curve[i][1])  # the first of equal bests
    best_batches = curve[at][0]
    column.update(
        hparams=flat_hparams(trial["hparams"]), batches=trial["batches_trained"],
        best_batches=best_batches, curve=[[b, v] for b, v in curve],
        validation=next(m for b, m in rows if b == best_batches))
    return column


def compare(db: StateDB, experiment_ids: Iterable[int]) -> dict[str, Any]:
    """The experiments' columns, in the order given, with the union of their hyperparameter
    and validation metric names. Raises OperationError (fewer than two, or a job) or
    NotFound (an unknown id)."""
    ids = _ids(experiment_ids)
    experiments = [db.experiment(i) for i in ids]
    for experiment in experiments:
        if experiment.kind == ExperimentKind.JOB:
            raise OperationError(f"{experiment.id} is a job, not an experiment; compare "
                                 "experiments (`localdet status` lists them)")
    columns = [best_trial(db, experiment) for experiment in experiments]
    hyperparameters = sorted({name for c in columns for name in c["hparams"]})
    searcher_metrics = list(dict.fromkeys(c["metric"] for c in columns))
    others = sorted({name for c in columns for name in c["validation"]} - set(searcher_metrics))
    return {"experiments": columns, "hyperparameters": hyperparameters,
            "metrics": searcher_metrics + others}
