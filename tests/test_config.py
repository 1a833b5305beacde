"""Tests for localdet.config.experiment: Determined experiment configs -> canonical, validated
form."""

from __future__ import annotations

import copy
import json
import textwrap

import jsonschema
import pytest
import yaml

from localdet.config.experiment import (
    ConfigError,
    global_batch_size,
    length_to_batches,
    load_config_file,
    load_config_text,
    load_job_config_file,
    load_job_config_text,
    parse_config,
    parse_job_config,
    schema_path,
)

# Modelled on Determined's examples/computer_vision/mnist_tf_keras/const.yaml, plus keys that
# mean nothing on one machine (image, resource_pool, bind_mounts).
MNIST_CONST = textwrap.dedent(
    """\
    name: mnist_tf_keras_const
    description: MNIST with tf.keras
    hyperparameters:
      global_batch_size: 32
      dense1:
        type: int
        minval: 32
        maxval: 256
      dropout:
        type: double
        minval: 0.2
        maxval: 0.5
      lr:
        type: log
        minval: -4.0
        maxval: -2.0
      activation:
        type: categorical
        vals: [relu, tanh]
      optimizer: adam
    records_per_epoch: 60000
    searcher:
      name: single
      metric: val_accuracy
      smaller_is_better: false
      max_length:
        epochs: 5
    min_validation_period:
      epochs: 1
    entrypoint: model_def:MNistTrial
    environment:
      image: determinedai/environments:cuda-11.3-tf-2.8-gpu-0.19.4
      environment_variables:
        - TF_CPP_MIN_LOG_LEVEL=2
        - EXTRA=a=b
    resources:
      resource_pool: gpu-pool
      slots_per_trial: 1
    bind_mounts:
      - host_path: /data
        container_path: /data
    """
)

MINIMAL = {
    "entrypoint": "model_def:Trial",
    "hyperparameters": {"global_batch_size": 64},
    "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 100}},
}


def minimal(**overrides):
    cfg = copy.deepcopy(MINIMAL)
    cfg.update(overrides)
    return cfg


def with_searcher(**fields):
    return minimal(searcher={**MINIMAL["searcher"], **fields})


# --- the full example -------------------------------------------------------------------------


def test_mnist_const_canonical_values():
    parsed = load_config_text(MNIST_CONST)
    cfg = parsed.config
    assert cfg["name"] == "mnist_tf_keras_const"
    assert cfg["entrypoint_kind"] == "trial_class"
    assert cfg["trial_class"] == "model_def:MNistTrial"
    assert cfg["script_command"] is None
    hps = cfg["hyperparameters"]
    assert hps["global_batch_size"] == {"type": "const", "val": 32}
    assert hps["dense1"] == {"type": "int", "minval": 32, "maxval": 256}
    assert hps["dropout"] == {"type": "double", "minval": 0.2, "maxval": 0.5}
    assert hps["lr"] == {"type": "log", "minval": -4.0, "maxval": -2.0, "base": 10}
    assert hps["activation"] == {"type": "categorical", "vals": ["relu", "tanh"]}
    assert hps["optimizer"] == {"type": "const", "val": "adam"}
    assert cfg["searcher"] == {
        "name": "single",
        "metric": "val_accuracy",
        "smaller_is_better": False,
        "max_length": {"epochs": 5},
        "max_concurrent_trials": 16,
    }
    assert cfg["records_per_epoch"] == 60000
    assert cfg["min_validation_period"] == {"epochs": 1}
    assert cfg["min_checkpoint_period"] == {"batches": 0}
    # "=" inside the value must survive: split on the first "=" only.
    assert cfg["environment"] == {"environment_variables": {"TF_CPP_MIN_LOG_LEVEL": "2",
                                                            "EXTRA": "a=b"},
                                  # kept for the TensorFlow release it names
                                  "image": "determinedai/environments:cuda-11.3-tf-2.8-gpu-0.19.4",
                                  "startup_hook": "warn"}
    assert cfg["resources"] == {"slots_per_trial": 1, "priority": None, "max_slots": None,
                                "engine": "auto", "max_memory": None}
    assert "bind_mounts" not in cfg
    assert length_to_batches(cfg["searcher"]["max_length"], cfg, "searcher.max_length") == 9375


