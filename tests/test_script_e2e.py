"""The New Keras API under the daemon: the proposal's training script (digits) as a
`entrypoint_script` experiment, paused and resumed exactly, then a batch-inference job that
loads its checkpoint."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import yaml
from conftest import wait_for
from test_multi_slot_e2e import pause_soon_after
from test_pause_resume_e2e import assert_ended_alike, trial_of

pytestmark = pytest.mark.slow

# Long enough that the pause, asked the moment 20 batches are recorded, lands well before
# the end even when a warm process trains the script at once.
LENGTH = 240
EXAMPLE = (__import__("pathlib").Path(__file__).resolve().parent.parent
           / "examples" / "digits_script")


def script_config(folder, name, **overrides):
    config = yaml.safe_load((EXAMPLE / "const.yaml").read_text())
    config.update(name=name, scheduling_unit=5, max_restarts=0,
                  searcher={"name": "single", "metric": "val_accuracy",
                            "smaller_is_better": False, "max_length": {"batches": LENGTH}},
                  reproducibility={"experiment_seed": 11},
                  environment={"environment_variables": ["TF_DETERMINISTIC_OPS=1"]})
    config.update(overrides)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_script_paused_and_resumed_ends_like_an_uninterrupted_run_and_a_job_predicts(
        home, tmp_path, daemons):
    daemon = daemons(home)
    home.cli("submit", script_config(tmp_path, "straight"), EXAMPLE)
    home.cli("submit", script_config(tmp_path, "paused"), EXAMPLE)
    straight_id = home.experiment_named("straight")["id"]
    paused_id = home.experiment_named("paused")["id"]
    assert home.wait_until_ended(straight_id)["state"] == "COMPLETED"
    pause_soon_after(home, paused_id, 20)
    wait_for(lambda: home.first_trial(paused_id)["state"] == "PAUSED", 300, "the pause", 0.1)
    stopped_at = trial_of(home, paused_id)["batches_trained"]
    assert 20 <= stopped_at < LENGTH
    home.cli("resume", paused_id)
    facts = home.wait_until_ended(paused_id)
    assert facts["state"] == "COMPLETED"
    assert facts["trials"][0]["batches_trained"] == LENGTH
    # Both launches (before and after the pause) recorded when their first batch ended.
    launches = facts["trials"][0]["launches"]
    assert len(launches) == 2 and all(launch["first_batch_seconds"] > 0
                                      for launch in launches)
    log = (home.path / "experiments" / str(paused_id) / "trials"
           / str(facts["trials"][0]["id"]) / "trial.log").read_text()
    assert "restored checkpoint" in log and "Test accuracy:" in log

    # The batch-inference job loads the straight run's latest checkpoint.
    straight_trial = trial_of(home, straight_id)["id"]
    output = tmp_path / "predictions.npy"
    job_config = tmp_path / "inference.yaml"
    job_config.write_text(yaml.safe_dump({
        "name": "digits-inference", "entrypoint_script": "python3 batch_inference.py",
        "data": {"trial_id": straight_trial, "batch_size": 64, "output": str(output)},
        "resources": {"slots": 1}}))
    result = home.cli("job", "run", job_config, EXAMPLE)
    assert "accuracy" in result.stdout
    daemon.stop()

    assert_ended_alike(home, paused_id, straight_id, tmp_path)

    from sklearn.datasets import load_digits

    from determined.keras import load_model_from_checkpoint_path

    exported = tmp_path / "straight-latest"
    home.cli("checkpoint", "export", trial_of(home, straight_id)["latest_checkpoint"], exported)
    model = load_model_from_checkpoint_path(str(exported))
    images = np.kron(load_digits().images, np.ones((4, 4)))[:, 2:30, 2:30] * 16.0
    data = np.expand_dims(images[1500:].astype("float32") / 255, -1)
    np.testing.assert_allclose(np.load(output), model.predict(data, batch_size=64, verbose=0),
                               rtol=1e-6, atol=1e-6)
    jobs = [e for e in home.json("status") if e.get("kind") == "job"]
    assert [(j["name"], j["state"]) for j in jobs] == [("digits-inference", "COMPLETED")]
    shutil.rmtree(exported)
