"""Searches recorded straight through the records API (no daemon, no training), for the
tests of importances, comparisons and their dashboard pages."""

from __future__ import annotations

import math
import random
from typing import Any

from localdet.records.db import StateDB

SPACE = {
    "global_batch_size": 16,
    "lr": {"type": "log", "minval": -4, "maxval": -1},
    "dropout": {"type": "double", "minval": 0.0, "maxval": 0.5},
    "optimizer": {"type": "categorical", "vals": ["adam", "sgd"]},
}


def config(name: str, metric: str = "val_loss", smaller_is_better: bool = True,
           space: dict | None = None) -> dict[str, Any]:
    from localdet.config.experiment import parse_config

    return parse_config({
        "name": name, "entrypoint": "model_def:Trial",
        "hyperparameters": SPACE if space is None else space,
        "searcher": {"name": "random", "metric": metric, "max_trials": 20,
                     "smaller_is_better": smaller_is_better,
                     "max_length": {"batches": 30}}}).config


def record_experiment(db: StateDB, name: str, trials: list[tuple[dict, list[float]]],
                      metric: str = "val_loss", smaller_is_better: bool = True,
                      space: dict | None = None) -> int:
    """A completed random search whose trials have these hyperparameters and validate the
    metric to these values (one every 10 batches, `loss` beside it in training)."""
    experiment_id = db.create_experiment(
        name=name, description="", config=config(name, metric, smaller_is_better, space),
        original_config="", searcher="random", metric=metric,
        smaller_is_better=smaller_is_better, experiment_seed=1, model_dir="/nowhere")
    for request_id, (hparams, values) in enumerate(trials, start=1):
        add_trial(db, experiment_id, request_id, hparams, values, metric)
    db.set_experiment_state(experiment_id, "COMPLETED")
    return experiment_id


def add_trial(db: StateDB, experiment_id: int, request_id: int, hparams: dict,
              values: list[float], metric: str = "val_loss") -> int:
    trial_id = db.create_trial(experiment_id=experiment_id, request_id=request_id,
                               hparams=hparams, seed=request_id, target_batches=10 * len(values))
    for step, value in enumerate(values, start=1):
        db.record_metrics(trial_id, "training", 10 * step, {"loss": value + 0.1})
        db.record_metrics(trial_id, "validation", 10 * step,
                          {metric: value, "val_accuracy": 1 - value / 10})
    db.update_trial(trial_id, state="COMPLETED")
    return trial_id


def lr_driven(count: int, seed: int = 0) -> list[tuple[dict, list[float]]]:
    """Trials whose val_loss is a bowl in log10(lr) (best at 1e-2.5); dropout and the
    optimizer are noise. Three validations each, improving."""
    rng = random.Random(seed)
    trials = []
    for _ in range(count):
        hparams = {"global_batch_size": 16, "lr": 10 ** rng.uniform(-4, -1),
                   "dropout": rng.uniform(0, 0.5), "optimizer": rng.choice(["adam", "sgd"])}
        final = (math.log10(hparams["lr"]) + 2.5) ** 2 + 0.05 * rng.random()
        trials.append((hparams, [final + 1.0, final + 0.3, final]))
    return trials
