"""Checkpoints of trials that report over HTTP (another machine, `--report http`, Ray): the
store's size and the bytes sent, chunked uploads against whole files (the protocol before
chunked uploads, which older trial processes still speak: `HTTPReporter.chunked = False`).

A frozen-base search, the model of tests/test_chunks.py: Input(256) + 3 frozen Dense(1024)
(9.4 MB of weights) + a trainable Dense(10) head per trial; 4 trials (a grid over the head's
learning rate), 4 checkpoints each (one `train_on_batch` between them), all kept, every
trial an `HTTPReporter` talking to a real `ReportServer` on 127.0.0.1. Prints, for each
protocol: the store's size against one checkpoint, the bytes uploaded for a trial's first
checkpoint and for its later ones (against the file), requests, and the median time from
`save_checkpoint` to committed. Sizes are exact; times are printed, never asserted.

    python scripts/bench/remote_checkpoint.py
    python scripts/bench/remote_checkpoint.py --keras2 --trials 2 --checkpoints 3
    python scripts/bench/remote_checkpoint.py --smoke     # 2 trials x 2 checkpoints
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _trial_setup import add_keras2_flag, select_keras  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
add_keras2_flag(parser)
parser.add_argument("--trials", type=int, default=4)
parser.add_argument("--checkpoints", type=int, default=4, help="checkpoints a trial")
parser.add_argument("--smoke", action="store_true", help="2 trials x 2 checkpoints")
args = parser.parse_args()
if args.smoke:
    args.trials, args.checkpoints = 2, 2
select_keras(args)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from localdet.checkpoints.rechunk import stored_bytes  # noqa: E402
from localdet.checkpoints.store import Store  # noqa: E402
from localdet.config.experiment import parse_config  # noqa: E402
from localdet.paths import Layout  # noqa: E402
from localdet.records.db import StateDB, now  # noqa: E402
from localdet.reporting.http_reporter import HTTPReporter  # noqa: E402
from localdet.reporting.report_server import (  # noqa: E402
    ReportServer,
    daemon_secret,
    launch_token,
)

MODEL = "determined-keras-model.h5"


def frozen_model(trial: int) -> tf.keras.Model:
    tf.keras.utils.set_random_seed(0)  # the same base in every trial
    inputs = tf.keras.Input((256,))
    features = inputs
    for i in range(3):
        features = tf.keras.layers.Dense(1024, activation="relu", name=f"base{i}",
                                         trainable=False)(features)
    tf.keras.utils.set_random_seed(trial)
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(10, activation="softmax",
                                                         name=f"head{trial}")(features))
    model.compile(optimizer=tf.keras.optimizers.Adam(10 ** -(trial + 1)),
                  loss="sparse_categorical_crossentropy", run_eagerly=True)
    return model


class Counted(HTTPReporter):
    """An HTTPReporter that counts its upload requests and their bytes."""

    uploads = 0
    sent = 0

    def _exchange(self, method, path, body, handle, headers=None):
        if method == "PUT":
            Counted.uploads += 1
            Counted.sent += int((headers or {}).get("Content-Length", 0))
        return super()._exchange(method, path, body, handle, headers)


def search(home: Path, chunked: bool) -> dict:
    layout = Layout(home).ensure()
    db = StateDB.open(layout.db)
    config = parse_config({
        "name": "remote-frozen", "entrypoint": "model_def:Trial",
        "hyperparameters": {"global_batch_size": 16},
        "searcher": {"name": "grid", "metric": "val_loss", "max_length": {"batches": 4}},
        "checkpoint_storage": {"save_trial_latest": 100}}).config
    experiment_id = db.create_experiment(
        name="remote-frozen", description="", config=config, original_config="",
        searcher="grid", metric="val_loss", smaller_is_better=True, experiment_seed=1,
        model_dir="")
    server = ReportServer(layout).start()
    x = np.random.default_rng(0).random((16, 256), dtype=np.float32)
    y = np.arange(16, dtype="int32") % 10
    first_sent, later_sent, file_sizes, seconds = [], [], [], []
    Counted.uploads = Counted.sent = 0
    try:
        for trial in range(args.trials):
            trial_id = db.create_trial(experiment_id=experiment_id, request_id=trial + 1,
                                       hparams={}, seed=1, target_batches=4)
            db.update_trial(trial_id, state="RUNNING", started_at=now())
            reporter = Counted(server.url, trial_id, 1,
                               launch_token(daemon_secret(layout), trial_id, 1),
                               trial_dir=home / "node")
            reporter.chunked = chunked
            model = frozen_model(trial)
            for batches in range(1, args.checkpoints + 1):
                model.train_on_batch(x, y)
                folder = home / f"t{trial}b{batches}"
                (folder / "code").mkdir(parents=True)
                (folder / "code" / "model_def.py").write_text("# the model\n")
                model.save(folder / MODEL)
                file_sizes.append((folder / MODEL).stat().st_size)
                before = Counted.sent
                started = time.perf_counter()
                reporter.save_checkpoint(folder, batches, {"framework": "tensorflow"})
                reporter.wait_for_checkpoints()
                seconds.append(time.perf_counter() - started)
                (first_sent if batches == 1 else later_sent).append(Counted.sent - before)
        one = max(c.size_bytes for c in db.checkpoints())
        return {"stored": stored_bytes(Store(layout.store)), "one": one,
                "checkpoints": len(db.checkpoints()), "file": max(file_sizes),
                "first": first_sent, "later": later_sent, "uploads": Counted.uploads,
                "sent": Counted.sent, "seconds": statistics.median(seconds)}
    finally:
        server.close()
        db.close()


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="localdet-remote-ckpt-") as scratch:
        results = {name: search(Path(scratch) / name, chunked)
                   for name, chunked in (("whole files", False), ("chunks", True))}
    print(f"frozen-base search over HTTP: {args.trials} trials x {args.checkpoints} "
          "checkpoints, all kept")
    for name, r in results.items():
        mb = 1e6
        print(f"  {name:11s}  store {r['stored'] / mb:6.1f} MB = {r['stored'] / r['one']:4.2f}x "
              f"one checkpoint ({r['one'] / mb:.1f} MB, {r['checkpoints']} checkpoints); "
              f"sent {r['sent'] / mb:.1f} MB in {r['uploads']} uploads")
        first, later = statistics.median(r["first"]), statistics.median(r["later"])
        print(f"  {'':11s}  a trial's first checkpoint sent {first / mb:5.2f} MB (median), a "
              f"later one {later / mb:5.2f} MB = {later / r['file']:.1%} of the "
              f"{r['file'] / mb:.1f} MB .h5; save to committed {r['seconds'] * 1000:.0f} ms "
              "(median)")


if __name__ == "__main__":
    main()
