"""Experiment and trial rows for the benchmarks, made as the intake and the daemon make them.

    config, create, length = searcher_trial(raw_config)      # what the searcher asks for
    experiment_id, trial_id = create_trial(layout, raw_config, [Path(__file__)])
    with epochs_trial(layout, raw_config, [Path(__file__)]) as (reporter, start):
        ...                                                   # the trial's code, timed from start

`raw_config` is an experiment config as a user writes it; it must set
`reproducibility.experiment_seed`. No TensorFlow here: importing this is cheap.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from localdet.config.experiment import parse_config
from localdet.paths import Layout
from localdet.records.db import StateDB
from localdet.reporting.sqlite_reporter import SQLiteReporter
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


@contextlib.contextmanager
def epochs_trial(layout: Layout, raw_config: dict,
                 model_files: Iterable[Path]) -> Iterator[tuple[SQLiteReporter, float]]:
    """A fresh trial (`create_trial`) run in this process as a script's `fit` runs it: no
    max_length (the script's epochs decide), stdout to the trial's log. Yields its reporter
    and the `time.perf_counter()` taken before the reporter opened, where timing starts."""
    experiment_id, trial_id = create_trial(layout, raw_config, model_files)
    log_path = layout.trial_log(experiment_id, trial_id)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a") as log, contextlib.redirect_stdout(log):
        start = time.perf_counter()
        reporter = SQLiteReporter(layout, trial_id)
        try:
            reporter.db.update_trial(trial_id, target_batches=0)
            yield reporter, start
        finally:
            reporter.db.close()