def test_mnist_const_warnings():
    warnings = load_config_text(MNIST_CONST).warnings
    assert len(warnings) == 3, warnings
    assert any("'environment.image'" in w for w in warnings)
    assert any("'resources.resource_pool'" in w for w in warnings)
    assert any("'bind_mounts'" in w for w in warnings)
    assert all(w.startswith("ignoring ") for w in warnings)


def test_load_config_file(tmp_path):
    path = tmp_path / "const.yaml"
    path.write_text(MNIST_CONST)
    assert load_config_file(path).config["trial_class"] == "model_def:MNistTrial"
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config_file(tmp_path / "missing.yaml")


# --- defaults -----------------------------------------------------------------------------------


def test_defaults_filled_on_minimal_config():
    cfg = parse_config(minimal()).config
    assert cfg["name"] == "experiment"
    assert cfg["description"] == ""
    assert cfg["data"] == {}
    assert cfg["records_per_epoch"] == 0
    assert cfg["scheduling_unit"] == 100
    assert cfg["perform_initial_validation"] is False
    assert cfg["checkpoint_policy"] == "best"
    assert cfg["max_restarts"] == 5
    assert cfg["checkpoint_storage"] == {"save_experiment_best": 0, "save_trial_best": 1,
                                         "save_trial_latest": 1}
    assert cfg["resources"]["slots_per_trial"] == 1
    assert cfg["reproducibility"] == {"experiment_seed": None}
    assert cfg["environment"] == {"environment_variables": {}, "startup_hook": "warn"}
    assert cfg["searcher"]["smaller_is_better"] is True


def test_given_values_are_not_overwritten_by_defaults():
    cfg = parse_config(minimal(
        max_restarts=0,
        checkpoint_storage={"save_trial_best": 3},
        reproducibility={"experiment_seed": 42},
        resources={"slots_per_trial": 2, "priority": 10},
    )).config
    assert cfg["max_restarts"] == 0
    assert cfg["checkpoint_storage"] == {"save_experiment_best": 0, "save_trial_best": 3,
                                         "save_trial_latest": 1}
    assert cfg["reproducibility"]["experiment_seed"] == 42
    assert cfg["resources"] == {"slots_per_trial": 2, "priority": 10, "max_slots": None,
                                "engine": "auto", "max_memory": None}


def test_parse_config_does_not_mutate_input():
    raw = minimal(environment={"environment_variables": ["A=1"], "image": "x"})
    before = copy.deepcopy(raw)
    parse_config(raw)
    assert raw == before


def test_bare_int_lengths_mean_batches():
    cfg = parse_config(minimal(
        searcher={"name": "single", "metric": "loss", "max_length": 500}, min_checkpoint_period=50
    )).config
    assert cfg["searcher"]["max_length"] == {"batches": 500}
    assert cfg["min_checkpoint_period"] == {"batches": 50}


def test_checkpoint_storage_container_keys_give_one_warning():
    # type, host_path, bucket...: where checkpoints go (tests/test_storage.py); the keys
    # about containers mean nothing here and are dropped with one warning.
    parsed = parse_config(minimal(checkpoint_storage={
        "type": "shared_fs", "host_path": "/mnt/shared", "container_path": "/determined",
        "propagation": "rprivate", "save_trial_latest": 2,
    }))
    storage_warnings = [w for w in parsed.warnings if "checkpoint_storage" in w]
    assert len(storage_warnings) == 1
    assert "'checkpoint_storage.container_path'" in storage_warnings[0]
    assert parsed.config["checkpoint_storage"] == {
        "type": "shared_fs", "host_path": "/mnt/shared",
        "save_experiment_best": 0, "save_trial_best": 1, "save_trial_latest": 2,
    }


def test_silently_kept_keys_and_other_searcher_fields():
    parsed = parse_config(minimal(labels=["a", "b"], debug=True, workspace="w", project="p")
                          | {"searcher": {**MINIMAL["searcher"], "max_concurrent_trials": 4,
                                         "max_trials": 1}})
    assert parsed.config["labels"] == ["a", "b"]
    assert parsed.config["debug"] is True
    assert parsed.config["searcher"]["max_concurrent_trials"] == 4
    assert parsed.warnings == ["ignoring 'workspace', 'project': it means nothing on one machine"]


# --- hyperparameters ---------------------------------------------------------------------------


