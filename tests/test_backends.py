"""Keras 3 on JAX (issue 35 item 3): `KERAS_BACKEND=jax` trains `context.fit` scripts without
TensorFlow: lengths, metrics, exact pause and resume, checkpoints that any backend loads, two
slots through keras.distribution, and localdet running where TensorFlow is absent; an
unchanged script (one that never imports `determined`) there too.

They run in the environment scripts/jax-env makes (localdet with JAX and Keras, no TensorFlow:
scripts/test passes its python as LOCALDET_JAX_PYTHON), where the checks run in one subprocess
(tests/backend_checks.py, once for the module) and each test asserts on what it found; the
checkpoint it wrote is then loaded here, on TensorFlow.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import REPO

TESTS = Path(__file__).resolve().parent
SCRIPT = TESTS / "trials" / "backend_script"


@pytest.fixture(scope="module")
def jax_python() -> str:
    python = os.environ.get("LOCALDET_JAX_PYTHON")
    if not python:
        setup = subprocess.run([str(REPO / "scripts" / "jax-env")], capture_output=True,
                               text=True, timeout=1800)
        assert setup.returncode == 0, f"scripts/jax-env failed:\n{setup.stderr[-4000:]}"
        python = setup.stdout.strip().splitlines()[-1]
    return python


def jax_environment(python: str, **extra: str) -> dict:
    """The environment's own programs first on PATH: a config's `python3 train.py` is its
    python, as where it is the only one."""
    env = {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "2",
           "PATH": f"{Path(python).parent}{os.pathsep}{os.environ['PATH']}", **extra}
    for name in ("TF_USE_LEGACY_KERAS", "LOCALDET_SLOTS", "LOCALDET_TRIAL_ID", "VIRTUAL_ENV"):
        env.pop(name, None)
    return env


@pytest.fixture(scope="module")
def facts(tmp_path_factory, jax_python):
    out = tmp_path_factory.mktemp("jax")
    env = jax_environment(jax_python, XLA_FLAGS="--xla_force_host_platform_device_count=2",
                          # the checks' eight fits of one model compile it once
                          JAX_COMPILATION_CACHE_DIR=str(out / "jax-cache"))
    result = subprocess.run([jax_python, str(TESTS / "backend_checks.py"), str(out)],
                            env=env, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    found = json.loads((out / "facts.json").read_text())
    found["out"] = str(out)
    return found


def test_fit_on_jax_trains_to_the_searcher_length_and_reports(facts):
    assert facts["backend"] == "jax"
    lengths = facts["lengths"]
    assert lengths["batches_trained"] == 30
    assert lengths["training_at"] == [5, 10, 15, 20, 25, 30]
    assert lengths["validation_at"] == [12, 24, 30]  # each 12-batch epoch's end, and the end
    assert lengths["history_keys"] == ["accuracy", "loss", "val_accuracy", "val_loss"]
    assert lengths["history_val_loss"][-1] == pytest.approx(lengths["last_val_loss"])
    # Its three validations share one callback list held open for the fit, as Keras's fit
    # shares its own: one thread pool for them, beside the fit's (not one per validation).
    assert lengths["thread_pools"] == 2


def test_fit_on_jax_trains_the_scripts_epochs_without_a_searcher_length(facts):
    assert facts["epochs"] == {"target": 24, "epochs": [1, 2], "batches_trained": 24}


@pytest.mark.parametrize("data", ["numpy_resume", "pydataset_resume"])
def test_a_paused_and_resumed_fit_on_jax_ends_with_the_same_weights_and_metrics(facts, data):
    resumed = facts[data]
    assert resumed["launches"] == 2  # paused mid-epoch, at batch 15
    assert resumed["same_weights"] and resumed["same_metrics"], resumed


def test_a_jax_checkpoint_is_keras_own_format_and_loads_on_jax(facts):
    lengths = facts["lengths"]
    assert "model.keras" in lengths["files"] and "trial_state.pkl" in lengths["files"]
    assert lengths["metadata"]["keras_backend"] == "jax"
    assert lengths["metadata"]["weights_file"] == "model.keras"
    assert lengths["loaded_predicts_alike"] and lengths["loaded_optimizer"] == "Adam"


def test_a_jax_checkpoint_loads_on_tensorflow(facts):
    import keras

    from determined.keras import load_model_from_checkpoint_path

    assert keras.backend.backend() == "tensorflow"
    model = load_model_from_checkpoint_path(facts["lengths"]["checkpoint"])
    x_val = np.random.default_rng(0).normal(size=(96, 6)).astype("float32")[:32]
    expected = np.load(Path(facts["out"]) / "expected.npy")
    np.testing.assert_allclose(model.predict(x_val, verbose=0), expected, atol=1e-5)
    assert model.optimizer is not None and model.loss == "sparse_categorical_crossentropy"


def test_a_jax_trial_imports_no_tensorflow(facts):
    assert facts["tensorflow_imported"] == []


def test_tensorflow_only_apis_say_so_in_one_sentence_on_jax(facts):
    error = facts["tensorflow_only"]["error"]
    assert error.startswith("determined.keras.TFKerasTrial runs on Keras's TensorFlow "
                            "backend only") and "KERAS_BACKEND=jax" in error
    assert error.count(". ") == 0


def test_two_slots_train_data_parallel_in_one_process(facts):
    parallel = facts["data_parallel"]
    assert parallel["distribution"] == "DataParallel" and parallel["devices"] == 2
    assert parallel["same_val_loss"] and parallel["batches_trained"] == 12


def test_an_unchanged_script_on_two_slots_trains_data_parallel_paused_and_resumed(facts):
    parallel = facts["unchanged_data_parallel"]
    assert parallel["devices"] == 2 and parallel["launches"] == 3  # paused in each phase
    assert parallel["batches_trained"] == 36  # 2 epochs, then 1, of 12 batches
    assert parallel["same_weights"] and parallel["same_val_loss"], parallel


@pytest.mark.slow
def test_localdet_runs_a_jax_script_where_tensorflow_is_absent(home, tmp_path, jax_python):
    env = jax_environment(jax_python, LOCALDET_HOME=str(home.path))
    absent = subprocess.run(["python3", "-c", "import tensorflow"], env=env,
                            capture_output=True, text=True)
    assert absent.returncode != 0 and "No module named 'tensorflow'" in absent.stderr
    config = {"name": "jax-script", "entrypoint_script": "python3 train.py",
              "hyperparameters": {"learning_rate": 0.01, "batch_size": 16, "epochs": 2},
              "scheduling_unit": 4, "reproducibility": {"experiment_seed": 5},
              "environment": {"environment_variables": ["KERAS_BACKEND=jax"]}}
    path = tmp_path / "jax.yaml"
    path.write_text(yaml.safe_dump(config))
    # The foreground runner (the daemon's work, in this process) and the trial's process.
    result = subprocess.run([jax_python, "-m", "localdet", "run", str(path), str(SCRIPT)],
                            env=env, capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "experiment 1: COMPLETED" in output, output[-4000:]
    assert "backend jax; tensorflow importable: False; tensorflow imported: False" in output
    assert "validation at 24" in output


def test_an_unchanged_scripts_fits_on_jax_are_phases_with_metrics_and_history(facts):
    unchanged = facts["unchanged"]
    # 12 batches an epoch: 2 epochs with validation data, then 1 without.
    assert unchanged["batches_trained"] == unchanged["target"] == 36
    assert unchanged["training_at"] == [6, 12, 18, 24, 30, 36]
    assert unchanged["validation"] == [[12, ["val_accuracy", "val_loss"]],
                                       [24, ["val_accuracy", "val_loss"]],
                                       # no validation data: the training metrics stand
                                       # in, loss as the searcher's val_loss too
                                       [36, ["accuracy", "loss", "val_loss"]]]
    assert unchanged["epochs"] == [[0, 1], [0]]
    assert unchanged["history_keys"] == [["accuracy", "loss", "val_accuracy", "val_loss"],
                                         ["accuracy", "loss"]]


def test_an_unchanged_script_on_jax_checkpoints_in_keras_format_that_loads(facts):
    unchanged = facts["unchanged"]
    assert {"model.keras", "trial_state.pkl", "metadata.json"} <= set(unchanged["files"])
    assert unchanged["keras_backend"] == "jax" and unchanged["phase"] == 1
    assert unchanged["metadata_batches"] == 36  # the trial's batches, across its phases
    assert unchanged["loaded_predicts_alike"]
    assert unchanged["weights_load_alike"]  # load_weights_from_checkpoint_path, no TensorFlow


def test_an_unchanged_script_paused_in_each_phase_on_jax_ends_alike(facts):
    unchanged = facts["unchanged"]
    assert unchanged["paused_launches"] == 3  # paused at batch 12, then in the second phase
    assert unchanged["same_weights"] and unchanged["same_metrics"], unchanged
    # The skipped first phase returns its recorded History; the resumed one its epoch.
    assert unchanged["resumed_history"] == [2, [0]]


UNCHANGED_TRAIN_PY = textwrap.dedent("""\
    import os
    import sys

    os.environ["KERAS_BACKEND"] = "jax"

    import keras
    import numpy as np

    learning_rate = 0.01

    rng = np.random.default_rng(7)
    x = rng.normal(size=(160, 8)).astype("float32")
    y = (x[:, 0] - x[:, 3] > 0).astype("int64")
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dropout(0.2),
                              keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(learning_rate),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    history = model.fit(x[:128], y[:128], batch_size=16, epochs=2,
                        validation_data=(x[128:], y[128:]))
    print(f"backend {keras.backend.backend()}; learning_rate {learning_rate}; epochs "
          f"{history.epoch}; tensorflow imported: {'tensorflow' in sys.modules}", flush=True)
    """)


@pytest.mark.slow
def test_localdet_runs_an_unchanged_jax_script_where_tensorflow_is_absent(home, tmp_path,
                                                                          jax_python):
    from determined.keras import load_model_from_checkpoint_path
    from localdet.records.db import StateDB

    script = tmp_path / "model" / "train.py"
    script.parent.mkdir()
    script.write_text(UNCHANGED_TRAIN_PY)
    env = jax_environment(jax_python, LOCALDET_HOME=str(home.path))
    # No config: `localdet run` makes one; KERAS_BACKEND=jax is the script's own, which the
    # launcher reads (Keras's default, TensorFlow, would fail here).
    env.pop("KERAS_BACKEND")
    result = subprocess.run([jax_python, "-m", "localdet", "run", str(script),
                             "--hp", "learning_rate=0.02"],
                            env=env, capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "experiment 1: COMPLETED" in output, output[-4000:]
    assert ("backend jax; learning_rate 0.02; epochs [0, 1]; tensorflow imported: False"
            in output), output[-4000:]
    db = StateDB.open(home.path / "localdet.db")
    trial = db.trials(1)[0]
    assert trial.batches_trained == 16  # 8 batches an epoch, the script's 2 epochs
    assert [m.batches_trained for m in db.metrics(trial.id, "validation")] == [8, 16]
    assert "val_accuracy" in db.metrics(trial.id, "validation")[-1].metrics
    exported = tmp_path / "exported"
    home.cli("checkpoint", "export", trial.latest_checkpoint, exported)
    model = load_model_from_checkpoint_path(str(exported))  # here, on TensorFlow
    assert model.predict(np.zeros((2, 8), "float32"), verbose=0).shape == (2, 2)


@pytest.mark.slow
def test_the_overhead_bench_runs_an_unchanged_script_on_jax(jax_python, tmp_path):
    """scripts/bench/overhead.py --backend jax --smoke (tests/test_scripts.py runs each
    bench on TensorFlow), as scripts/device-jax-bench runs it on a lent GPU machine, the
    environment's python alone on PATH (no .whl/ here: the environment has localdet and
    the rest). It runs, without TensorFlow, and prints its figures."""
    env = {**jax_environment(jax_python), "LOCALDET_DEVICE_SITE": str(tmp_path / "site")}
    env.pop("LOCALDET_HOME", None)
    assert not (REPO / ".whl").exists()  # else the script would install those wheels
    result = subprocess.run([str(REPO / "scripts" / "device-jax-bench"), "run", "--smoke"],
                            env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "keras3 on jax" in result.stdout and "TensorFlow imported: False" in result.stdout
    for figure in (r"^jax \S+ \[.*\] keras 3\.\d+\.\d+ localdet /",  # the script's check
                   r"bare model\.fit: \d+\.\d+ s",
                   r"unchanged script's model\.fit under localdet: \d+\.\d+ s",
                   r"ratio: \d+\.\d+", r"epoch time: bare \d+\.\d+ s"):
        assert re.search(figure, result.stdout, re.MULTILINE), (figure, result.stdout)


def test_numpy_batches_are_one_batch_each_and_found_again_by_position():
    from determined.keras._backend_data import NumpyBatches

    x, y = np.arange(10, dtype="float32")[:, None], np.arange(10)
    natural = iter(NumpyBatches((x, y), 4, seed=3, start=0, shuffle=False))
    # Full batches that cross the passes' boundaries, as on TensorFlow.
    assert [next(natural)[1].tolist() for _ in range(3)] == [[0, 1, 2, 3], [4, 5, 6, 7],
                                                             [8, 9, 0, 1]]
    shuffled = iter(NumpyBatches((x, y), 4, seed=3, start=0, shuffle=True))
    straight = [next(shuffled)[1].tolist() for _ in range(6)]
    resumed = iter(NumpyBatches((x, y), 4, seed=3, start=2, shuffle=True))
    assert [next(resumed)[1].tolist() for _ in range(4)] == straight[2:]
    assert sorted(straight[0] + straight[1] + straight[2][:2]) == list(range(10))  # a pass
