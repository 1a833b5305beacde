"""Which engine trains a trial on its slots, and the configs refused because none can."""

from __future__ import annotations

import pytest

from localdet.config import engines, keras_choice
from localdet.config.experiment import parse_config
from localdet.daemon.submissions import SubmissionError, read_submission


def config(slots: int, **environment) -> dict:
    return parse_config({
        "entrypoint": "model_def:Trial", "hyperparameters": {"global_batch_size": 32},
        "searcher": {"name": "single", "metric": "loss", "max_length": 10},
        "resources": {"slots_per_trial": slots},
        "environment": {"environment_variables": [f"{k}={v}" for k, v in environment.items()]},
    }).config


# The Keras line said in the config, whatever rule would pick for the folder's code.
KERAS3 = {"TF_USE_LEGACY_KERAS": "0"}


def model_dir(tmp_path, source: str = "import tensorflow as tf\n"):
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    (folder / "model_def.py").write_text(source)
    return folder


def test_one_slot_is_single_and_several_under_keras_3_are_mirrored(tmp_path):
    assert engines.choose(config(1), model_dir(tmp_path))[0] == engines.SINGLE
    engine, why = engines.choose(config(2, **KERAS3), model_dir(tmp_path))
    assert engine == engines.MIRRORED and "MirroredStrategy" in why


def config_with(slots: int, engine: str, **environment) -> dict:
    base = config(slots, **environment)
    base["resources"]["engine"] = engine
    return base


@pytest.mark.parametrize("keras2", [
    {"environment": {"TF_USE_LEGACY_KERAS": "1"}, "source": "import tensorflow as tf\n",
     "reason": "TF_USE_LEGACY_KERAS"},
    {"environment": {},
     "source": "import tensorflow as tf\nopt = tf.keras.optimizers.legacy.Adam()\n",
     "reason": "model_def.py:2"},
])
def test_several_slots_under_keras_2_run_one_process_per_slot(tmp_path, keras2, monkeypatch):
    folder = model_dir(tmp_path, keras2["source"])
    settings = config(2, **keras2["environment"])
    line, line_why = keras_choice.choose(folder, keras2["environment"], settings)
    assert line == "keras2" and keras2["reason"] in line_why
    monkeypatch.setattr(engines, "horovod_installed", lambda: False)
    # Horovod's semantics without Horovod: no tf.distribute strategy, averaged gradients.
    engine, why = engines.choose(config(2, **keras2["environment"]), folder)
    assert engine == engines.GRADIENT_ALLREDUCE
    assert why == ("2 slots under Keras 2: one process per slot, gradients averaged across "
                   "them as under Horovod")
    assert engines.processes(engine, 2) == 2
    monkeypatch.setattr(engines, "horovod_installed", lambda: True)
    assert engines.choose(config(2, **keras2["environment"]), folder)[0] == engines.HOROVOD
    assert engines.choose(config(1, **keras2["environment"]), folder)[0] == engines.SINGLE
    # A forced engine that cannot run this Keras is refused, naming why it runs under it.
    with pytest.raises(engines.EngineRefusal) as error:
        engines.choose(config_with(2, "mirrored", **keras2["environment"]), folder)
    assert str(error.value).startswith("resources.engine mirrored cannot train this trial")
    rule, source = keras_choice.rule_of(line_why)  # the rule and what decided, in one line
    assert f"by rule {rule}, decided by {source})" in str(error.value)
    assert "\n" not in str(error.value) and len(str(error.value)) <= 300


def test_the_config_can_force_an_engine_and_one_that_cannot_run_is_refused(
        tmp_path, monkeypatch):
    folder = model_dir(tmp_path)
    monkeypatch.setattr(engines, "horovod_installed", lambda: False)
    keras2 = {"TF_USE_LEGACY_KERAS": "1"}
    for forced in ("multi_worker_mirrored", "gradient_allreduce"):  # asked for by name
        assert engines.choose(config_with(2, forced, **keras2), folder)[0] == forced
    with pytest.raises(engines.EngineRefusal, match="gradient_allreduce runs Keras 2 only"):
        engines.choose(config_with(2, "gradient_allreduce", **KERAS3), folder)
    with pytest.raises(engines.EngineRefusal, match="horovod.tensorflow is not installed here"):
        engines.choose(config_with(2, "horovod", **keras2), folder)
    with pytest.raises(engines.EngineRefusal, match="Horovod does not support Keras 3"):
        engines.choose(config_with(2, "horovod", **KERAS3), folder)
    with pytest.raises(engines.EngineRefusal, match="Keras 3 fails under MultiWorker"):
        engines.choose(config_with(2, "multi_worker_mirrored", **KERAS3), folder)
    assert engines.processes(engines.MIRRORED, 4) == 1
    with pytest.raises(ValueError, match="engine"):  # the schema knows the names
        parse_config({"entrypoint": "model_def:Trial", "hyperparameters": {},
                      "searcher": {"name": "single", "metric": "loss", "max_length": 10},
                      "resources": {"slots_per_trial": 2, "engine": "ray"}})


def test_submit_refuses_a_config_no_engine_can_run(tmp_path):
    path = tmp_path / "wide.yaml"
    path.write_text("entrypoint: model_def:Trial\nhyperparameters: {global_batch_size: 32}\n"
                    "searcher: {name: single, metric: loss, max_length: 10}\n"
                    "resources: {slots_per_trial: 2, engine: horovod}\n"
                    "environment: {environment_variables: [TF_USE_LEGACY_KERAS=0]}\n")
    with pytest.raises(SubmissionError, match="Horovod does not support Keras 3"):
        read_submission(path, model_dir(tmp_path))
    # A job's slots are only reserved for it: no engine is involved.
    job = tmp_path / "job.yaml"
    job.write_text("entrypoint: python3 infer.py\nresources: {slots: 2}\n"
                   "environment: {environment_variables: [TF_USE_LEGACY_KERAS=1]}\n")
    read_submission(job, model_dir(tmp_path), kind="job")


def test_on_a_cluster_only_multi_worker_mirrored_trials_may_be_bigger_than_a_node(tmp_path):
    from localdet.daemon.submissions import check_engine

    folder = model_dir(tmp_path)
    with pytest.raises(SubmissionError) as error:  # Keras 3: one process, one node
        check_engine(config(2, **KERAS3), "experiment", folder, node_slots=1)
    assert str(error.value).startswith(
        "resources.slots_per_trial is 2 but no node of the Ray cluster has more than 1 "
        "slot(s), and engine mirrored keeps a trial within one node")
    check_engine(config(2, **KERAS3), "experiment", folder, node_slots=2)
    check_engine(config_with(2, "multi_worker_mirrored", TF_USE_LEGACY_KERAS="1"),
                 "experiment", folder, node_slots=1)
    assert engines.spans_nodes(engines.MULTI_WORKER_MIRRORED)
    assert engines.spans_nodes(engines.HOROVOD)
    assert engines.spans_nodes(engines.GRADIENT_ALLREDUCE)
    assert not any(engines.spans_nodes(e) for e in (engines.SINGLE, engines.MIRRORED))
