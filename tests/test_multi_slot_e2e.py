"""A trial on two slots trains data-parallel and ends like the same trial on one slot with
the same global batch size. Under Keras 3 the two slots are one process with a
MirroredStrategy over two logical CPU devices (GPUs where there are some); under Keras 2 they
are two processes with Horovod's semantics (gradient_allreduce here, where Horovod is not
installed: each rank's own loss, averaged gradients), or MultiWorkerMirroredStrategy when the
config asks for it."""

from __future__ import annotations

import os
import signal
import subprocess

import h5py
import numpy as np
import pytest
import yaml
from conftest import EXAMPLE, REPO, wait_for, write_config
from test_pause_resume_e2e import final_weights, trial_of

pytestmark = pytest.mark.slow

SHORT = dict(searcher={"name": "single", "metric": "val_accuracy", "smaller_is_better": False,
                       "max_length": {"batches": 60}},
             min_validation_period={"batches": 30},
             # Keras 3 asked for: a trial class would otherwise run under Keras 2.
             environment={"environment_variables": ["TF_DETERMINISTIC_OPS=1",
                                                    "TF_USE_LEGACY_KERAS=0"]})


def one_and_two_slots(home, tmp_path, config: dict, daemons) -> tuple[dict, dict, str]:
    """The same experiment on one slot and on two, under one daemon: (one, two, two's log),
    each as `localdet status` tells it at the end."""
    daemon = daemons(home, "--slots", "2")
    for name, slots in (("one", 1), ("two", 2)):
        home.cli("submit", write_config(tmp_path, name, resources={"slots_per_trial": slots},
                                        **config), EXAMPLE)
    one, two = home.experiment_named("one")["id"], home.experiment_named("two")["id"]
    assert home.wait_until_ended(one)["state"] == "COMPLETED"
    assert home.wait_until_ended(two)["state"] == "COMPLETED"
    daemon.stop()
    one, two = home.experiment(one), home.experiment(two)
    log = (home.path / "experiments" / str(two["id"]) / "trials" / str(two["trials"][0]["id"])
           / "trial.log").read_text()
    return one, two, log


def test_two_slots_under_keras_3_end_like_one(home, tmp_path, daemons):
    one, two, log = one_and_two_slots(home, tmp_path, SHORT, daemons)
    assert "2 slots in this process: MirroredStrategy over" in log
    # Forked from the warm process the 1-slot trial's launch started: its devices are made
    # after the fork, as in a cold process.
    from test_warm import launches

    assert launches(home, two["id"]) == [True]
    one_trial, two_trial = one["trials"][0], two["trials"][0]
    # recorded on each trial's launch
    assert (one_trial["engine"], two_trial["engine"]) == ("single", "mirrored")
    assert_same_weights(home, one["id"], two["id"], tmp_path)
    one_metrics = one_trial["latest_validation"]
    two_metrics = two_trial["latest_validation"]
    assert one_metrics["val_accuracy"] == pytest.approx(two_metrics["val_accuracy"], abs=1e-5)


SCRIPT = '''
import determined as det
import tensorflow as tf
from sklearn.datasets import load_digits

context = det.keras.init()
x, y = load_digits(return_X_y=True)
x, y = (x / 16.0).astype("float32"), y.astype("int32")
x_train, y_train = context.wrap_data(x[:1400], y[:1400])
x_val, y_val = context.wrap_data(x[1400:], y[1400:])
model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(32, activation="relu"),
                             tf.keras.layers.Dense(10, activation="softmax")])
model.compile(optimizer=context.wrap_optimizer(tf.keras.optimizers.SGD(0.05)),
              loss="sparse_categorical_crossentropy", metrics=["accuracy"])
context.fit(model, x=x_train, y=y_train, batch_size=context.distributed.shard_batch_size(32),
            epochs=2, validation_data=(x_val, y_val))
'''


