"""Determined's Core API (`det.core.init()`) and its Keras callback: the contexts against a
real state database and reporter, off localdet as Determined's off-cluster context, and, end
to end under one daemon, our compat folders (tests/compat/core_api): an iris Keras script
with DeterminedCallback and det.keras.TensorBoard under the tensorflow launcher, and a plain
Python loop."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import wait_for
from test_multi_slot_e2e import pause_soon_after

import determined as det
from determined import _info

COMPAT = Path(__file__).resolve().parent / "compat" / "core_api"


@pytest.fixture
def trial_process(tmp_path, monkeypatch):
    """Make this process a trial the launcher started: an experiment and a RUNNING trial
    recorded, and the environment a launcher gives. Returns (db, make) where make(searcher)
    records the trial and returns its id."""
    from localdet.config.experiment import parse_config
    from localdet.paths import Layout
    from localdet.records.db import StateDB

    layout = Layout(tmp_path / "home").ensure()
    db = StateDB.open(layout.db)
    monkeypatch.setenv("LOCALDET_HOME", str(layout.home))
    monkeypatch.setattr(_info, "_cache", {})

    def make(searcher: dict) -> int:
        config = parse_config({"entrypoint": "python3 train.py", "searcher": searcher,
                               "hyperparameters": {"lr": 0.1}}).config
        experiment_id = db.create_experiment(
            name="core", description="", config=config, original_config="",
            searcher=searcher["name"], metric=searcher["metric"], smaller_is_better=True,
            experiment_seed=1, model_dir=str(tmp_path))
        length = (searcher.get("max_length") or {}).get("batches", 0)
        trial_id = db.create_trial(experiment_id=experiment_id, request_id=1,
                                   hparams={"lr": 0.1}, seed=3, target_batches=length)
        db.update_trial(trial_id, state="RUNNING", pid=os.getpgrp())
        monkeypatch.setenv("LOCALDET_TRIAL_ID", str(trial_id))
        _info._cache.clear()
        return trial_id

    yield db, make
    db.close()


def test_a_script_without_a_length_records_metrics_and_checkpoints_and_pauses(trial_process,
                                                                            monkeypatch):
    db, make = trial_process
    trial_id = make({"name": "single", "metric": "err"})
    with det.core.init() as core_context:
        info = det.get_cluster_info()
        assert (info.task_type, info.trial.trial_id, info.trial.hparams,
                info.latest_checkpoint) == ("TRIAL", trial_id, {"lr": 0.1}, None)
        assert core_context.info is info and info.trial._config["searcher"]["metric"] == "err"
        core_context.train.report_training_metrics(10, {"loss": np.float32(0.5), "name": "x"})
        core_context.train.report_validation_metrics(20, {"err": 0.25})
        with core_context.checkpoint.store_path({"steps_completed": 20, "note": "a"}) as (
                path, storage_id):
            (path / "weights.txt").write_text("w=1")
        core_context.train.report_progress(0.5)
        assert db.trial(trial_id).target_batches == 40  # its progress: half way at 20
        assert not core_context.preempt.should_preempt()
        # A script the searcher gave no length: its own loop decides, so no operations.
        with pytest.raises(ValueError, match="no searcher.max_length"):
            next(core_context.searcher.operations())
    metrics = {(m.kind, m.batches_trained): m.metrics for m in db.metrics(trial_id)}
    assert metrics == {("training", 10): {"loss": 0.5}, ("validation", 20): {"err": 0.25}}
    checkpoint = db.checkpoint(storage_id)
    assert (checkpoint.batches_trained, checkpoint.metadata) == (20, {"steps_completed": 20,
                                                                      "note": "a"})
    trial = db.trial(trial_id)
    assert (trial.latest_checkpoint, trial.target_batches) == (storage_id, 20)  # its end

    # Launched again, paused: it resumes from the checkpoint, and a pause keeps its target.
    db.update_trial(trial_id, stop_requested="PAUSE")
    _info._cache.clear()
    with det.core.init() as core_context:
        info = det.get_cluster_info()
        assert (info.latest_checkpoint, info.trial.steps_completed) == (storage_id, 20)
        with core_context.checkpoint.restore_path(info.latest_checkpoint) as path:
            assert (path / "weights.txt").read_text() == "w=1"
            assert json.loads((path / "metadata.json").read_text())["note"] == "a"
        assert core_context.checkpoint.get_metadata(storage_id)["note"] == "a"
        # Without the database (a trial on another machine): the checkpoint's metadata.json.
        from determined.core._reporting import reporter_factory

        def elsewhere(uuid):
            raise FileNotFoundError("no database here")
        monkeypatch.setattr(reporter_factory(), "checkpoint_metadata", elsewhere)
        assert core_context.checkpoint.get_metadata(storage_id) == {"steps_completed": 20,
                                                                    "note": "a"}
        core_context.train.report_validation_metrics(30, {"err": 0.2})
        assert core_context.preempt.should_preempt()
        assert core_context.preempt.should_preempt()  # it stays asked
    trial = db.trial(trial_id)
    assert (trial.stop_requested, trial.target_batches) == ("PAUSING", 31)


def test_a_searcher_length_reaches_the_script_and_preempts_once_validated(trial_process):
    db, make = trial_process
    trial_id = make({"name": "single", "metric": "err", "max_length": {"batches": 30}})
    with det.core.init() as core_context:
        for op in core_context.searcher.operations():
            assert op.length == 30
            core_context.train.report_validation_metrics(20, {"err": 0.5})
            assert not core_context.preempt.should_preempt()
            op.report_progress(32)
            op.report_completed(0.4)  # recorded as a validation at the batches reached
            assert core_context.preempt.should_preempt()
        assert core_context.searcher.get_configured_units() == det.core.Unit.BATCHES
    assert [(m.batches_trained, m.metrics) for m in db.metrics(trial_id)] == \
        [(20, {"err": 0.5}), (30, {"err": 0.4})]
    assert db.trial(trial_id).target_batches == 30  # the searcher's, never the script's


def test_report_early_exit_invalid_hp_ends_the_trial_as_invalid_hp_does(
        trial_process, capsys, tmp_path):
    from localdet.processes import failures, launcher

    _, make = trial_process
    make({"name": "single", "metric": "err"})
    with pytest.raises(SystemExit) as exited:
        with det.core.init() as core_context:
            core_context.train.report_early_exit(det.core.EarlyExitReason.INVALID_HP)
    assert exited.value.code == 1
    log = tmp_path / "trial.log"
    log.write_text(capsys.readouterr().err)
    assert failures.invalid_hparams(launcher.failure(log))  # no restarts; the search goes on


def test_a_time_metric_length_counts_in_that_metric():
    from determined.core._length import TrialLength

    epochs = TrialLength(None, 3, searched=True, time_metric="epochs")  # max_time: 3 epochs
    epochs.validated(200, {"epochs": 2.0, "loss": 0.1})
    assert not epochs.reached()
    epochs.validated(300, {"epochs": 3.0})
    assert epochs.reached()
    batches = TrialLength(None, 300, searched=True, time_metric="batches")
    batches.validated(299, {"epochs": 9.0})
    assert not batches.reached()
    batches.validated(300)
    assert batches.reached()


def _completed(operations, metric):
    for op in operations:
        yield op
        op.report_completed(metric)


def test_off_localdet_it_is_determineds_off_cluster_context(tmp_path, monkeypatch):
    monkeypatch.delenv("LOCALDET_TRIAL_ID", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert det.get_cluster_info() is None
    with det.core.init() as core_context:
        with core_context.checkpoint.store_path({"steps_completed": 5}) as (path, storage_id):
            (path / "model").write_text("m")
        core_context.train.report_validation_metrics(5, {"loss": 1.0})
        assert not core_context.preempt.should_preempt()
        assert core_context.train.get_tensorboard_path() is None
        (op,) = list(_completed(core_context.searcher.operations(), 1.0))
        assert op.length == 1
    stored = tmp_path / "data" / "determined" / storage_id
    assert (stored / "model").read_text() == "m"
    assert json.loads((stored / "metadata.json").read_text()) == {"steps_completed": 5}
    context = det.core.init(checkpoint_storage=str(tmp_path / "elsewhere"))
    uploaded = context.checkpoint.upload(stored, {"steps_completed": 6},
                                         selector=lambda name: name == "model")
    assert sorted(p.name for p in (tmp_path / "elsewhere" / uploaded).iterdir()) == \
        ["metadata.json", "model"]


def test_the_launchers_run_a_script_by_hand(tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "determined.launch.tensorflow", "--port",
                           "1", "--", "python3", "-c", "print('ran')"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert (done.returncode, done.stdout) == (0, "ran\n")
    with pytest.raises(ImportError, match="torch.distributed launcher"):
        __import__("determined.launch.torch_distributed")


# --- end to end, under one daemon -------------------------------------------------------------


def _config(folder: Path, source: str, name: str, **changes) -> Path:
    config = yaml.safe_load((COMPAT / source).read_text())
    config.update(name=name, reproducibility={"experiment_seed": 5}, **changes)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _final_weights(home, experiment_id: int) -> np.ndarray:
    model_dir = home.rows("SELECT model_dir FROM experiments WHERE id = ?",
                          experiment_id)[0]["model_dir"]
    return np.load(Path(model_dir) / "final_weights.npy")


@pytest.mark.slow
def test_core_api_scripts_under_the_daemon(home, tmp_path, daemons):
    """One daemon: the iris DeterminedCallback script under a random search whose length
    stops it (one trial), the same script with no length paused and resumed (it ends with
    the same weights), and the plain loop."""
    iris, plain = COMPAT / "iris_callback", COMPAT / "plain_loop"
    entry = "python3 -m determined.launch.tensorflow -- python3 train.py --epochs {}"
    daemons(home, "--slots", "2")
    search = {"name": "random", "metric": "val_categorical_accuracy", "max_trials": 1,
              "smaller_is_better": False, "max_length": {"batches": 156}}
    home.cli("submit", _config(tmp_path, "iris_callback/const.yaml", "searched",
                               searcher=search, entrypoint=entry.format(100)), iris)
    home.cli("submit", _config(tmp_path, "iris_callback/const.yaml", "paused",
                               entrypoint=entry.format(20)), iris)
    searched, paused = (home.experiment_named(n)["id"] for n in ("searched", "paused"))
    pause_soon_after(home, paused, 24)
    wait_for(lambda: home.first_trial(paused)["state"] == "PAUSED", 300, "the pause", 0.1)
    stopped = home.first_trial(paused)
    # While the script decides its length, its target is what its progress says (160).
    assert 24 <= stopped["batches_trained"] < 160 == stopped["target_batches"]
    home.cli("resume", paused)
    home.cli("submit", _config(tmp_path, "plain_loop/const.yaml", "plain"), plain)
    # The searcher's length reaches the script: it stops at the first epoch end past it.
    for experiment_id in (searched, paused):
        facts = home.wait_until_ended(experiment_id)
        assert facts["state"] == "COMPLETED", home.ended_report(experiment_id)
        assert facts["trials"][0]["batches_trained"] == 160
    np.testing.assert_array_equal(_final_weights(home, searched), _final_weights(home, paused))
    trial = home.first_trial(paused)
    assert trial["target_batches"] == 160
    assert home.rows("SELECT COUNT(*) AS n FROM metrics WHERE trial_id = ? AND kind = ?",
                     trial["id"], "validation")[0]["n"] == 20
    assert home.rows("SELECT metadata FROM checkpoints WHERE uuid = ?",
                     trial["latest_checkpoint"])[0]["metadata"] == '{"steps_completed": 160}'
    tensorboard = home.path / "experiments" / str(paused) / "trials" / str(trial["id"])
    assert list((tensorboard / "tensorboard").rglob("events.out.tfevents.*"))
    facts = home.wait_until_ended(home.experiment_named("plain")["id"])
    assert facts["state"] == "COMPLETED" and facts["trials"][0]["batches_trained"] == 400


# --- DeterminedCallback and the off-cluster contexts, in this process -------------------------


class _Recorder:
    """A core context's train/preempt stand-in that notes what the callback does, beside a
    real DummyCheckpointContext in `storage` (a shared_fs manager that notes restores)."""

    def __init__(self, folder: Path):
        from determined.common import storage

        events = self.events = []

        class NotingStorage(storage.SharedFSStorageManager):
            def restore_path(self, src, selector=None):
                events.append(("restore", (src, selector)))
                return super().restore_path(src, selector)

        self.distributed = det.core.DummyDistributedContext()
        self.checkpoint = det.core.DummyCheckpointContext(self.distributed,
                                                          NotingStorage(str(folder)))
        self.train = self
        self.preempt = self
        self.preempt_after_epochs = None

    def set_status(self, status):
        self.events.append(("status", status))

    def report_metrics(self, group, steps, metrics):
        self.events.append((group, (steps, dict(metrics))))

    def report_progress(self, progress):
        self.events.append(("progress", progress))

    def should_preempt(self):
        epochs = sum(1 for kind, _ in self.events if kind == "progress")
        return epochs == self.preempt_after_epochs


def _fit(folder: Path, checkpoint=None, continue_id=1, epochs=2, **settings):
    """Two epochs of 4 batches of a one-weight model under a noting DeterminedCallback;
    returns (events, the final weight)."""
    import tensorflow as tf

    core = _Recorder(folder)
    if "preempt_after_epochs" in settings:
        core.preempt_after_epochs = settings.pop("preempt_after_epochs")

    class Noting(det.keras.DeterminedCallback):
        def save_model(self, model, path, distributed):
            super().save_model(model, path, distributed)
            core.events.append(("save_model", Path(path)))

        def load_model(self, model, path, distributed):
            super().load_model(model, path, distributed)
            core.events.append(("load_model", Path(path)))

        def on_train_batch_end(self, batch, logs=None):
            core.events.append(("batch", batch))
            super().on_train_batch_end(batch, logs)

    model = tf.keras.Sequential([tf.keras.Input((2,)),
                                 tf.keras.layers.Dense(1, use_bias=False,
                                                       kernel_initializer="zeros")])
    model.compile(loss="mse", optimizer=tf.keras.optimizers.SGD(0.1), metrics=["mae"])
    x, y = np.ones((16, 2), "float32"), np.ones((16, 1), "float32")
    model.fit(x, y, batch_size=4, epochs=epochs, validation_data=(x, y), verbose=0,
              shuffle=False, callbacks=[Noting(core, checkpoint=checkpoint,
                                               continue_id=continue_id, **settings)])
    return core.events, float(model.layers[-1].get_weights()[0][0, 0])


def _kinds(events):
    return [kind if kind in ("batch", "save_model", "load_model", "restore")
            else f"{kind}:{value}" if kind in ("status", "progress") else f"{kind}:{value[0]}"
            for kind, value in events]


def test_determined_callback_keeps_determineds_order_statuses_and_metric_names(tmp_path):
    events, _ = _fit(tmp_path)
    order = [k for k in _kinds(events) if k != "batch"]
    assert order == ["status:training", "status:validating", "validation:4", "training:4",
                     "progress:0.5", "status:checkpointing", "save_model",
                     "status:training", "status:validating", "validation:8", "training:8",
                     "progress:1.0", "status:checkpointing", "save_model", "status:finishing"]
    for group in ("training", "validation"):
        for steps, metrics in (value for kind, value in events if kind == group):
            assert set(metrics) == {"loss", "mae", "epochs", "batches"}, metrics
            assert metrics["batches"] == steps
    assert [v[1]["epochs"] for k, v in events if k == "validation"] == [1, 2]
    # Every 3 batches instead of each epoch; a checkpoint only at the end (0 epochs).
    events, _ = _fit(tmp_path, train_metrics_report_period=3, checkpoint_epochs=0)
    assert [k for k in _kinds(events) if k.startswith(("training", "save"))] == \
        ["training:3", "training:6", "save_model"]
    assert _kinds(events)[-2:] == ["save_model", "status:finishing"]  # in on_train_end
    # Preempted after the first epoch, with nothing saved then: saved at the end.
    events, _ = _fit(tmp_path, checkpoint_epochs=2, preempt_after_epochs=1)
    assert [k for k in _kinds(events) if k in ("batch", "save_model")] == \
        ["batch"] * 4 + ["save_model"]


def test_determined_callback_resumes_and_warm_starts_through_a_storage_manager(tmp_path):
    events, weight = _fit(tmp_path, epochs=1)
    saved = next(path for kind, path in events if kind == "save_model")
    storage_id = saved.parent.name  # written in place: the folder is the storage id
    assert saved == tmp_path / storage_id / "model_checkpoint"
    assert json.loads((saved.parent / "metadata.json").read_text()) == {"steps_completed": 4}
    # The same continue_id goes on at epoch 2 and batch 5; the checkpoint stays open (a
    # restore_path block) until the first batch has read it.
    events, resumed = _fit(tmp_path, checkpoint=storage_id, epochs=2)
    kinds = _kinds(events)
    assert kinds[:4] == ["status:restoring", "restore", "load_model", "status:training"]
    assert events[1][1] == (storage_id, None)
    assert [k for k in kinds if k.startswith("training")] == ["training:8"]
    _, straight = _fit(tmp_path / "straight", epochs=2)
    assert resumed == straight
    # Another continue_id: the weights only, training from epoch 1 and batch 1.
    events, _ = _fit(tmp_path, checkpoint=storage_id, continue_id=2, epochs=1)
    assert [k for k in _kinds(events) if k.startswith("training")] == ["training:4"]
    checkpoint = det.core.DummyCheckpointContext(det.core.DummyDistributedContext(),
                                                 str(tmp_path))
    assert checkpoint.get_metadata(storage_id) == {"steps_completed": 4}
    checkpoint.delete(storage_id)
    assert not (tmp_path / storage_id).exists()


def test_a_callback_checkpoint_loads_with_load_weights_and_the_loader_says_so(tmp_path):
    import tensorflow as tf

    from determined.keras._load import CheckpointLoadError, load_model_from_checkpoint_path

    events, weight = _fit(tmp_path, epochs=1)
    folder = next(path for kind, path in events if kind == "save_model").parent
    model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1, use_bias=False)])
    # As Determined documented under Keras 2; Keras 3 reads weights only by a file's suffix.
    keras2 = tf.keras.__name__.startswith("tf_keras")
    weights = folder / ("model_checkpoint" if keras2 else "model_checkpoint.weights.h5")
    model.load_weights(weights)
    assert float(model.layers[-1].get_weights()[0][0, 0]) == weight
    with pytest.raises(CheckpointLoadError) as refused:
        load_model_from_checkpoint_path(str(folder))
    assert str(refused.value) == (
        f"'{folder}' is a DeterminedCallback checkpoint, which holds the model's weights "
        f"(Keras {2 if keras2 else 3}) but not the model: build the model in your code and "
        f"read them with model.load_weights('{weights}')")


def test_the_searcher_metric_is_found_under_either_keras_name():
    from determined.core._train import _with_searcher_metric

    assert _with_searcher_metric({"loss": 1.0}, "val_loss") == {"loss": 1.0, "val_loss": 1.0}
    assert _with_searcher_metric({"val_acc": 0.5}, "acc") == {"val_acc": 0.5, "acc": 0.5}
    assert _with_searcher_metric({"loss": 1.0, "val_loss": 2.0}, "val_loss")["val_loss"] == 2.0
    assert _with_searcher_metric({"loss": 1.0}, "acc") == {"loss": 1.0}


def test_tf_config_workers_started_by_hand_share_a_key_from_their_cluster(monkeypatch):
    from determined.core._distributed import DistributedContext

    monkeypatch.delenv("LOCALDET_DIST_AUTHKEY", raising=False)
    monkeypatch.delenv("LOCALDET_CHIEF_ADDR", raising=False)
    cluster = {"worker": ["localhost:12345", "localhost:12346"]}
    ranks = [DistributedContext._ranks_from_tf_config(
        {"cluster": cluster, "task": {"type": "worker", "index": i}}) for i in (0, 1)]
    assert [r.rank for r in ranks] == [0, 1] and ranks[0]._authkey == ranks[1]._authkey
    other = DistributedContext._ranks_from_tf_config(
        {"cluster": {"worker": ["localhost:1", "localhost:2"]},
         "task": {"type": "worker", "index": 0}})
    assert other._authkey not in (None, ranks[0]._authkey)
    monkeypatch.setenv("LOCALDET_DIST_AUTHKEY", "ab" * 32)  # the launcher's key wins
    assert DistributedContext._ranks_from_tf_config(
        {"cluster": cluster, "task": {"type": "worker", "index": 0}})._authkey == b"\xab" * 32


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("TF_USE_LEGACY_KERAS") == "1",
                    reason="already running under Keras 2")
def test_a_callback_checkpoint_loads_with_load_weights_under_keras2_too():
    import subprocess
    import sys

    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    check = ("import tempfile, pathlib, tensorflow as tf, test_core_api as t; "
             "assert tf.keras.__name__.startswith('tf_keras'); "
             "t.test_a_callback_checkpoint_loads_with_load_weights_and_the_loader_says_so("
             "pathlib.Path(tempfile.mkdtemp())); print('loaded')")
    done = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True,
                          text=True, timeout=300, cwd=Path(__file__).parent)
    assert done.returncode == 0 and done.stdout.endswith("loaded\n"), done.stderr[-4000:]


def test_a_shared_restore_is_made_once_by_the_chief_and_held_until_every_rank_is_done(
        tmp_path):
    from contextlib import contextmanager

    from determined.core._checkpoint import DownloadMode, _shared_restore

    class Ranks:
        """Two ranks' view of the collectives: what the chief broadcast, and the barriers."""

        def __init__(self, rank):
            self.rank, self.size, self.calls = rank, 2, []

        def broadcast(self, value):
            self.calls.append(("broadcast", value))
            return value if self.rank == 0 else str(tmp_path / "chiefs")

        def allgather(self, value):
            self.calls.append(("allgather", value))
            return [value, value]

    restored = []

    @contextmanager
    def restore():
        restored.append(True)
        yield tmp_path / "chiefs"

    chief, other = Ranks(0), Ranks(1)
    with _shared_restore(chief, DownloadMode.LocalWorkersShareDownload, restore) as path:
        assert path == tmp_path / "chiefs" and chief.calls == [("broadcast", str(path))]
    with _shared_restore(other, DownloadMode.LocalWorkersShareDownload, restore) as path:
        assert path == tmp_path / "chiefs"
    assert restored == [True]  # only the chief restored
    assert chief.calls[-1] == other.calls[-1] == ("allgather", None)
    # Without sharing each rank restores its own copy and no collective is called.
    alone = Ranks(1)
    with _shared_restore(alone, DownloadMode.NoSharedDownload, restore):
        pass
    assert restored == [True, True] and alone.calls == []
