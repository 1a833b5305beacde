"""How much slower is training as a localdet trial than with bare Keras `model.fit`?

Trains the same small conv net (Conv2D(32, 3) + Flatten + Dense(64) + Dense(10), Adam 1e-3)
on scikit-learn's digits (8x8x1, 80/20 split) with global batch size 32, for the same number
of batches, with the same seed and the same shuffled, repeated tf.data pipeline, two ways:

  bare      build + compile, model.fit(steps_per_epoch=BATCHES, epochs=1), one
            model.evaluate on the validation data, one model.save(... .h5)
  localdet  experiment and trial rows made as the intake and daemon make them (parse_config,
            StateDB.create_experiment, the `single` searcher's operations, create_trial) in a
            temporary LOCALDET_HOME; then, timed, SQLiteReporter(...).trial_info() and
            TrialController.for_trial_class(BenchTrial, info, reporter).run() in this process:
            training metrics every 100 batches, one validation and one checkpoint (real store)
            at the end.

Timed: everything after the TensorFlow import and data loading, model building, compiling and
tracing included, on both sides. One untimed warm-up run of each, then `--repeats` timed runs
of each, alternating which goes first; prints the median of each, the ratio of the medians,
and the ratio of the fastest runs (TensorFlow sometimes stalls ~1 s tearing down the training
iterator, on either side; see README.md). Both sides must print the same val_accuracy.

    python scripts/bench/overhead.py                  # Keras 3, 600 batches, 3 repeats
    python scripts/bench/overhead.py --keras2         # Keras 2 (tf-keras): TF_USE_LEGACY_KERAS=1
    python scripts/bench/overhead.py --batches 2000 --repeats 5
    python scripts/bench/overhead.py --api fit        # New Keras API: context.fit
    python scripts/bench/overhead.py --api unchanged  # the bare script's own model.fit, hooked
    python scripts/bench/overhead.py --smoke          # seconds: tiny sizes, figures meaningless
    python scripts/bench/overhead.py --backend jax    # --api unchanged on Keras 3's JAX backend
    python scripts/bench/overhead.py --backend torch --python PY   # PY has PyTorch and Keras

With `--backend jax` or `torch`, `--api unchanged` (the default there) or `--api fit` runs
on that Keras 3 backend without TensorFlow: scripts/bench/_overhead_backend.py, in the python
that has the backend (`--python`; for JAX by default LOCALDET_JAX_PYTHON, else the
environment scripts/jax-env makes; for PyTorch this python if it has PyTorch), with
KERAS_BACKEND set; `--smoke` there too.

With `--remote` the localdet side reports over the network transport a trial on another
machine uses: `HTTPReporter` against a `ReportServer` (localdet/reporting/report_server.py) on
127.0.0.1, served from a thread of this process, instead of `SQLiteReporter`. Measured on
a shared 2-core CPU machine (Keras 3, 600 batches, 3 repeats, noisy): over HTTP ratio 1.013
to bare Keras (fastest runs 0.977); the local transport in the run after it 0.665 (fastest
runs 1.012): remote over local by the fastest runs 0.97, within the 1.05 target.

With `--api fit` both sides train `--epochs` epochs of the NumPy arrays with validation at
every epoch end: bare `model.fit(x, y, epochs=E, validation_data=...)` against a script's
`context.fit(model, x, y, epochs=E, validation_data=...)` (metrics, checkpoint at the end).
The training set is cut to whole batches (1,408 of digits' 1,437 training examples): Keras
would end each epoch with a short batch where localdet's batches are all full, and the two
sides would not train the same examples. They still shuffle with different generators, so
their val_accuracy may differ in the last digits.

With `--api unchanged` both sides run the same code, `run_bare_fit` (the --api fit bare side:
an unchanged script's `model.fit`, its own `model.save`); the localdet side first does what
`determined.exec.unchanged_script` does in a trial (reporter, seeded generators, the fit
hook of determined/keras/_unchanged.py), so its `fit` is trained by localdet's runner.

Measured on the shared 2-core CPU machine (`--api unchanged`, digits' shapes, 15 to 20
epochs, 5 to 9 repeats), epoch time under localdet over bare: Keras 3 on TensorFlow 0.64 and
Keras 2 0.79 (localdet feeds `fit`'s NumPy arrays through its tf.data stream); PyTorch 0.99;
JAX 1.12, over the 1.02 target (about 4 ms of a 33-ms epoch). Of that, each validation
made a callback list of its own, whose thread pool was started and joined every epoch;
one list held open for the fit (as Keras's fit holds its own) gave 1.048 in the next
run (9 repeats of 20 epochs; 1.066 and 1.196 in two runs just before, same machine):
still over, the rest the runner's own Python a step. That Python is now a third of
Keras's: Keras's JAX `fit` stores its state on the model through `Layer.__setattr__` every
step, whose tracker walks the dict and its lists (about 600 of a step's 900 Python calls,
counted with cProfile over 20 epochs), where the runner sets it plainly; with the batch's
end worked out per workload and the arrays sliced without a walk over their structure, a
step makes 291 calls. A one-Dense-layer model, whose epoch is nearly all Python, trains
its epochs in 0.78x bare's; this bench's conv net, whose steps are XLA's work, 0.99, 1.03,
1.08, 1.08 and 1.14 in five runs of 9 repeats one after another (1.03 and 1.09 just before
the change): no longer the runner's Python, and within the machine's noise. The machine's
speed drifts by a quarter between runs, so compare the two sides of one run only.

With `--api fit` or `unchanged` the figure is the epoch time: each epoch's wall time from its
start to the next's (its validation, and localdet's metrics and checkpoints at the boundary,
included), each run's first (compiling) and last epoch left out, the median over all runs,
both sides timed by the same callback (scripts/bench/_timing.py). The whole runs' ratio
is printed too: it adds what happens once (building, the last checkpoint, the trial's rows).

Needs `pip install .[test]` (scikit-learn). Timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

SEED = 42
BATCH_SIZE = 32
LEARNING_RATE = 1e-3


sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import alternate, epoch_clock, print_epoch_times  # noqa: E402  (imports no TensorFlow)
from _trial_setup import (  # noqa: E402  (imports no TensorFlow)
    add_keras2_flag,
    create_trial,
    epochs_trial,
    searcher_trial,
    select_keras,
)

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--batches", type=int, default=600, help="batches to train per run")
parser.add_argument("--repeats", type=int, default=3, help="timed runs of each side")
parser.add_argument("--warmup", type=int, default=100,
                    help="batches of the untimed warm-up (0: none)")
parser.add_argument("--api", choices=("trial", "fit", "unchanged"),
                    help="TFKerasTrial (default), the New Keras API's context.fit, or an "
                    "unchanged script's model.fit (the default with --backend jax|torch)")
parser.add_argument("--backend", choices=("tensorflow", "jax", "torch"), default="tensorflow",
                    help="Keras 3's backend (jax, torch: without TensorFlow, in --python)")
parser.add_argument("--python", help="with --backend jax|torch: the python that has it")
parser.add_argument("--epochs", type=int, default=15, help="epochs per run with --api fit")
parser.add_argument("--remote", action="store_true",
                    help="the trial reports over HTTP to a report server (HTTPReporter)")
parser.add_argument("--smoke", action="store_true",
                    help="a check that it runs (tests/test_scripts.py): 20 batches (3 epochs), "
                    "1 repeat, no warm-up")
add_keras2_flag(parser)
args = parser.parse_args() if __name__ == "__main__" else parser.parse_args([])
if args.smoke:
    args.batches, args.repeats, args.warmup, args.epochs = 20, 1, 0, 3


def backend_python(backend: str, given: str | None) -> str:
    """The python that has `backend` (and Keras and localdet)."""
    if given:
        return given
    if backend == "jax":
        if os.environ.get("LOCALDET_JAX_PYTHON"):
            return os.environ["LOCALDET_JAX_PYTHON"]
        made = subprocess.run([str(Path(__file__).resolve().parents[2] / "scripts" / "jax-env")],
                              capture_output=True, text=True, check=True)
        return made.stdout.strip().splitlines()[-1]
    if importlib.util.find_spec(backend) is None:
        parser.error(f"this python has no {backend}; pass --python with one that has it (and "
                     "Keras and localdet)")
    return sys.executable


if args.backend != "tensorflow":  # TensorFlow's own APIs are not for these backends
    if args.api == "trial" or args.remote or args.keras2:
        parser.error("--backend jax|torch measures --api unchanged or --api fit, without "
                     "--remote or --keras2 (TensorFlow's)")
    python = backend_python(args.backend, args.python)
    command = [python, str(Path(__file__).resolve().parent / "_overhead_backend.py"),
               "--api", args.api or "unchanged", "--epochs", str(args.epochs),
               "--repeats", str(args.repeats), *(["--smoke"] if args.smoke else [])]
    sys.exit(subprocess.run(command, env={**os.environ, "KERAS_BACKEND": args.backend}
                            ).returncode)
args.api = args.api or "trial"
if args.remote and args.api != "trial":
    parser.error("--remote measures the trial API only; leave out --api fit")
select_keras(args)

import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

from determined import keras as det_keras  # noqa: E402
from determined.keras import (  # noqa: E402
    KerasContext,
    _data,
    _unchanged,
)
from determined.keras._trial_controller import (  # noqa: E402
    TrialController,
    keras_line,
    prepare_process,
)
from determined.keras._unchanged_fit import ScriptFits  # noqa: E402
from localdet.paths import Layout  # noqa: E402
from localdet.records.db import StateDB, now  # noqa: E402
from localdet.reporting.http_reporter import HTTPReporter  # noqa: E402
from localdet.reporting.report_server import ReportServer, trial_environment  # noqa: E402
from localdet.reporting.sqlite_reporter import SQLiteReporter  # noqa: E402

logging.getLogger("absl").setLevel(logging.ERROR)  # Keras 3 calls .h5 "legacy"; both sides save it
warnings.simplefilter("ignore")

x, y = load_digits(return_X_y=True)
x = (x / 16.0).astype("float32").reshape(-1, 8, 8, 1)
X_TRAIN, X_VAL, Y_TRAIN, Y_VAL = train_test_split(x, y.astype("int32"), test_size=0.2,
                                                  random_state=0)
if args.api != "trial":  # whole batches: Keras would train a short last one, localdet not
    WHOLE = len(X_TRAIN) // BATCH_SIZE * BATCH_SIZE
    X_TRAIN, Y_TRAIN = X_TRAIN[:WHOLE], Y_TRAIN[:WHOLE]


def build_model(learning_rate: float) -> tf.keras.Model:
    model = tf.keras.Sequential([
        tf.keras.Input(shape=(8, 8, 1)),
        tf.keras.layers.Conv2D(32, 3, activation="relu"),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10, activation="softmax"),
    ])
    model.compile(optimizer=tf.keras.optimizers.Adam(learning_rate=learning_rate),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


class BenchTrial(det_keras.TFKerasTrial):
    """The same model and data as the bare run, as a Determined user writes a trial."""

    def build_model(self):
        model = self.context.wrap_model(build_model(self.context.get_hparam("learning_rate")))
        self.context.wrap_optimizer(model.optimizer)
        return model

    def build_training_data_loader(self):
        return X_TRAIN, Y_TRAIN

    def build_validation_data_loader(self):
        return X_VAL, Y_VAL


def run_bare(batches: int, seed: int, out_dir: Path) -> tuple[float, float]:
    """(seconds, val_accuracy) of fit + evaluate + save, with the trial's data pipeline."""
    start = time.perf_counter()
    tf.keras.utils.set_random_seed(seed)
    model = build_model(LEARNING_RATE)
    # The same batches, in the same order, as the localdet trial trains on.
    train = _data.training_stream((X_TRAIN, Y_TRAIN), BATCH_SIZE, seed).dataset
    val = (tf.data.Dataset.from_tensor_slices((X_VAL, Y_VAL)).batch(BATCH_SIZE)
           .prefetch(tf.data.AUTOTUNE))
    model.fit(train, steps_per_epoch=batches, epochs=1, shuffle=False, verbose=0)
    results = model.evaluate(val, verbose=0, return_dict=True)
    model.save(out_dir / "model.h5")
    return time.perf_counter() - start, float(results["accuracy"])


