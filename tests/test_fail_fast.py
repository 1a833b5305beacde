"""Failures that will repeat end at once: a trial that fails the same way at the same point
on two launches in a row (before its first batch, or at the same phase after the same batches:
its first checkpoint, say) is not restarted again, and in a search its siblings end too; a
trial that fails at a different point each time keeps its restarts. One real daemon runs
every case."""

from __future__ import annotations

import json
import sqlite3

import pytest
from conftest import write_config

from localdet.config.experiment import parse_config
from localdet.processes import failures, launcher

TINY_TRIAL = '''
import numpy as np
import tensorflow as tf

from determined import keras

{extra}


class Boom(tf.keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if {fail_after} and batch + 1 >= {fail_after}:
            raise RuntimeError("the data went bad")


class BadCheckpoint(keras.callbacks.Callback):
    """What a layer written against Keras 2's internals does under Keras 3: it trains, then
    fails as its checkpoint is written."""

    def on_checkpoint_end(self, checkpoint_dir):
        if {fail_checkpoint}:
            raise AttributeError("'MultiHead' object has no attribute '_trainable_weights'")


class TinyTrial(keras.TFKerasTrial):
    def __init__(self, context):
        self.context = context

    def build_model(self):
        {build}
        model = self.context.wrap_model(tf.keras.Sequential(
            [tf.keras.Input(shape=(4,)), tf.keras.layers.Dense(2)]))
        model.compile(optimizer=self.context.wrap_optimizer(tf.keras.optimizers.SGD(0.1)),
                      loss="mse")
        return model

    def keras_callbacks(self):
        return [Boom(), BadCheckpoint()]

    def build_training_data_loader(self):
        rng = np.random.default_rng(0)
        return (rng.normal(size=(64, 4)).astype("float32"),
                rng.normal(size=(64, 2)).astype("float32"))

    def build_validation_data_loader(self):
        return self.build_training_data_loader()
'''


def model_folder(path, extra="", fail_after="0", build="pass", fail_checkpoint=False):
    path.mkdir(parents=True)
    (path / "model_def.py").write_text(TINY_TRIAL.format(
        extra=extra, fail_after=fail_after, build=build, fail_checkpoint=fail_checkpoint))
    return path


# Fails one batch later on each launch: the same error, never at the same point.
LATER_EACH_LAUNCH = """
import functools
import pathlib
LAUNCHES = pathlib.Path({counter!r})


@functools.cache
def FAIL_AFTER():
    # Counted at the launch's first batch, not at import: a process started ahead of its
    # slot imports the module before it is launched, and may be ended unlaunched.
    LAUNCHES.write_text(str(int(LAUNCHES.read_text() or 0) + 1) if LAUNCHES.exists() else "1")
    return 2 + int(LAUNCHES.read_text())
"""


def experiment(tmp_path, name, **overrides):
    settings = dict(entrypoint="model_def:TinyTrial",
                    hyperparameters={"global_batch_size": 8, "width": 4},
                    searcher={"name": "single", "metric": "val_loss",
                              "max_length": {"batches": 8}},
                    scheduling_unit=4)
    settings.update(overrides)
    return write_config(tmp_path, name, **settings)


def failed_events(home, trial_id: int) -> list[dict]:
    with sqlite3.connect(home.path / "localdet.db", timeout=30) as db:
        rows = db.execute("SELECT payload FROM events WHERE kind = 'trial_failed' AND "
                          "trial_id = ? ORDER BY id", [trial_id]).fetchall()
    return [json.loads(payload) for (payload,) in rows]


def launches(home, experiment_id: int) -> dict[int, int]:
    with sqlite3.connect(home.path / "localdet.db", timeout=30) as db:
        rows = db.execute("SELECT trial_id, COUNT(*) FROM events WHERE kind = 'trial_launched' "
                          "AND experiment_id = ? GROUP BY trial_id", [experiment_id]).fetchall()
    return dict(rows)


