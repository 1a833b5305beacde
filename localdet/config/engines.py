"""How a trial trains on its slots, chosen per trial at submission and recorded at launch:

    engine, why = choose(config, model_dir)   # e.g. ("multi_worker_mirrored", "2 slots ...")
    processes(engine, slots)                  # 1, or one rank per slot

- "single": one slot, one process.
- "mirrored" (Keras 3): one process, a `MirroredStrategy` over the slots' GPUs (or as many
  logical CPU devices).
- "horovod" (Keras 2, where `horovod.tensorflow` imports): one process per slot joined by
  Horovod over Gloo, started by the rank supervisor (localdet/processes/ranks.py).
- "gradient_allreduce" (Keras 2): one process per slot, each a plain single-device Keras 2
  process; the optimizers average their gradients across the processes before applying
  them, as Horovod's DistributedOptimizer does (determined/keras/_engine.py). Started by the
  rank supervisor, with TF_CONFIG set for code that builds its own strategy.
- "multi_worker_mirrored" (Keras 2, when a config asks for it): one process per slot,
  `MultiWorkerMirroredStrategy` over free localhost ports (TF_CONFIG), started by the rank
  supervisor. tf_keras refuses SUM_OVER_BATCH_SIZE losses under it, which Horovod allowed.

On a Ray cluster the ranks of a multi-process engine may run on several nodes, one actor
each (localdet/scheduling/ray_cluster.py); "mirrored" stays within one node.

`resources.engine: auto` gives a Keras 2 trial Horovod's semantics, as Determined ran every
multi-slot TFKerasTrial (each rank's own loss, whatever its reduction; averaged gradients; the
same batches per rank): Horovod where it is installed, else gradient_allreduce. Keras 3 gets
mirrored (Horovod has no Keras 3 support, and Keras 3 fails under
MultiWorkerMirroredStrategy). A config may force one engine; one that cannot run
here is refused at submission with the reason (EngineRefusal).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from localdet.config import keras_choice
from localdet.config.typed import ExperimentConfig

SINGLE, MIRRORED = "single", "mirrored"
MULTI_WORKER_MIRRORED, HOROVOD = "multi_worker_mirrored", "horovod"
GRADIENT_ALLREDUCE = "gradient_allreduce"
MULTI_PROCESS = (MULTI_WORKER_MIRRORED, HOROVOD, GRADIENT_ALLREDUCE)


class EngineRefusal(ValueError):
    """No engine here can train this config on its slots; the message says what to change."""


def spans_nodes(engine: str) -> bool:
    """Whether the engine's ranks may run on several machines of a cluster: each rank is its
    own process, joined over the network (TF_CONFIG, Horovod's Gloo rendezvous, or the
    trial's process group). Keras
    3's mirrored engine is one process, so it stays on one machine."""
    return engine in MULTI_PROCESS


def horovod_installed() -> bool:
    """Whether `horovod.tensorflow` is importable here (found, without importing
    TensorFlow); the trial's own import says more if it is broken."""
    try:
        return importlib.util.find_spec("horovod.tensorflow") is not None
    except (ImportError, ValueError):
        return False


def processes(engine: str, slots: int) -> int:
    """How many training processes (ranks) the engine runs for a trial of `slots` slots."""
    return slots if engine in MULTI_PROCESS else 1


def choose(config: dict, model_dir: Path) -> tuple[str, str]:
    settings = ExperimentConfig.from_dict(config)  # engine "auto" when stored without one
    slots = settings.resources.slots_per_trial
    wanted = settings.resources.engine
    if slots <= 1:
        return SINGLE, "one slot"
    environment = {str(k): str(v) for k, v in settings.environment_variables.items()}
    line, why = keras_choice.choose(Path(model_dir), environment, config)
    keras = "Keras 2" if line == "keras2" else "Keras 3"
    if wanted == "auto":
        if line == "keras3":
            wanted = MIRRORED
        else:
            wanted = HOROVOD if horovod_installed() else GRADIENT_ALLREDUCE
    refusal = _refusal(wanted, line)
    if refusal:
        # The rule and what decided, not the whole reason: the refusal stays one short line.
        rule, source = keras_choice.rule_of(why)
        because = f"rule {rule}" + (f", decided by {source}" if source else "") if rule else why
        raise EngineRefusal(f"resources.engine {wanted} cannot train this trial: {refusal} "
                          f"(it runs under {keras} by {because})")
    how = {MIRRORED: "one process, MirroredStrategy over its devices",
           MULTI_WORKER_MIRRORED: "one process per slot, MultiWorkerMirroredStrategy",
           HOROVOD: "one process per slot, Horovod over Gloo",
           GRADIENT_ALLREDUCE: "one process per slot, gradients averaged across them as "
                               "under Horovod"}[wanted]
    return wanted, f"{slots} slots under {keras}: {how}"


def _refusal(engine: str, line: str) -> str:
    if engine == MIRRORED and line == "keras2":
        return ("localdet runs Keras 2 on several slots with one process per slot; use "
                "engine: auto, gradient_allreduce or multi_worker_mirrored")
    if engine == MULTI_WORKER_MIRRORED and line == "keras3":
        return ("Keras 3 fails under MultiWorkerMirroredStrategy (keras issue 20585); use "
                "engine: auto or mirrored, or Keras 2 (TF_USE_LEGACY_KERAS=1)")
    if engine == GRADIENT_ALLREDUCE and line == "keras3":
        return ("gradient_allreduce runs Keras 2 only; use engine: auto or mirrored, or "
                "Keras 2 (TF_USE_LEGACY_KERAS=1)")
    if engine == HOROVOD and line == "keras3":
        return "Horovod does not support Keras 3; use engine: auto, or Keras 2"
    if engine == HOROVOD and not horovod_installed():
        return ("horovod.tensorflow is not installed here (Horovod 0.28.1 needs TensorFlow "
                "2.15 or older; see scripts/horovod-env); use engine: auto")
    return ""
