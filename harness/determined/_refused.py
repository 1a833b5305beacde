"""Determined's subpackages for frameworks and services localdet does not serve. They are
refused when used (`import determined.pytorch`, `det.pytorch`), never when `determined` is
imported, with one sentence saying what to use instead.

A few of them (PARTLY_SERVED) import, because code imports them for a name or two, or only
to import them (Determined's own test helpers do `from determined import gpu, workload`):
what they serve works, and any other name in them refuses, with its module's sentence,
when used."""

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
    "layers": ("Determined's internal workload layers", "localdet's runner drives the trial"),
    "workload": ("Determined's internal workloads", "localdet's runner drives the trial"),
    "ipc": ("Determined's internal process messaging", "localdet's runner drives the trial"),
    "common.storage": ("Determined's cloud checkpoint storage",
                       "off localdet checkpoints go to a folder: use "
                       "determined.common.storage.SharedFSStorageManager"),
    "common.util": ("Determined's internal helpers", "nothing here needs them"),
    "common.check": ("Determined's internal argument checks", "nothing here needs them"),
    "gpu": ("Determined's agent GPU discovery",
            "read context.env.container_gpus or tf.config.list_physical_devices('GPU')"),
    "constants": ("Determined's cluster constants", "nothing here needs them"),
    "common.api": ("the master's HTTP API client",
                   "the SDK (determined.experimental.client) reaches localdet's records "
                   "directly, and determined.common.api serves only its errors"),
    "common": ("the master's API client and Determined's internals",
               "use determined.experimental.client or the det and localdet commands"),
    "_generic": ("Determined 0.17's internal generic trial context",
                 "localdet's runner drives the trial"),
}


# Modules that import (their own files say what they serve); names they do not serve
# refuse when used, with their entry in REFUSED.
PARTLY_SERVED = {"common", "common.storage", "common.util", "common.check", "common.api",
                 "gpu", "workload"}
# Packages served whole, inside a refused one: the SDK's classes and its errors.
SERVED = ("common.experimental", "common.api.errors")


class NotServedImportError(ImportError):
    """A refused Determined subpackage was imported or used."""


def refusal(name: str, shown: Optional[str] = None) -> NotServedImportError:
    """The refusal of REFUSED[name], naming `determined.<shown>` (default: the name)."""
    what, instead = REFUSED[name]
    return NotServedImportError(f"determined.{shown or name} ({what}) is not served by "
                                f"localdet; {instead}.")


def refusal_of_name(module: str, name: str, served: str) -> NotServedImportError:
    """The refusal of `name` in the PARTLY_SERVED `module`, which serves `served`."""
    what, instead = REFUSED[module]
    return NotServedImportError(f"determined.{module}.{name} ({what}) is not served by "
                                f"localdet, whose determined.{module} serves {served}; "
                                f"{instead}.")


def refusing_getattr(module: str, served: str) -> Any:
    """A module `__getattr__` for the PARTLY_SERVED `module`: Python's own lookups (dunder
    names) get AttributeError, any other name the refusal."""

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(f"module 'determined.{module}' has no attribute {name!r}")
        raise refusal_of_name(module, name, served)

    return __getattr__


class _RefusingFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Optional[Any]:
        head, _, rest = fullname.partition(".")
        if head != "determined" or rest in PARTLY_SERVED:
            return None
        if any(rest == served or rest.startswith(served + ".") for served in SERVED):
            return None
        for name in (".".join(rest.split(".")[:2]), rest.split(".")[0]):
            if name in REFUSED:  # a refused module, or one refused within a served package
                raise refusal(name, rest)
        return None


def install() -> None:
    if not any(isinstance(f, _RefusingFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _RefusingFinder())
