"""TFKerasTrialContext: what a trial knows about itself, and the wrappers it must call."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from determined.core import DistributedContext, TrialInfo
from determined.keras import _engine


class _ArgNotProvided:
    """Marks a `configure_fit` argument the caller did not pass (None is a real value)."""


_NOT_PROVIDED = _ArgNotProvided()


class TFKerasExperimentalContext:
    """Experimental features; `context.experimental`."""


class TFKerasTrialContext:
    """Runtime information for a `TFKerasTrial`, plus `wrap_model`/`wrap_optimizer`/
    `wrap_dataset`, which let localdet checkpoint and distribute what they wrap.

        lr = context.get_hparam("learning_rate")
        model = context.wrap_model(tf.keras.Sequential([...]))
        dataset = context.wrap_dataset(tf.data.Dataset.from_tensor_slices((x, y)))
    """

    def __init__(self, info: TrialInfo, distributed: Optional[DistributedContext] = None):
        self._info = info
        # The engine's context: one per process, as its collectives need one connection.
        self.distributed = distributed or _engine.current().distributed
        self.experimental = TFKerasExperimentalContext()
        self.models: List[Any] = []
        self.optimizers: List[Any] = []
        self._wrapped_datasets: set = set()
        self.fit_config: Dict[str, Any] = {}
        self.checkpoint_metadata: Dict[str, Any] = {}
        self._stop_requested = False

    # -- who am I -----------------------------------------------------------------------
    def get_experiment_config(self) -> Dict[str, Any]:
        return self._info.config

    def get_data_config(self) -> Dict[str, Any]:
        return self._info.config.get("data", {})

    def get_experiment_id(self) -> int:
        return self._info.experiment_id

    def get_trial_id(self) -> int:
        return self._info.trial_id

    def get_trial_seed(self) -> int:
        return self._info.seed

    def get_hparams(self) -> Dict[str, Any]:
        return self._info.hparams

    def get_hparam(self, name: str) -> Any:
        if name not in self._info.hparams:
            known = ", ".join(sorted(self._info.hparams)) or "none"
            raise ValueError(f"hyperparameter '{name}' is not in the experiment config; "
                             f"the known hyperparameters are: {known}")
        return self._info.hparams[name]

    def get_global_batch_size(self) -> int:
        if "global_batch_size" not in self._info.hparams:
            raise ValueError("get_global_batch_size() needs a 'global_batch_size' "
                             "hyperparameter in the experiment config")
        return int(self._info.hparams["global_batch_size"])

    def get_per_slot_batch_size(self) -> int:
        return self.get_global_batch_size() // self.distributed.size

    def get_stop_requested(self) -> bool:
        return self._stop_requested

    def set_stop_requested(self, stop_requested: bool) -> None:
        """Ask localdet to end this trial at the next workload boundary."""
        self._stop_requested = bool(stop_requested)

    def add_checkpoint_metadata(self, metadata: Dict[str, Any]) -> None:
        """Attach metadata (JSON-serialisable) to this trial's checkpoints from now on; it
        shows in `localdet checkpoints` and in the exported folder's metadata.json.

            self.context.add_checkpoint_metadata({"dataset_version": "2024-05"})
        """
        self.checkpoint_metadata.update(metadata)

    # -- wrappers -----------------------------------------------------------------------
    def wrap_model(self, model: Any) -> Any:
        self.models.append(model)
        return model

    def wrap_optimizer(self, optimizer: Any) -> Any:
        """Track the optimizer for checkpoints; under Horovod, wrap it in Horovod's
        DistributedOptimizer (compile the model with what this returns)."""
        optimizer = _engine.current().wrap_optimizer(optimizer)
        self.optimizers.append(optimizer)
        return optimizer

    def wrap_dataset(self, dataset: Any, shard_dataset: bool = True) -> Any:
        if shard_dataset and self.distributed.size > 1:
            dataset = dataset.shard(self.distributed.size, self.distributed.rank)
        self._wrapped_datasets.add(id(dataset))
        return dataset

    def is_wrapped_dataset(self, dataset: Any) -> bool:
        return id(dataset) in self._wrapped_datasets

    def configure_fit(self, verbose: Optional[bool] = None, class_weight: Any = _NOT_PROVIDED,
                      workers: Optional[int] = None, use_multiprocessing: Optional[bool] = None,
                      max_queue_size: Optional[int] = None, shuffle: Optional[bool] = None,
                      validation_steps: Any = _NOT_PROVIDED) -> None:
        """Set arguments of the `model.fit` call; a later call only overrides what it passes."""
        given = {"verbose": verbose, "workers": workers,
                 "use_multiprocessing": use_multiprocessing,
                 "max_queue_size": max_queue_size, "shuffle": shuffle}
        self.fit_config.update({k: v for k, v in given.items() if v is not None})
        for key, value in (("class_weight", class_weight), ("validation_steps", validation_steps)):
            if value is not _NOT_PROVIDED:
                self.fit_config[key] = value
