"""Laptop mode: a New Keras API script run on its own records itself as an unmanaged
experiment (runner 'script'), unless recording is off."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from localdet.records.db import StateDB

REPO = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent("""
    import os
    import numpy as np
    import tensorflow as tf
    import determined as det
    import determined.keras

    context = det.keras.init(**eval(os.environ.get("INIT_ARGS", "{}")))
    hparams = context.training.hparams
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int64")
    model = tf.keras.Sequential([tf.keras.Input(shape=(4,)),
                                 tf.keras.layers.Dense(hparams["units"], activation="relu"),
                                 tf.keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer=context.wrap_optimizer(tf.keras.optimizers.SGD(0.1)),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    history = context.fit(model, x, y, batch_size=16, epochs=3, validation_split=0.25,
                          verbose=0)
    print("epochs", history.epoch)
    if os.environ.get("FAIL_AFTER_FIT"):
        raise RuntimeError("the script broke after training")
""")


def run_script(tmp_path: Path, **env) -> subprocess.CompletedProcess:
    folder = tmp_path / "project"
    folder.mkdir(exist_ok=True)
    (folder / "train.py").write_text(SCRIPT)
    (folder / "big.bin").write_bytes(b"\0" * 2048)  # data beside the script: not code
    environment = {**os.environ, "LOCALDET_HOME": str(tmp_path / "home"),
                   "TF_CPP_MIN_LOG_LEVEL": "2", **env}
    environment.pop("LOCALDET_TRIAL_ID", None)
    return subprocess.run([sys.executable, "train.py"], cwd=folder, env=environment,
                          capture_output=True, text=True, timeout=300)


def records(tmp_path: Path):
    db = StateDB.open(tmp_path / "home" / "localdet.db")
    experiments = db.experiments()
    trials = db.trials()
    return db, experiments, trials


def test_a_script_run_on_its_own_is_recorded_as_an_unmanaged_experiment(tmp_path):
    done = run_script(tmp_path, INIT_ARGS="{'hparams': {'units': 8}}")
    assert done.returncode == 0, done.stderr
    assert "epochs [0, 1, 2]" in done.stdout
    assert "recording this run as experiment 1" in done.stdout
    db, experiments, trials = records(tmp_path)
    (experiment,), (trial,) = experiments, trials
    assert (experiment.runner, experiment.state, experiment.name) == ("script", "COMPLETED",
                                                                      "train")
    assert trial.state == "COMPLETED" and trial.hparams == {"units": 8}
    assert trial.target_batches == trial.batches_trained == 9  # 3 epochs of 48 // 16
    assert [m.batches_trained for m in db.metrics(trial.id, "validation")] == [3, 6, 9]
    (checkpoint,) = db.checkpoints(trial_id=trial.id)
    code = set(checkpoint.manifest["files"])
    assert "code/train.py" in code and "code/big.bin" not in code
    status = subprocess.run([sys.executable, "-m", "localdet", "status", "--json"],
                            env={**os.environ, "LOCALDET_HOME": str(tmp_path / "home")},
                            capture_output=True, text=True, check=True)
    assert '"runner": "script"' in status.stdout


def test_hyperparameters_come_from_the_config_named_by_LOCALDET_CONFIG(tmp_path):
    config = tmp_path / "const.yaml"
    config.write_text("name: from-config\nentrypoint_script: python3 train.py\n"
                      "hyperparameters:\n  units: {type: int, minval: 3, maxval: 5}\n")
    done = run_script(tmp_path, LOCALDET_CONFIG=str(config))
    assert done.returncode == 0, done.stderr
    _, (experiment,), (trial,) = records(tmp_path)
    assert experiment.name == "from-config" and 3 <= trial.hparams["units"] <= 5


def test_a_script_that_raises_is_recorded_as_an_error(tmp_path):
    done = run_script(tmp_path, INIT_ARGS="{'hparams': {'units': 4}}", FAIL_AFTER_FIT="1")
    assert done.returncode == 1
    db, (experiment,), (trial,) = records(tmp_path)
    assert trial.state == experiment.state == "ERROR"
    assert trial.error == "RuntimeError: the script broke after training"
    assert db.checkpoints(trial_id=trial.id)  # what it recorded before is kept


def test_recording_can_be_switched_off(tmp_path):
    done = run_script(tmp_path, INIT_ARGS="{'hparams': {'units': 4}}", LOCALDET_RECORD="0")
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "home" / "localdet.db").exists()


def test_a_missing_hyperparameter_names_where_to_set_it(tmp_path):
    done = run_script(tmp_path)
    assert done.returncode == 1
    assert "hyperparameter 'units' is not set" in done.stderr
    assert "det.keras.init(hparams=" in done.stderr


@pytest.mark.slow
def test_the_proposals_training_script_runs_on_a_laptop(tmp_path):
    example = REPO / "examples" / "digits_script"
    environment = {**os.environ, "LOCALDET_HOME": str(tmp_path / "home"),
                   "LOCALDET_CONFIG": str(example / "const.yaml"), "TF_CPP_MIN_LOG_LEVEL": "2"}
    environment.pop("LOCALDET_TRIAL_ID", None)
    done = subprocess.run([sys.executable, "train.py"], cwd=example, env=environment,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    accuracy = float(done.stdout.split("Test accuracy:")[1].split()[0])
    assert accuracy > 0.8
    db, (experiment,), (trial,) = records(tmp_path)
    assert experiment.state == "COMPLETED" and trial.batches_trained == 220  # 20 epochs of 11
    assert db.metrics(trial.id, "validation")[-1].metrics["val_accuracy"] == pytest.approx(
        accuracy)
