"""End to end: a real daemon process, real SQLite, real TensorFlow training on digits."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import yaml
from conftest import EXAMPLE, TEST_TRIALS, Home, wait_for, write_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def state(tmp_path_factory, module_daemons):
    """One state folder and daemon for the module; the bundled example is dropped into the
    queue while the daemon is down, as `cp -r examples/digits_trial queue/` would."""
    root = tmp_path_factory.mktemp("e2e")
    home = Home(root / "home")
    submission = root / "digits_trial"
    shutil.copytree(EXAMPLE, submission)
    shutil.copy(TEST_TRIALS / "predicting_trial.py", submission)
    config = yaml.safe_load((EXAMPLE / "const.yaml").read_text())
    config["entrypoint"] = "predicting_trial:PredictingTrial"
    config["environment"] = {"environment_variables": [f"PREDICTIONS_FILE={root / 'final.npy'}"]}
    (submission / "const.yaml").write_text(yaml.safe_dump(config))
    (home.path / "queue").mkdir(parents=True)
    shutil.copytree(submission, home.path / "queue" / "digits_trial")

    daemon = module_daemons(home)
    facts = home.wait_until_ended(home.experiment_named("digits-const")["id"])
    yield home, daemon, facts, root
    daemon.stop()


def test_example_dropped_while_daemon_was_down_runs_to_completion(state):
    home, _, facts, _ = state
    assert facts["state"] == "COMPLETED", home.ended_report(facts["id"])
    assert not (home.path / "queue" / "digits_trial").exists()
    (trial,) = facts["trials"]
    assert trial["state"] == "COMPLETED"
    # 5 epochs of 1437 records at 32 per batch, validated every epoch (45 batches).
    assert trial["batches_trained"] == 225
    assert trial["best_validation"]["val_accuracy"] > 0.8  # chance is 0.1
    assert trial["latest_checkpoint"]
    # How long its one launch took to end the first batch, in `status --json` and the table.
    assert trial["launch_seconds"] > 0
    assert [launch["first_batch_seconds"] for launch in trial["launches"]] == [
        trial["launch_seconds"]]
    table = home.cli("status", facts["id"], process=True).stdout
    assert "Start" in table and f"{trial['launch_seconds']:.1f} s" in table
    # The tests' status and commands, run in their process, are what the command prints.
    assert home.status(facts["id"]) == home.json("status", facts["id"], process=True) \
        == home.json("status", facts["id"])
    assert home.cli("status", facts["id"]).stdout == table
    listed = [e for e in home.status() if e["id"] == facts["id"]]
    assert listed == [e for e in home.json("status", process=True)
                      if e["id"] == facts["id"]] and listed


def test_metric_rows_and_checkpoints_follow_the_periods(state):
    from localdet.records.db import StateDB

    home, _, facts, _ = state
    db = StateDB.open(home.path / "localdet.db")
    trial_id = facts["trials"][0]["id"]
    training = [r.batches_trained for r in db.metrics(trial_id, "training")]
    validation = [r.batches_trained for r in db.metrics(trial_id, "validation")]
    # A workload ends every scheduling_unit (100) batches and wherever a validation (every
    # 45) or a checkpoint (every 90) is due, and at the end.
    assert training == [45, 90, 100, 135, 180, 200, 225]
    assert validation == [45, 90, 135, 180, 225]
    checkpoints = home.json("checkpoints", facts["id"], "--all")
    assert [c["batches_trained"] for c in checkpoints] == [90, 180, 225]
    # A trial class runs under Keras 2, as under Determined (localdet/config/keras_choice.py).
    assert all(c["size_bytes"] > 0 and c["metadata"]["keras_line"] == "keras2"
               for c in checkpoints)
    assert home.experiment(facts["id"])["trials"][0]["latest_checkpoint"] == checkpoints[-1]["uuid"]
    # Retention (save_trial_best 1, save_trial_latest 1) kept the latest and the best only.
    accuracy = {r.batches_trained: r.metrics["val_accuracy"]
                for r in db.metrics(trial_id, "validation")}
    best = max((90, 180, 225), key=lambda batches: accuracy[batches])
    kept = [c["batches_trained"] for c in home.json("checkpoints", facts["id"])]
    assert kept == sorted({best, 225})
    assert {c["batches_trained"]: c["state"] for c in checkpoints if c["state"] == "DELETED"} \
        == {b: "DELETED" for b in (90, 180, 225) if b not in kept}


def test_exported_checkpoint_loads_and_predicts_like_the_final_model(state, tmp_path):
    from determined.keras import load_model_from_checkpoint_path

    home, _, facts, root = state
    last = home.json("checkpoints", facts["id"])[-1]
    home.cli("checkpoint", "export", last["uuid"][:8], tmp_path / "best")
    exported = tmp_path / "best"
    assert {p.name for p in exported.iterdir()} >= {
        "determined-keras-model.h5", "code", "config.yaml", "hparams.json", "metadata.json"}
    assert (exported / "code" / "model_def.py").is_file()
    assert yaml.safe_load((exported / "config.yaml").read_text())["name"] == "digits-const"

    model = load_model_from_checkpoint_path(str(exported))
    import sys
    sys.path.insert(0, str(EXAMPLE))
    from model_def import load_data
    _, x_val, _, _ = load_data()
    np.testing.assert_allclose(model.predict(x_val, verbose=0), np.load(root / "final.npy"),
                               rtol=1e-6, atol=1e-6)


def test_identical_blobs_are_stored_once(state):
    from localdet.checkpoints.manifest import files_of
    from localdet.records.db import StateDB

    home, _, facts, _ = state
    objects = [p for p in (home.path / "store" / "objects").rglob("*") if p.is_file()]
    # Three checkpoints share the model code, config and hyperparameters (and the .h5's
    # unchanged chunks): stored once each.
    names = {p.read_bytes() for p in objects}
    assert len(names) == len(objects)
    with StateDB.open(home.path / "localdet.db") as db:
        named = [sha for c in db.checkpoints(facts["id"], include_deleted=True)
                 for entry in files_of(c.manifest).values() for sha, _ in entry.blobs]
    assert len(objects) < len(named)


def test_corrupted_blob_is_refused_on_export(state, tmp_path):
    from localdet.records.db import StateDB

    home, _, facts, _ = state
    first = home.json("checkpoints", facts["id"])[0]
    manifest = StateDB.open(home.path / "localdet.db").checkpoint(first["uuid"]).manifest
    entry = manifest["files"]["determined-keras-model.h5"]
    sha = entry["chunks"][-1][0] if "chunks" in entry else entry["sha256"]  # its last blob
    blob = home.path / "store" / "objects" / sha[:2] / sha
    original = blob.read_bytes()
    blob.chmod(0o644)
    try:
        blob.write_bytes(original[:-1] + bytes([original[-1] ^ 0xFF]))
        result = home.cli("checkpoint", "export", first["uuid"], tmp_path / "out", check=False)
        assert result.returncode == 1
        assert "determined-keras-model.h5" in result.stderr and "corrupt" in result.stderr
        assert "Traceback" not in result.stderr
        assert not (tmp_path / "out" / "determined-keras-model.h5").exists()
    finally:
        blob.write_bytes(original)


def test_bad_config_is_rejected_and_a_good_one_after_it_still_runs(state, tmp_path):
    home, daemon, _, _ = state
    bad = tmp_path / "bad"
    write_config(bad, "bad-one", serarcher={"name": "single"})
    (bad / "model_def.py").write_text((EXAMPLE / "model_def.py").read_text())
    shutil.copytree(bad, home.path / "queue" / "bad")
    error_file = home.path / "queue" / "rejected" / "bad" / "error.txt"
    wait_for(error_file.exists, 120, "the bad submission to be rejected")
    message = error_file.read_text()
    assert "serarcher" in message and "did you mean 'searcher'" in message

    good = write_config(tmp_path / "good", "good-one")
    home.cli("submit", good, EXAMPLE)
    facts = home.wait_until_ended(home.experiment_named("good-one")["id"])
    assert facts["state"] == "COMPLETED"
    assert facts["trials"][0]["batches_trained"] == 20
    assert daemon.process.poll() is None


def test_trial_that_breaks_the_api_ends_in_error_with_one_clear_sentence(state, tmp_path):
    home, daemon, _, _ = state
    model_dir = tmp_path / "model"
    shutil.copytree(EXAMPLE, model_dir)
    shutil.copy(TEST_TRIALS / "uncompiled_trial.py", model_dir)
    config = write_config(tmp_path, "uncompiled", entrypoint="uncompiled_trial:UncompiledTrial")
    home.cli("submit", config, model_dir)
    facts = home.wait_until_ended(home.experiment_named("uncompiled")["id"])
    assert facts["state"] == "ERROR"
    assert "needs a compiled model" in facts["trials"][0]["error"]
    status = home.cli("status", facts["id"]).stdout
    assert "needs a compiled model" in status
    assert daemon.process.poll() is None


def test_example_runs_under_keras_2(state):
    home, _, _, _ = state
    home.cli("submit", EXAMPLE.parent / "digits_keras2.yaml", EXAMPLE)
    facts = home.wait_until_ended(home.experiment_named("digits-keras2")["id"])
    assert facts["state"] == "COMPLETED", home.ended_report(facts["id"])
    assert facts["trials"][0]["best_validation"]["val_accuracy"] > 0.8
    checkpoints = home.json("checkpoints", facts["id"])
    assert checkpoints[-1]["metadata"]["keras_line"] == "keras2"


def test_a_second_daemon_on_the_same_home_refuses_to_start(state, daemons):
    home, daemon, _, _ = state
    second = daemons(home)
    assert second.process.wait(timeout=30) == 1
    log = second.log_path.read_text()
    assert f"another localdet daemon (pid {daemon.process.pid})" in log
    assert daemon.process.poll() is None


def test_a_determined_keras2_trial_folder_runs_unchanged(state):
    """Our Determined-style iris example: legacy RMSprop(lr=, decay=), launcher-form
    entrypoint, no Keras line named in its config: localdet sees the Keras 2 code and runs
    it there."""
    home, _, _, _ = state
    iris = EXAMPLE.parent / "iris_keras2"
    submitted = home.cli("submit", iris / "const.yaml", iris)
    assert "environment.image" in submitted.stderr
    facts = home.wait_until_ended(home.experiment_named("iris_const")["id"])
    assert facts["state"] == "COMPLETED", home.ended_report(facts["id"])
    assert facts["trials"][0]["batches_trained"] == 500
    assert "val_categorical_accuracy" in facts["trials"][0]["latest_validation"]
    assert home.json("checkpoints", facts["id"])[-1]["metadata"]["keras_line"] == "keras2"
    from localdet.records.db import StateDB
    launches = [e["payload"] for e in StateDB.open(home.path / "localdet.db").events(facts["id"])
                if e["kind"] == "trial_launched"]
    assert "optimizers.legacy" in launches[0]["keras_line_reason"]