def run_bare_fit(epochs: int, seed: int, out_dir: Path) -> tuple[float, float, list[float]]:
    """(seconds, val_accuracy, the middle epochs' times) of a script's fit and save."""
    start = time.perf_counter()
    tf.keras.utils.set_random_seed(seed)
    model = build_model(LEARNING_RATE)
    clock = epoch_clock(tf.keras.callbacks.Callback)
    history = model.fit(X_TRAIN, Y_TRAIN, batch_size=BATCH_SIZE, epochs=epochs, verbose=0,
                        validation_data=(X_VAL, Y_VAL), callbacks=[clock])
    model.save(out_dir / "model.h5")
    return (time.perf_counter() - start, float(history.history["val_accuracy"][-1]),
            clock.middle())


def run_localdet_fit(layout: Layout, epochs: int) -> tuple[float, float, list[float]]:
    """A script's context.fit, recorded as the daemon's trial would be."""
    with epochs_trial(layout, raw_config(1), [Path(__file__)]) as (reporter, start):
        info = reporter.trial_info()
        prepare_process(info)
        context = KerasContext(info, reporter)
        model = build_model(LEARNING_RATE)
        context.wrap_optimizer(model.optimizer)
        clock = epoch_clock(tf.keras.callbacks.Callback)
        history = context.fit(model, X_TRAIN, Y_TRAIN, batch_size=BATCH_SIZE, epochs=epochs,
                              verbose=0, validation_data=(X_VAL, Y_VAL), callbacks=[clock])
        return (time.perf_counter() - start, float(history.history["val_accuracy"][-1]),
                clock.middle())


