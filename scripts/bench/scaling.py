"""How does a trial's throughput scale with its slots, on every engine?

Each engine line trains the same TFKerasTrial (a small conv net on scikit-learn's digits,
upsampled to 28x28) through localdet's own TrialController on 1 slot (engine "single") and
on 2 slots (and on every GPU count above 2 where GPUs exist), each run started as the
launcher would start that trial (LOCALDET_ENGINE, LOCALDET_SLOTS, localdet/processes/launcher.py):

- Keras 3: "mirrored", one process with a MirroredStrategy over N GPUs, or over N logical
  CPU devices without a GPU.
- Keras 2 (TF_USE_LEGACY_KERAS=1): "multi_worker_mirrored", N processes under the rank
  supervisor (python -m localdet.processes.ranks --tf-config).
- Horovod: "horovod", N processes under the rank supervisor (--horovod), in the TensorFlow
  2.15 + Horovod environment that scripts/horovod-env makes (or `--horovod-python`); the line
  is skipped, with a note, where there is none.

This process makes the state folder and each run's two trials (create_trial imports no
TensorFlow); every rank of the run trains them: a short warm-up trial (tracing, threads),
then the timed one of `--batches` batches of `--global-batch-size` samples. Rank 0 reports
the timed trial's seconds and final weights.

Prints, per engine line, samples per second on 1 and on N slots, the scaling efficiency
((samples/s on N) / (N x samples/s on 1), against that line's own 1-slot run in this same
bench run) and, as the correctness check, the largest difference between the final weights
on N slots and on 1 (the same global batch size must give the same training, to float
rounding). On CPU the N processes (or logical devices) share the machine's cores (on a
2-core machine, 2 processes share its 2 cores): the efficiency measures the engine's
overhead, not a speed-up, and the run is an overhead-and-correctness check; on GPUs it is
the real figure.
In float32 the weight difference grows with training (a rounding difference flips a ReLU or
a max-pool choice now and then, and SGD carries it on): measured on CPU for every engine,
1e-8 after 10 batches, 1e-4 to 3e-4 after 100, 2e-4 to 2e-3 after 200; with
`set_floatx("float64")` it is 6e-17 after 200, so the training itself is the same.

    python scripts/bench/scaling.py                 # 1 and 2 slots, every engine
    python scripts/bench/scaling.py --batches 400   # longer timed run
    python scripts/bench/scaling.py --smoke         # seconds: the Keras 3 line, 5 batches

Timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from localdet.paths import Layout

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _trial_setup import create_trial  # noqa: E402  (imports no TensorFlow)

# Where scripts/horovod-env makes the Horovod environment.
HOROVOD_PYTHON = (Path(os.environ.get("LOCALDET_CACHE") or Path.home() / ".cache" / "localdet")
                  / "horovod-0.28.1-tf2.15" / "bin" / "python")

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--batches", type=int, default=200, help="batches in the timed trial")
parser.add_argument("--global-batch-size", type=int, default=64)
parser.add_argument("--horovod-python", default=str(HOROVOD_PYTHON) if HOROVOD_PYTHON.exists()
                    else None, help=f"the Python of a Horovod environment (default: "
                    f"{HOROVOD_PYTHON}, where it exists)")
parser.add_argument("--trials", type=int, nargs="+", help=argparse.SUPPRESS)  # in a worker
parser.add_argument("--out", help=argparse.SUPPRESS)
parser.add_argument("--smoke", action="store_true",
                    help="a check that it runs (tests/test_scripts.py): the Keras 3 line alone, "
                    "5 timed batches, no warm-up")
args = parser.parse_args()
if args.smoke:
    args.batches = 5
# Batches of the untimed warm-up trial before the timed one (none with --smoke).
WARM_UP_BATCHES = 0 if args.smoke else 20

MODEL_DEF = '''
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

from determined import keras


class ConvDigits(keras.TFKerasTrial):
    def __init__(self, context):
        self.context = context
        x, y = load_digits(return_X_y=True)
        images = np.kron(x.reshape(-1, 8, 8), np.ones((4, 4)))[:, 2:30, 2:30, None] / 16.0
        self.x, self.y = images.astype("float32"), y.astype("int32")

    def build_model(self):
        model = self.context.wrap_model(tf.keras.Sequential([
            tf.keras.Input((28, 28, 1)),
            tf.keras.layers.Conv2D(32, 3, activation="relu"),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Conv2D(64, 3, activation="relu"),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(10, activation="softmax"),
        ]))
        model.compile(optimizer=self.context.wrap_optimizer(tf.keras.optimizers.SGD(0.01)),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        return model

    def build_training_data_loader(self):
        return self.x[:1500], self.y[:1500]

    def build_validation_data_loader(self):
        return self.x[1500:], self.y[1500:]
'''


def raw_config(name: str, batches: int) -> dict:
    return {"name": name, "entrypoint": "model_def:ConvDigits",
            "hyperparameters": {"global_batch_size": args.global_batch_size},
            "searcher": {"name": "single", "metric": "val_accuracy", "smaller_is_better": False,
                         "max_length": {"batches": batches}},
            "scheduling_unit": batches, "min_validation_period": {"batches": batches},
            "environment": {"environment_variables": ["TF_DETERMINISTIC_OPS=1"]},
            "reproducibility": {"experiment_seed": 5}}


def worker(trials: list[int], out: Path) -> None:
    """One rank of a run (the only one for "single" and "mirrored"): trains the warm-up
    trial, then the timed one; rank 0 writes the result."""
    layout = Layout.from_environment()
    sys.path.insert(0, str(layout.home))
    from model_def import ConvDigits

    from determined.core import WorkerReporter
    from determined.keras._trial_controller import TrialController  # starts TensorFlow
    from localdet.reporting.sqlite_reporter import SQLiteReporter

    rank = int(os.environ.get("LOCALDET_RANK", "0"))
    for trial_id in trials:
        reporter = SQLiteReporter(layout, trial_id)
        if rank > 0:  # only the chief records, as reporter_from_environment has it
            reporter = WorkerReporter(reporter)
        controller = TrialController.for_trial_class(ConvDigits, reporter.trial_info(), reporter)
        start = time.perf_counter()
        controller.run()
        seconds = time.perf_counter() - start
    if rank == 0:
        weights = [w.tolist() for w in controller.model.get_weights()]
        out.write_text(json.dumps({"seconds": seconds, "weights": weights}))


def run(layout: Layout, python: str, legacy_keras: str | None, engine: str, slots: int,
        gpus: int) -> dict:
    """Train a warm-up and a timed trial on `slots` slots with `engine`, started as the
    launcher would start them; rank 0's result (seconds, weights)."""
    from localdet.processes.launcher import supervised_argv

    home = layout.home
    trials = [create_trial(layout, raw_config(name, batches), [home / "model_def.py"])[1]
              for name, batches in (("warm-up", WARM_UP_BATCHES), ("timed", args.batches))
              if batches]
    devices = ",".join(map(str, range(slots)))
    env = {**os.environ, "LOCALDET_HOME": str(home), "LOCALDET_ENGINE": engine,
           "LOCALDET_SLOTS": devices, "CUDA_VISIBLE_DEVICES": devices if gpus else "",
           "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TF_USE_LEGACY_KERAS", None)  # None: TensorFlow 2.15, whose only Keras is Keras 2
    if legacy_keras is not None:
        env["TF_USE_LEGACY_KERAS"] = legacy_keras
    out = home / f"result-{trials[-1]}.json"
    argv = [python, __file__, "--trials", *map(str, trials), "--out", str(out)]
    # One process, or the rank supervisor as the launcher starts it, run by `python` (the
    # Horovod environment's, whose Horovod runner it needs).
    argv = [python, *supervised_argv(argv, engine, slots)[1:]]
    done = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, check=False)
    if done.returncode:
        sys.exit(f"{engine} on {slots} slot(s) failed (status {done.returncode}):\n"
                 f"{done.stdout}")
    return json.loads(out.read_text())


