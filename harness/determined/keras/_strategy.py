"""The tf.distribute strategy of a trial that has several slots in one process (Keras 3:
`MirroredStrategy` over the slots' GPUs, or over as many logical CPU devices on a machine
without one). Made once, before TensorFlow starts its runtime, and set as the process's
default strategy, so that every model, optimizer and metric the trial's code creates, in
`build_model()` or in a plain script before `context.fit`, is mirrored without the code
asking for a scope:

    strategy = enter_strategy(slots_in_this_process())   # None for one slot
    ...
    iterator = distribute(dataset)                        # the dataset as the replicas see it

A dataset still yields whole batches (the process's batch size); the strategy splits each
among the replicas, so the global batch is the same on 1 and N slots.
"""

from __future__ import annotations

import os
from typing import Any, Optional

import tensorflow as tf

_strategy: Optional[Any] = None


class StrategyError(RuntimeError):
    """The trial's slots cannot be used this way here; the message says what to change."""


def slots_in_this_process() -> int:
    """How many slots the launcher gave this process (`LOCALDET_SLOTS`, e.g. "0,1")."""
    slots = os.environ.get("LOCALDET_SLOTS", "")
    return len([s for s in slots.split(",") if s.strip()]) or 1


def enter_strategy(slots: int, keras_line: str) -> Optional[Any]:
    """Make the process's strategy for `slots` slots and make it the default; None (the
    default strategy) for one slot."""
    global _strategy
    if slots <= 1:
        return None
    if _strategy is not None:
        return _strategy
    if keras_line == "keras2":
        raise StrategyError(
            f"resources.slots_per_trial is {slots} but multi-slot trials under Keras 2 need "
            "one process per slot, which localdet does not run yet; use slots_per_trial: 1, "
            "or Keras 3 (leave TF_USE_LEGACY_KERAS unset)")
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        if len(gpus) < slots:
            raise StrategyError(f"the trial was given {slots} slots but TensorFlow sees "
                                f"{len(gpus)} GPU(s) (CUDA_VISIBLE_DEVICES="
                                f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
        devices = [f"/gpu:{i}" for i in range(slots)]
    else:
        # CPU slots: as many logical devices, so that the replicas really are separate.
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(slots)])
        devices = [f"/cpu:{i}" for i in range(slots)]
    _strategy = tf.distribute.MirroredStrategy(devices)
    tf.distribute.experimental_set_strategy(_strategy)
    return _strategy


def current() -> Optional[Any]:
    return _strategy


def distribute(dataset: Any) -> Any:
    """The dataset as the replicas consume it (unchanged without a strategy)."""
    return dataset if _strategy is None else _strategy.experimental_distribute_dataset(dataset)
