"""Checkpoint cost and store size: localdet's chunked store against a bare Keras .h5 save and
load, and against the store as it was (files stored whole, `Store(chunked=False)`).

Two models, each in a real TrialController (temporary LOCALDET_HOME, rows made by
_trial_setup.py) that trains 2 batches in `run()` (which takes an untimed first checkpoint):

  changing  Input(784) + Dense(2048) + Dense(2048) + Dense(10), Adam: 23 MB of weights, a
            70 MB .h5 with Adam's two slots, every byte of it new after each step
  frozen    Input(256) + 3 frozen Dense(1024) (9.4 MB of weights) + a trainable Dense(10)
            head, Adam: after a step only the head and its slots change

Then, `--repeats` times, alternating which side goes first, each call timed on its own:

  save (changed)   after one `train_on_batch`: bare `model.save(path.h5)` against
                   `TrialController.checkpoint()`, chunked and whole (what training waits for;
                   storing and committing go on beside it)
  save (durable)   the same until the checkpoint is stored and committed
  restore          bare `tf.keras.models.load_model(path.h5)` against
                   `TrialController._restore(uuid)` of a chunked and of a whole checkpoint

and a frozen-base search: 4 trials (a grid over the head's learning rate) of the frozen model,
4 checkpoints each, all kept, in one store: its size against one checkpoint's, and what the
same files take stored whole (the sum of the distinct files' sizes).

Prints medians and ratios (target <= 1.25 against bare) and the fastest runs' ratios.
`--smoke`: tiny models, one repeat, no warming, a search of 2 trials x 2 checkpoints (seconds
once TensorFlow is imported).
`--chunk-sizes 32,64,128,256,512` (KiB) measures what chose `chunking.AVERAGE_SIZE`: the
search's 16 .h5 files stored again at each average chunk size (store size against one
checkpoint, blob count), and a 70 MB file of new bytes put into the store (median of 3).

    python scripts/bench/checkpoint.py                 # Keras 3, 5 repeats
    python scripts/bench/checkpoint.py --keras2        # Keras 2 (tf-keras): TF_USE_LEGACY_KERAS=1
    python scripts/bench/checkpoint.py --smoke
    python scripts/bench/checkpoint.py --repeats 1 --chunk-sizes 32,64,128,256,512

The average chunk size, measured this way (`--repeats 3 --chunk-sizes 32,64,128,256,512`) on
the 2-vCPU development machine, Keras 3, the machine shared and loaded (load average 9 to 15),
so the put times are rough; the sizes are exact:

  average   frozen-base search's .h5 files   blobs   70 MB of new bytes put
   32 KiB   1.24x one checkpoint               309   3.66 s (an outlier; about 1.5 s)
   64 KiB   1.24x                              156   0.81 s
  128 KiB   1.41x                               93   0.68 s
  256 KiB   1.56x                               51   0.51 s
  512 KiB   1.74x                               34   0.37 s
  stored whole: 16.0x, and the 70 MB put about 0.15 s (moved in without a copy)

128 KiB: well under the 2x target, with room for other layouts, and a few hundred chunk files
for a 70 MB model; 64 KiB saves a little more space for twice the files (and S3 requests) and
more time per put, 256 KiB and more give the space back.

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
FROZEN_INPUTS, FROZEN_UNITS = 256, 1024
SEARCH_TRIALS, SEARCH_CHECKPOINTS = 4, 4

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _trial_setup import add_keras2_flag, create_trial, select_keras  # noqa: E402  (imports no TensorFlow)

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--repeats", type=int, default=5, help="timed runs of each operation")
parser.add_argument("--units", type=int, default=UNITS,
                    help="units of the changing model's two hidden layers")
parser.add_argument("--frozen-units", type=int, default=FROZEN_UNITS,
                    help="units of the frozen base's three layers")
parser.add_argument("--warm-mb", type=int, default=1024,
                    help="touch and free this much memory before each timed call (README.md)")
parser.add_argument("--profile", action="store_true",
                    help="cProfile one checkpoint and one restore (stderr)")
parser.add_argument("--smoke", action="store_true",
                    help="tiny models, one repeat, no warming: the same figures in seconds")
parser.add_argument("--chunk-sizes", default="",
                    help="comma-separated average chunk sizes in KiB to measure (docstring)")
add_keras2_flag(parser)
args = parser.parse_args() if __name__ == "__main__" else parser.parse_args([])
if args.smoke:
    args.repeats, args.units, args.frozen_units, args.warm_mb = 1, 64, 256, 0
    SEARCH_TRIALS, SEARCH_CHECKPOINTS = 2, 2  # each trial builds and traces its model again
select_keras(args)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from determined import keras as det_keras  # noqa: E402
from determined.keras._trial_controller import MODEL_FILENAME, TrialController, keras_line  # noqa: E402
from localdet.checkpoints import chunking  # noqa: E402
from localdet.checkpoints.manifest import files_of  # noqa: E402
from localdet.checkpoints.rechunk import stored_bytes  # noqa: E402
from localdet.checkpoints.store import Store  # noqa: E402
from localdet.paths import Layout  # noqa: E402
from localdet.records.db import StateDB  # noqa: E402
from localdet.reporting.sqlite_reporter import SQLiteReporter  # noqa: E402

logging.getLogger("absl").setLevel(logging.ERROR)  # Keras 3 calls .h5 "legacy"; both sides save it
warnings.simplefilter("ignore")

rng = np.random.default_rng(0)
X = rng.random((4 * BATCH_SIZE, INPUTS), dtype=np.float32)
XF = rng.random((4 * BATCH_SIZE, FROZEN_INPUTS), dtype=np.float32)
Y = rng.integers(0, CLASSES, size=4 * BATCH_SIZE).astype("int32")


def build_model(kind: str, learning_rate: float) -> tf.keras.Model:
    if kind == "changing":
        model = tf.keras.Sequential([
            tf.keras.Input(shape=(INPUTS,)),
            tf.keras.layers.Dense(args.units, activation="relu"),
            tf.keras.layers.Dense(args.units, activation="relu"),
            tf.keras.layers.Dense(CLASSES, activation="softmax"),
        ])
    else:  # the same frozen base (same seed) under each trial's own head
        tf.keras.utils.set_random_seed(SEED)
        inputs = tf.keras.Input(shape=(FROZEN_INPUTS,))
        features = inputs
        for i in range(3):
            features = tf.keras.layers.Dense(args.frozen_units, activation="relu",
                                             name=f"base{i}", trainable=False)(features)
        model = tf.keras.Model(inputs, tf.keras.layers.Dense(
            CLASSES, activation="softmax", name="head")(features))
    model.compile(optimizer=tf.keras.optimizers.Adam(learning_rate),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


class BenchTrial(det_keras.TFKerasTrial):
    def build_model(self):
        model = self.context.wrap_model(build_model(self.context.get_hparam("model"),
                                                    self.context.get_hparam("lr")))
        self.context.wrap_optimizer(model.optimizer)
        return model

    def _x(self):
        return X if self.context.get_hparam("model") == "changing" else XF

    def build_training_data_loader(self):
        return self._x(), Y

    def build_validation_data_loader(self):
        return self._x(), Y


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


def raw_config(kind: str, learning_rate: float) -> dict:
    return {
        "name": f"checkpoint-bench-{kind}", "entrypoint": "checkpoint:BenchTrial",
        "hyperparameters": {"global_batch_size": BATCH_SIZE, "model": kind,
                            "lr": learning_rate},
        "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 2}},
        "min_validation_period": {"batches": 0}, "min_checkpoint_period": {"batches": 0},
        "max_restarts": 0, "reproducibility": {"experiment_seed": SEED},
    }


@contextlib.contextmanager
def controller_for(layout: Layout, kind: str, learning_rate: float = 1e-3):
    """A TrialController of a fresh trial that has run 2 batches and a first checkpoint."""
    experiment_id, trial_id = create_trial(layout, raw_config(kind, learning_rate),
                                           [Path(__file__)])
    log_path = layout.trial_log(experiment_id, trial_id)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a") as log, contextlib.redirect_stdout(log):
        reporter = SQLiteReporter(layout, trial_id)
        controller = TrialController.for_trial_class(BenchTrial, reporter.trial_info(),
                                                     reporter)
        controller.run()
        try:
            yield controller, reporter
        finally:
            reporter.wait_for_checkpoints()
            reporter.db.close()


SIDES = ("bare", "chunked", "whole")
ROWS = (("save changed", "save (changed): ", "model.save"),
        ("save durable", "save (durable): ", "model.save"),
        ("restore", "restore:        ", "load_model"))


def time_model(layout: Layout, kind: str, scratch: Path) -> tuple[dict[str, list[float]], float]:
    """{"save changed bare": [seconds, ...], ...} and the .h5's size, for one model."""
    times: dict[str, list[float]] = {}
    bare_path = scratch / f"bare-{kind}" / "model.h5"
    bare_path.parent.mkdir()
    with controller_for(layout, kind) as (controller, reporter):
        model, store = controller.model, reporter.store
        x = X if kind == "changing" else XF
        last: dict[str, str] = {}

        def bare_save() -> None:
            bare_path.unlink(missing_ok=True)
            model.save(bare_path)

        def save(side: str, durable: bool) -> Callable[[], None]:
            def run() -> None:
                store.chunked = side == "chunked"
                last[side] = controller.checkpoint()
                if durable:
                    reporter.wait_for_checkpoints()
            return run

        def restore(side: str) -> Callable[[], None]:
            return lambda: controller._restore(last[side])

        def each(name: str, calls: dict[str, Callable[[], object]], i: int) -> None:
            order = SIDES[i % 3:] + SIDES[:i % 3]  # each side goes first in turn
            for side in order:
                reporter.wait_for_checkpoints()  # untimed: the previous one's storing
                times.setdefault(f"{name} {side}", []).append(timed(calls[side]))

        bare_save(), save("chunked", True)(), save("whole", True)()  # untimed warm-up
        for i in range(args.repeats):
            model.train_on_batch(x[:BATCH_SIZE], Y[:BATCH_SIZE])
            each("save changed", {"bare": bare_save, "chunked": save("chunked", False),
                                  "whole": save("whole", False)}, i)
            model.train_on_batch(x[:BATCH_SIZE], Y[:BATCH_SIZE])
            each("save durable", {"bare": bare_save, "chunked": save("chunked", True),
                                  "whole": save("whole", True)}, i)
            each("restore", {"bare": lambda: tf.keras.models.load_model(bare_path),
                             "chunked": restore("chunked"), "whole": restore("whole")}, i)
            for folder in controller.info.trial_dir.glob(".restore-*"):
                shutil.rmtree(folder)  # untimed: the restored copy, if one is left
            print(f"{kind} repeat {i + 1}: " + ", ".join(f"{k} {v[-1]:.3f} s"
                                                       for k, v in times.items()),
                  file=sys.stderr, flush=True)
        if args.profile:
            model.train_on_batch(x[:BATCH_SIZE], Y[:BATCH_SIZE])
            profiled(f"{kind}: TrialController.checkpoint(), chunked", save("chunked", True))
            profiled(f"{kind}: TrialController._restore(uuid), chunked", restore("chunked"))
        store.chunked = True
    return times, bare_path.stat().st_size


