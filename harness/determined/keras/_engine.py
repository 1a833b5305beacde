"""How this training process trains on its share of a trial's slots: the harness side of
`localdet/config/engines.py`, picked from LOCALDET_ENGINE (which the launcher sets) and started
once, before TensorFlow starts its runtime:

    engine = start(keras_line)                     # in prepare_process
    optimizer = engine.wrap_optimizer(optimizer)   # context.wrap_optimizer
    engine.prepare(model, dataset)                 # before the first step
    iterator = engine.training_iterator(dataset)   # the batches as this process trains on them
    logs = engine.training_metrics(model.train_function(iterator))
    metrics = engine.evaluate(model, dataset, steps=None, callbacks=[])

- single: one slot, one process.
- mirrored (Keras 3): one process, a MirroredStrategy over its slots' GPUs, or as many logical
  CPU devices; it splits each batch among the replicas. It is the process's default strategy,
  so every model, optimizer and metric the trial's code creates is mirrored without a scope.
- multi_worker_mirrored (Keras 2): this process is one rank of several (one per slot), joined
  by a MultiWorkerMirroredStrategy over localhost (TF_CONFIG), likewise the default strategy.
- horovod (Keras 2): one rank of several, each a plain Keras 2 process; every wrapped
  optimizer averages its gradients across the ranks with Horovod's allreduce before applying
  them. So each rank computes its own loss, with whatever reduction the code asks for.
- gradient_allreduce (Keras 2, where Horovod is not installed): the same, the gradients
  exchanged through the trial's own process group instead of Horovod.

In the multi-process engines every rank is fed its own part of each global batch (the
controller builds the parts), so N slots train on exactly the batches one slot does, and
every rank reports the same, global, metrics.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

import numpy as np
import tensorflow as tf

from determined.core import DistributedContext
from determined.core._reporting import ENGINE_VAR, SLOTS_VAR

_current: Optional["Single"] = None


class EngineError(RuntimeError):
    """The trial's slots cannot be used this way here; the message says what to change."""


def slots_in_this_process() -> int:
    """How many slots the launcher gave this process (`LOCALDET_SLOTS`, e.g. "0,1")."""
    slots = os.environ.get(SLOTS_VAR, "")
    return len([s for s in slots.split(",") if s.strip()]) or 1


def start(keras_line: str) -> "Single":
    """This process's engine, made once; later calls return the same one."""
    global _current
    if _current is None:
        name = os.environ.get(ENGINE_VAR) or (
            "mirrored" if slots_in_this_process() > 1 else "single")
        kinds = {"single": Single, "mirrored": Mirrored,
                 "multi_worker_mirrored": MultiWorkerMirrored, "horovod": Horovod,
                 "gradient_allreduce": GradientAllreduce}
        if name not in kinds:
            raise EngineError(f"LOCALDET_ENGINE={name!r} is not an engine; it is one of "
                              f"{', '.join(kinds)}")
        _current = kinds[name](DistributedContext.from_environment(), keras_line)
    return _current


def current() -> "Single":
    """The engine started in this process, or a single-process one if none was."""
    global _current
    if _current is None:
        _current = Single(DistributedContext.from_environment(), "")
    return _current


def _not_resharded(dataset: tf.data.Dataset) -> tf.data.Dataset:
    # Each rank's dataset is already its own part; tf.distribute must not shard it again.
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return dataset.with_options(options)


def count_batches(dataset: tf.data.Dataset) -> int:
    """Batches in one pass of `dataset`: read through when it cannot say."""
    count = int(dataset.cardinality())
    return count if count >= 0 else int(dataset.reduce(np.int64(0), lambda n, _: n + 1))


class Single:
    """One process trains alone; also the base of the others."""

    name = "single"
    iterator_checkpoints = True  # its tf.data iterator can be saved in a checkpoint

    def __init__(self, distributed: DistributedContext, keras_line: str):
        self.distributed = distributed
        self.keras_line = keras_line

    def describe(self) -> str:
        return ""

    def wrap_optimizer(self, optimizer: Any) -> Any:
        return optimizer

    def prepare(self, model: Any, dataset: tf.data.Dataset) -> None:
        pass

    def training_iterator(self, dataset: tf.data.Dataset) -> Any:
        return iter(dataset)

    def training_metrics(self, logs: Dict[str, Any]) -> Dict[str, float]:
        return {k: float(v) for k, v in logs.items() if np.ndim(v) == 0}

    def evaluate(self, model: Any, dataset: Any, steps: Optional[int],
                 callbacks: List[Any]) -> Dict[str, float]:
        results = model.evaluate(dataset, steps=steps, verbose=0, return_dict=True,
                                 callbacks=callbacks)
        return {k: float(v) for k, v in results.items() if np.ndim(v) == 0}


