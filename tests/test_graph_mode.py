"""A trial whose code disables eager execution (TensorFlow 1-style graph mode, Keras 2's v1
models) trains, validates, checkpoints, pauses and resumes through the trial controller, and
its checkpoint loads in a default (Keras 3) process.

Graph mode is process-global, so the controller runs in a subprocess: this file, run as a
script, trains the compat folder straight through and again paused twice (each segment in a
fresh graph, as a resumed process would be) and writes what the test compares.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

FOLDER = Path(__file__).resolve().parent / "compat" / "graph_mode"
TARGET = 12
PAUSES = (3, 8)  # mid-pass (5 batches a pass), and where a validation is due


class PausingReporter:
    """The real reporter, asking the trial to pause once at each of the given batches."""

    def __init__(self, inner, pause_at):
        self._inner = inner
        self._pending = set(pause_at)

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def should_pause(self) -> bool:
        batches = self._inner.db.trial(self._inner.trial_id).batches_trained
        if batches in self._pending:
            self._pending.discard(batches)
            return True
        return False


def _train(tmp_path: Path, pause_at=()) -> dict:
    """Run the trial to its end in this (graph-mode) process; returns its record."""
    import tensorflow as tf
    from conftest import start_trial
    from model_def import GraphModeTrial

    from determined.keras._trial_controller import TrialController

    db, trial_id, reporter, _ = start_trial(
        tmp_path, TARGET, hparams={"global_batch_size": 8},
        entrypoint="model_def:GraphModeTrial", min_validation_period={"batches": 4},
        scheduling_unit=1)
    shutil.copytree(FOLDER, tmp_path / "model", dirs_exist_ok=True)  # over the stub
    pausing = PausingReporter(reporter, pause_at)
    segments, paused = [], True
    while paused:
        tf.keras.backend.clear_session()  # a fresh graph and session, as in a new process
        controller = TrialController.for_trial_class(GraphModeTrial, reporter.trial_info(),
                                                     pausing)
        controller.run()
        paused = controller.paused
        segments.append(controller.batches_trained)
    weights = tf.keras.backend.batch_get_value(controller.model.weights)
    from localdet.reporting.sqlite_reporter import CheckpointReader

    reader = CheckpointReader(reporter.layout)
    export = reader.materialize(reader.resolve(trial_id=trial_id), tmp_path / "export")
    return {"segments": segments, "weights": [w.tolist() for w in weights],
            "optimizer": [np.asarray(v).tolist() for v in tf.keras.backend.batch_get_value(
                controller.model.optimizer.weights)],
            "metrics": [[m.kind, m.batches_trained, m.metrics] for m in db.metrics(trial_id)],
            "checkpoints": [c.batches_trained for c in db.checkpoints(trial_id=trial_id)],
            "export": str(export)}


def main(out: Path) -> None:
    sys.path[:0] = [str(FOLDER), str(Path(__file__).resolve().parent)]
    import model_def  # noqa: F401  (disables eager execution, as the trial's import would)

    record = {"straight": _train(out / "straight"),
              "paused": _train(out / "paused", PAUSES)}
    (out / "record.json").write_text(json.dumps(record))


@pytest.fixture(scope="module")
def record(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("graph_mode")
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    result = subprocess.run([sys.executable, __file__, str(out)], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads((out / "record.json").read_text())


def test_a_graph_mode_trial_paused_twice_ends_like_an_uninterrupted_run(record):
    straight, paused = record["straight"], record["paused"]
    assert straight["segments"] == [TARGET]
    assert paused["segments"] == [*PAUSES, TARGET]
    assert straight["weights"] == paused["weights"]
    assert straight["optimizer"] == paused["optimizer"]  # the momentum slots, restored
    assert paused["metrics"] == straight["metrics"]
    kinds = {(kind, batches) for kind, batches, _ in straight["metrics"]}
    assert {("validation", 4), ("validation", 8), ("validation", TARGET)} <= kinds
    assert paused["checkpoints"] == [*PAUSES, TARGET]


def test_its_checkpoint_loads_and_evaluates_in_a_keras_3_process(record):
    sys.path.insert(0, str(FOLDER))
    from determined.keras import load_model_from_checkpoint_path

    x, y, _ = _validation()
    model = load_model_from_checkpoint_path(record["paused"]["export"])
    recorded = [m for kind, batches, m in record["paused"]["metrics"]
                if kind == "validation" and batches == TARGET][0]
    metrics = model.evaluate(x, y, batch_size=8, verbose=0, return_dict=True)
    assert metrics["loss"] == pytest.approx(recorded["val_loss"], rel=1e-5)


def _validation():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(20, 4)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], "float32") + 0.25).astype("float32")
    return x, y, None


if __name__ == "__main__":
    main(Path(sys.argv[1]))