@pytest.mark.parametrize("line", ["keras3", "keras2"])
def test_a_script_on_two_slots_ends_like_one_without_code_changes(home, tmp_path, line):
    """Keras 3: one process, two devices; Keras 2: two processes, each fed its rows of the
    same shuffled global batches (wrap_data's shards are put back together)."""
    model = tmp_path / "script"
    model.mkdir()
    (model / "train.py").write_text(SCRIPT)
    variables = ["TF_DETERMINISTIC_OPS=1", f"TF_USE_LEGACY_KERAS={int(line == 'keras2')}"]
    ids = []
    for slots in (1, 2):
        config = write_config(tmp_path, f"script{slots}", entrypoint="python3 train.py",
                              resources={"slots_per_trial": slots},
                              environment={"environment_variables": variables})
        home.cli("run", config, model, "--slots", "2", "--quiet")
        ids.append(home.experiment_named(f"script{slots}")["id"])
    assert_same_weights(home, ids[0], ids[1], tmp_path)
    one, two = trial_of(home, ids[0]), trial_of(home, ids[1])
    assert two["engine"] == {"keras3": "mirrored", "keras2": "gradient_allreduce"}[line]
    assert two["batches_trained"] == one["batches_trained"]
    # Only the chief records when the launch's first batch ended, however many processes.
    from localdet.records.db import StateDB
    with StateDB.open(home.path / "localdet.db") as db:
        events = db.events(ids[1])
    assert [e["kind"] for e in events].count("trial_first_batch") == 1
    assert two["launch_seconds"] > 0


GENERATOR_SCRIPT = SCRIPT.replace('''x_train, y_train = context.wrap_data(x[:1400], y[:1400])
''', '''def rows():  # 1,120 rows of 1,400: data of unknown length
    yield from ((x[i], y[i]) for i in range(1400) if i % 5)


train = context.wrap_data(tf.data.Dataset.from_generator(rows, output_signature=(
    tf.TensorSpec((64,), tf.float32), tf.TensorSpec((), tf.int32))).batch(
        context.distributed.shard_batch_size(32)))
''').replace("x=x_train, y=y_train, batch_size=context.distributed.shard_batch_size(32),",
              "train,")


@pytest.mark.parametrize("line", ["keras3", "keras2"])
def test_a_fit_over_data_of_unknown_length_on_two_slots_trains_its_epochs(home, tmp_path,
                                                                         line):
    """Keras 3 (one process) ends each epoch where the data does; Keras 2's ranks, whose
    passes must end together, count one pass first (each rank's half: 560 rows, 35 batches
    of 16), as long as on one slot (1,120 rows, 35 batches of 32)."""
    model = tmp_path / "script"
    model.mkdir()
    (model / "train.py").write_text(GENERATOR_SCRIPT)
    variables = [f"TF_USE_LEGACY_KERAS={int(line == 'keras2')}"]
    config = write_config(tmp_path, "generated", entrypoint="python3 train.py",
                          resources={"slots_per_trial": 2},
                          searcher={"name": "single", "metric": "val_accuracy",
                                    "smaller_is_better": False},  # no length: the epochs
                          environment={"environment_variables": variables})
    home.cli("run", config, model, "--slots", "2", "--quiet")
    trial = trial_of(home, home.experiment_named("generated")["id"])
    assert trial["state"] == "COMPLETED"
    assert trial["batches_trained"] == trial["target_batches"] == 70  # 2 epochs


KERAS2 = dict(SHORT, environment={"environment_variables": ["TF_DETERMINISTIC_OPS=1",
                                                             "TF_USE_LEGACY_KERAS=1"]})


def assert_same_weights(home, a: int, b: int, tmp_path) -> None:
    for (name_a, wa), (name_b, wb) in zip(final_weights(home, a, tmp_path),
                                          final_weights(home, b, tmp_path), strict=True):
        assert name_a == name_b
        np.testing.assert_allclose(wa, wb, atol=1e-5)