def test_nested_hyperparameters_and_bare_values_normalised():
    cfg = parse_config(minimal(hyperparameters={
        "global_batch_size": 16,
        "layers": [64, 32],
        "flag": True,
        "nothing": None,
        "optimizer": {
            "name": "adam",
            "lr": {"type": "log", "minval": -5, "maxval": -1, "base": 2, "count": 3},
            "inner": {"momentum": {"type": "const", "val": 0.9}},
        },
    })).config
    hps = cfg["hyperparameters"]
    assert hps["layers"] == {"type": "const", "val": [64, 32]}
    assert hps["flag"] == {"type": "const", "val": True}
    assert hps["nothing"] == {"type": "const", "val": None}
    assert hps["optimizer"]["name"] == {"type": "const", "val": "adam"}
    assert hps["optimizer"]["lr"] == {"type": "log", "minval": -5, "maxval": -1, "base": 2,
                                      "count": 3}
    assert hps["optimizer"]["inner"]["momentum"] == {"type": "const", "val": 0.9}


def test_equal_bounds_are_allowed():
    cfg = parse_config(minimal(hyperparameters={
        "global_batch_size": 8, "d": {"type": "int", "minval": 4, "maxval": 4}})).config
    assert cfg["hyperparameters"]["d"]["minval"] == 4


# --- errors name the key path -------------------------------------------------------------------

ERROR_CASES = [
    # (description, config, expected .path, substrings the message must contain)
    ("wrong type", minimal(resources={"slots_per_trial": "two"}), "resources.slots_per_trial",
     ["resources.slots_per_trial: expected an integer, got 'two'"]),
    ("float where int", minimal(max_restarts=2.0), "max_restarts",
     ["max_restarts: expected an integer"]),
    ("bool where int", minimal(scheduling_unit=True), "scheduling_unit",
     ["expected an integer, got True"]),
    ("hp number", minimal(hyperparameters={"lr": {"type": "double", "minval": "abc", "maxval": 1}}),
     "hyperparameters.lr.minval", ["hyperparameters.lr.minval: expected a number, got 'abc'"]),
    ("int hp bound not int",
     minimal(hyperparameters={"n": {"type": "int", "minval": 1.5, "maxval": 4}}),
     "hyperparameters.n.minval", ["hyperparameters.n.minval: expected an integer"]),
    ("missing entrypoint", {k: v for k, v in MINIMAL.items() if k != "entrypoint"}, "entrypoint",
     ["missing required key 'entrypoint'"]),
    ("missing searcher", {k: v for k, v in MINIMAL.items() if k != "searcher"}, "searcher",
     ["missing required key 'searcher'"]),
    ("missing metric", minimal(searcher={"name": "single", "max_length": 10}), "searcher.metric",
     ["missing required key 'searcher.metric'"]),
    ("both entrypoints", minimal(entrypoint_script="train.py"), "",
     ["'entrypoint'", "'entrypoint_script'", "only one"]),
    ("unknown top-level key", minimal(serocher={}), "serocher",
     ["unknown key 'serocher' at top level; did you mean 'searcher'?"]),
    ("unknown nested key", with_searcher(max_lenght=5), "searcher.max_lenght",
     ["unknown key 'max_lenght' at searcher; did you mean 'max_length'?"]),
    ("unknown resources key", minimal(resources={"slots_per_trail": 2}),
     "resources.slots_per_trail",
     ["unknown key 'slots_per_trail' at resources; did you mean 'slots_per_trial'?"]),
    ("unknown hp leaf key",
     minimal(hyperparameters={"g": {"n": {"type": "int", "minval": 1, "maxval": 2, "cnt": 2}}}),
     "hyperparameters.g.n.cnt",
     ["unknown key 'cnt' at hyperparameters.g.n; did you mean 'count'?"]),
    ("unknown key, nothing close", minimal(reproducibility={"zzz": 1}), "reproducibility.zzz",
     ["unknown key 'zzz' at reproducibility"]),
    ("bad max_length unit", with_searcher(max_length={"steps": 10}), "searcher.max_length",
     ["searcher.max_length: expected one of 'batches', 'records', 'epochs' (got {'steps': 10})"]),
    ("two max_length units", with_searcher(max_length={"batches": 1, "epochs": 1}),
     "searcher.max_length", ["searcher.max_length", "exactly one"]),
    ("zero max_length", with_searcher(max_length={"epochs": 0}), "searcher.max_length.epochs",
     ["searcher.max_length.epochs: expected a value >= 1, got 0"]),
    ("hp range", minimal(hyperparameters={"dense1": {"type": "int", "minval": 256, "maxval": 32}}),
     "hyperparameters.dense1.minval", ["hyperparameters.dense1.minval", "maxval (32)", "256"]),
    ("nested hp range",
     minimal(hyperparameters={"opt": {"lr": {"type": "log", "minval": -1, "maxval": -3}}}),
     "hyperparameters.opt.lr.minval", ["hyperparameters.opt.lr.minval"]),
    ("empty vals", minimal(hyperparameters={"a": {"type": "categorical", "vals": []}}),
     "hyperparameters.a.vals", ["hyperparameters.a.vals: must not be empty"]),
    ("count < 1",
     minimal(hyperparameters={"a": {"type": "double", "minval": 0, "maxval": 1, "count": 0}}),
     "hyperparameters.a.count", ["hyperparameters.a.count"]),
    ("unknown hp type", minimal(hyperparameters={"a": {"type": "float", "val": 1}}),
     "hyperparameters.a.type", ["hyperparameters.a.type: expected one of 'const'"]),
    ("bad env var", minimal(environment={"environment_variables": ["A=1", "NOVALUE"]}),
     "environment.environment_variables[1]",
     ["environment.environment_variables[1]", "KEY=VALUE", "NOVALUE"]),
    ("bad per-device env var", minimal(environment={"environment_variables": {"cuda": ["X"]}}),
     "environment.environment_variables.cuda[0]", ["environment.environment_variables.cuda[0]"]),
    ("unsupported searcher", with_searcher(name="pbt"), "searcher.name",
     ["searcher.name: 'pbt' is not supported yet; supported: single, grid, random, adaptive_asha, "
      "async_halving"]),
    ("unsupported searcher adaptive_simple", with_searcher(name="adaptive_simple", max_trials=16),
     "searcher.name", ["'adaptive_simple' is not supported yet"]),
    ("unknown searcher", with_searcher(name="gird"), "searcher.name",
     ["searcher.name", "did you mean 'grid'?"]),
    ("bad checkpoint_policy", minimal(checkpoint_policy="sometimes"), "checkpoint_policy",
     ["checkpoint_policy: expected one of 'best', 'all', 'none'"]),
    ("negative seed", minimal(reproducibility={"experiment_seed": -1}),
     "reproducibility.experiment_seed", ["reproducibility.experiment_seed"]),
    ("bad trial class", minimal(entrypoint="model-def:Trial"), "entrypoint",
     ["entrypoint", "module:ClassName"]),
    ("blank entrypoint", minimal(entrypoint="   "), "entrypoint", ["entrypoint"]),
    ("epochs without records_per_epoch", minimal(min_validation_period={"epochs": 1}),
     "min_validation_period", ["min_validation_period", "records_per_epoch"]),
    ("records without global_batch_size",
     minimal(hyperparameters={}, min_checkpoint_period={"records": 10}),
     "hyperparameters.global_batch_size",
     ["hyperparameters.global_batch_size", "min_checkpoint_period"]),
]


