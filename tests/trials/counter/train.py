"""A trial that trains in milliseconds, for tests that need hundreds of real launches.

It is a real trial process under the daemon: it talks to localdet only through the
`TrialReporter` seam (metrics, checkpoints, `should_pause`), checkpoints at workload
boundaries and on a pause, and resumes exactly. Its "weights" are four numbers moved by a
deterministic step per batch, so any interruption that loses or repeats a batch changes them.

Hyperparameters: `variant` (changes the step), `batch_seconds` (a batch's duration),
`checkpoint_seconds` (how long writing a checkpoint takes), `crash_at` (the first launch
dies at this batch, a later one does not; 0: never); optional: `print_lines` (lines it
prints per batch), `checkpoint_bytes` (random bytes added to each checkpoint).
"""

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from determined.core import reporter_from_environment


def step(weights: np.ndarray, batch: int, seed: int, variant: int) -> np.ndarray:
    return weights * 0.9 + np.sin(batch * (variant + 1) + seed % 1000 + np.arange(4))


def checkpoint(reporter, weights: np.ndarray, batches: int, seconds: float,
               extra_bytes: int = 0) -> None:
    folder = Path(tempfile.mkdtemp(prefix="counter-checkpoint-"))
    time.sleep(seconds)  # a model's weights take a while to write
    if extra_bytes:  # written as a model's file would be: all of it, or an error
        (folder / "weights.bin").write_bytes(os.urandom(extra_bytes))
    (folder / "state.json").write_text(json.dumps({"batches": batches,
                                                   "weights": weights.tolist()}))
    reporter.save_checkpoint(folder, batches, {"framework": "counter"})


def main() -> None:
    reporter = reporter_from_environment()
    info = reporter.trial_info()
    hp = info.hparams
    weights, batches = np.zeros(4), 0
    if info.latest_checkpoint:
        restored = Path(tempfile.mkdtemp(prefix="counter-restore-"))
        reporter.restore_checkpoint(info.latest_checkpoint, restored / "ckpt")
        reporter.verify_restored_checkpoint()
        state = json.loads((restored / "ckpt" / "state.json").read_text())
        weights, batches = np.array(state["weights"]), state["batches"]
        shutil.rmtree(restored)
    crash_marker = info.trial_dir / "crashed-once"
    unit = info.scheduling_unit
    while batches < info.target_batches:
        for _ in range(min(unit, info.target_batches - batches)):
            weights = step(weights, batches, info.seed, hp["variant"])
            batches += 1
            for line in range(hp.get("print_lines", 0)):
                print(f"batch {batches} line {line}: {weights.tolist()}")
            time.sleep(hp["batch_seconds"])
            if batches == hp["crash_at"] and not crash_marker.exists():
                crash_marker.write_text("")
                os._exit(3)  # no checkpoint, no goodbye: a crash
        reporter.report_training_metrics(batches, {"loss": float(np.abs(weights).sum())})
        finished = batches >= info.target_batches
        paused = not finished and reporter.should_pause()
        if finished or paused or batches % info.checkpoint_period == 0:
            checkpoint(reporter, weights, batches, hp["checkpoint_seconds"],
                       hp.get("checkpoint_bytes", 0))
        if paused:
            reporter.wait_for_checkpoints()
            print(f"[trial {info.trial_id}] paused at {batches} batches", flush=True)
            return
    reporter.report_validation_metrics(batches, {"val_loss": float(np.abs(weights).sum())})
    reporter.wait_for_checkpoints()


if __name__ == "__main__":
    main()