class Mirrored(Single):
    name = "mirrored"
    iterator_checkpoints = False

    def __init__(self, distributed: DistributedContext, keras_line: str):
        super().__init__(distributed, keras_line)
        slots = slots_in_this_process()
        if keras_line == "keras2":
            raise EngineError(
                f"resources.slots_per_trial is {slots} but the mirrored engine runs Keras 3 "
                "only; under Keras 2 use resources.engine: auto (one process per slot)")
        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            if len(gpus) < slots:
                raise EngineError(f"the trial was given {slots} slots but TensorFlow sees "
                                  f"{len(gpus)} GPU(s) (CUDA_VISIBLE_DEVICES="
                                  f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
            devices = [f"/gpu:{i}" for i in range(slots)]
        else:
            # CPU slots: as many logical devices, so that the replicas really are separate.
            cpu = tf.config.list_physical_devices("CPU")[0]
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(slots)])
            devices = [f"/cpu:{i}" for i in range(slots)]
        self.strategy = tf.distribute.MirroredStrategy(devices)
        tf.distribute.experimental_set_strategy(self.strategy)

    def describe(self) -> str:
        return (f"{self.strategy.num_replicas_in_sync} slots in this process: MirroredStrategy "
                f"over {', '.join(self.strategy.extended.worker_devices)}")

    def prepare(self, model: Any, dataset: tf.data.Dataset) -> None:
        # The optimizer's and metrics' variables must exist, mirrored, before the first
        # distributed step: Keras 3 would create them inside it, which fails. A batch of
        # zeros shaped like the data: reading a real one could disturb a Sequence's workers.
        model._symbolic_build(data_batch=tf.nest.map_structure(
            lambda spec: tf.zeros([d or 1 for d in spec.shape], spec.dtype),
            dataset.element_spec))

    def training_iterator(self, dataset: tf.data.Dataset) -> Any:
        return iter(self.strategy.experimental_distribute_dataset(dataset))


class MultiWorkerMirrored(Single):
    name = "multi_worker_mirrored"
    iterator_checkpoints = False

    def __init__(self, distributed: DistributedContext, keras_line: str):
        super().__init__(distributed, keras_line)
        if keras_line != "keras2":
            raise EngineError("the multi_worker_mirrored engine runs Keras 2 only (Keras 3 "
                              "fails under MultiWorkerMirroredStrategy); use "
                              "resources.engine: auto")
        if not os.environ.get("TF_CONFIG"):
            raise EngineError("the multi_worker_mirrored engine needs TF_CONFIG, which the "
                              "rank supervisor (python -m localdet.processes.ranks "
                              "--tf-config) sets")
        self.strategy = tf.distribute.MultiWorkerMirroredStrategy()
        tf.distribute.experimental_set_strategy(self.strategy)
        self._steps: Dict[int, int] = {}

    def describe(self) -> str:
        return (f"rank {self.distributed.rank} of {self.distributed.size}: "
                "MultiWorkerMirroredStrategy")

    def prepare(self, model: Any, dataset: tf.data.Dataset) -> None:
        # The metrics a step returns are already global; Keras 2's "auto" would sum them
        # over the workers.
        model.distribute_reduction_method = "first"

    def training_iterator(self, dataset: tf.data.Dataset) -> Any:
        part = _not_resharded(dataset)
        return iter(self.strategy.distribute_datasets_from_function(lambda _: part))

    def evaluate(self, model: Any, dataset: Any, steps: Optional[int],
                 callbacks: List[Any]) -> Dict[str, float]:
        model.distribute_reduction_method = "first"
        part = _not_resharded(dataset)
        if steps is None:
            # Every rank runs as many steps as the longest part; a rank whose part is over
            # feeds empty batches, which count for nothing. Validation data does not change:
            # counted once.
            if id(dataset) not in self._steps:
                self._steps[id(dataset)] = max(self.distributed.allgather(count_batches(part)))
            steps = self._steps[id(dataset)]
        distributed = self.strategy.distribute_datasets_from_function(lambda _: part)
        return super().evaluate(model, distributed, steps, callbacks)


