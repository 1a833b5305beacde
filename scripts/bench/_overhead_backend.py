"""overhead.py's `--api unchanged` (and `--api fit`) on Keras 3's JAX or PyTorch backend,
where TensorFlow may be absent: `overhead.py --backend jax|torch` runs this file in the python
that has the backend (see there), with KERAS_BACKEND set (a `_` module: what runs it is
overhead.py).

    python scripts/bench/overhead.py --backend jax --api unchanged          # 15 epochs, 3 repeats
    python scripts/bench/overhead.py --backend torch --python PY --smoke    # a check that it runs

The same conv net on digits-shaped data as overhead.py (scikit-learn's digits where it is
installed, else stand-in data of the same shapes, told in the output), trained two ways in
this process (the training set cut to whole batches, as there):

  bare      `run_bare_fit`: keras.utils.set_random_seed, build + compile, model.fit(x, y,
            epochs=E, validation_data=...), model.save(model.keras)
  localdet  a trial's rows made as the daemon makes them (scripts/bench/_trial_setup.py); then
            what determined.exec.unchanged_script does in a trial on this backend (reporter,
            prepare_process, the fit hook) and the same `run_bare_fit`, whose model.fit is
            trained by localdet's backend runner (metrics, one checkpoint at the end); with
            `--api fit`, a script's context.fit instead.

JAX's persistent compilation cache is shared by both sides (a folder of the run's own), so
neither side compiles less than the other. Timed and printed as overhead.py does; nothing
is asserted.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

SEED = 42
BATCH_SIZE = 32
LEARNING_RATE = 1e-3

sys.path.insert(0, str(Path(__file__).resolve().parent))

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--api", choices=("unchanged", "fit"), default="unchanged")
parser.add_argument("--epochs", type=int, default=15)
parser.add_argument("--repeats", type=int, default=3)
parser.add_argument("--smoke", action="store_true",
                    help="a check that it runs: 3 epochs, 1 repeat, no warm-up")
args = parser.parse_args()
if args.smoke:
    args.epochs, args.repeats = 3, 1  # one epoch between the first and the last
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
if os.environ.get("KERAS_BACKEND") not in ("jax", "torch"):
    sys.exit("_overhead_backend.py: set KERAS_BACKEND=jax or torch (overhead.py --backend does)")

scratch = tempfile.TemporaryDirectory(prefix="localdet-bench-")
if os.environ["KERAS_BACKEND"] == "jax":  # both sides compile into one cache
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(Path(scratch.name) / "jax-cache"))

import keras  # noqa: E402
import numpy as np  # noqa: E402
from _timing import alternate, epoch_clock, print_epoch_times  # noqa: E402
from _trial_setup import epochs_trial, searcher_trial  # noqa: E402

from determined.keras import _backend_fit, _unchanged  # noqa: E402
from determined.keras._backend_context import BackendKerasContext  # noqa: E402
from determined.keras._unchanged_fit import ScriptFits  # noqa: E402
from localdet.paths import Layout  # noqa: E402


def digits() -> tuple:
    """scikit-learn's digits as overhead.py reads them, or stand-in data of their shapes."""
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError:
        rng = np.random.default_rng(0)
        x = rng.random((1797, 8, 8, 1)).astype("float32")
        y = (x.reshape(len(x), -1)[:, :10].argmax(axis=1)).astype("int32")  # learnable
        return ("stand-in data of digits' shapes (scikit-learn is not installed)",
                x[:1437], x[1437:], y[:1437], y[1437:])
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32").reshape(-1, 8, 8, 1)
    return ("scikit-learn's digits",
            *train_test_split(x, y.astype("int32"), test_size=0.2, random_state=0))


DATA, X_TRAIN, X_VAL, Y_TRAIN, Y_VAL = digits()
# Whole batches (as overhead.py's --api fit|unchanged): Keras would end each epoch with a short
# batch where localdet's are all full, so the sides would not train the same examples.
WHOLE = len(X_TRAIN) // BATCH_SIZE * BATCH_SIZE
X_TRAIN, Y_TRAIN = X_TRAIN[:WHOLE], Y_TRAIN[:WHOLE]


