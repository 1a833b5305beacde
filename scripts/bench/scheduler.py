"""How well does the daemon keep its slots busy with many short trials?

A real daemon (temporary LOCALDET_HOME, `--slots 2` CPU slots) runs a random search of
`--trials` (default 40) trials of the digits example, each only `--batches` batches long, so
that a trial is mostly process start-up (Python, TensorFlow, the model) and the gaps the
scheduler leaves between trials show. From the trials' recorded start and end times:

  utilisation   busy slot-seconds / available slot-seconds between the first start and the
                last end (target >= 0.90)
  gap           per slot, the time from one trial's end to the next one's start; the median
                is printed (target <= 1 s)

The baseline, measured in the same run: the same number of bare `python -c "import
tensorflow; fit the same model"` processes through a pool of 2 workers, no daemon. The ratio
of wall times (daemon / bare) is what scheduling, recording and checkpointing cost.

    python scripts/bench/scheduler.py               # 40 trials on 2 slots
    python scripts/bench/scheduler.py --trials 10   # a quicker look
    python scripts/bench/scheduler.py --smoke       # 2 trials on 1 slot: that it runs

Timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "digits_trial"
BARE_TRIAL = """
import os, sys
sys.path.insert(0, os.environ["EXAMPLE"])
import tensorflow as tf
from model_def import load_data
x, _, y, _ = load_data()
model = tf.keras.Sequential([tf.keras.Input(shape=(64,)),
                             tf.keras.layers.Dense(32, activation="relu"),
                             tf.keras.layers.Dense(10, activation="softmax")])
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
model.fit(x[:32 * int(os.environ["BATCHES"])], y[:32 * int(os.environ["BATCHES"])],
          batch_size=32, verbose=0)
"""

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--trials", type=int, default=40)
parser.add_argument("--slots", type=int, default=2)
parser.add_argument("--batches", type=int, default=5, help="how long each trial trains")
parser.add_argument("--smoke", action="store_true",
                    help="the same figures from 2 trials of 2 batches on 1 slot (TensorFlow's "
                         "start-up: tens of seconds)")
args = parser.parse_args()
if args.smoke:
    args.trials, args.slots, args.batches = 2, 1, 2


def config() -> dict:
    return {
        "name": "scheduler-bench",
        "entrypoint": "model_def:DigitsTrial",
        "hyperparameters": {"global_batch_size": 32, "dropout": 0.0,
                            "hidden_units": {"type": "int", "minval": 16, "maxval": 64},
                            "learning_rate": {"type": "log", "minval": -3, "maxval": -1}},
        "searcher": {"name": "random", "metric": "val_accuracy", "smaller_is_better": False,
                     "max_length": {"batches": args.batches}, "max_trials": args.trials,
                     "max_concurrent_trials": args.slots * 2},
        "max_restarts": 0,
        "reproducibility": {"experiment_seed": 1},
    }


def seconds(text: str) -> float:
    return datetime.datetime.fromisoformat(text).timestamp()


def run_daemon() -> tuple[float, list[tuple[float, float, list[int]]]]:
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "LOCALDET_HOME": home}
        daemon = subprocess.Popen([sys.executable, "-m", "localdet", "daemon",
                                   "--slots", str(args.slots)], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            config_path = Path(home) / "bench.yaml"
            config_path.write_text(yaml.safe_dump(config()))
            submitted = time.monotonic()
            subprocess.run([sys.executable, "-m", "localdet", "submit", str(config_path),
                            str(EXAMPLE)], env=env, check=True, stdout=subprocess.DEVNULL)
            db = sqlite3.connect(Path(home) / "localdet.db", timeout=30)
            while True:
                time.sleep(0.5)
                try:
                    rows = db.execute("SELECT state FROM experiments").fetchall()
                except sqlite3.OperationalError:  # the daemon has yet to create its tables
                    continue
                if rows and rows[0][0] not in ("ACTIVE", "PAUSED"):
                    break
            wall = time.monotonic() - submitted
            state = rows[0][0]
            trials = db.execute(
                "SELECT started_at, ended_at, slots, state FROM trials").fetchall()
            db.close()
        finally:
            daemon.terminate()
            daemon.wait()
    if state != "COMPLETED":
        sys.exit(f"the search ended {state}; see the daemon's log")
    return wall, [(seconds(s), seconds(e), json.loads(slots)) for s, e, slots, _ in trials]


def run_bare() -> float:
    env = {**os.environ, "EXAMPLE": str(EXAMPLE), "BATCHES": str(args.batches),
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    start = time.monotonic()
    with ThreadPoolExecutor(args.slots) as pool:
        list(pool.map(lambda _: subprocess.run([sys.executable, "-c", BARE_TRIAL], env=env,
                                               check=True, stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL), range(args.trials)))
    return time.monotonic() - start


def main() -> None:
    bare = run_bare()
    wall, trials = run_daemon()
    first = min(start for start, _, _ in trials)
    last = max(end for _, end, _ in trials)
    busy = sum((end - start) * len(slots) for start, end, slots in trials)
    utilisation = busy / (args.slots * (last - first))
    gaps = []
    for slot in range(args.slots):
        on_slot = sorted((start, end) for start, end, slots in trials if slot in slots)
        gaps += [b[0] - a[1] for a, b in itertools.pairwise(on_slot)]
    print(f"{len(trials)} trials of {args.batches} batches on {args.slots} CPU slots")
    print(f"  utilisation        {utilisation:.3f}   (target >= 0.90)")
    print(f"  median gap         {statistics.median(gaps):.3f} s (target <= 1 s; "
          f"max {max(gaps):.3f} s)")
    print(f"  wall: daemon       {wall:.1f} s (submit to experiment COMPLETED)")
    print(f"  wall: bare pool    {bare:.1f} s ({args.slots} workers, bare model.fit processes)")
    print(f"  ratio              {wall / bare:.2f}")


if __name__ == "__main__":
    main()