@pytest.mark.parametrize(("config", "path", "parts"), [c[1:] for c in ERROR_CASES],
                         ids=[c[0] for c in ERROR_CASES])
def test_errors_name_the_key_path(config, path, parts):
    with pytest.raises(ConfigError) as info:
        parse_config(config)
    assert info.value.path == path
    for part in parts:
        assert part in str(info.value)


@pytest.mark.parametrize(("missing", "typo"),
                         [("searcher", "serocher"), ("entrypoint", "entrypiont")])
def test_unknown_key_preferred_over_missing_key_it_explains(missing, typo):
    raw = {k: v for k, v in MINIMAL.items() if k != missing} | {typo: MINIMAL[missing]}
    with pytest.raises(ConfigError,
                       match=f"unknown key '{typo}' at top level; did you mean '{missing}'"):
        parse_config(raw)


@pytest.mark.parametrize(("text", "fragment"), [
    ("name: x\nsearcher: [1, 2\nentrypoint: a:B\n", "line 3"),
    ("name: x\nsearcher:\n  metric: a\n   name: b\n", "line 4"),
    ("name: a\nname: b\n", "line 2"),  # duplicate keys are errors, not "last one wins"
])
def test_yaml_errors_give_line_numbers(text, fragment):
    with pytest.raises(ConfigError, match="YAML") as info:
        load_config_text(text)
    assert fragment in str(info.value)


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", ""])
def test_non_mapping_top_level(text):
    with pytest.raises(ConfigError) as info:
        load_config_text(text)
    assert info.value.path == ""