def pause_soon_after(home, experiment_id: int, batches: int) -> None:
    """Ask for a pause the moment the trial has trained `batches`: watched in the database
    and asked in process, so a loaded machine cannot let it run to its end meanwhile."""
    from localdet.paths import Layout
    from localdet.records.actions import request
    from localdet.records.db import StateDB

    db = StateDB.open(home.path / "localdet.db")
    try:
        wait_for(lambda: any(t.batches_trained >= batches for t in db.trials(experiment_id)),
                 180, f"{batches} batches", interval=0.02)
        request(Layout(home.path), db, "pause", experiment_id=experiment_id)
    finally:
        db.close()


def rank_pids(home, trial_id: int) -> list[int]:
    """The rank processes under a trial's supervisor (the process the daemon records)."""
    from localdet.records.db import StateDB

    db = StateDB.open(home.path / "localdet.db")
    try:
        supervisor = db.trial(trial_id).pid
    finally:
        db.close()
    found = subprocess.run(["pgrep", "-P", str(supervisor)], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split()]


def test_two_processes_under_keras_2_paused_resumed_and_a_rank_killed_end_like_one(
        home, tmp_path, daemons):
    """Keras 2: two processes (gradient_allreduce). The 2-slot trial is paused and
    resumed (both ranks stop and start again), and one rank is killed with kill -9 (the
    other is stopped, the trial restarts from its checkpoint); it still ends like one slot."""
    long = dict(KERAS2, scheduling_unit=10, max_restarts=1,
                # Long enough that the rank is killed well before the end even on a loaded
                # machine (at 200, a run beside a warm process once finished first).
                searcher=dict(KERAS2["searcher"], max_length={"batches": 320}),
                min_checkpoint_period={"batches": 40})
    # A warm process: each launch's supervisor is forked from it, and forks its ranks.
    daemon = daemons(home, "--slots", "2", "--warm", "1")
    home.cli("submit", write_config(tmp_path, "two", resources={"slots_per_trial": 2},
                                    **long), EXAMPLE)
    two = home.experiment_named("two")["id"]
    # (The waits read the database: polling `localdet status` would take a core from the
    # ranks.)
    wait_for(lambda: home.first_trial(two).get("batches_trained", 0) >= 20, 180, "20 batches",
             0.1)
    home.cli("pause", two)
    wait_for(lambda: home.first_trial(two)["state"] == "PAUSED", 120, "the pause", 0.1)
    paused_at = trial_of(home, two)["batches_trained"]
    assert paused_at < 320
    home.cli("resume", two)

    def resumed() -> bool:
        trial = home.first_trial(two)
        return trial["state"] == "RUNNING" and trial["batches_trained"] > paused_at

    wait_for(resumed, 180, "the resume", 0.1)
    wait_for(lambda: home.rows("SELECT 1 FROM checkpoints WHERE experiment_id = ? AND state = "
                               "'COMPLETED' AND batches_trained >= 80", two),
             180, "a checkpoint after the resume", 0.1)
    trial_id = home.first_trial(two)["id"]
    ranks = wait_for(lambda: len(rank_pids(home, trial_id)) == 2
                     and rank_pids(home, trial_id), 30, "the ranks")
    os.kill(ranks[1], signal.SIGKILL)
    home.cli("submit", write_config(tmp_path, "one", resources={"slots_per_trial": 1},
                                    **long), EXAMPLE)
    one = home.experiment_named("one")["id"]
    assert home.wait_until_ended(two)["state"] == "COMPLETED"
    assert home.wait_until_ended(one)["state"] == "COMPLETED"
    daemon.stop()
    one_trial, two_trial = trial_of(home, one), trial_of(home, two)
    log = (home.path / "experiments" / str(two) / "trials" / str(two_trial["id"])
           / "trial.log").read_text()
    assert "[rank 1] " in log
    assert "rank 1 of 2: gradients averaged across the ranks' processes" in log
    assert "rank 1 was killed by SIGKILL; stopping the other ranks" in log
    # The resume and the restart at least (the first launch finds a warm process of
    # another kind: the daemon started before the experiment was submitted).
    assert log.count("2 ranks forked from a warm process") >= 2
    assert two_trial["restarts"] == 1
    assert one_trial["engine"] == "single"
    assert two_trial["engine"] == "gradient_allreduce"
    assert "gradient_allreduce x2" in home.cli("status", two).stdout
    assert_same_weights(home, one, two, tmp_path)
    # Training metrics are the global ones, recorded once (by the chief), as on one slot.
    for key in ("val_accuracy", "val_loss"):
        assert one_trial["latest_validation"][key] == pytest.approx(
            two_trial["latest_validation"][key], abs=1e-5)


