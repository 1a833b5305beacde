"""Experiment and trial rows for the benchmarks, made as the intake and the daemon make them.

    config, create, length = searcher_trial(raw_config)      # what the searcher asks for
    experiment_id, trial_id = create_trial(layout, raw_config, [Path(__file__)])

`raw_config` is an experiment config as a user writes it; it must set
`reproducibility.experiment_seed`. No TensorFlow here: importing this is cheap.
"""

from __future__ import annotations

import argparse
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from localdet.config.experiment import parse_config
from localdet.paths import Layout
from localdet.records.db import StateDB
from localdet.search.methods import Create, ValidateAfter, make_search_method


def add_keras2_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--keras2", action="store_true",
                        help="use Keras 2 (tf-keras): sets TF_USE_LEGACY_KERAS=1")


def select_keras(args: argparse.Namespace) -> None:
    """Call before importing TensorFlow, which reads these once."""
    if args.keras2:
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # as the localdet launcher does


def searcher_trial(raw_config: dict) -> tuple[dict, Create, int]:
    """The validated config, and the trial the searcher asks for first (Create, length)."""
    config = parse_config(raw_config).config
    seed = config["reproducibility"]["experiment_seed"]
    ops = make_search_method(config, seed).initial_operations()
    return (config, next(op for op in ops if isinstance(op, Create)),
            next(op for op in ops if isinstance(op, ValidateAfter)).length)


def create_trial(layout: Layout, raw_config: dict, model_files: Iterable[Path]) -> tuple[int, int]:
    """(experiment id, trial id) of fresh rows in `layout`'s database (parse_config,
    StateDB.create_experiment, the searcher's first operations, create_trial); `model_files`
    are copied into the experiment's model folder, the snapshot of the submitted folder."""
    config, create, length = searcher_trial(raw_config)
    searcher = config["searcher"]
    seed = config["reproducibility"]["experiment_seed"]
    db = StateDB.open(layout.db)
    try:
        with db.atomic():
            experiment_id = db.create_experiment(
                name=config["name"], description=config["description"], config=config,
                original_config="", searcher=searcher["name"], metric=searcher["metric"],
                smaller_is_better=searcher["smaller_is_better"], experiment_seed=seed,
                model_dir="")
            model_dir = layout.model_dir(experiment_id)
            db.db["experiments"].update(experiment_id, {"model_dir": str(model_dir)})
        model_dir.mkdir(parents=True)
        for path in model_files:
            shutil.copy(path, model_dir / Path(path).name)
        trial_id = db.create_trial(experiment_id=experiment_id, request_id=create.request_id,
                                   hparams=create.hparams, seed=create.seed,
                                   target_batches=length)
    finally:
        db.close()
    return experiment_id, trial_id
