"""Experiment configs as each Determined release from 0.17 to 0.38 wrote them are accepted as
written: what means something on one machine is applied, the rest is noted as unused (one
warning, recorded with the experiment), and nothing is silently misread. The configs below
are our own, written the way each era's examples and documentation wrote them (the keys come
from Determined's expconf schemas at v0.17.0 ... v0.38.1). The last test reads every Keras and
TensorFlow example config in a Determined checkout's history, when one is at hand."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from localdet.config.experiment import ConfigError, load_config_text, parse_config
from localdet.search.methods import Create, ValidateAfter, make_search_method

# 0.17: trial classes, lengths as {batches: N} or a bare int, images per device type, the
# cluster's settings (registry, pod spec, capabilities, data layer, HDFS storage, profiling).
ERA_0_17 = """\
name: mnist_tf_keras_0.17
description: null
data_layer: {type: shared_fs}
data: {url: /data/mnist.npz}
hyperparameters:
  global_batch_size: 32
  dense1: {type: int, minval: 32, maxval: 128}
  dropout: {type: double, minval: 0.2, maxval: 0.5}
records_per_epoch: 6000
min_validation_period: {batches: 100}
min_checkpoint_period: 200
scheduling_unit: 50
perform_initial_validation: true
searcher:
  name: adaptive_asha
  metric: val_accuracy
  smaller_is_better: false
  max_length: {batches: 960}
  max_trials: 8
  bracket_rungs: [3]
  mode: aggressive
  divisor: 4
  max_rungs: 3
  stop_once: false
  source_trial_id: null
entrypoint: model_def:MNistTrial
max_restarts: 2
environment:
  image: {cpu: "determinedai/environments:py-3.8-cpu", gpu: "determinedai/environments:cuda-11"}
  environment_variables:
    cpu: [OMP_NUM_THREADS=2, SHARED=cpu]
    gpu: [NCCL_DEBUG=INFO, SHARED=gpu]
  force_pull_image: false
  registry_auth: {username: me, password: secret, serveraddress: registry.example.com}
  pod_spec: {spec: {containers: [{name: determined-container}]}}
  add_capabilities: [SYS_PTRACE]
  drop_capabilities: [NET_RAW]
  ports: {tensorboard: 6006}
resources:
  slots_per_trial: 1
  max_slots: 4
  weight: 1.0
  native_parallel: false
  shm_size: 4294967296
  resource_pool: gpu-pool
  agent_label: fast
  priority: 42
  devices: [{host_path: /dev/fuse, container_path: /dev/fuse, mode: mrw}]
bind_mounts: [{host_path: /data, container_path: /data, read_only: true, propagation: rprivate}]
optimizations: {aggregation_frequency: 1, average_training_metrics: true, mixed_precision: O0}
profiling: {enabled: true, begin_on_batch: 0, end_after_batch: 10, sync_timings: true}
security: {kerberos: {config_file: /etc/krb5.conf}}
internal: null
checkpoint_storage:
  type: hdfs
  hdfs_url: hdfs://namenode:9000
  hdfs_path: /checkpoints
  user: hdfs
  save_trial_best: 2
tensorboard_storage: {type: shared_fs, host_path: /tmp}
checkpoint_policy: best
reproducibility: {experiment_seed: 1234}
"""

# 0.18 to 0.2x: workspaces and projects, HPC launchers, one image for all, proxy ports,
# async_halving, lengths in epochs with a searched batch size, cloud storage.
ERA_0_2X = """\
name: cifar10_tf_keras_0.2x
workspace: research
project: vision
records_per_epoch: 5000
hyperparameters:
  global_batch_size: {type: int, minval: 16, maxval: 64}
  learning_rate: {type: log, minval: -5.0, maxval: 1.0, base: 10.0}
searcher:
  name: async_halving
  metric: val_categorical_error
  max_length: {epochs: 4}
  max_trials: 6
  num_rungs: 2
  divisor: 2