class _GradientAveraging(Single):
    """Averages gradients across the ranks in the optimizers: an optimizer given to
    `wrap_optimizer`, and the model's own, gets an `apply_gradients` that first replaces the
    gradients by their mean over the ranks, then applies them as before. Every
    update goes through `apply_gradients` (Keras's `minimize` too), so gradients are averaged
    once per update however the step reaches the optimizer: Keras's own train_step, or a
    custom one that calls `apply_gradients` itself (a GAN's). Subclasses say how the ranks
    exchange gradients and variables. Each rank trains on its own part of every batch, so
    its metrics are averaged here."""

    iterator_checkpoints = False  # only the chief saves, and each rank has its own iterator

    def __init__(self, distributed: DistributedContext, keras_line: str):
        super().__init__(distributed, keras_line)
        self._records: Dict[int, int] = {}
        if keras_line != "keras2":
            raise EngineError(f"the {self.name} engine runs Keras 2 only; use "
                              "resources.engine: auto")
        self._optimizers: List[Any] = []  # every optimizer it averages, for the broadcast

    def wrap_optimizer(self, optimizer: Any) -> Any:
        if optimizer is None or isinstance(optimizer, str):
            return optimizer  # Keras makes the object at compile; prepare() wraps that one
        if "_localdet_apply_gradients" not in vars(optimizer):
            # On the object itself, past Keras's attribute tracking: the object the user
            # holds, its class (what a checkpoint's .h5 records), state and tracking stay
            # as they are. Keras's minimize() and any train_step reach it by
            # self.apply_gradients.
            apply_gradients = optimizer.apply_gradients
            engine = self

            def averaging_apply_gradients(grads_and_vars: Any, *args: Any,
                                          **kwargs: Any) -> Any:
                return apply_gradients(engine.averaged(grads_and_vars), *args, **kwargs)

            object.__setattr__(optimizer, "_localdet_apply_gradients", apply_gradients)
            object.__setattr__(optimizer, "apply_gradients", averaging_apply_gradients)
            self._optimizers.append(optimizer)
        return optimizer

    def averaged(self, grads_and_vars: Any) -> List[Any]:
        """The (gradient, variable) pairs with each gradient replaced by its mean over the
        ranks (one exchange for all of them); a None gradient stays None."""
        pairs = list(grads_and_vars)
        present = [index for index, (grad, _) in enumerate(pairs) if grad is not None]
        if self.distributed.size == 1 or not present:
            return pairs
        # Sparse gradients (embeddings) are averaged dense: the same numbers.
        grads = [tf.convert_to_tensor(pairs[index][0]) for index in present]
        means = self._mean_over_ranks(grads)
        for index, mean in zip(present, means, strict=True):
            pairs[index] = (mean, pairs[index][1])
        return pairs

    def _mean_over_ranks(self, grads: List[Any]) -> List[Any]:
        raise NotImplementedError

    def _broadcast(self, variables: List[Any]) -> None:
        raise NotImplementedError

    def prepare(self, model: Any, dataset: tf.data.Dataset) -> None:
        if model.optimizer is not None:
            self.wrap_optimizer(model.optimizer)  # compile(optimizer="adam"), or unwrapped
        # The ranks start from the chief's weights, also after a restore (they are the same
        # when seeded alike). Variables made in the first step (optimizer slots, layers
        # built on their first call) are made by the same seeded code on every rank.
        variables: Dict[Any, Any] = {}
        for variable in [*model.variables, *(v for o in self._optimizers
                                             for v in _optimizer_variables(o))]:
            variables.setdefault(variable.ref(), variable)
        self._broadcast(list(variables.values()))

    def training_metrics(self, logs: Dict[str, Any]) -> Dict[str, float]:
        # Each rank's metrics cover its own part of the batches: average them.
        local = super().training_metrics(logs)
        every = self.distributed.allgather(local)
        return {k: float(np.mean([ranks[k] for ranks in every])) for k in local}

    def evaluate(self, model: Any, dataset: Any, steps: Optional[int],
                 callbacks: List[Any]) -> Dict[str, float]:
        local = super().evaluate(model, dataset, steps, callbacks)
        key = id(dataset)
        if key not in self._records:  # validation data does not change: count it once
            self._records[key] = sum(int(tf.shape(tf.nest.flatten(batch)[0])[0])
                                     for batch in dataset)
        every = self.distributed.allgather((local, self._records[key]))
        total = sum(records for _, records in every) or 1
        return {k: float(sum(metrics[k] * records for metrics, records in every) / total)
                for k in local}