DATASET_TRIAL = '''
import tensorflow as tf
from sklearn.datasets import load_digits

from determined import keras


class DatasetDigits(keras.TFKerasTrial):
    def __init__(self, context):
        self.context = context
        x, y = load_digits(return_X_y=True)
        self.x, self.y = (x / 16.0).astype("float32"), y.astype("int32")

    def build_model(self):
        model = self.context.wrap_model(tf.keras.Sequential([
            tf.keras.Input((64,)), tf.keras.layers.Dense(32, activation="relu"),
            tf.keras.layers.Dense(10, activation="softmax")]))
        model.compile(optimizer=self.context.wrap_optimizer(tf.keras.optimizers.SGD(0.05)),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        return model

    def build_training_data_loader(self):
        data = self.context.wrap_dataset(
            tf.data.Dataset.from_tensor_slices((self.x[:1400], self.y[:1400])))
        # A stateful op (PyFunc), as augmentation pipelines have: no iterator of it can be
        # saved, on one slot or several.
        halve = lambda a: tf.ensure_shape(
            tf.numpy_function(lambda v: v * 0.5, [a], tf.float32, stateful=True), a.shape)
        return data.shuffle(1400, seed=3).batch(self.context.get_per_slot_batch_size()).map(
            lambda a, b: (halve(a), b))

    def build_validation_data_loader(self):
        data = self.context.wrap_dataset(
            tf.data.Dataset.from_tensor_slices((self.x[1400:], self.y[1400:])))
        return data.batch(self.context.get_per_slot_batch_size())
'''


@pytest.mark.parametrize(("base", "engine"), [(SHORT, "mirrored"),
                                             (KERAS2, "multi_worker_mirrored")],
                         ids=["keras3", "keras2"])
def test_a_tf_data_trial_on_two_slots_paused_and_resumed_ends_like_a_straight_run(
        home, tmp_path, base, engine, daemons):
    """A distributed tf.data iterator cannot be checkpointed (nor one with a stateful op);
    on several slots the stream finds its place again by reading up to it, which ends
    exactly where a straight run does.
    (Keras 2 asks for multi_worker_mirrored by name: it stays available.)"""
    model = tmp_path / "dataset_trial"
    model.mkdir()
    (model / "model_def.py").write_text(DATASET_TRIAL)
    resources = {"slots_per_trial": 2, "engine": "auto" if engine == "mirrored" else engine}
    config = dict(base, entrypoint="model_def:DatasetDigits", scheduling_unit=5,
                  resources=resources,
                  searcher=dict(SHORT["searcher"], max_length={"batches": 100}))
    daemon = daemons(home, "--slots", "2", "--warm", "1")  # ranks forked, as on a bigger box
    home.cli("submit", write_config(tmp_path, "paused", **config), model)
    paused = home.experiment_named("paused")["id"]
    pause_soon_after(home, paused, 15)
    wait_for(lambda: home.first_trial(paused)["state"] == "PAUSED", 120, "the pause", 0.1)
    assert 15 <= trial_of(home, paused)["batches_trained"] < 100
    home.cli("resume", paused)
    home.cli("submit", write_config(tmp_path, "straight", **config), model)
    straight = home.experiment_named("straight")["id"]
    assert home.wait_until_ended(paused)["state"] == "COMPLETED"
    assert home.wait_until_ended(straight)["state"] == "COMPLETED"
    daemon.stop()
    assert trial_of(home, paused)["engine"] == engine
    assert_same_weights(home, paused, straight, tmp_path)


