"""An unchanged Keras script (it never imports `determined`) under the daemon: two fit
phases trained as one trial, paused after its first epoch, resumed, ending with the weights
of an uninterrupted run; metrics and checkpoints recorded, the checkpoint loaded downstream."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import yaml
from conftest import wait_for
from test_multi_slot_e2e import pause_soon_after
from test_pause_resume_e2e import assert_ended_alike, trial_of

pytestmark = pytest.mark.slow

# 192 records in batches of 16: 12 batches an epoch; 2 epochs, then 2 more fine-tuning.
TRAIN_PY = textwrap.dedent('''\
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(7)
    x = rng.normal(size=(224, 8)).astype("float32")
    y = (x[:, 0] - x[:, 3] > 0).astype("int64")
    x_train, y_train, x_val, y_val = x[:192], y[:192], x[192:], y[192:]

    base = tf.keras.layers.Dense(16, activation="relu", name="base")
    model = tf.keras.Sequential([tf.keras.Input(shape=(8,)), base,
                                 tf.keras.layers.Dropout(0.2),
                                 tf.keras.layers.Dense(2, activation="softmax", name="head")])
    model.compile(optimizer=tf.keras.optimizers.Adam(0.01),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x_train, y_train, batch_size=16, epochs=2, validation_data=(x_val, y_val))
    base.trainable = False
    model.compile(optimizer=tf.keras.optimizers.Adam(0.001),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    history = model.fit(x_train, y_train, batch_size=16, epochs=2,
                        validation_data=(x_val, y_val))
    print("fine-tuned val_accuracy:", history.history["val_accuracy"][-1])
    ''')
TOTAL = 48


def experiment(folder, name):
    model_dir = folder / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "train.py").write_text(TRAIN_PY)
    config = {"name": name, "entrypoint_script": "train.py", "scheduling_unit": 4,
              "max_restarts": 0, "reproducibility": {"experiment_seed": 5},
              "searcher": {"name": "single", "metric": "val_accuracy",
                           "smaller_is_better": False},
              "environment": {"environment_variables": ["TF_DETERMINISTIC_OPS=1"]}}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, model_dir


def test_an_unchanged_script_paused_and_resumed_across_phases(home, tmp_path, daemons):
    daemon = daemons(home)
    home.cli("submit", *experiment(tmp_path / "a", "straight"))
    home.cli("submit", *experiment(tmp_path / "b", "paused"))
    straight_id = home.experiment_named("straight")["id"]
    paused_id = home.experiment_named("paused")["id"]
    pause_soon_after(home, paused_id, 12)  # the first epoch of the first phase
    wait_for(lambda: home.first_trial(paused_id)["state"] == "PAUSED", 300, "the pause", 0.1)
    assert 12 <= trial_of(home, paused_id)["batches_trained"] < TOTAL
    assert home.wait_until_ended(straight_id)["state"] == "COMPLETED"
    home.cli("resume", paused_id)
    facts = home.wait_until_ended(paused_id)
    assert facts["state"] == "COMPLETED"
    assert facts["trials"][0]["batches_trained"] == TOTAL
    trial_id = facts["trials"][0]["id"]
    log = (home.path / "experiments" / str(paused_id) / "trials" / str(trial_id)
           / "trial.log").read_text()
    assert "restored checkpoint" in log and "fine-tuned val_accuracy:" in log
    assert "trains the script's epochs=2" in log
    daemon.stop()

    assert_ended_alike(home, paused_id, straight_id, tmp_path)
    # Both phases recorded, counted on: validations at each epoch's end.
    validation = home.rows("SELECT batches_trained FROM metrics WHERE trial_id = ? AND "
                           "kind = 'validation' ORDER BY batches_trained", trial_id)
    assert [row[0] for row in validation] == [12, 24, 36, 48]
    checkpoints = home.json("checkpoints", paused_id)
    assert checkpoints[-1]["batches_trained"] == TOTAL

    from determined.keras import load_model_from_checkpoint_path

    export = tmp_path / "export"
    home.cli("checkpoint", "export", checkpoints[-1]["uuid"], export)
    model = load_model_from_checkpoint_path(str(export))
    assert model.predict(np.zeros((2, 8), "float32"), verbose=0).shape == (2, 2)
    assert not model.get_layer("base").trainable  # the fine-tuning phase's model