class Horovod(_GradientAveraging):
    """Horovod's allreduce in the step. (Horovod's own DistributedOptimizer averages only
    the gradients it computes, in `minimize`; on TensorFlow 2.4 and later a train_step that
    hands its gradients to `apply_gradients` itself trains each rank on its own gradients.)"""

    name = "horovod"

    def __init__(self, distributed: DistributedContext, keras_line: str):
        if keras_line != "keras2":
            raise EngineError("Horovod does not support Keras 3; use resources.engine: auto")
        super().__init__(distributed, keras_line)
        try:
            import horovod.tensorflow as hvd
        except ImportError as error:
            raise EngineError(f"the horovod engine needs horovod.tensorflow, which does "
                              f"not import here: {error}") from None
        self.hvd = hvd
        hvd.init()
        if (hvd.rank(), hvd.size()) != (distributed.rank, distributed.size):
            raise EngineError(f"Horovod says rank {hvd.rank()} of {hvd.size()} but localdet "
                              f"started rank {distributed.rank} of {distributed.size}")

    def describe(self) -> str:
        return f"rank {self.hvd.rank()} of {self.hvd.size()}: Horovod"

    def _mean_over_ranks(self, grads: List[Any]) -> List[Any]:
        return list(self.hvd.grouped_allreduce(grads, op=self.hvd.Average))

    def _broadcast(self, variables: List[Any]) -> None:
        self.hvd.broadcast_variables(variables, root_rank=0)


class GradientAllreduce(_GradientAveraging):
    """Horovod's semantics without Horovod. Each rank is a plain Keras 2 process (no
    strategy scope, so any loss reduction is allowed); the exchange is a `tf.numpy_function`
    in the compiled step, through the trial's process group
    (determined.core._process_group), which every rank reaches in the same order."""

    name = "gradient_allreduce"
    COLLECTIVE = "gradient_allreduce"

    def describe(self) -> str:
        return (f"rank {self.distributed.rank} of {self.distributed.size}: gradients averaged "
                "across the ranks' processes (no tf.distribute strategy)")

    def _mean_over_ranks(self, grads: List[Any]) -> List[Any]:
        means = tf.numpy_function(self._exchange, grads, [g.dtype for g in grads],
                                  stateful=True, name="localdet_gradient_allreduce")
        for mean, grad in zip(means, grads, strict=True):
            mean.set_shape(grad.shape)
        return list(means)

    def _exchange(self, *arrays: np.ndarray) -> List[np.ndarray]:
        # Runs in the step, on a TensorFlow thread, while the trial's own thread waits for
        # the step: no other collective of this process runs meanwhile.
        group = self.distributed._process_group(self.COLLECTIVE)
        return group.allreduce_mean(self.COLLECTIVE, arrays)

    def prepare(self, model: Any, dataset: tf.data.Dataset) -> None:
        if getattr(model, "jit_compile", False):  # before any collective: every rank stops
            raise EngineError("model.compile(jit_compile=True) cannot train on several slots "
                              "without Horovod (XLA cannot compile the gradient exchange); "
                              "compile without jit_compile")
        super().prepare(model, dataset)

    def _broadcast(self, variables: List[Any]) -> None:
        chief = self.distributed.rank == 0
        values = self.distributed.broadcast([np.asarray(v.numpy()) for v in variables]
                                            if chief else None)
        if chief:
            return
        shapes = [tuple(v.shape) for v in variables]
        if [tuple(np.shape(value)) for value in values] != shapes:
            raise EngineError(f"rank {self.distributed.rank} built a model whose variables "
                              "differ from rank 0's; every rank must build the same model")
        for variable, value in zip(variables, values, strict=True):
            variable.assign(value)


def _optimizer_variables(optimizer: Any) -> List[Any]:
    # A method on Keras 2's legacy optimizers, a property on its newer ones.
    variables = getattr(optimizer, "variables", None)
    found = variables() if callable(variables) else variables
    return list(found or [])