def gpu_count() -> int:
    from localdet.scheduling.slots import GPU, detect_slots

    return sum(1 for slot in detect_slots() if slot.kind == GPU)


def main() -> None:
    import numpy as np

    from localdet.config import engines
    gpus = gpu_count()
    lines = [("Keras 3", sys.executable, "0", engines.MIRRORED),
             ("Keras 2", sys.executable, "1", engines.MULTI_WORKER_MIRRORED)]
    if args.horovod_python:
        lines.append(("Horovod", args.horovod_python, None, engines.HOROVOD))
    if args.smoke:  # each line is two or three more processes that import TensorFlow
        lines = lines[:1]
    samples = args.batches * args.global_batch_size
    kind = (f"{gpus} GPU(s)" if gpus else
            f"CPU (the slots share {os.cpu_count()} cores: overhead and correctness only)")
    print(f"{args.batches} batches of {args.global_batch_size} samples, conv net on digits; "
          f"{kind}", flush=True)
    with tempfile.TemporaryDirectory(prefix="scaling-") as folder:
        layout = Layout(Path(folder)).ensure()
        (layout.home / "model_def.py").write_text(MODEL_DEF)
        for label, python, legacy_keras, engine in lines:
            one = run(layout, python, legacy_keras, engines.SINGLE, 1, gpus)
            for slots in [2, *range(3, gpus + 1)]:
                result = run(layout, python, legacy_keras, engine, slots, gpus)
                rate_one, rate = samples / one["seconds"], samples / result["seconds"]
                difference = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
                                 for a, b in zip(result["weights"], one["weights"],
                                                 strict=True))  # the same model's weights
                print(f"  {label}  {engine:21}  1 slot {rate_one:6.0f}  {slots} slots "
                      f"{rate:6.0f} samples/s  efficiency {rate / (slots * rate_one):.2f}  "
                      f"max |weights - 1 slot| {difference:.1e}", flush=True)
    if args.smoke:
        print("  Keras 2 and Horovod  skipped: --smoke runs the Keras 3 line alone")
    elif not args.horovod_python:
        print(f"  Horovod  skipped: no --horovod-python, and {HOROVOD_PYTHON} does not exist "
              "(scripts/horovod-env makes it)")


if __name__ == "__main__":
    if args.trials:
        worker(args.trials, Path(args.out))
    else:
        main()
