"""An experiment config as frozen dataclasses, built from its validated, filled dict.

    from localdet.config.typed import ExperimentConfig

    settings = parse_config(raw).settings                   # right after validation
    settings = ExperimentConfig.from_dict(experiment.config)   # a config stored by any localdet
    settings.searcher.max_concurrent_trials                 # 16 unless the config says otherwise
    settings.checkpoint_storage.save_trial_best             # 1
    settings.batches(settings.searcher.max_length, "searcher.max_length")   # in batches

Every default lives in the schema (state/expconf.schema.json: `default`, and
`x-defaults-by-name` for what depends on the searcher's name); these classes have none of
their own. `from_dict` fills whatever a dict lacks from the schema first, so a config stored
by an older localdet (before some key had a default) reads with today's defaults, and a
consumer never repeats one as `.get(key, default)`. The dict itself stays what is stored in
SQLite: building these changes nothing in it.

Hyperparameters and `data` stay mappings (their keys are the user's own); like the rest they
are copies, not to be changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from localdet.config.schema import length_to_batches, section_with_defaults, with_defaults


@dataclass(frozen=True)
class Length:
    """A length in the unit the config gave it: ``{"epochs": 2}`` is Length("epochs", 2)."""

    unit: str   # "batches", "records" or "epochs"
    count: int

    @classmethod
    def from_value(cls, value: Mapping[str, int] | int) -> Length:
        if isinstance(value, Mapping):
            ((unit, count),) = value.items()
            return cls(unit, count)
        return cls("batches", value)  # Determined's legacy bare int, in configs stored long ago

    def as_dict(self) -> dict[str, int]:
        return {self.unit: self.count}


@dataclass(frozen=True)
class Searcher:
    name: str
    metric: str
    smaller_is_better: bool
    max_length: Length | None       # None: a script's own epochs decide
    max_trials: int | None          # random and adaptive_asha require it
    max_concurrent_trials: int      # 0: no limit
    # adaptive_asha's (filled for it from x-defaults-by-name; None for other searchers)
    max_rungs: int | None
    divisor: float | None
    mode: str | None
    stop_once: bool | None
    bracket_rungs: tuple[int, ...] | None
    # accepted for Determined's configs, not used by the searchers localdet runs
    num_rungs: int | None
    # the warm start (localdet/checkpoints/warm_start.py): trials start from this checkpoint
    # (a trial's latest), resolved into source_checkpoint_uuid when the experiment is recorded
    source_trial_id: int | None
    source_checkpoint_uuid: str | None

    @classmethod
    def from_dict(cls, section: Mapping[str, Any]) -> Searcher:
        length = section.get("max_length")
        divisor = section.get("divisor")
        rungs = section.get("bracket_rungs")
        return cls(
            name=section["name"], metric=section["metric"],
            smaller_is_better=section["smaller_is_better"],
            max_length=None if length is None else Length.from_value(length),
            max_trials=section.get("max_trials"),
            max_concurrent_trials=section["max_concurrent_trials"],
            max_rungs=section.get("max_rungs"),
            divisor=None if divisor is None else float(divisor),
            mode=section.get("mode"), stop_once=section.get("stop_once"),
            bracket_rungs=None if rungs is None else tuple(rungs),
            num_rungs=section.get("num_rungs"), source_trial_id=section.get("source_trial_id"),
            source_checkpoint_uuid=section.get("source_checkpoint_uuid"))


@dataclass(frozen=True)
class Resources:
    slots_per_trial: int
    priority: int | None
    max_slots: int | None        # None: no cap on the experiment's slots
    max_memory: int | None       # bytes (parse_config converts '4GB'); None: no cap
    engine: str  # "auto", "mirrored", "multi_worker_mirrored", "horovod", "gradient_allreduce"

    @classmethod
    def from_dict(cls, section: Mapping[str, Any]) -> Resources:
        return cls(slots_per_trial=section["slots_per_trial"], priority=section["priority"],
                   max_slots=section["max_slots"], max_memory=section["max_memory"],
                   engine=section["engine"])


@dataclass(frozen=True)
class CheckpointStorage:
    """Retention (save_*) and where checkpoints go (no type: localdet's own store)."""

    save_experiment_best: int
    save_trial_best: int
    save_trial_latest: int
    type: str | None             # "shared_fs", "s3" or None
    host_path: str | None
    storage_path: str | None
    bucket: str | None
    prefix: str | None
    endpoint_url: str | None
    access_key: str | None
    secret_key: str | None

    @classmethod
    def from_dict(cls, section: Mapping[str, Any]) -> CheckpointStorage:
        """From a `checkpoint_storage` section, stored or partial: the schema fills the rest."""
        filled = section_with_defaults(section, "checkpoint_storage")
        return cls(save_experiment_best=filled["save_experiment_best"],
                   save_trial_best=filled["save_trial_best"],
                   save_trial_latest=filled["save_trial_latest"], type=filled.get("type"),
                   host_path=filled.get("host_path"), storage_path=filled.get("storage_path"),
                   bucket=filled.get("bucket"), prefix=filled.get("prefix"),
                   endpoint_url=filled.get("endpoint_url"), access_key=filled.get("access_key"),
                   secret_key=filled.get("secret_key"))

    def describe(self) -> str:
        """``checkpoint_storage.save_trial_best: 1, save_trial_latest: 1, save_experiment_best: 0``
        (what retention keeps, as an error message names it)."""
        return (f"checkpoint_storage.save_trial_best: {self.save_trial_best}, save_trial_latest: "
                f"{self.save_trial_latest}, save_experiment_best: {self.save_experiment_best}")

    @classmethod
    def of(cls, config: Any) -> CheckpointStorage:
        """From an ExperimentConfig, an experiment config dict or its `checkpoint_storage`
        section itself."""
        if isinstance(config, CheckpointStorage):
            return config
        if isinstance(config, ExperimentConfig):
            return config.checkpoint_storage
        section = config.get("checkpoint_storage", config) if isinstance(config, Mapping) else {}
        return cls.from_dict(section if isinstance(section, Mapping) else {})


@dataclass(frozen=True)
class ExperimentConfig:
    name: str
    description: str
    labels: tuple[str, ...]
    debug: bool
    entrypoint_kind: str | None  # "trial_class" or "script" (None only in a hand-made dict)
    trial_class: str | None      # "module:Class" for a trial class
    script_command: str | None   # the command for a script
    hyperparameters: Mapping[str, Any]  # normalized: every leaf is {"type": ...}
    searcher: Searcher
    records_per_epoch: int       # 0: not given
    min_validation_period: Length
    min_checkpoint_period: Length
    scheduling_unit: int
    perform_initial_validation: bool
    data: Mapping[str, Any]
    environment_variables: Mapping[str, str]
    checkpoint_storage: CheckpointStorage
    checkpoint_policy: str
    max_restarts: int
    resources: Resources
    experiment_seed: int | None  # None until the submission picks one

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> ExperimentConfig:
        """From a config `parse_config` filled, or one stored in SQLite by any localdet: what
        it lacks comes from the schema's defaults (the dict itself is left as it is)."""
        config = with_defaults(config)
        env = config["environment"]["environment_variables"]
        if not isinstance(env, Mapping):  # a list of KEY=VALUE, as written in the YAML
            env = dict(entry.split("=", 1) for entry in env)
        return cls(
            name=config["name"], description=config["description"],
            labels=tuple(config["labels"]), debug=config["debug"],
            entrypoint_kind=config.get("entrypoint_kind"), trial_class=config.get("trial_class"),
            script_command=config.get("script_command"),
            hyperparameters=config["hyperparameters"],
            searcher=Searcher.from_dict(config["searcher"]),
            records_per_epoch=config["records_per_epoch"],
            min_validation_period=Length.from_value(config["min_validation_period"]),
            min_checkpoint_period=Length.from_value(config["min_checkpoint_period"]),
            scheduling_unit=config["scheduling_unit"],
            perform_initial_validation=config["perform_initial_validation"],
            data=config["data"], environment_variables=dict(env),
            checkpoint_storage=CheckpointStorage.from_dict(config["checkpoint_storage"]),
            checkpoint_policy=config["checkpoint_policy"], max_restarts=config["max_restarts"],
            resources=Resources.from_dict(config["resources"]),
            experiment_seed=config["reproducibility"]["experiment_seed"])

    @classmethod
    def of(cls, config: ExperimentConfig | Mapping[str, Any]) -> ExperimentConfig:
        """`config` itself if typed already, else built from the dict."""
        return config if isinstance(config, ExperimentConfig) else cls.from_dict(config)

    def batches(self, length: Length, what: str,
                hparams: Mapping[str, Any] | None = None) -> int:
        """`length` in batches (records and epochs rounded up); `what` names it in errors.
        `hparams`: one trial's, whose own global_batch_size counts its records and epochs
        (Determined's way when the batch size is searched)."""
        space = self.hyperparameters
        if hparams is not None and "global_batch_size" in hparams:
            space = {"global_batch_size": hparams["global_batch_size"]}
        return length_to_batches(length.as_dict(), {"records_per_epoch": self.records_per_epoch,
                                                    "hyperparameters": space}, what)

    @property
    def batch_size_searched(self) -> bool:
        """Whether global_batch_size is a range or a choice, so that a length in records or
        epochs comes to a different number of batches for each trial."""
        hp = self.hyperparameters.get("global_batch_size")
        return isinstance(hp, Mapping) and hp.get("type") not in (None, "const")
