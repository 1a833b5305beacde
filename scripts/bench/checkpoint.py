"""How much slower are localdet's checkpoint save and restore than a bare Keras .h5 save and load?

A real TrialController (temporary LOCALDET_HOME, rows made by _trial_setup.py) trains
Input(784) + Dense(2048) + Dense(2048) + Dense(10) with Adam for 2 batches in `run()`, which
also takes an untimed first checkpoint: 23 MB of weights, a 70 MB .h5 with Adam's two slots.
Then, `--repeats` times, alternating which side goes first, each call timed on its own:

  save (changed)    after one `train_on_batch`: bare `model.save(path.h5)` against
                    `TrialController.checkpoint()` (h5, code, config, trial state, put into
                    the content-addressed store, manifest committed to SQLite)
  save (unchanged)  the same again without training: the store already holds the blobs
  restore           bare `tf.keras.models.load_model(path.h5)` against
                    `TrialController._restore(uuid)` of the last changed checkpoint

Prints the .h5 size, the median of each, the ratio of the medians (target <= 1.25) and of the
fastest runs. `--profile` adds a cProfile of one checkpoint and one restore (stderr). Before
each timed call it touches and frees `--warm-mb` of memory (see README.md).

    python scripts/bench/checkpoint.py                 # Keras 3, 5 repeats
    python scripts/bench/checkpoint.py --keras2        # Keras 2 (tf-keras): TF_USE_LEGACY_KERAS=1
    python scripts/bench/checkpoint.py --repeats 9 --profile

Timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import logging
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

SEED = 42
BATCH_SIZE = 32
INPUTS, UNITS, CLASSES = 784, 2048, 10

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _trial_setup import add_keras2_flag, create_trial, select_keras  # noqa: E402  (imports no TensorFlow)

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--repeats", type=int, default=5, help="timed runs of each operation")
parser.add_argument("--units", type=int, default=UNITS, help="units of the two hidden layers")
parser.add_argument("--warm-mb", type=int, default=1024,
                    help="touch and free this much memory before each timed call (README.md)")
parser.add_argument("--profile", action="store_true",
                    help="cProfile one checkpoint and one restore (stderr)")
add_keras2_flag(parser)
args = parser.parse_args() if __name__ == "__main__" else parser.parse_args([])
select_keras(args)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from determined import keras as det_keras  # noqa: E402
from determined.keras._trial_controller import MODEL_FILENAME, TrialController, keras_line  # noqa: E402
from localdet.paths import Layout  # noqa: E402
from localdet.reporting.sqlite_reporter import SQLiteReporter  # noqa: E402

logging.getLogger("absl").setLevel(logging.ERROR)  # Keras 3 calls .h5 "legacy"; both sides save it
warnings.simplefilter("ignore")

rng = np.random.default_rng(0)
X = rng.random((4 * BATCH_SIZE, INPUTS), dtype=np.float32)
Y = rng.integers(0, CLASSES, size=4 * BATCH_SIZE).astype("int32")


def build_model() -> tf.keras.Model:
    model = tf.keras.Sequential([
        tf.keras.Input(shape=(INPUTS,)),
        tf.keras.layers.Dense(args.units, activation="relu"),
        tf.keras.layers.Dense(args.units, activation="relu"),
        tf.keras.layers.Dense(CLASSES, activation="softmax"),
    ])
    model.compile(optimizer=tf.keras.optimizers.Adam(1e-3),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


class BenchTrial(det_keras.TFKerasTrial):
    def build_model(self):
        model = self.context.wrap_model(build_model())
        self.context.wrap_optimizer(model.optimizer)
        return model

    def build_training_data_loader(self):
        return X, Y

    def build_validation_data_loader(self):
        return X, Y


def timed(fn: Callable[[], object]) -> float:
    if args.warm_mb:  # freed just now, so the page cache can take it without host faults
        np.ones(args.warm_mb << 20, dtype=np.uint8)
    gc.collect()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def profiled(title: str, fn: Callable[[], object]) -> None:
    print(f"--- cProfile: {title} ---", file=sys.stderr)
    profile = cProfile.Profile()
    profile.runcall(fn)
    pstats.Stats(profile, stream=sys.stderr).sort_stats("cumulative").print_stats(25)


ROWS = (("save changed", "save (changed):  ", "bare model.save", "localdet checkpoint"),
        ("save until durable", "save (durable):  ", "bare model.save",
         "localdet checkpoint stored and committed"),
        ("save unchanged", "save (unchanged):", "bare model.save", "localdet checkpoint"),
        ("restore", "restore:         ", "bare load_model", "localdet restore"))


def main() -> None:
    raw_config = {
        "name": "checkpoint-bench", "entrypoint": "checkpoint:BenchTrial",
        "hyperparameters": {"global_batch_size": BATCH_SIZE},
        "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 2}},
        "min_validation_period": {"batches": 0}, "min_checkpoint_period": {"batches": 0},
        "max_restarts": 0, "reproducibility": {"experiment_seed": SEED},
    }
    times: dict[str, list[float]] = {}
    uuids = {"last": "", "changed": ""}
    with tempfile.TemporaryDirectory(prefix="localdet-bench-") as tmp:
        layout = Layout(Path(tmp) / "home").ensure()
        os.environ["LOCALDET_HOME"] = str(layout.home)
        experiment_id, trial_id = create_trial(layout, raw_config, [Path(__file__)])
        log_path = layout.trial_log(experiment_id, trial_id)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        bare_path = Path(tmp) / "bare" / "model.h5"
        bare_path.parent.mkdir()
        with open(log_path, "a") as log, contextlib.redirect_stdout(log):
            reporter = SQLiteReporter(layout, trial_id)
            controller = TrialController.for_trial_class(BenchTrial, reporter.trial_info(),
                                                         reporter)
            controller.run()  # 2 batches, a validation and the first (untimed) checkpoint
            model = controller.model

            def bare_save() -> None:
                bare_path.unlink(missing_ok=True)
                model.save(bare_path)

            def localdet_save() -> None:
                # Training waits only for this; storing and committing go on beside it.
                uuids["last"] = controller.checkpoint()

            def localdet_save_durable() -> None:
                uuids["last"] = controller.checkpoint()
                reporter.wait_for_checkpoints()

            def localdet_restore() -> None:
                controller._restore(uuids["changed"])

            def both(name: str, bare: Callable[[], object], localdet: Callable[[], object],
                     i: int) -> None:
                for side in (("bare", "localdet") if i % 2 == 0 else ("localdet", "bare")):
                    reporter.wait_for_checkpoints()  # untimed: the previous one's storing
                    seconds = timed(bare if side == "bare" else localdet)
                    times.setdefault(f"{name} {side}", []).append(seconds)

            bare_save(), localdet_save()  # untimed warm-up of both
            for i in range(args.repeats):
                model.train_on_batch(X[:BATCH_SIZE], Y[:BATCH_SIZE])
                both("save changed", bare_save, localdet_save, i)
                uuids["changed"] = uuids["last"]
                model.train_on_batch(X[:BATCH_SIZE], Y[:BATCH_SIZE])
                both("save until durable", bare_save, localdet_save_durable, i)
                both("save unchanged", bare_save, localdet_save, i)
                both("restore", lambda: tf.keras.models.load_model(bare_path),
                     localdet_restore, i)
                for folder in controller.info.trial_dir.glob(".restore-*"):
                    shutil.rmtree(folder)  # untimed: the restored copy, if one is left
                print(f"repeat {i + 1}: " + ", ".join(f"{k} {v[-1]:.3f} s"
                                                      for k, v in times.items()),
                      file=sys.stderr, flush=True)
            if args.profile:
                model.train_on_batch(X[:BATCH_SIZE], Y[:BATCH_SIZE])
                profiled("TrialController.checkpoint(), model changed", localdet_save)
                uuids["changed"] = uuids["last"]
                profiled("TrialController._restore(uuid)", localdet_restore)
            checkpoint_mb = reporter.db.checkpoint(uuids["last"]).size_bytes / 1e6
            reporter.db.close()
        size = bare_path.stat().st_size

    weights_mb = sum(np.asarray(w).nbytes for w in model.weights) / 1e6
    devices = ", ".join(d.device_type for d in tf.config.list_logical_devices()) or "?"
    print(f"{keras_line()} (TensorFlow {tf.__version__}, devices: {devices}), "
          f"median of {args.repeats}")
    print(f"model: {size / 1e6:.1f} MB in {MODEL_FILENAME} ({weights_mb:.1f} MB of weights, "
          f"the rest optimizer state); whole checkpoint {checkpoint_mb:.1f} MB")
    for name, label, bare_what, localdet_what in ROWS:
        bare, localdet = times[f"{name} bare"], times[f"{name} localdet"]
        print(f"{label} {bare_what} {statistics.median(bare):.3f} s, {localdet_what} "
              f"{statistics.median(localdet):.3f} s, ratio "
              f"{statistics.median(localdet) / statistics.median(bare):.2f} (target <= 1.25); "
              f"fastest runs {min(localdet) / min(bare):.2f}")


if __name__ == "__main__":
    main()