def test_yaml_exponent_without_dot_is_a_float():
    text = yaml.safe_dump(minimal()) + "data:\n  lr: 1e-4\n  big: 2E5\n"
    cfg = load_config_text(text).config
    assert cfg["data"] == {"lr": 1e-4, "big": 2e5}
    assert yaml.safe_load("x: 1e-4") == {"x": "1e-4"}  # PyYAML's own loader left untouched


# --- environment variables ---------------------------------------------------------------------


def test_per_device_env_vars_merge_cpu_then_cuda():
    parsed = parse_config(minimal(environment={"environment_variables": {
        "cpu": ["A=cpu", "ONLY_CPU=1"], "cuda": ["A=cuda", "ONLY_CUDA=1"], "rocm": ["R=1"],
    }}))
    assert parsed.config["environment"]["environment_variables"] == {"A": "cuda", "ONLY_CPU": "1",
                                                                     "ONLY_CUDA": "1"}
    assert any("rocm" in w for w in parsed.warnings)


# --- entrypoints -------------------------------------------------------------------------------


@pytest.mark.parametrize(("entrypoint", "kind", "trial_class", "script"), [
    ("model_def:MNistTrial", "trial_class", "model_def:MNistTrial", None),
    ("pkg.sub.model_def:Trial", "trial_class", "pkg.sub.model_def:Trial", None),
    ("python3 -m determined.launch.horovod --autohorovod --trial model_def:Trial",
     "trial_class", "model_def:Trial", None),
    ("python3 -m determined.launch.torch_distributed --trial=pkg.m:T", "trial_class", "pkg.m:T",
     None),
    ("python3 -m determined.launch.horovod --fusion-threshold-mb 1 -- --trial model_def:Trial",
     "trial_class", "model_def:Trial", None),
    ("python3 -m determined.launch.tensorflow -- python3 train.py --epochs 3",
     "script", None, "python3 train.py --epochs 3"),
    ("python3 -m determined.launch.tensorflow -- python3 train.py --trial x",
     "script", None, "python3 train.py --trial x"),
    ("python3 train.py", "script", None, "python3 train.py"),
    (["python3", "train.py", "--name", "a b"], "script", None, "python3 train.py --name 'a b'"),
])
def test_entrypoint_forms(entrypoint, kind, trial_class, script):
    cfg = parse_config(minimal(entrypoint=entrypoint)).config
    assert (cfg["entrypoint_kind"], cfg["trial_class"], cfg["script_command"]) == \
        (kind, trial_class, script)


@pytest.mark.parametrize(("script", "command"), [
    ("train.py", "python3 train.py"), ("python3 train.py --x 1", "python3 train.py --x 1")])
def test_entrypoint_script(script, command):
    raw = {k: v for k, v in MINIMAL.items() if k != "entrypoint"} | {"entrypoint_script": script}
    cfg = parse_config(raw).config
    assert (cfg["entrypoint_kind"], cfg["trial_class"], cfg["script_command"]) == \
        ("script", None, command)
    assert cfg["entrypoint"] is None


@pytest.mark.parametrize("entrypoint", ["python3 -m determined.launch.horovod --trial not_a_class",
                                        "python3 -m determined.launch.horovod --autohorovod",
                                        "python3 'unclosed"])
def test_bad_launcher_entrypoints(entrypoint):
    with pytest.raises(ConfigError) as info:
        parse_config(minimal(entrypoint=entrypoint))
    assert info.value.path == "entrypoint"


# --- lengths -----------------------------------------------------------------------------------

LENGTH_CFG = {"records_per_epoch": 1000,
              "hyperparameters": {"global_batch_size": {"type": "const", "val": 64}}}


@pytest.mark.parametrize(("length", "batches"), [
    ({"batches": 7}, 7),
    (7, 7),
    ({"records": 640}, 10),
    ({"records": 641}, 11),  # partial batch rounds up
    ({"epochs": 1}, 16),  # 1000 / 64 = 15.6
    ({"epochs": 3}, 47),  # 3000 / 64 = 46.9, not 3 * 16
    ({"batches": 0}, 0),
])
def test_length_to_batches(length, batches):
    assert length_to_batches(length, LENGTH_CFG, "searcher.max_length") == batches


