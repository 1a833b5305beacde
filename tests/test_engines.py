"""Which engine trains a trial on its slots, and the configs refused because none can."""

from __future__ import annotations

import pytest

from localdet import engines
from localdet.config import parse_config
from localdet.submissions import SubmissionError, read_submission


def config(slots: int, **environment) -> dict:
    return parse_config({
        "entrypoint": "model_def:Trial", "hyperparameters": {"global_batch_size": 32},
        "searcher": {"name": "single", "metric": "loss", "max_length": 10},
        "resources": {"slots_per_trial": slots},
        "environment": {"environment_variables": [f"{k}={v}" for k, v in environment.items()]},
    }).config


def model_dir(tmp_path, source: str = "import tensorflow as tf\n"):
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    (folder / "model_def.py").write_text(source)
    return folder


def test_one_slot_is_single_and_several_under_keras_3_are_mirrored(tmp_path):
    assert engines.choose(config(1), model_dir(tmp_path))[0] == engines.SINGLE
    engine, why = engines.choose(config(2), model_dir(tmp_path))
    assert engine == engines.MIRRORED and "MirroredStrategy" in why


@pytest.mark.parametrize("keras2", [
    {"environment": {"TF_USE_LEGACY_KERAS": "1"}, "source": "import tensorflow as tf\n",
     "reason": "TF_USE_LEGACY_KERAS"},
    {"environment": {}, "source": "opt = tf.keras.optimizers.legacy.Adam()\n",
     "reason": "model_def.py uses optimizers.legacy"},
])
def test_several_slots_under_keras_2_are_refused_with_the_reason(tmp_path, keras2):
    folder = model_dir(tmp_path, keras2["source"])
    with pytest.raises(engines.EngineError) as error:
        engines.choose(config(2, **keras2["environment"]), folder)
    message = str(error.value)
    assert message.startswith("resources.slots_per_trial is 2 but the trial runs under Keras 2")
    assert keras2["reason"] in message and "use slots_per_trial: 1, or Keras 3" in message
    assert engines.choose(config(1, **keras2["environment"]), folder)[0] == engines.SINGLE


def test_submit_refuses_a_config_no_engine_can_run(tmp_path):
    path = tmp_path / "wide.yaml"
    path.write_text("entrypoint: model_def:Trial\nhyperparameters: {global_batch_size: 32}\n"
                    "searcher: {name: single, metric: loss, max_length: 10}\n"
                    "resources: {slots_per_trial: 2}\n"
                    "environment: {environment_variables: [TF_USE_LEGACY_KERAS=1]}\n")
    with pytest.raises(SubmissionError, match="runs under Keras 2"):
        read_submission(path, model_dir(tmp_path))
    # A job's slots are only reserved for it: no engine is involved.
    job = tmp_path / "job.yaml"
    job.write_text("entrypoint: python3 infer.py\nresources: {slots: 2}\n"
                   "environment: {environment_variables: [TF_USE_LEGACY_KERAS=1]}\n")
    read_submission(job, model_dir(tmp_path), kind="job")
