"""context.fit on a Keras 3 backend other than TensorFlow, in one process: tests/test_backends.py
runs this once (KERAS_BACKEND must be chosen before Keras is imported, so not in pytest's own
process) and asserts on the facts it writes as JSON:

    KERAS_BACKEND=jax python tests/backend_checks.py OUT_FOLDER   (or torch, where installed)

Real parts throughout: a real SQLite file and checkpoint store (conftest.start_trial), real
Keras on a tiny model. The last check sets a distribution for the rest of the process.

An unchanged script (one that never imports `determined`) is checked here too: its fit
calls served by the hook determined.exec.unchanged_script installs, as two phases.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))

import keras  # noqa: E402
from conftest import start_trial  # noqa: E402

from determined.core._reporting import HOME_VAR, SLOTS_VAR  # noqa: E402
from determined.keras import _backend_fit, _unchanged  # noqa: E402
from determined.keras._backend_context import BackendKerasContext  # noqa: E402
from determined.keras._unchanged_fit import METADATA_KEY, ScriptFits  # noqa: E402

RNG = np.random.default_rng(0)
X = RNG.normal(size=(96, 6)).astype("float32")
Y = (X[:, 0] + X[:, 1] > 0).astype("int64")
X_VAL, Y_VAL = X[:32], Y[:32]


class Batches(keras.utils.PyDataset):
    def __init__(self, batch=8):
        super().__init__()
        self.batch = batch

    def __len__(self):
        return len(X) // self.batch

    def __getitem__(self, i):
        rows = slice(i * self.batch, (i + 1) * self.batch)
        return X[rows], Y[rows]


class Pausing:
    """The real reporter, asking the trial to pause at the given batches as `localdet pause`
    would."""

    def __init__(self, inner, pause_at):
        self._inner, self._pending = inner, set(pause_at)

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def should_pause(self):
        batches = self._inner.db.trial(self._inner.trial_id).batches_trained
        if batches in self._pending:
            self._pending.discard(batches)
            return True
        return False


def script(reporter, data="numpy", **fit_args):
    """What a training script does: init (seeding), build, wrap, fit."""
    info = reporter.trial_info()
    _backend_fit.prepare_process(info)
    context = BackendKerasContext(info, reporter)
    model = keras.Sequential([keras.Input(shape=(6,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dropout(0.3),
                              keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer=context.wrap_optimizer(keras.optimizers.Adam(0.01)),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    if data == "numpy":
        fit_args = {"x": X, "y": Y, "batch_size": 8, **fit_args}
    else:
        fit_args = {"x": Batches(), **fit_args}
    fit_args.setdefault("validation_data", (X_VAL, Y_VAL))
    history = context.fit(model, **fit_args)
    return context, model, history


class thread_pools_started:
    """Counts the thread pools started (Keras's callback lists start one for asynchronous
    batch callbacks) until `stop()`."""

    def __init__(self):
        import concurrent.futures

        self.count, self._init = 0, concurrent.futures.ThreadPoolExecutor.__init__
        counter = self

        def counted(pool, *args, **kwargs):
            counter.count += 1
            counter._init(pool, *args, **kwargs)

        concurrent.futures.ThreadPoolExecutor.__init__ = counted

    def stop(self) -> None:
        import concurrent.futures

        concurrent.futures.ThreadPoolExecutor.__init__ = self._init


def lengths_and_metrics(out: Path) -> dict:
    db, trial_id, reporter, _ = start_trial(out / "lengths", 30, scheduling_unit=5)
    pools = thread_pools_started()
    _, model, history = script(reporter, epochs=1000)  # the searcher's 30 batches win
    pools.stop()
    trial = db.trial(trial_id)
    # The latest checkpoint as a downstream script gets it (`localdet checkpoint export`).
    folder = reporter.restore_checkpoint(trial.latest_checkpoint, out / "exported")
    reporter.verify_restored_checkpoint()
    np.save(out / "expected.npy", model.predict(X_VAL, verbose=0))
    from determined.keras import load_model_from_checkpoint_path

    loaded = load_model_from_checkpoint_path(str(folder))
    return {
        "batches_trained": trial.batches_trained,
        "training_at": [m.batches_trained for m in db.metrics(trial_id, "training")],
        "validation_at": [m.batches_trained for m in db.metrics(trial_id, "validation")],
        "history_keys": sorted(history.history),
        "history_val_loss": history.history["val_loss"],
        "last_val_loss": db.metrics(trial_id, "validation")[-1].metrics["val_loss"],
        "checkpoint": str(folder),
        "files": sorted(p.name for p in folder.iterdir()),
        "metadata": json.loads((folder / "metadata.json").read_text()),
        "loaded_predicts_alike": bool(np.allclose(loaded.predict(X_VAL, verbose=0),
                                                  np.load(out / "expected.npy"), atol=1e-6)),
        "loaded_optimizer": type(loaded.optimizer).__name__,
        "thread_pools": pools.count,
        # what the other checks compare with: this is their uninterrupted run
        "weights": [w.numpy() for w in model.weights],
        "metrics": [(m.kind, m.batches_trained, m.metrics) for m in db.metrics(trial_id)],
    }


def paused_and_resumed(out: Path, data: str, straight: dict) -> dict:
    """The fit of lengths_and_metrics paused mid-epoch (batch 15 of 12-batch epochs) and
    resumed in a new context, as a relaunched script: weights and every metric alike."""
    db, trial_id, reporter, _ = start_trial(out / f"paused-{data}", 30, scheduling_unit=5)
    pausing = Pausing(reporter, {15})
    launches = 0
    while db.trial(trial_id).batches_trained < 30 and launches < 3:
        launches += 1
        _, model, _ = script(pausing, data)
    metrics = [(m.kind, m.batches_trained, m.metrics) for m in db.metrics(trial_id)]
    return {"launches": launches,
            "same_weights": all(np.array_equal(a, b) for a, b in zip(
                straight["weights"], [w.numpy() for w in model.weights], strict=True)),
            "same_metrics": straight["metrics"] == metrics, "metrics": len(metrics)}


def epochs_without_a_length(out: Path) -> dict:
    db, trial_id, reporter, _ = start_trial(out / "epochs", 1)
    db.update_trial(trial_id, target_batches=0)  # a config without max_length
    _, _, history = script(reporter, epochs=3, initial_epoch=1)
    return {"target": db.trial(trial_id).target_batches, "epochs": history.epoch,
            "batches_trained": db.trial(trial_id).batches_trained}


def unchanged_train_py():
    """An unchanged script: build, compile, fit with validation data; then fine-tune with
    the first layer frozen and a new optimizer, without validation data (96 records in
    batches of 8: 12 batches an epoch; 2 epochs, then 1)."""
    model = keras.Sequential([keras.Input(shape=(6,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dropout(0.3),
                              keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    first = model.fit(X, Y, batch_size=8, epochs=2, validation_data=(X_VAL, Y_VAL), verbose=0)
    model.layers[0].trainable = False
    model.compile(optimizer=keras.optimizers.Adam(0.001),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    second = model.fit(X, Y, batch_size=8, epochs=1, verbose=0)
    return model, first, second


def unchanged_run(folder: Path, pause_at=()) -> dict:
    """The script's launches until it ends (each launch prepared as
    determined.exec.unchanged_script prepares one: seeded generators, the fit hook), paused
    at `pause_at`, with no searcher length (the script's epochs decide)."""
    os.environ[HOME_VAR] = str(folder / "home")  # where a trial finds its checkpoints' records
    db, trial_id, reporter, _ = start_trial(folder, 1, scheduling_unit=6)
    db.update_trial(trial_id, target_batches=0)
    pausing = Pausing(reporter, pause_at)
    launches, ended = 0, None
    while ended is None and launches < 4:
        launches += 1
        info = pausing.trial_info()
        _backend_fit.prepare_process(info)
        _unchanged.install(ScriptFits(info, pausing).fit)
        try:
            ended = unchanged_train_py()
        except SystemExit as paused:  # checkpointed: the process ends, resumed anew
            assert paused.code == 0, paused.code
        finally:
            _unchanged.uninstall()
    model, first, second = ended
    trial = db.trial(trial_id)
    return {"launches": launches, "model": model, "db": db, "reporter": reporter,
            "trial": trial, "first": first, "second": second,
            "weights": [w.numpy() for w in model.weights],
            "metrics": [(m.kind, m.batches_trained, m.metrics) for m in db.metrics(trial_id)]}


def unchanged_script(out: Path) -> tuple[dict, dict]:
    """Metrics and History, checkpoints (Keras's format, naming the phase, loaded
    downstream), and a run paused in each phase that ends with the uninterrupted one's
    weights and metrics; and the uninterrupted run."""
    straight = unchanged_run(out / "unchanged-straight")
    trial, db = straight["trial"], straight["db"]
    folder = straight["reporter"].restore_checkpoint(trial.latest_checkpoint,
                                                     out / "unchanged-exported")
    straight["reporter"].verify_restored_checkpoint()
    from determined.keras import (
        load_model_from_checkpoint_path,
        load_weights_from_checkpoint_path,
    )

    loaded = load_model_from_checkpoint_path(str(folder))
    # The other downstream way: the weights into a model the code builds.
    built = load_weights_from_checkpoint_path(keras.models.clone_model(straight["model"]),
                                              str(folder))
    metadata = json.loads((folder / "metadata.json").read_text())
    paused = unchanged_run(out / "unchanged-paused", {12, 30})
    return {
        "batches_trained": trial.batches_trained, "target": trial.target_batches,
        "training_at": [m.batches_trained for m in db.metrics(trial.id, "training")],
        "validation": [(m.batches_trained, sorted(m.metrics))
                       for m in db.metrics(trial.id, "validation")],
        "epochs": [straight["first"].epoch, straight["second"].epoch],
        "history_keys": [sorted(straight["first"].history), sorted(straight["second"].history)],
        "files": sorted(p.name for p in folder.iterdir()),
        "keras_backend": metadata.get("keras_backend"),
        "phase": metadata.get(METADATA_KEY, {}).get("phase"),
        "metadata_batches": metadata.get("batches_trained"),
        "loaded_predicts_alike": bool(np.allclose(
            loaded.predict(X_VAL, verbose=0), straight["model"].predict(X_VAL, verbose=0),
            atol=1e-6)),
        "weights_load_alike": bool(np.allclose(
            built.predict(X_VAL, verbose=0), straight["model"].predict(X_VAL, verbose=0),
            atol=1e-6)),
        "paused_launches": paused["launches"],
        "same_weights": all(np.array_equal(a, b) for a, b in zip(
            straight["weights"], paused["weights"], strict=True)),
        "same_metrics": straight["metrics"] == paused["metrics"],
        "resumed_history": [len(paused["first"].history["val_loss"]),
                            paused["second"].epoch],
    }, straight


def tensorflow_only_names() -> dict:
    from determined.keras._backend import BackendError

    try:
        from determined.keras import TFKerasTrial  # noqa: F401
    except BackendError as error:
        return {"error": str(error)}
    return {"error": None}


def data_parallel(out: Path, one_device: dict) -> dict:
    """Two slots in this process: keras.distribution.DataParallel over two CPU devices (the
    process was started with XLA_FLAGS giving JAX two): the validation loss of one device."""
    os.environ[SLOTS_VAR] = "0,1"
    try:
        db, trial_id, reporter, _ = start_trial(out / "two-devices", 12, scheduling_unit=6)
        _, model, two = script(reporter)
    finally:
        os.environ.pop(SLOTS_VAR)
    return {"distribution": type(keras.distribution.distribution()).__name__,
            "devices": len(model.weights[0].value.sharding.device_set),
            "same_val_loss": bool(np.isclose(one_device["history_val_loss"][0],
                                             two.history["val_loss"][0], atol=1e-5)),
            "batches_trained": db.trial(trial_id).batches_trained}


def unchanged_data_parallel(out: Path, one_device: dict) -> dict:
    """The unchanged script on two slots (DataParallel over two CPU devices), paused in each
    of its phases: it ends with the one-device run's weights and validation losses."""
    os.environ[SLOTS_VAR] = "0,1"
    try:
        two = unchanged_run(out / "unchanged-two-devices", {12, 30})
    finally:
        os.environ.pop(SLOTS_VAR)
    return {"launches": two["launches"],
            "devices": len(two["model"].weights[0].value.sharding.device_set),
            "same_weights": all(np.allclose(a, b, atol=1e-5) for a, b in zip(
                one_device["weights"], two["weights"], strict=True)),
            "same_val_loss": bool(np.allclose(
                one_device["first"].history["val_loss"], two["first"].history["val_loss"],
                atol=1e-5)),
            "batches_trained": two["trial"].batches_trained}


def main() -> None:
    out = Path(sys.argv[1])
    facts: dict = {"backend": keras.backend.backend()}
    began = time.time()
    straight = {"numpy": lengths_and_metrics(out)}
    facts["lengths"] = {k: v for k, v in straight["numpy"].items()
                        if k not in ("weights", "metrics")}
    facts["numpy_resume"] = paused_and_resumed(out, "numpy", straight["numpy"])
    db, trial_id, reporter, _ = start_trial(out / "sequence", 30, scheduling_unit=5)
    _, model, _ = script(reporter, "sequence")
    facts["pydataset_resume"] = paused_and_resumed(out, "sequence", {
        "weights": [w.numpy() for w in model.weights],
        "metrics": [(m.kind, m.batches_trained, m.metrics) for m in db.metrics(trial_id)]})
    facts["epochs"] = epochs_without_a_length(out)
    facts["unchanged"], one_device = unchanged_script(out)
    facts["tensorflow_only"] = tensorflow_only_names()
    # Before the distribution (which may import more): what a trial on this backend loaded.
    facts["tensorflow_imported"] = sorted(m for m in sys.modules
                                          if m.split(".")[0] in ("tensorflow", "tf_keras"))
    if keras.backend.backend() == "jax":  # several slots: JAX's alone here
        facts["data_parallel"] = data_parallel(out, facts["lengths"])
        facts["unchanged_data_parallel"] = unchanged_data_parallel(out, one_device)
    facts["seconds"] = round(time.time() - began, 1)
    (out / "facts.json").write_text(json.dumps(facts, indent=1))


if __name__ == "__main__":
    os.environ.pop(SLOTS_VAR, None)
    main()