def run_localdet_unchanged(layout: Layout, epochs: int, out_dir: Path
                           ) -> tuple[float, float, list[float]]:
    """The bare side's own code, its model.fit served by localdet's hook as in a trial of
    an unchanged script (determined.exec.unchanged_script)."""
    with epochs_trial(layout, raw_config(1), [Path(__file__)]) as (reporter, start):
        info = reporter.trial_info()
        prepare_process(info)
        _unchanged.install(ScriptFits(info, reporter, managed=False).fit)
        try:
            _, accuracy, epoch_times = run_bare_fit(epochs, info.seed, out_dir)
        finally:
            _unchanged.uninstall()
        return time.perf_counter() - start, accuracy, epoch_times


def raw_config(batches: int) -> dict:
    return {
        "name": "overhead-bench", "entrypoint": "overhead:BenchTrial",
        "hyperparameters": {"global_batch_size": BATCH_SIZE, "learning_rate": LEARNING_RATE},
        "searcher": {"name": "single", "metric": "val_accuracy", "smaller_is_better": False,
                     "max_length": {"batches": batches}},
        "scheduling_unit": 100, "min_validation_period": {"batches": 0},
        "min_checkpoint_period": {"batches": 0}, "max_restarts": 0,
        "reproducibility": {"experiment_seed": SEED},
    }