@pytest.mark.slow
def test_repeating_failures_end_at_once_and_failures_after_training_keep_restarts(
        home, tmp_path, daemons):
    # One slot: the trials run one after another, so the launches counted are exact.
    daemon = daemons(home, "--slots", "1")
    # 1. A search whose model folder fails at import: two launches of its first trial.
    home.cli("submit", experiment(
        tmp_path, "import-fails", max_restarts=5,
        hyperparameters={"global_batch_size": 8,
                         "width": {"type": "int", "minval": 2, "maxval": 9}},
        searcher={"name": "random", "metric": "val_loss", "max_trials": 4,
                  "max_length": {"batches": 8}}),
        model_folder(tmp_path / "import", extra="import not_a_module"))
    # 2. A failure in build_model, the same for every trial of a grid.
    home.cli("submit", experiment(
        tmp_path, "setup-fails", max_restarts=3,
        hyperparameters={"global_batch_size": 8,
                         "width": {"type": "categorical", "vals": [2, 3, 4]}},
        searcher={"name": "grid", "metric": "val_loss", "max_length": {"batches": 8}}),
        model_folder(tmp_path / "setup",
                     build="raise ValueError('the model needs a column named label')"))
    # 3. A script that fails at import.
    script = tmp_path / "script"
    script.mkdir()
    (script / "train.py").write_text("import os\nfrom determined.keras import NoSuchName\n")
    home.cli("submit", experiment(tmp_path, "script-fails", entrypoint="python3 train.py",
                                  max_restarts=4), script)
    # 4. A trial that trains, then fails one batch later on each launch: the same error,
    #    never at the same point, so it is restarted as often as max_restarts says.
    home.cli("submit", experiment(tmp_path, "fails-after-training", max_restarts=2),
             model_folder(tmp_path / "late", fail_after="FAIL_AFTER()",
                          extra=LATER_EACH_LAUNCH.format(counter=str(tmp_path / "launches"))))
    # 7. A trial that trains, then fails at its first checkpoint every time: it ends after
    #    two launches, though max_restarts allows five.
    home.cli("submit", experiment(tmp_path, "checkpoint-fails", max_restarts=5),
             model_folder(tmp_path / "at-checkpoint", fail_checkpoint=True))
    # 5. A trial class (Keras 2, by Determined's rule) reaching for an activation only Keras
    #    3 has: the error is about the Keras line.
    home.cli("submit", experiment(tmp_path, "keras-line", max_restarts=3),
             model_folder(tmp_path / "keras", build="tf.keras.activations.silu"))
    # 6. A grid whose widest trial raises det.InvalidHP: it alone ends, at once.
    home.cli("submit", experiment(
        tmp_path, "invalid-hp", max_restarts=3,
        hyperparameters={"global_batch_size": 8,
                         "width": {"type": "categorical", "vals": [2, 9]}},
        searcher={"name": "grid", "metric": "val_loss", "max_length": {"batches": 8}}),
        model_folder(tmp_path / "invalid", build=(
            "if self.context.get_hparam('width') > 4: "
            "raise det.InvalidHP('width 9 does not fit the data')"),
            extra="import determined as det"))
    ids = {name: home.experiment_named(name)["id"] for name in
           ("import-fails", "setup-fails", "script-fails", "fails-after-training",
            "keras-line", "invalid-hp", "checkpoint-fails")}
    facts = {name: home.wait_until_ended(i, timeout=600) for name, i in ids.items()}
    status = home.cli("status", ids["import-fails"]).stdout
    listing = home.cli("status").stdout
    keras_status = home.cli("status", ids["keras-line"]).stdout
    daemon.stop()

    message = "ModuleNotFoundError: No module named 'not_a_module'"
    search = facts["import-fails"]
    first, *siblings = search["trials"]
    assert launches(home, search["id"]) == {first["id"]: 2}
    assert search["state"] == "ERROR" and len(siblings) == 3
    assert search["error"] == f"every trial failed the same way before training: {message}"
    assert all(t["state"] == "ERROR" and t["restarts"] == 0 for t in siblings)
    assert first["restarts"] == 1 and first["error"].splitlines()[0] == message
    assert search["progress"] == 0.0
    assert message in status and "TF_USE_LEGACY_KERAS" not in status
    (row,) = [line for line in listing.splitlines() if "import-fails" in line]
    assert "100%" not in row

    grid = facts["setup-fails"]
    counts = launches(home, grid["id"])
    assert sorted(counts.values()) == [1, 1, 2]  # the siblings end at their first failure
    assert all(t["state"] == "ERROR" for t in grid["trials"])
    assert grid["error"] == ("every trial failed the same way before training: "
                             "ValueError: the model needs a column named label")

    script_run = facts["script-fails"]
    (trial,) = script_run["trials"]
    assert script_run["state"] == "ERROR" and launches(home, script_run["id"]) == {trial["id"]: 2}
    assert trial["error"].startswith("ImportError: cannot import name 'NoSuchName'")

    late = facts["fails-after-training"]
    (trial,) = late["trials"]
    assert late["state"] == "ERROR" and trial["restarts"] == 2
    assert launches(home, late["id"]) == {trial["id"]: 3}
    assert trial["error"].splitlines()[0] == "RuntimeError: the data went bad"
    assert [e["batches"] for e in failed_events(home, trial["id"])] == [2, 3, 4]

    at_checkpoint = facts["checkpoint-fails"]
    (trial,) = at_checkpoint["trials"]
    assert at_checkpoint["state"] == "ERROR" and trial["restarts"] == 1
    assert launches(home, at_checkpoint["id"]) == {trial["id"]: 2}
    points = [(e["phase"], e["batches"], e["trained"]) for e in failed_events(home, trial["id"])]
    assert points == [("checkpoint", 8, True)] * 2
    assert trial["error"].splitlines()[:2] == [
        "AttributeError: 'MultiHead' object has no attribute '_trainable_weights'",
        trial["error"].splitlines()[1]]
    assert trial["error"].splitlines()[1].startswith(
        "it failed at its checkpoint after 8 batches, the same way as before")

    for run in facts.values():  # which Keras each trial ran under, and why: trial classes
        for t in run["trials"]:  # and a script using `determined` are Determined's: Keras 2
            if t["id"] in launches(home, run["id"]):
                assert (t["keras_line"], t["keras_line_rule"]) == ("keras2", "determined_api")

    invalid = facts["invalid-hp"]
    by_width = {t["hparams"]["width"]: t for t in invalid["trials"]}
    assert invalid["state"] == "COMPLETED" and by_width[2]["state"] == "COMPLETED"
    assert by_width[9]["state"] == "ERROR" and by_width[9]["restarts"] == 0
    assert launches(home, invalid["id"])[by_width[9]["id"]] == 1
    assert by_width[9]["error"].splitlines()[0] == "InvalidHP: width 9 does not fit the data"

    keras = facts["keras-line"]
    (trial,) = keras["trials"]
    assert keras["state"] == "ERROR" and launches(home, keras["id"]) == {trial["id"]: 2}
    assert trial["error"].startswith("AttributeError: module 'tf_keras.")
    assert "has no attribute 'silu' (the trial ran under keras2, chosen because: rule " \
           "determined_api, decided by model_def:TinyTrial: a TFKerasTrial" in trial["error"]
    assert "TF_USE_LEGACY_KERAS=0" in " ".join(keras_status.split())


