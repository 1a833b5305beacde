"""TFKerasTrialContext: what a trial knows about itself, and the wrappers it must call."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, List, NamedTuple, Optional

from determined._assignable import computed, refused_attribute
from determined._trial_context import TrialContext
from determined.core import DistributedContext, TrialInfo
from determined.keras import _engine


class _ArgNotProvided:
    """Marks a `configure_fit` argument the caller did not pass (None is a real value)."""


_NOT_PROVIDED = _ArgNotProvided()


class TFKerasTrainConfig(NamedTuple):
    """What Determined's wrapped `model.fit` once handed its runner (a type that old code
    names; localdet's runner does not use it)."""

    training_data: Any
    validation_data: Any
    callbacks: List[Any]


class TFKerasExperimentalContext:
    """Experimental features; `context.experimental`.

    `cache_train_dataset` / `cache_validation_dataset` decorate a function that makes a
    `tf.data.Dataset`; the dataset is cached in a file after its first full pass, so later
    epochs (and later runs of the trial) read the cache:

        @context.experimental.cache_train_dataset("digits", "v1", shuffle=True)
        def make_dataset():
            return tf.data.Dataset.from_tensor_slices((x, y))

        dataset = context.wrap_dataset(make_dataset())
    """

    def __init__(self, cache_root: Optional[Path] = None, seed: int = 0):
        self._cache_root = cache_root
        self._seed = seed

    def cache_train_dataset(self, dataset_id: str, dataset_version: str, shuffle: bool = False,
                            skip_shuffle_at_epoch_end: bool = False) -> Callable:
        return self._cache("train", dataset_id, dataset_version, shuffle,
                           not skip_shuffle_at_epoch_end)

    def cache_validation_dataset(self, dataset_id: str, dataset_version: str,
                                 shuffle: bool = False) -> Callable:
        return self._cache("validation", dataset_id, dataset_version, shuffle, True)

    # Determined 0.17 to 0.19 handed out the decorators themselves.
    def get_train_cacheable(self) -> Callable:
        """`cache_train_dataset`, as Determined 0.17 to 0.19 returned it."""
        return self.cache_train_dataset

    def get_validation_cacheable(self) -> Callable:
        """`cache_validation_dataset`, as Determined 0.17 to 0.19 returned it."""
        return self.cache_validation_dataset

    def _cache(self, split: str, dataset_id: str, version: str, shuffle: bool,
               reshuffle: bool) -> Callable:
        def decorate(make: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(make)
            def cached(*args: Any, **kwargs: Any) -> Any:
                root = self._cache_root or Path(tempfile.gettempdir())
                folder = root / "dataset-cache" / f"{dataset_id}-{version}"
                folder.mkdir(parents=True, exist_ok=True)
                dataset = make(*args, **kwargs).cache(str(folder / split))
                if shuffle:
                    # A buffer as large as the data makes the order a full permutation;
                    # counting an unknown length reads it once, which fills the cache.
                    size = int(dataset.cardinality())
                    if size < 0:
                        size = int(dataset.reduce(0, lambda n, _: n + 1))
                    dataset = dataset.shuffle(max(size, 1),
                                              seed=self._seed,
                                              reshuffle_each_iteration=reshuffle)
                return dataset
            return cached
        return decorate


class TFKerasTrialContext(TrialContext):
    """Runtime information for a `TFKerasTrial` (`context.env`, `context.distributed`,
    the hyperparameters, ...; see `determined.TrialContext`), plus `wrap_model`/
    `wrap_optimizer`/`wrap_dataset`, which let localdet checkpoint and distribute what they
    wrap.

        lr = context.get_hparam("learning_rate")
        model = context.wrap_model(tf.keras.Sequential([...]))
        dataset = context.wrap_dataset(tf.data.Dataset.from_tensor_slices((x, y)))
    """

    def __init__(self, info: TrialInfo, distributed: Optional[DistributedContext] = None, *,
                 managed_training: bool = True):
        # The engine's context: one per process, as its collectives need one connection.
        super().__init__(info, distributed or _engine.current().distributed,
                         managed_training=managed_training)
        self.experimental = TFKerasExperimentalContext(info.trial_dir, info.seed)
        self.models: List[Any] = []
        self.optimizers: List[Any] = []
        self._wrapped_datasets: set = set()
        self.fit_config: Dict[str, Any] = {}
        self.checkpoint_metadata: Dict[str, Any] = {}

    # Determined's context held these as plain attributes, so user code may assign them.
    @computed
    def model(self) -> Any:
        """The model last given to `wrap_model` (None before)."""
        return self.models[-1] if self.models else None

    @computed
    def dataset_initialized(self) -> bool:
        """Whether `wrap_dataset` has been called."""
        return bool(self._wrapped_datasets)

    compile_args = refused_attribute("context.compile_args", "the model is compiled as it "
                                     "is, so read its settings from the model "
                                     "(model.optimizer, model.loss)")
    # Determined's runner filled it in; localdet's runner reads the trial's methods itself.
    train_config: Optional[TFKerasTrainConfig] = None
    hvd_config = refused_attribute("context.hvd_config", "Determined 0.17's Horovod settings "
                                   "are not served; read context.distributed for the ranks")
    rendezvous_info = refused_attribute("context.rendezvous_info", "a trial's processes all "
                                        "run on this machine; context.distributed has the "
                                        "ranks")

    @classmethod
    def from_config(cls, config: Dict[str, Any]) -> "TFKerasTrialContext":
        """A context for trying a `TFKerasTrial` without localdet (see
        `determined.TrialContext.from_config`)."""
        return super().from_config(config)  # type: ignore[return-value]

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
        """Track the optimizer for checkpoints; on several slots under Keras 2, make the
        same object average its gradients across the ranks (localdet/config/engines.py)."""
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