GAN = REPO / "tests" / "compat" / "subclassed_gan"


def checkpoint_arrays(folder) -> list[tuple[str, np.ndarray]]:
    """(name, array) of every array in an exported checkpoint's Keras file: the whole
    model's .h5, or a subclassed model's weights file, as its metadata names it. Its "rest"
    (the metric trackers' running totals, which each rank keeps over its own part of the
    batches; the metrics reported are averaged over the ranks) is left out."""
    import json

    metadata = json.loads((folder / "metadata.json").read_text())
    arrays = []
    with h5py.File(folder / metadata.get("weights_file", "determined-keras-model.h5")) as h5:
        h5.visititems(lambda name, obj: arrays.append((name, np.asarray(obj)))
                      if isinstance(obj, h5py.Dataset) else None)
    return [(name, array) for name, array in arrays if not name.startswith("rest/")]


def gan_on_one_and_two_slots(home, tmp_path, daemons) -> tuple[dict, dict, str]:
    """The GAN-like compat folder's distributed.yaml (Keras 2) on one slot and on two, under
    one daemon: their final weights agree within 1e-5. Returns (one, two, two's log)."""
    config = yaml.safe_load((GAN / "distributed.yaml").read_text())
    # Both at once: their start-ups overlap; the 2-slot trial's ranks forked warm.
    daemon = daemons(home, "--slots", "3", "--warm", "1")
    for slots in (1, 2):
        path = tmp_path / f"gan{slots}.yaml"
        path.write_text(yaml.safe_dump(dict(
            config, name=f"gan{slots}", resources={"slots_per_trial": slots},
            reproducibility={"experiment_seed": 7},
            environment={"environment_variables": ["TF_USE_LEGACY_KERAS=1",
                                                   "TF_DETERMINISTIC_OPS=1"]})))
        home.cli("submit", path, GAN)
    ids = [home.experiment_named(f"gan{slots}")["id"] for slots in (1, 2)]
    for experiment in ids:
        assert home.wait_until_ended(experiment)["state"] == "COMPLETED"
    daemon.stop()
    arrays = []
    for experiment in ids:
        last = home.json("checkpoints", experiment)[-1]
        assert last["batches_trained"] == 40
        home.cli("checkpoint", "export", last["uuid"], tmp_path / f"export-{experiment}")
        arrays.append(checkpoint_arrays(tmp_path / f"export-{experiment}"))
    assert len(arrays[0]) >= 8  # both sub-models' kernels and biases at least
    for (name_a, a), (name_b, b) in zip(*arrays, strict=True):
        assert name_a == name_b
        np.testing.assert_allclose(a, b, atol=1e-5, err_msg=name_a)
    one, two = trial_of(home, ids[0]), trial_of(home, ids[1])
    for key in ("val_d_loss", "val_g_loss"):
        assert one["latest_validation"][key] == pytest.approx(
            two["latest_validation"][key], abs=1e-5)
    log = (home.path / "experiments" / str(ids[1]) / "trials" / str(two["id"])
           / "trial.log").read_text()
    return one, two, log


def test_a_subclassed_gan_with_sum_over_batch_size_losses_on_two_slots_ends_like_one(
        home, tmp_path, daemons):
    """Its train_step hands each optimizer its gradients itself, with a loss of the default
    reduction: under MultiWorkerMirroredStrategy tf_keras refuses that loss; under
    gradient_allreduce each rank computes it on its half of every batch and the gradients
    are averaged, as under Horovod."""
    one, two, log = gan_on_one_and_two_slots(home, tmp_path, daemons)
    assert (one["engine"], two["engine"]) == ("single", "gradient_allreduce")
    assert "rank 1 of 2: gradients averaged across the ranks' processes" in log