def build_model() -> keras.Model:
    model = keras.Sequential([
        keras.Input(shape=(8, 8, 1)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])
    model.compile(optimizer=keras.optimizers.Adam(learning_rate=LEARNING_RATE),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def run_bare_fit(epochs: int, seed: int, out_dir: Path) -> tuple[float, float, list[float]]:
    """An unchanged script's training: (seconds, last val_accuracy, the middle epochs'
    times)."""
    start = time.perf_counter()
    keras.utils.set_random_seed(seed)
    model = build_model()
    clock = epoch_clock(keras.callbacks.Callback)
    history = model.fit(X_TRAIN, Y_TRAIN, batch_size=BATCH_SIZE, epochs=epochs, verbose=0,
                        validation_data=(X_VAL, Y_VAL), callbacks=[clock])
    model.save(out_dir / "model.keras")
    return (time.perf_counter() - start, float(history.history["val_accuracy"][-1]),
            clock.middle())


def raw_config() -> dict:
    return {
        "name": "overhead-bench", "entrypoint_script": "python3 _overhead_backend.py",
        "hyperparameters": {},
        "searcher": {"name": "single", "metric": "val_accuracy", "smaller_is_better": False,
                     "max_length": {"batches": 1}},
        "scheduling_unit": 100, "min_validation_period": {"batches": 0},
        "min_checkpoint_period": {"batches": 0}, "max_restarts": 0,
        "reproducibility": {"experiment_seed": SEED},
    }


def run_localdet(layout: Layout, epochs: int, out_dir: Path) -> tuple[float, float, list]:
    """The bare side's code in a trial's process (or a context.fit script's), its stdout
    to the trial's log."""
    with epochs_trial(layout, raw_config(), [Path(__file__)]) as (reporter, start):
        info = reporter.trial_info()
        _backend_fit.prepare_process(info)
        if args.api == "unchanged":
            _unchanged.install(ScriptFits(info, reporter, managed=False).fit)
            try:
                _, accuracy, epoch_times = run_bare_fit(epochs, info.seed, out_dir)
            finally:
                _unchanged.uninstall()
        else:
            context = BackendKerasContext(info, reporter)
            model = build_model()
            context.wrap_optimizer(model.optimizer)
            clock = epoch_clock(keras.callbacks.Callback)
            history = context.fit(model, X_TRAIN, Y_TRAIN, batch_size=BATCH_SIZE,
                                  epochs=epochs, verbose=0, validation_data=(X_VAL, Y_VAL),
                                  callbacks=[clock])
            accuracy, epoch_times = float(history.history["val_accuracy"][-1]), clock.middle()
        return time.perf_counter() - start, accuracy, epoch_times


def main() -> None:
    layout = Layout(Path(scratch.name) / "home").ensure()
    os.environ["LOCALDET_HOME"] = str(layout.home)
    bare_dir = Path(scratch.name) / "bare"
    bare_dir.mkdir()
    seed = searcher_trial(raw_config())[1].seed  # the bare run uses the trial's

    def timed(side: str, epochs: int) -> tuple[float, float, list[float]]:
        keras.backend.clear_session()
        gc.collect()
        return (run_bare_fit(epochs, seed, bare_dir) if side == "bare"
                else run_localdet(layout, epochs, bare_dir))

    if not args.smoke:  # untimed: imports, first compilations
        timed("bare", 2)
        timed("localdet", 2)
    times, epoch_times = alternate(timed, args.repeats, args.epochs)
    bare, localdet = statistics.median(times["bare"]), statistics.median(times["localdet"])
    if keras.backend.backend() == "torch":  # keras.distribution is JAX's alone
        import torch

        devices = "cuda" if torch.cuda.is_available() else "cpu"
    else:
        devices = ", ".join(str(d) for d in keras.distribution.list_devices()) or "?"
    print(f"keras3 on {keras.backend.backend()} (Keras {keras.__version__}, devices: "
          f"{devices}; TensorFlow imported: {'tensorflow' in sys.modules}), {args.epochs} "
          f"epochs with validation of {BATCH_SIZE}, {DATA}")
    print(f"bare model.fit: {bare:.2f} s (median of {args.repeats})")
    side = {"fit": "context.fit",
            "unchanged": "unchanged script's model.fit under localdet"}[args.api]
    print(f"{side}: {localdet:.2f} s (median of {args.repeats})")
    print(f"ratio: {localdet / bare:.3f} (whole runs: set-up and the last checkpoint too)")
    print(f"ratio of the fastest runs: {min(times['localdet']) / min(times['bare']):.3f}")
    print_epoch_times(epoch_times, 1.02)


if __name__ == "__main__":
    try:
        main()
    finally:
        scratch.cleanup()