def frozen_search(layout: Layout) -> tuple[int, int, int, list[Path]]:
    """(store bytes, one checkpoint's bytes, bytes stored whole, the .h5 files) of a search
    of SEARCH_TRIALS frozen-base trials with SEARCH_CHECKPOINTS checkpoints each."""
    h5s: list[Path] = []
    for trial in range(SEARCH_TRIALS):
        with controller_for(layout, "frozen", 10.0 ** -(trial + 1)) as (controller, reporter):
            for _ in range(SEARCH_CHECKPOINTS - 1):  # run() took the first
                controller.model.train_on_batch(XF[:BATCH_SIZE], Y[:BATCH_SIZE])
                controller.checkpoint()
            reporter.wait_for_checkpoints()
    with StateDB.open(layout.db) as db:
        checkpoints = db.checkpoints()
        one = max(c.size_bytes for c in checkpoints)
        whole = {(e.sha256, e.size) for c in checkpoints for e in files_of(c.manifest).values()}
        store = Store(layout.store)
        for i, c in enumerate(checkpoints):  # the .h5 files, for --chunk-sizes
            path = layout.home / "search-h5" / f"{i}.h5"
            path.parent.mkdir(exist_ok=True)
            entry = files_of(c.manifest)[MODEL_FILENAME]
            store.materialize({"m.h5": entry}, path.parent / f"{i}")
            h5s.append(path.parent / f"{i}" / "m.h5")
    return stored_bytes(store), one, sum(size for _, size in whole), h5s


