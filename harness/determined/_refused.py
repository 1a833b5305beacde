"""Determined's subpackages for frameworks and services localdet does not serve. They are
refused when used (`import determined.pytorch`, `det.pytorch`), never when `determined` is
imported, with one sentence saying what to use instead."""

from __future__ import annotations

import importlib.abc
import sys
from typing import Any, Optional

KERAS_INSTEAD = ("write the model as a determined.keras.TFKerasTrial or a script with "
                 "det.keras.init()")

REFUSED = {
    "pytorch": ("PyTorchTrial and the PyTorch API", KERAS_INSTEAD),
    "estimator": ("EstimatorTrial", KERAS_INSTEAD),
    "transformers": ("the Hugging Face integration", KERAS_INSTEAD),
    "experimental": ("the client of a Determined master",
                     "use the localdet commands (status, checkpoints, checkpoint export, "
                     "metrics) or determined.keras.load_model_from_checkpoint_path"),
    "horovod": ("Determined's Horovod wrapper",
                "set resources.engine: horovod in the experiment config and call "
                "context.wrap_optimizer"),
    "launch.torch_distributed": ("Determined's torch.distributed launcher",
                                 "a Keras trial's slots are given by "
                                 "resources.slots_per_trial; use determined.launch.tensorflow "
                                 "or determined.launch.horovod"),
    "launch.deepspeed": ("Determined's DeepSpeed launcher",
                         "a Keras trial's slots are given by resources.slots_per_trial; use "
                         "determined.launch.tensorflow or determined.launch.horovod"),
    "profiler": ("the cluster profiler", "use TensorBoard (localdet tensorboard) for profiles"),
    "tensorboard": ("the master's TensorBoard upload",
                    "use determined.keras.callbacks.TensorBoard and `localdet tensorboard`"),
    "searcher": ("the custom searcher API",
                 "use searcher.name single, grid, random or adaptive_asha"),
    "layers": ("Determined's internal workload layers", "localdet's runner drives the trial"),
    "workload": ("Determined's internal workloads", "localdet's runner drives the trial"),
    "ipc": ("Determined's internal process messaging", "localdet's runner drives the trial"),
    "gpu": ("Determined's agent GPU discovery",
            "read context.env.container_gpus or tf.config.list_physical_devices('GPU')"),
    "constants": ("Determined's cluster constants", "nothing here needs them"),
    "common": ("the master's API client", "use the localdet commands"),
    "_generic": ("Determined 0.17's internal generic trial context",
                 "localdet's runner drives the trial"),
}


class NotServedImportError(ImportError):
    """A refused Determined subpackage was imported or used."""


def refusal(name: str) -> NotServedImportError:
    what, instead = REFUSED[name]
    return NotServedImportError(f"determined.{name} ({what}) is not served by localdet; "
                                f"{instead}.")


class _RefusingFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Optional[Any]:
        head, _, rest = fullname.partition(".")
        if head != "determined":
            return None
        for name in (".".join(rest.split(".")[:2]), rest.split(".")[0]):
            if name in REFUSED:  # a refused module, or one refused within a served package
                raise refusal(name)
        return None


def install() -> None:
    if not any(isinstance(f, _RefusingFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _RefusingFinder())