entrypoint: model_def:CIFARTrial
environment:
  image: determinedai/environments:cuda-11.3-pytorch-1.10-tf-2.8-gpu-0.19.4
  environment_variables: [TF_FORCE_GPU_ALLOW_GROWTH=true]
  proxy_ports: [{proxy_port: 6006, proxy_tcp: false, unauthenticated: false}]
  slurm: [--exclusive]
  pbs: []
slurm: {slots_per_node: 2, gpu_type: a100, sbatch_args: [--time=1:00:00]}
pbs: {slots_per_node: 2, pbsbatch_args: []}
resources: {slots_per_trial: 1, resource_manager: default}
checkpoint_storage:
  type: gcs
  bucket: my-bucket
  prefix: cifar
  save_experiment_best: 1
"""

# 0.26 to 0.37: log policies, retention, integrations, preemption timeouts, webhooks, a local
# directory for checkpoints.
ERA_0_3X = """\
name: fashion_mnist_tf_keras_0.3x
hyperparameters: {global_batch_size: 32, dense1: 128}
records_per_epoch: 60000
searcher: {name: single, metric: val_accuracy, smaller_is_better: false, max_length: {epochs: 1}}
entrypoint: model_def:FashionMNISTTrial
log_policies:
  - {pattern: ".*CUDA out of memory.*", action: {type: cancel_retries}}
retention_policy: {log_retention_days: 30}
preemption_timeout: 60
integrations:
  pachyderm:
    pachd: {host: pachd, port: 30650}
    proxy: {scheme: http, host: pachd, port: 80}
    dataset: {project: p, repo: r, commit: c, branch: main, token: t}
  webhooks: {webhook_name: [slack]}
resources: {slots_per_trial: 1, is_single_node: true}
checkpoint_storage: {type: directory, container_path: /mnt/checkpoints, save_trial_latest: 2}
"""

# 0.38: time_metric/max_time (max_length deprecated), a single searcher with no length (the
# script's own loop decides), the Core API launched by determined.launch.tensorflow.
ERA_0_38_ADAPTIVE = """\
name: iris_tf_keras_adaptive_search
environment:
  image:
    cpu: determinedai/tensorflow-ngc:0.38.1
    gpu: determinedai/tensorflow-ngc:0.38.1
hyperparameters:
  learning_rate: {type: log, minval: -5.0, maxval: 1.0, base: 10.0}
  layer1_dense_size: {type: int, minval: 4, maxval: 32}
  global_batch_size: {type: int, minval: 5, maxval: 30}
searcher:
  name: adaptive_asha
  metric: categorical_accuracy
  smaller_is_better: false
  time_metric: batches
  max_time: 6400
  max_trials: 512
entrypoint: >-
  python3 -m determined.launch.tensorflow --
  python3 train.py
"""

ERA_0_38_CONST = """\
name: iris_tf_keras_const
environment:
  image:
    cpu: determinedai/tensorflow-ngc:0.38.1
    gpu: determinedai/tensorflow-ngc:0.38.1
hyperparameters: {learning_rate: 1.0e-4, layer1_dense_size: 16, global_batch_size: 16}
searcher: {name: single, metric: val_categorical_accuracy, smaller_is_better: false}
entrypoint: >-
  python3 -m determined.launch.tensorflow --
  python3 train.py
