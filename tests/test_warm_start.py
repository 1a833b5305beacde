"""Warm starts (`searcher.source_checkpoint_uuid` / `source_trial_id`) and
`localdet checkpoint import`: a folder goes into the store and comes back byte for byte; a
config naming a missing source is refused at submission in one sentence; a TFKerasTrial
warm-started from a checkpoint starts from its weights and optimizer state at batch 0; a
checkpoint in Determined 0.12's form (an HDF5 file without a suffix) loads and warm-starts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from click.testing import CliRunner
from conftest import start_trial

import determined as det
from determined import keras
from determined.core import TrialInfo
from determined.keras._trial_controller import TrialController
from localdet.checkpoints import warm_start
from localdet.checkpoints.manifest import build_manifest, files_of
from localdet.checkpoints.store import FileEntry, Store
from localdet.config.experiment import parse_config
from localdet.daemon.submissions import SubmissionError, check_warm_start, submit
from localdet.records.states import ExperimentState, Runner, TrialState


def _folder(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes()
            for p in sorted(path.rglob("*")) if p.is_file()}


def test_import_stores_a_folder_that_export_gives_back_unchanged(layout, db, tmp_path):
    folder = tmp_path / "0.17-keras"
    (folder / "code").mkdir(parents=True)
    (folder / "code" / "model_def.py").write_text("class Trial: ...\n")
    (folder / "determined-keras-model-weights.index").write_bytes(bytes(range(256)))
    (folder / "metadata.json").write_text(json.dumps(
        {"hparams": {"learning_rate": 0.01}, "latest_batch": 40, "framework": "tensorflow"}))
    from localdet.ui.cli import cli

    result = CliRunner().invoke(cli, ["checkpoint", "import", str(folder)],
                                env={"LOCALDET_HOME": str(layout.home)})
    assert result.exit_code == 0, result.output
    uuid = result.stdout.strip().splitlines()[-1]  # the uuid alone on the last line

    found = db.checkpoint(uuid)
    out = tmp_path / "out"
    Store(layout.store).materialize(files_of(found.manifest), out)
    assert _folder(out) == _folder(folder)
    assert found.batches_trained == 40
    assert found.metadata["framework"] == "tensorflow"  # its own metadata, readable
    experiment, trial = db.experiment(found.experiment_id), db.trial(found.trial_id)
    assert (experiment.state, experiment.runner) == (ExperimentState.COMPLETED, Runner.SCRIPT)
    assert trial.state == TrialState.COMPLETED and trial.hparams == {"learning_rate": 0.01}

    missing = CliRunner().invoke(cli, ["checkpoint", "import", str(tmp_path / "nowhere")],
                                 env={"LOCALDET_HOME": str(layout.home)})
    assert missing.exit_code != 0


def _parsed(**searcher):
    return parse_config({"entrypoint": "model_def:Trial", "hyperparameters": {},
                         "searcher": {"name": "single", "metric": "val_loss",
                                      "max_length": {"batches": 10}, **searcher}})


def _checkpoint(db, trial_id: int, batches: int, uuid: str) -> str:
    entry = FileEntry("0" * 64, 0)
    trial = db.trial(trial_id)
    db.add_checkpoint(build_manifest(uuid=uuid, experiment_id=trial.experiment_id,
                                     trial_id=trial_id, batches_trained=batches,
                                     files={"a": entry}, metadata={}))
    return uuid


def test_sources_resolve_at_submission_and_missing_ones_are_refused(layout, db, tmp_path):
    experiment = db.create_experiment(
        name="source", description="", config=_parsed().config, original_config="",
        searcher="single", metric="val_loss", smaller_is_better=True, experiment_seed=1,
        model_dir="")
    with_checkpoints = db.create_trial(experiment_id=experiment, request_id=1, hparams={},
                                       seed=1, target_batches=10)
    without = db.create_trial(experiment_id=experiment, request_id=2, hparams={}, seed=1,
                              target_batches=10)
    late = _checkpoint(db, with_checkpoints, 20, "bbbbbbbb-0000-4000-8000-000000000002")
    _checkpoint(db, with_checkpoints, 10, "aaaaaaaa-0000-4000-8000-000000000001")

    by_trial = _parsed(source_trial_id=with_checkpoints)
    check_warm_start(db, by_trial, "experiment")  # the trial's latest: most batches
    assert by_trial.config["searcher"]["source_checkpoint_uuid"] == late
    by_prefix = _parsed(source_checkpoint_uuid="aaaaaaaa")
    check_warm_start(db, by_prefix, "experiment")
    assert by_prefix.config["searcher"]["source_checkpoint_uuid"].startswith("aaaaaaaa-")
    both = _parsed(source_trial_id=with_checkpoints, source_checkpoint_uuid="aaaaaaaa")
    check_warm_start(db, both, "experiment")
    assert both.config["searcher"]["source_checkpoint_uuid"] == late and both.warnings

    for searcher, words in (({"source_checkpoint_uuid": "cccc"}, "no checkpoint matches"),
                            ({"source_trial_id": 999}, "there is no trial 999"),
                            ({"source_trial_id": without}, "has no checkpoint")):
        with pytest.raises(SubmissionError, match=words) as refused:
            check_warm_start(db, _parsed(**searcher), "experiment")
        assert str(refused.value).count(". ") == 0  # one sentence
    # `localdet submit` refuses it too, before anything is queued.
    config = tmp_path / "const.yaml"
    config.write_text("entrypoint: model_def:Trial\nsearcher: {name: single, metric: val_loss,"
                      " max_length: 10, source_checkpoint_uuid: cccc}\n")
    with pytest.raises(SubmissionError, match="no checkpoint matches 'cccc'"):
        submit(layout, config, None)
    assert not any(layout.queue.iterdir()) or all(p.name.startswith(("jobs", "rejected"))
                                                  for p in layout.queue.iterdir())

    # Retention keeps what a running experiment starts from; not once it has ended.
    db.create_experiment(name="warm", description="", config=by_prefix.config,
                         original_config="", searcher="single", metric="val_loss",
                         smaller_is_better=True, experiment_seed=1, model_dir="")
    assert warm_start.warm_start_sources(db) == {"aaaaaaaa-0000-4000-8000-000000000001"}


def test_trial_info_names_the_source_only_until_the_trial_has_its_own_checkpoint():
    info = TrialInfo(experiment_id=1, trial_id=1, hparams={}, seed=1, target_batches=1,
                     scheduling_unit=1, validation_period=0, checkpoint_period=0,
                     latest_checkpoint=None, config={"searcher": {"source_checkpoint_uuid": "x"}},
                     model_dir=Path("."), trial_dir=Path("."))
    assert info.warm_start_checkpoint == "x"
    # context.env shows the source, as Determined did, and the trial still starts at 0.
    env = det.EnvContext(info, det.core.DummyDistributedContext())
    assert env.latest_checkpoint == "x" and env.steps_completed == 0
    info.latest_checkpoint = "own"
    assert info.warm_start_checkpoint is None


class LineTrial(keras.TFKerasTrial):
    """y = 2x: the trained weight and the optimizer's step count tell where a trial
    started."""

    def build_model(self):
        model = self.context.wrap_model(tf.keras.Sequential([
            tf.keras.Input(shape=(1,)),
            tf.keras.layers.Dense(1, kernel_initializer="zeros", use_bias=False)]))
        optimizer = tf.keras.optimizers.SGD(self.context.get_hparam("learning_rate"))
        model.compile(optimizer=self.context.wrap_optimizer(optimizer), loss="mse")
        return model

    def build_training_data_loader(self):
        x = np.linspace(-1, 1, 40, dtype="float32").reshape(-1, 1)
        return x, 2 * x

    def build_validation_data_loader(self):
        x = np.linspace(-1, 1, 8, dtype="float32").reshape(-1, 1)
        return x, 2 * x


def test_a_warm_started_trial_starts_from_the_weights_at_batch_0(tmp_path, capsys):
    db, source_trial, reporter, info = start_trial(
        tmp_path, target=3, hparams={"global_batch_size": 4, "learning_rate": 0.1})
    source = TrialController.for_trial_class(LineTrial, info, reporter)
    source.run()
    uuid = db.trial(source_trial).latest_checkpoint
    trained = source.model.get_weights()[0]
    assert not np.allclose(trained, 0)

    # Learning rate 0: what the warm-started trial ends with is what it started from. Its
    # checkpoints go to another store than the source's, which is read where it lives.
    (tmp_path / "shared").mkdir()
    db, trial_id, reporter, info = start_trial(
        tmp_path, target=2, hparams={"global_batch_size": 4, "learning_rate": 0.0},
        searcher={"name": "single", "metric": "val_loss", "max_length": {"batches": 2},
                  "source_checkpoint_uuid": uuid},
        checkpoint_storage={"type": "shared_fs", "host_path": str(tmp_path / "shared")})
    assert info.warm_start_checkpoint == uuid and info.latest_checkpoint is None
    warm = TrialController.for_trial_class(LineTrial, info, reporter)
    warm.run()
    np.testing.assert_array_equal(warm.model.get_weights()[0], trained)
    assert float(warm.model.optimizer.learning_rate.numpy()) == 0.0  # its own rate
    assert int(warm.model.optimizer.iterations.numpy()) == 3 + 2  # the source's steps on
    assert [c.batches_trained for c in db.checkpoints(trial_id=trial_id)] == [2]
    assert [m.batches_trained for m in db.metrics(trial_id, "training")] == [2]
    assert f"warm start from checkpoint {uuid}" in capsys.readouterr().out


def test_determined_0_12_form_loads_and_warm_starts(tmp_path):
    """Determined 0.12 wrote the whole-model HDF5 file without its suffix."""
    from determined.keras import load_model_from_checkpoint_path
    from determined.keras._warm_start import load_into

    model = tf.keras.Sequential([tf.keras.Input(shape=(2,)), tf.keras.layers.Dense(3)])
    model.compile(optimizer="sgd", loss="mse")
    folder = tmp_path / "0.12.3-keras"
    folder.mkdir()
    model.save(tmp_path / "model.h5")
    (tmp_path / "model.h5").rename(folder / "determined-keras-model")
    loaded = load_model_from_checkpoint_path(str(folder))
    for saved, back in zip(model.get_weights(), loaded.get_weights(), strict=True):
        np.testing.assert_array_equal(saved, back)

    fresh = tf.keras.Sequential([tf.keras.Input(shape=(2,)), tf.keras.layers.Dense(3)])
    fresh.compile(optimizer="sgd", loss="mse")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    assert load_into(folder, fresh, [fresh.optimizer], scratch)[0] == "weights"
    np.testing.assert_array_equal(fresh.get_weights()[0], model.get_weights()[0])
