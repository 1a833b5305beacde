"""How does a trial's throughput scale with its slots?

For each slot count (1, 2, and every GPU count above 2 where GPUs exist), a fresh process
trains the same TFKerasTrial (a small conv net on scikit-learn's digits, upsampled to 28x28)
through localdet's own TrialController, as the launcher would start it with that many
slots (LOCALDET_SLOTS): one slot trains on one device; N slots under Keras 3 train in one
process on a MirroredStrategy over N GPUs, or N logical CPU devices without a GPU. Each
process first trains a short warm-up trial (tracing, threads), then times a second trial
of `--batches` batches of `--global-batch-size` samples.

Prints samples per second for each slot count, the scaling efficiency
((samples/s on N) / (N x samples/s on 1)) and, as the correctness check, the largest
difference between the final weights on N slots and on 1 (the same global batch size
must give the same training, to float rounding). On CPU, N logical devices share the same
cores: the efficiency there measures overhead, not speed-up; on GPUs it is the real figure.
In float32 the weight difference grows with training (a rounding difference flips a ReLU or
a max-pool choice now and then, and SGD carries it on): measured here, 3e-8 after 10
batches, 2.5e-4 after 200; with `set_floatx("float64")` it is 6e-17 after 200, so the
training itself is the same.

    python scripts/bench/scaling.py                 # 1 and 2 slots
    python scripts/bench/scaling.py --batches 400   # longer timed run

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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _trial_setup import create_trial  # noqa: E402  (imports no TensorFlow)

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--batches", type=int, default=200, help="batches in the timed trial")
parser.add_argument("--global-batch-size", type=int, default=64)
parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)  # slots, in a worker
parser.add_argument("--out", help=argparse.SUPPRESS)
args = parser.parse_args()

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


def worker(slots: int, out: Path) -> None:
    """One slot count, in a process of its own (the strategy is made once per process)."""
    from localdet.paths import Layout

    home = Path(tempfile.mkdtemp(prefix="scaling-"))
    os.environ["LOCALDET_HOME"] = str(home)
    layout = Layout(home).ensure()
    model_def = home / "model_def.py"
    model_def.write_text(MODEL_DEF)
    sys.path.insert(0, str(home))
    from determined.keras._trial_controller import TrialController  # starts TensorFlow
    from localdet.reporting import SQLiteReporter
    from model_def import ConvDigits

    timings = {}
    for name, batches in (("warm-up", 20), ("timed", args.batches)):
        _, trial_id = create_trial(layout, raw_config(name, batches), [model_def])
        reporter = SQLiteReporter(layout, trial_id)
        controller = TrialController.for_trial_class(ConvDigits, reporter.trial_info(), reporter)
        start = time.perf_counter()
        controller.run()
        timings[name] = time.perf_counter() - start
    weights = [w.tolist() for w in controller.model.get_weights()]
    out.write_text(json.dumps({"seconds": timings["timed"], "weights": weights}))


def gpu_count() -> int:
    from localdet.slots import GPU, detect_slots

    return sum(1 for slot in detect_slots() if slot.kind == GPU)


def main() -> None:
    import numpy as np

    gpus = gpu_count()
    counts = [1, 2] + list(range(3, gpus + 1))
    results = {}
    for slots in counts:
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            env = {**os.environ, "LOCALDET_SLOTS": ",".join(map(str, range(slots))),
                   "TF_CPP_MIN_LOG_LEVEL": "2"}
            if not gpus:
                env["CUDA_VISIBLE_DEVICES"] = ""
            subprocess.run([sys.executable, __file__, "--worker", str(slots), "--out", out.name,
                            "--batches", str(args.batches),
                            "--global-batch-size", str(args.global_batch_size)],
                           env=env, check=True, stdout=subprocess.DEVNULL)
            results[slots] = json.loads(Path(out.name).read_text())
    samples = args.batches * args.global_batch_size
    one = samples / results[1]["seconds"]
    kind = f"{gpus} GPU(s)" if gpus else "CPU (logical devices share 2 cores: overhead only)"
    print(f"{args.batches} batches of {args.global_batch_size} samples, conv net on digits; {kind}")
    for slots in counts:
        rate = samples / results[slots]["seconds"]
        difference = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
                         for a, b in zip(results[slots]["weights"], results[1]["weights"]))
        print(f"  {slots} slot(s)  {rate:8.0f} samples/s   efficiency {rate / (slots * one):.2f}"
              f"   max |weights - 1 slot| {difference:.1e}")


if __name__ == "__main__":
    if args.worker:
        worker(args.worker, Path(args.out))
    else:
        main()
