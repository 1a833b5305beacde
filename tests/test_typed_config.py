"""The typed experiment config (localdet/config/typed.py): built right after validation,
every default taken from the schema (its one home), and built as well from a config dict an
older localdet stored, without changing that dict."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest

from localdet.config import engines, schema
from localdet.config.experiment import parse_config, parse_job_config, schema_path
from localdet.config.typed import CheckpointStorage, ExperimentConfig, Length
from localdet.search.methods import Create, make_search_method

BARE = {"entrypoint": "model_def:Trial", "hyperparameters": {"global_batch_size": 32},
        "searcher": {"name": "single", "metric": "val_loss", "max_length": 100}}
ASHA = {"entrypoint": "model_def:Trial",
        "hyperparameters": {"global_batch_size": 32,
                            "lr": {"type": "log", "minval": -4, "maxval": -1}},
        "searcher": {"name": "adaptive_asha", "metric": "val_loss", "max_length": 64,
                     "max_trials": 12}}


def schema_defs() -> dict:
    return json.loads(schema_path().read_text(encoding="utf-8"))["$defs"]


def test_a_config_with_nothing_optional_gets_the_documented_defaults():
    settings = parse_config(copy.deepcopy(BARE)).settings
    assert (settings.name, settings.description, settings.labels, settings.debug) == (
        "experiment", "", (), False)
    assert settings.searcher.smaller_is_better is True
    assert settings.searcher.max_concurrent_trials == 16
    assert settings.searcher.max_length == Length("batches", 100)
    assert settings.searcher.max_trials is None and settings.searcher.divisor is None
    assert settings.records_per_epoch == 0 and settings.scheduling_unit == 100
    assert settings.min_validation_period == settings.min_checkpoint_period == Length("batches", 0)
    assert settings.perform_initial_validation is False
    assert (settings.checkpoint_policy, settings.max_restarts) == ("best", 5)
    assert settings.checkpoint_storage == CheckpointStorage(
        save_experiment_best=0, save_trial_best=1, save_trial_latest=1, type=None,
        host_path=None, storage_path=None, bucket=None, prefix=None, endpoint_url=None,
        access_key=None, secret_key=None)
    resources = settings.resources
    assert (resources.slots_per_trial, resources.priority, resources.max_slots,
            resources.max_memory, resources.engine) == (1, None, None, None, "auto")
    assert settings.experiment_seed is None  # the submission picks and records one
    assert (settings.entrypoint_kind, settings.trial_class) == ("trial_class", "model_def:Trial")
    assert settings.hyperparameters == {"global_batch_size": {"type": "const", "val": 32}}


def test_adaptive_asha_gets_its_own_defaults_and_a_log_its_base():
    settings = parse_config(copy.deepcopy(ASHA)).settings
    searcher = settings.searcher
    assert (searcher.max_rungs, searcher.divisor, searcher.mode, searcher.stop_once) == (
        5, 4.0, "standard", False)
    assert searcher.bracket_rungs is None
    assert settings.hyperparameters["lr"]["base"] == 10


def test_every_default_comes_from_the_schema():
    # The typed values of a bare config are the schema's defaults, section by section: change
    # one in state/expconf.schema.json and the typed config follows.
    defs = schema_defs()
    settings = parse_config(copy.deepcopy(ASHA)).settings
    sections = {"resources": settings.resources, "checkpoint_storage": settings.checkpoint_storage,
                "searcher": settings.searcher}
    checked = 0
    for section, typed in sections.items():
        for key, spec in defs[section]["properties"].items():
            if isinstance(spec, dict) and "default" in spec and key != "max_length":
                assert getattr(typed, key) == spec["default"], f"{section}.{key}"
                checked += 1
    for key, value in defs["searcher"]["x-defaults-by-name"]["adaptive_asha"].items():
        assert getattr(settings.searcher, key) == value, f"searcher.{key}"
        checked += 1
    assert checked == 14


def test_a_default_changed_in_the_schema_reaches_every_consumer(monkeypatch):
    # No consumer keeps a copy of its own: patch the schema's defaults and they all follow.
    defs = schema.schema()["$defs"]
    monkeypatch.setitem(defs["searcher"]["properties"]["max_concurrent_trials"], "default", 3)
    monkeypatch.setitem(defs["searcher"]["x-defaults-by-name"]["adaptive_asha"], "divisor", 2)
    monkeypatch.setitem(defs["checkpoint_storage"]["properties"]["save_trial_best"], "default", 2)
    random = dict(BARE, searcher={"name": "random", "metric": "val_loss", "max_length": 10,
                                  "max_trials": 20})
    _, old = old_stored(random)
    creates = [op for op in make_search_method(old, 1).initial_operations()
               if isinstance(op, Create)]
    assert len(creates) == 3  # paced by the patched max_concurrent_trials
    _, old_asha = old_stored(ASHA)
    search = make_search_method(old_asha, 1)
    assert {bracket.divisor for bracket in search.brackets} == {2.0}
    assert CheckpointStorage.of(old).describe().startswith("checkpoint_storage.save_trial_best: 2,")


def test_the_stored_dict_is_left_as_it_is_and_reads_back_the_same():
    parsed = parse_config(copy.deepcopy(ASHA))
    stored = json.dumps(parsed.config)
    again = ExperimentConfig.from_dict(json.loads(stored))  # as read back from SQLite
    assert again == parsed.settings
    assert json.dumps(parsed.config) == stored
    with pytest.raises(dataclasses.FrozenInstanceError):
        again.max_restarts = 0  # type: ignore[misc]


def old_stored(raw: dict) -> tuple[dict, dict]:
    """(today's filled config, the same config as an older localdet stored it: without the
    keys that gained defaults since, max_length as a bare int)."""
    filled = parse_config(copy.deepcopy(raw)).config
    old = copy.deepcopy(filled)
    for key in ("engine", "max_memory", "priority", "max_slots"):
        del old["resources"][key]
    old["checkpoint_storage"] = {}
    del old["environment"]["environment_variables"]
    del old["reproducibility"]
    for key in ("max_concurrent_trials", "max_rungs", "divisor", "mode", "stop_once"):
        old["searcher"].pop(key, None)
    old["searcher"]["max_length"] = old["searcher"]["max_length"]["batches"]
    return filled, old


def test_a_config_stored_by_an_older_localdet_loads_with_todays_defaults():
    filled, old = old_stored(ASHA)
    snapshot = copy.deepcopy(old)
    settings = ExperimentConfig.from_dict(old)
    assert old == snapshot  # building it changed nothing in the stored dict
    today = ExperimentConfig.from_dict(filled)
    assert settings == dataclasses.replace(today, experiment_seed=None)
    assert settings.searcher.max_length == Length("batches", 64)
    assert settings.environment_variables == {}


def test_a_search_over_an_old_stored_config_makes_the_same_trials():
    filled, old = old_stored(ASHA)
    assert (make_search_method(old, 5).initial_operations()
            == make_search_method(filled, 5).initial_operations())


def test_consumers_read_the_schema_defaults_of_an_old_stored_config(tmp_path):
    _, old = old_stored(BARE)
    assert CheckpointStorage.of(old).describe() == (
        "checkpoint_storage.save_trial_best: 1, save_trial_latest: 1, save_experiment_best: 0")
    assert CheckpointStorage.of({"save_trial_best": 3}).save_trial_latest == 1  # a section
    assert engines.choose(old, tmp_path) == (engines.SINGLE, "one slot")


def test_a_job_has_its_own_defaults_in_the_canonical_form():
    parsed = parse_job_config({"entrypoint_script": "python3 infer.py", "resources": {"slots": 2}})
    assert parsed.settings.resources.slots_per_trial == 2
    assert parsed.settings.max_restarts == 0  # a job's default, not an experiment's 5
    assert parsed.settings.name == "job"
    assert parsed.settings == ExperimentConfig.from_dict(parsed.config)


def test_a_length_in_epochs_counts_each_trials_own_batch_size():
    settings = parse_config({
        "entrypoint": "model_def:Trial", "records_per_epoch": 1000,
        "hyperparameters": {"global_batch_size": {"type": "categorical", "vals": [10, 30]}},
        "searcher": {"name": "grid", "metric": "val_loss", "max_length": {"epochs": 2}}}).settings
    assert settings.batch_size_searched
    length = settings.searcher.max_length
    assert [settings.batches(length, "searcher.max_length", {"global_batch_size": size})
            for size in (10, 30)] == [200, 67]
    ops = make_search_method(settings, 1).initial_operations()
    sizes = {op.request_id: op.hparams["global_batch_size"] for op in ops
             if isinstance(op, Create)}
    targets = {op.request_id: op.length for op in ops if hasattr(op, "length")}
    assert {sizes[r]: targets[r] for r in sizes} == {10: 200, 30: 67}
    assert not ExperimentConfig.from_dict(BARE).batch_size_searched