# -- the decisions, on recorded events -------------------------------------------------------

def recorded_trial(layout, db):
    config = parse_config({"entrypoint": "python3 train.py"}).config
    experiment_id = db.create_experiment(
        name="x", description="", config=config, original_config="", searcher="single",
        metric="val_loss", smaller_is_better=True, experiment_seed=1, model_dir="/nowhere")
    trial_id = db.create_trial(experiment_id=experiment_id, request_id=1, hparams={}, seed=1,
                               target_batches=10)
    return db.trial(trial_id)


def launch_and_fail(layout, db, trial, text: str):
    log = layout.trial_log(trial.experiment_id, trial.id)
    log.parent.mkdir(parents=True, exist_ok=True)
    db.log_event("trial_launched", experiment_id=trial.experiment_id, trial_id=trial.id,
                 log_offset=launcher.log_size(log))
    with open(log, "a") as out:
        out.write(text)
    return failures.record(db, layout, db.trial(trial.id))


def traceback_of(line: str) -> str:
    return f"Traceback (most recent call last):\n  File \"train.py\", line 1\n{line}\n"


def test_a_failure_repeats_only_when_two_launches_in_a_row_fail_alike_untrained(layout, db):
    trial = recorded_trial(layout, db)
    first = launch_and_fail(layout, db, trial, traceback_of("ImportError: x"))
    assert first == launcher.Failure("ImportError: x", None, False)
    assert not failures.repeats(db, trial, first)  # one launch is no pattern
    second = launch_and_fail(layout, db, trial, traceback_of("ImportError: y"))
    assert not failures.repeats(db, trial, second)  # a different message
    third = launch_and_fail(layout, db, trial, traceback_of("ImportError: y"))
    assert failures.repeats(db, trial, third)
    # A launch in between that did not fail (paused) breaks the run.
    db.log_event("trial_launched", experiment_id=trial.experiment_id, trial_id=trial.id)
    fourth = launch_and_fail(layout, db, trial, traceback_of("ImportError: y"))
    assert not failures.repeats(db, trial, fourth)
    # A launch that printed no traceback (killed, say) is not recorded as a failure.
    assert launch_and_fail(layout, db, trial, "Killed\n") is None