"""


def warned(parsed) -> str:
    return "\n".join(parsed.warnings)


def test_a_0_17_config_applies_what_one_machine_can_and_notes_the_rest():
    parsed = load_config_text(ERA_0_17)
    cfg, settings = parsed.config, parsed.settings
    assert settings.searcher.max_length is not None
    assert (cfg["searcher"]["max_length"], cfg["min_checkpoint_period"]) == (
        {"batches": 960}, {"batches": 200})
    assert (settings.description, settings.scheduling_unit, settings.perform_initial_validation,
            settings.max_restarts, settings.resources.max_slots, settings.resources.priority,
            settings.experiment_seed) == ("", 50, True, 2, 4, 42, 1234)
    # cpu's variables, then the GPU's (gpu: the name before 0.17.6) over them.
    assert settings.environment_variables == {"OMP_NUM_THREADS": "2", "NCCL_DEBUG": "INFO",
                                              "SHARED": "gpu"}
    # HDFS cannot be reached: localdet's own store keeps them, as retention says.
    assert cfg["checkpoint_storage"] == {"save_trial_best": 2, "save_trial_latest": 1,
                                         "save_experiment_best": 0}
    notes = warned(parsed)
    for key in ("environment.image", "environment.force_pull_image",
                "environment.registry_auth", "environment.pod_spec",
                "environment.add_capabilities", "environment.drop_capabilities",
                "environment.ports", "resources.shm_size", "resources.resource_pool",
                "resources.agent_label", "resources.devices", "resources.weight",
                "resources.native_parallel", "bind_mounts", "optimizations",
                "profiling.sync_timings", "security", "data_layer", "tensorboard_storage",
                "checkpoint_storage.hdfs_url", "checkpoint_storage.type"):
        assert f"'{key}'" in notes, key
    assert "internal" not in notes  # null: the default, nothing to note
    # Read for the daemon's system metrics: sampled up to batch 10.
    assert cfg["profiling"] == {"enabled": True, "begin_on_batch": 0, "end_after_batch": 10}
    assert "bind_mounts: a trial here sees '/data' at its own path" not in notes  # same path
    assert all("\n" not in w for w in parsed.warnings)


def test_a_0_2x_config_searches_with_each_trials_own_batch_size():
    parsed = load_config_text(ERA_0_2X)
    cfg, settings = parsed.config, parsed.settings
    assert (settings.searcher.name, settings.searcher.bracket_rungs) == ("async_halving", (2,))
    assert settings.environment_variables == {"TF_FORCE_GPU_ALLOW_GROWTH": "true"}
    assert "type" not in cfg["checkpoint_storage"] and "bucket" not in cfg["checkpoint_storage"]
    assert cfg["checkpoint_storage"]["save_experiment_best"] == 1
    notes = warned(parsed)
    for key in ("workspace", "project", "slurm", "pbs", "environment.image",
                "environment.proxy_ports", "environment.slurm", "environment.pbs",
                "resources.resource_manager", "checkpoint_storage.type"):
        assert f"'{key}'" in notes, key
    # 4 epochs of 5000 records: each trial's own batches, its bottom rung half of that.
    search = make_search_method(cfg, 3)
    ops = search.initial_operations()
    creates = {op.request_id: op for op in ops if isinstance(op, Create)}
    lengths = {op.request_id: op.length for op in ops if isinstance(op, ValidateAfter)}
    assert len(creates) == 6
    for request_id, create in creates.items():
        per_epoch = -(-5000 // create.hparams["global_batch_size"])
        assert lengths[request_id] == -(-2 * 5000 // create.hparams["global_batch_size"])
        assert abs(lengths[request_id] - 2 * per_epoch) <= 1
    assert len(set(lengths.values())) > 1


def test_a_0_3x_config_writes_checkpoints_to_its_directory(tmp_path):
    parsed = load_config_text(ERA_0_3X)
    storage = parsed.settings.checkpoint_storage
    assert (storage.type, storage.host_path, storage.save_trial_latest) == (
        "shared_fs", "/mnt/checkpoints", 2)
    notes = warned(parsed)
    for key in ("log_policies", "retention_policy", "preemption_timeout", "integrations",
                "resources.is_single_node"):
        assert f"'{key}'" in notes, key
    assert parsed.settings.batches(parsed.settings.searcher.max_length,
                                   "searcher.max_length") == 1875  # 60000 / 32
    moved = parse_config({"entrypoint": "python3 train.py", "bind_mounts": [
        {"host_path": "/srv/data", "container_path": "/data"}]})
    assert ("bind_mounts: a trial here sees '/srv/data' at its own path, not at '/data' as in "
            "Determined's container") in moved.warnings


def test_0_38s_time_metric_is_the_same_length_as_max_length():
    adaptive = load_config_text(ERA_0_38_ADAPTIVE)
    searcher = adaptive.config["searcher"]
    assert searcher["max_length"] == {"batches": 6400}
    assert "time_metric" not in searcher and "max_time" not in searcher
    written = yaml.safe_load(ERA_0_38_ADAPTIVE)
    for key in ("time_metric", "max_time"):
        del written["searcher"][key]
    as_max_length = parse_config({**written, "searcher": {**written["searcher"],
                                                          "max_length": {"batches": 6400}}})
    ops = make_search_method(adaptive.config, 5).initial_operations()
    assert ops == make_search_method(as_max_length.config, 5).initial_operations()
    assert adaptive.config["script_command"] == "python3 train.py"
    assert "'environment.image'" in warned(adaptive)


@pytest.mark.parametrize(("unit", "extra", "batches"), [
    ("records", {}, 40),  # 640 records of 16
    ("epochs", {"records_per_epoch": 320}, 40),  # 2 epochs of 320 records of 16
])
def test_time_metric_records_and_epochs_count_as_max_length_does(unit, extra, batches):
    count = 640 if unit == "records" else 2
    parsed = parse_config({"entrypoint": "model_def:T", **extra,
                           "hyperparameters": {"global_batch_size": 16},
                           "searcher": {"name": "single", "metric": "loss",
                                        "time_metric": unit, "max_time": count}})
    assert parsed.config["searcher"]["max_length"] == {unit: count}
    ops = make_search_method(parsed.config, 1).initial_operations()
    assert [op.length for op in ops if isinstance(op, ValidateAfter)] == [batches]


def test_a_single_searcher_with_no_length_gives_its_trial_no_target():
    parsed = load_config_text(ERA_0_38_CONST)
    assert parsed.config["searcher"]["max_length"] is None
    assert parsed.config["searcher"]["name"] == "single"
    ops = make_search_method(parsed.config, 1).initial_operations()
    assert [op.length for op in ops if isinstance(op, ValidateAfter)] == [0]  # the script's


@pytest.mark.parametrize(("searcher", "path", "words"), [
    ({"time_metric": "batches"}, "searcher.max_time", "missing required key 'searcher.max_time'"),
    ({"max_time": 10}, "searcher.time_metric", "missing required key 'searcher.time_metric'"),
    ({"time_metric": "batch", "max_time": 10}, "searcher.time_metric", "did you mean 'batches'?"),
    ({"time_metric": "steps_completed", "max_time": 10}, "searcher.time_metric",
     "not in a metric the script reports"),
    ({"time_metric": "batches", "max_time": 0}, "searcher.max_time", "expected a value >= 1"),
    ({"time_metric": "epochs", "max_time": 2}, "searcher.max_length", "records_per_epoch"),
])
def test_a_time_length_that_cannot_work_is_refused_in_one_sentence(searcher, path, words):
    with pytest.raises(ConfigError) as info:
        parse_config({"entrypoint": "python3 train.py",
                      "hyperparameters": {"global_batch_size": 8},
                      "searcher": {"name": "single", "metric": "loss", **searcher}})
    assert info.value.path == path
    assert words in str(info.value) and "\n" not in str(info.value)


def test_time_metric_wins_over_a_leftover_max_length_with_a_warning():
    parsed = parse_config({"entrypoint": "python3 train.py", "searcher": {
        "name": "single", "metric": "loss", "max_length": {"batches": 5},
        "time_metric": "batches", "max_time": 50}})
    assert parsed.config["searcher"]["max_length"] == {"batches": 50}
    assert any("ignoring 'searcher.max_length'" in w for w in parsed.warnings)


def test_null_means_the_default_and_legacy_searchers_are_named():
    parsed = parse_config({"entrypoint": "python3 train.py", "description": None,
                           "max_restarts": None, "resources": {"slots_per_trial": None},
                           "searcher": {"name": "single", "metric": "loss", "max_length": None,
                                        "budget": None}})
    assert (parsed.settings.description, parsed.settings.max_restarts,
            parsed.settings.resources.slots_per_trial) == ("", 5, 1)
    with pytest.raises(ConfigError, match=r"searcher.name: 'adaptive' is not supported"):
        parse_config({"entrypoint": "python3 train.py", "searcher": {
            "name": "adaptive", "metric": "loss", "budget": {"batches": 100},
            "max_length": {"batches": 10}, "train_stragglers": True}})


def test_a_searched_batch_size_that_is_no_integer_is_refused():
    with pytest.raises(ConfigError) as info:
        parse_config({"entrypoint": "model_def:T", "records_per_epoch": 100,
                      "hyperparameters": {"global_batch_size": {
                          "type": "double", "minval": 8, "maxval": 16}},
                      "searcher": {"name": "random", "metric": "loss", "max_trials": 2,
                                   "max_length": {"epochs": 1}}})
    assert info.value.path == "hyperparameters.global_batch_size"


# -- Determined's own example configs, every version in its history -----------------------

def determined_checkout() -> Path | None:
    """The clone of determined-ai/determined that DETERMINED_CHECKOUT names, or None when it
    is unset (no machine's own path is written into the repository)."""
    candidate = os.environ.get("DETERMINED_CHECKOUT")
    if not candidate:
        return None
    if not (Path(candidate) / ".git").exists():
        pytest.fail(f"DETERMINED_CHECKOUT={candidate} is not a git clone of "
                    "determined-ai/determined: point it at one, or unset it to skip")
    return Path(candidate)


# Keras and TensorFlow examples (and the harness's test trials), by their folders' names.
KERAS_OR_TF = re.compile(r"(keras|_tf|tf_|tensorflow|estimator)[^/]*/[^/]*\.ya?ml$", re.I)
RELEASE = re.compile(r"v?0\.(1[7-9]|2\d|3[0-8])\.\d+")


def _git(checkout: Path, *args: str, data: bytes | None = None) -> bytes:
    return subprocess.run(["git", "-C", str(checkout), *args], input=data, check=True,
                          capture_output=True, timeout=120).stdout


def example_configs(checkout: Path) -> dict[str, str]:
    """{"path@blob": text} for every version of a Keras/TF example config that a release
    from 0.17.0 to 0.38.x held or a commit between them wrote (deleted examples included)."""
    places = ["examples", "harness/tests/experiment/fixtures"]
    tags = [t for t in _git(checkout, "tag").decode().split() if RELEASE.fullmatch(t)]
    found: dict[str, str] = {}
    for tag in tags:
        for line in _git(checkout, "ls-tree", "-r", tag, "--", *places).decode().splitlines():
            meta, path = line.split("\t", 1)
            found[meta.split()[2]] = path
    first = next((t for t in tags if t.lstrip("v") == "0.17.0"), None)
    last = max(tags, key=lambda t: [int(n) for n in t.lstrip("v").split(".")], default=None)
    if first and last:
        raw = _git(checkout, "log", last, f"^{first}", "--format=", "--raw", "--no-abbrev",
                   "--", *places).decode()
        for line in raw.splitlines():
            meta, _, path = line.partition("\t")
            fields = meta.split()
            if len(fields) >= 5 and fields[4] != "D":
                found[fields[3]] = path.split("\t")[-1]
    blobs = sorted(b for b, p in found.items() if KERAS_OR_TF.search(p))
    out = _git(checkout, "cat-file", "--batch", data="".join(f"{b}\n" for b in blobs).encode())
    texts, at = {}, 0
    for blob in blobs:
        header_end = out.index(b"\n", at)
        size = int(out[at:header_end].split()[2])
        texts[f"{found[blob]}@{blob[:10]}"] = out[header_end + 1:header_end + 1 + size].decode()
        at = header_end + 1 + size + 1
    return texts


def test_every_keras_and_tf_example_config_of_every_release_parses():
    checkout = determined_checkout()
    if checkout is None:
        pytest.skip("no Determined checkout: set DETERMINED_CHECKOUT to a clone of "
                    "determined-ai/determined with its tags")
    configs = example_configs(checkout)
    assert len(configs) > 100, "the checkout lacks its history (a shallow clone?)"
    refused = {}
    for name, text in configs.items():
        try:
            load_config_text(text)
        except ConfigError as error:
            refused[name] = str(error)
    assert refused == {}
    assert any("time_metric" in text for text in configs.values())  # 0.38's are among them