def test_length_in_epochs_needs_records_per_epoch():
    with pytest.raises(ConfigError) as info:
        length_to_batches({"epochs": 2}, {**LENGTH_CFG, "records_per_epoch": 0},
                          "searcher.max_length")
    assert info.value.path == "searcher.max_length"
    assert "records_per_epoch" in str(info.value)


def test_length_in_records_needs_const_int_batch_size():
    cfg = {"hyperparameters": {"global_batch_size": {"type": "int", "minval": 16, "maxval": 64}}}
    with pytest.raises(ConfigError, match="hyperparameters.global_batch_size"):
        length_to_batches({"records": 100}, cfg, "min_validation_period")
    # Batches need no batch size.
    assert length_to_batches({"batches": 5}, cfg, "min_validation_period") == 5


def test_length_with_unknown_unit():
    with pytest.raises(ConfigError, match="searcher.max_length: expected one of"):
        length_to_batches({"steps": 3}, LENGTH_CFG, "searcher.max_length")


@pytest.mark.parametrize(("hp", "expected"), [(32, 32), ({"type": "const", "val": 8}, 8)])
def test_global_batch_size(hp, expected):
    assert global_batch_size({"hyperparameters": {"global_batch_size": hp}}) == expected


@pytest.mark.parametrize("hp", [0, "32", 32.0, {"type": "categorical", "vals": [16, 32]}])
def test_global_batch_size_rejects(hp):
    with pytest.raises(ConfigError) as info:
        global_batch_size({"hyperparameters": {"global_batch_size": hp}})
    assert info.value.path == "hyperparameters.global_batch_size"


def test_global_batch_size_missing():
    with pytest.raises(ConfigError, match="global_batch_size"):
        global_batch_size({"hyperparameters": {}})


# --- the schema itself -------------------------------------------------------------------------