def test_the_experiment_says_in_one_line_when_every_trial_failed_alike(layout, db):
    trial = recorded_trial(layout, db)
    launch_and_fail(layout, db, trial, traceback_of("ImportError: z"))
    db.update_trial(trial.id, state="ERROR", error="long story")
    failed = [db.trial(trial.id)]
    assert failures.experiment_error(db, trial.experiment_id, failed) == (
        "every trial failed the same way before training: ImportError: z")
    db.record_metrics(trial.id, "training", 4, {"loss": 1.0})
    launch_and_fail(layout, db, trial, traceback_of("ImportError: z"))  # after training
    assert failures.experiment_error(db, trial.experiment_id, failed) == "long story"


def mark(signature: str, phase: str | None = None, batches: int | None = None,
         trained: bool = True) -> str:
    """A trial class's failure mark (harness/determined/exec/run_trial.py)."""
    point = {"phase": phase, "batches": batches} if phase else {}
    return launcher.FAILURE_MARK + json.dumps({
        "signature": signature, "message": signature, "stage": "training", "trained": trained,
        **point}) + "\n"


def test_a_failure_after_training_repeats_at_the_same_phase_and_batches(layout, db):
    trial = recorded_trial(layout, db)
    db.record_metrics(trial.id, "training", 8, {"loss": 1.0})
    error = "AttributeError: 'MultiHead' object has no attribute '_trainable_weights'"
    failure = launch_and_fail(layout, db, trial, mark(error, "checkpoint", 8))
    assert (failure.phase, failure.batches) == ("checkpoint", 8)
    assert not failures.repeats(db, trial, failure)  # one launch is no pattern
    assert failures.repeats(db, trial, launch_and_fail(layout, db, trial,
                                                       mark(error, "checkpoint", 8)))
    assert failures.point_of(db, trial) == ("checkpoint", 8)
    # Further along (it resumed from a later checkpoint): another point.
    assert not failures.repeats(db, trial, launch_and_fail(layout, db, trial,
                                                           mark(error, "checkpoint", 16)))
    # The same batches, another phase: another point.
    assert not failures.repeats(db, trial, launch_and_fail(layout, db, trial,
                                                           mark(error, "validation", 16)))
    assert failures.repeats(db, trial, launch_and_fail(layout, db, trial,
                                                       mark(error, "validation", 16)))
    # Another message at the same point is another failure.
    assert not failures.repeats(db, trial, launch_and_fail(layout, db, trial,
                                                           mark("OSError: x", "validation", 16)))
    # In training itself, at the same batch: deterministic too.
    launch_and_fail(layout, db, trial, mark("RuntimeError: nan", "training", 20))
    assert failures.repeats(db, trial, launch_and_fail(layout, db, trial,
                                                       mark("RuntimeError: nan", "training", 20)))


def test_a_failure_after_training_that_cannot_say_where_keeps_its_restarts(layout, db):
    trial = recorded_trial(layout, db)
    db.record_metrics(trial.id, "training", 8, {"loss": 1.0})
    for _ in range(3):  # a script's traceback: no point
        failure = launch_and_fail(layout, db, trial, traceback_of("RuntimeError: data"))
        assert failure.trained and not failures.repeats(db, db.trial(trial.id), failure)
        assert failures.point_of(db, trial) is None


def test_a_sibling_that_failed_fast_at_a_checkpoint_says_the_same_of_this_one(layout, db):
    trial = recorded_trial(layout, db)
    sibling = db.trial(db.create_trial(experiment_id=trial.experiment_id, request_id=2,
                                       hparams={}, seed=2, target_batches=10))
    db.record_metrics(sibling.id, "training", 4, {"loss": 1.0})
    error = "AttributeError: no _trainable_weights"
    db.log_event("trial_failed_fast", experiment_id=trial.experiment_id, trial_id=trial.id,
                 signature=error, stage="training", phase="checkpoint")
    # At its own first checkpoint (after other batches, by its hyperparameters): at once.
    assert failures.repeats(db, sibling, launch_and_fail(layout, db, sibling,
                                                         mark(error, "checkpoint", 4)))
    # The same message in training is not a checkpoint's failure.
    assert not failures.repeats(db, sibling, launch_and_fail(layout, db, sibling,
                                                             mark(error, "training", 3)))