def chunk_sizes(h5s: list[Path], one: int, scratch: Path) -> None:
    print("average chunk size: frozen-base search store, blobs; 70 MB of new bytes put")
    big = 4 << 20 if args.smoke else 70_000_000
    chosen = chunking.AVERAGE_SIZE, chunking.MIN_SIZE, chunking.MAX_SIZE
    for kib in (int(k) for k in args.chunk_sizes.split(",")):
        avg = kib * 1024
        chunking.AVERAGE_SIZE, chunking.MIN_SIZE, chunking.MAX_SIZE = avg, avg // 4, avg * 4
        store = Store(scratch / f"store-{kib}")
        for i, h5 in enumerate(h5s):
            folder = scratch / f"c{kib}-{i}"
            folder.mkdir()
            shutil.copy(h5, folder / MODEL_FILENAME)
            store.put_directory(folder, consume=True)
        size, blobs = stored_bytes(store), len(list(store.objects.glob("??/*")))
        seconds = []
        for r in range(1 if args.smoke else 3):
            folder = scratch / f"b{kib}-{r}"
            folder.mkdir()
            (folder / MODEL_FILENAME).write_bytes(os.urandom(big))
            seconds.append(timed(lambda s=store, f=folder: s.put_directory(f, consume=True)))
        print(f"  {kib:4d} KiB: {size / one:.2f}x one checkpoint, {blobs} blobs; "
              f"{big / 1e6:.0f} MB put {statistics.median(seconds):.3f} s")
        shutil.rmtree(store.root)
    chunking.AVERAGE_SIZE, chunking.MIN_SIZE, chunking.MAX_SIZE = chosen


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="localdet-bench-") as tmp:
        scratch = Path(tmp)
        search_layout = Layout(scratch / "search").ensure()
        os.environ["LOCALDET_HOME"] = str(search_layout.home)
        stored, one, whole, h5s = frozen_search(search_layout)
        if args.chunk_sizes:
            chunk_sizes(h5s, one, scratch)
        layout = Layout(scratch / "home").ensure()
        os.environ["LOCALDET_HOME"] = str(layout.home)
        results = {kind: time_model(layout, kind, scratch) for kind in ("changing", "frozen")}

    devices = ", ".join(d.device_type for d in tf.config.list_logical_devices()) or "?"
    print(f"{keras_line()} (TensorFlow {tf.__version__}, devices: {devices}), median of "
          f"{args.repeats}; average chunk {chunking.AVERAGE_SIZE // 1024} KiB")
    print(f"frozen-base search ({SEARCH_TRIALS} trials x {SEARCH_CHECKPOINTS} checkpoints, all "
          f"kept): store {stored / 1e6:.1f} MB = {stored / one:.2f}x one checkpoint "
          f"({one / 1e6:.1f} MB; target <= 2); stored whole {whole / 1e6:.1f} MB = "
          f"{whole / one:.1f}x")
    for kind, (times, size) in results.items():
        print(f"{kind} model: {size / 1e6:.1f} MB in {MODEL_FILENAME}")
        for name, label, bare_what in ROWS:
            med = {side: statistics.median(times[f"{name} {side}"]) for side in SIDES}
            fast = {side: min(times[f"{name} {side}"]) for side in SIDES}
            print(f"  {label} bare {bare_what} {med['bare']:.3f} s, chunked "
                  f"{med['chunked']:.3f} s, whole {med['whole']:.3f} s; chunked/bare "
                  f"{med['chunked'] / med['bare']:.2f} (target <= 1.25), whole/bare "
                  f"{med['whole'] / med['bare']:.2f}, chunked/whole "
                  f"{med['chunked'] / med['whole']:.2f}; fastest runs chunked/bare "
                  f"{fast['chunked'] / fast['bare']:.2f}")


if __name__ == "__main__":
    main()