def test_schema_is_valid_draft_2020_12():
    schema = json.loads(schema_path().read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$schema"].endswith("2020-12/schema")


# --- scripts: searcher and max_length optional --------------------------------------------------

SCRIPT = {"entrypoint_script": "python3 train.py"}


def test_a_script_needs_no_searcher():
    parsed = parse_config(SCRIPT)
    cfg = parsed.config
    assert (cfg["entrypoint_kind"], cfg["script_command"]) == ("script", "python3 train.py")
    assert cfg["searcher"] == {"name": "single", "metric": "val_loss", "smaller_is_better": True,
                               "max_length": None, "max_concurrent_trials": 16}
    assert parsed.warnings == []


@pytest.mark.parametrize("entrypoint", [{"entrypoint": "python3 train.py --epochs 3"},
                                        {"entrypoint": ["python3", "train.py"]},
                                        {"entrypoint_script": "train.py"}])
def test_a_script_may_leave_out_max_length(entrypoint):
    cfg = parse_config({**entrypoint, "searcher": {"name": "single", "metric": "val_accuracy",
                                                   "smaller_is_better": False}}).config
    assert cfg["searcher"]["max_length"] is None
    assert (cfg["searcher"]["metric"], cfg["searcher"]["smaller_is_better"]) == \
        ("val_accuracy", False)


def test_a_script_with_max_length_keeps_it():
    cfg = parse_config({**SCRIPT, "searcher": {"name": "single", "metric": "m",
                                               "max_length": 40}}).config
    assert cfg["searcher"]["max_length"] == {"batches": 40}


@pytest.mark.parametrize(("raw", "path", "fragment"), [
    ({"entrypoint": "model_def:Trial"}, "searcher",
     "missing required key 'searcher'; a trial class entrypoint needs a searcher"),
    ({"entrypoint": "model_def:Trial", "searcher": {"name": "single", "metric": "m"}},
     "searcher.max_length", "missing required key 'searcher.max_length'"),
    ({"entrypoint": "python3 -m determined.launch.horovod --trial m:T",
      "searcher": {"name": "single", "metric": "m"}}, "searcher.max_length", "searcher.max_length"),
    ({**SCRIPT, "searcher": {"name": "single"}}, "searcher.metric",
     "missing required key 'searcher.metric'"),
])
def test_trial_classes_still_need_a_searcher_and_its_max_length(raw, path, fragment):
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    assert info.value.path == path
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


# --- jobs ----------------------------------------------------------------------------------------

JOB = textwrap.dedent(
    """\
    entrypoint_script: python3 batch_inference.py
    data: {trial_id: 777, batch_size: 64}
    resources: {slots: 1}
    """
)


def test_a_job_config_becomes_the_canonical_form_the_launcher_needs():
    parsed = load_job_config_text(JOB)
    cfg = parsed.config
    assert parsed.warnings == []
    assert (cfg["entrypoint_kind"], cfg["script_command"], cfg["trial_class"]) == (
        "script", "python3 batch_inference.py", None)
    assert cfg["data"] == {"trial_id": 777, "batch_size": 64}
    assert cfg["resources"]["slots_per_trial"] == 1
    assert cfg["environment"] == {"environment_variables": {}, "startup_hook": "warn"}
    assert cfg["max_restarts"] == 0
    assert cfg["name"] == "job"
    # What the reporter and the daemon read from any config is there too.
    assert cfg["scheduling_unit"] == 100 and cfg["min_validation_period"] == {"batches": 0}
    assert cfg["reproducibility"] == {"experiment_seed": None}


def test_a_job_config_honours_its_keys():
    cfg = parse_job_config({
        "name": "infer", "description": "batch inference", "entrypoint": "python3 infer.py --n 3",
        "data": {"x": 1}, "resources": {"slots": 2}, "max_restarts": 2,
        "environment": {"environment_variables": {"cpu": ["A=1"], "cuda": ["A=2", "B=3"]}},
    }).config
    assert (cfg["name"], cfg["description"], cfg["script_command"]) == (
        "infer", "batch inference", "python3 infer.py --n 3")
    assert cfg["resources"]["slots_per_trial"] == 2 and cfg["max_restarts"] == 2
    assert cfg["environment"]["environment_variables"] == {"A": "2", "B": "3"}


def test_a_job_config_ignores_searcher_and_hyperparameters_with_a_warning():
    parsed = parse_job_config({"entrypoint": "python3 x.py", "searcher": {"name": "single"},
                               "hyperparameters": {"lr": 0.1},
                               "environment": {"image": "determinedai/x"}})
    assert any("'searcher', 'hyperparameters'" in w and "no search" in w for w in parsed.warnings)
    assert any("'environment.image'" in w for w in parsed.warnings)
    assert parsed.config["hyperparameters"] == {}


def test_load_job_config_file(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(JOB)
    assert load_job_config_file(path).config["data"]["trial_id"] == 777
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_job_config_file(tmp_path / "missing.yaml")


JOB_ERRORS = [
    ("trial class", {"entrypoint": "model_def:Trial"}, "entrypoint",
     ["a job runs a script such as 'python3 batch_inference.py'", "'model_def:Trial'"]),
    ("launcher trial class", {"entrypoint": "python3 -m determined.launch.horovod --trial m:T"},
     "entrypoint", ["a job runs a script"]),
    ("no entrypoint", {"data": {}}, "entrypoint", ["missing required key 'entrypoint'"]),
    ("zero slots", {"entrypoint": "python3 x.py", "resources": {"slots": 0}}, "resources.slots",
     ["resources.slots: expected a value >= 1, got 0"]),
    ("slots not int", {"entrypoint": "python3 x.py", "resources": {"slots": "2"}},
     "resources.slots", ["resources.slots: expected an integer"]),
    ("experiment's slot key", {"entrypoint": "python3 x.py", "resources": {"slots_per_trial": 2}},
     "resources.slots_per_trial",
     ["unknown key 'slots_per_trial' at resources; did you mean 'slots'?"]),
    ("experiment-only key", {"entrypoint": "python3 x.py", "records_per_epoch": 5},
     "records_per_epoch", ["unknown key 'records_per_epoch' at top level"]),
    ("negative restarts", {"entrypoint": "python3 x.py", "max_restarts": -1}, "max_restarts",
     ["max_restarts: expected a value >= 0"]),
    ("data not a mapping", {"entrypoint": "python3 x.py", "data": [1]}, "data",
     ["data: expected a mapping"]),
]


@pytest.mark.parametrize(("raw", "path", "parts"), [c[1:] for c in JOB_ERRORS],
                         ids=[c[0] for c in JOB_ERRORS])
def test_job_config_errors_name_the_key_path(raw, path, parts):
    with pytest.raises(ConfigError) as info:
        parse_job_config(raw)
    assert info.value.path == path
    for part in parts:
        assert part in str(info.value)


def test_an_empty_job_config_says_what_it_needs():
    with pytest.raises(ConfigError, match="entrypoint_script"):
        load_job_config_text("")