def run_localdet(layout: Layout, batches: int, report_url: str | None = None
                 ) -> tuple[float, float]:
    """(seconds, val_accuracy) of a whole trial, run in this process; stdout to trial.log.
    With `report_url`, it reports over HTTP to that report server."""
    experiment_id, trial_id = create_trial(layout, raw_config(batches), [Path(__file__)])
    log_path = layout.trial_log(experiment_id, trial_id)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    db = StateDB.open(layout.db)
    if report_url:  # launched, as the daemon records it: the server answers only then
        db.update_trial(trial_id, state="RUNNING", started_at=now())
    with open(log_path, "a") as log, contextlib.redirect_stdout(log):
        start = time.perf_counter()
        if report_url:
            env = trial_environment(layout, trial_id, 1, report_url)
            reporter = HTTPReporter(report_url, trial_id, 1, env["LOCALDET_REPORT_TOKEN"],
                                    model_dir=layout.model_dir(experiment_id),
                                    trial_dir=layout.trial_dir(experiment_id, trial_id))
            reporter.start()
        else:
            reporter = SQLiteReporter(layout, trial_id)
        TrialController.for_trial_class(BenchTrial, reporter.trial_info(), reporter).run()
        seconds = time.perf_counter() - start
    last = db.metrics(trial_id, "validation")[-1].metrics
    db.close()
    if not report_url:
        reporter.db.close()
    return seconds, float(last["val_accuracy"])


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="localdet-bench-") as tmp:
        layout = Layout(Path(tmp) / "home").ensure()
        os.environ["LOCALDET_HOME"] = str(layout.home)
        bare_dir = Path(tmp) / "bare"
        bare_dir.mkdir()
        seed = searcher_trial(raw_config(args.batches))[1].seed  # the bare run uses the trial's
        server = ReportServer(layout, "127.0.0.1").start() if args.remote else None

        def timed(side: str, length: int) -> tuple[float, float, list[float]]:
            tf.keras.backend.clear_session()
            gc.collect()
            if args.api == "fit":
                return (run_bare_fit(length, seed, bare_dir) if side == "bare"
                        else run_localdet_fit(layout, length))
            if args.api == "unchanged":
                return (run_bare_fit(length, seed, bare_dir) if side == "bare"
                        else run_localdet_unchanged(layout, length, bare_dir))
            return (*(run_bare(length, seed, bare_dir) if side == "bare"
                      else run_localdet(layout, length, server and server.url)), [])

        length = args.epochs if args.api != "trial" else args.batches
        warmup = 2 if args.api != "trial" else args.warmup
        if warmup:
            timed("bare", warmup)
            timed("localdet", warmup)
        times, epoch_times = alternate(timed, args.repeats, length)

    bare, localdet = statistics.median(times["bare"]), statistics.median(times["localdet"])
    devices = ", ".join(d.device_type for d in tf.config.list_logical_devices()) or "?"
    what = (f"{args.epochs} epochs with validation" if args.api != "trial"
            else f"{args.batches} batches")
    print(f"{keras_line()} (TensorFlow {tf.__version__}, devices: {devices}), "
          f"{what} of {BATCH_SIZE}")
    print(f"bare model.fit: {bare:.2f} s (median of {args.repeats})")
    side = {"fit": "context.fit", "unchanged": "unchanged script's model.fit under localdet",
            "trial": "localdet trial"}[args.api]
    side += " over HTTP (HTTPReporter + ReportServer)" if args.remote else ""
    print(f"{side}: {localdet:.2f} s (median of {args.repeats})")
    if args.api == "trial":
        print(f"ratio: {localdet / bare:.3f} (target <= 1.05)")
    else:
        print(f"ratio: {localdet / bare:.3f} (whole runs: set-up and the last checkpoint too)")
    print(f"ratio of the fastest runs: {min(times['localdet']) / min(times['bare']):.3f}")
    if args.api != "trial":
        print_epoch_times(epoch_times, 1.02 if args.api == "unchanged" else 1.05)


if __name__ == "__main__":
    main()
