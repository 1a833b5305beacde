"""determined.experimental: Determined's Python SDK, over localdet's records (no master).
`client` is the module most code uses (`from determined.experimental import client`);
the classes are also here, as Determined had them. A few names of a master's features
(projects, sessions, Determined 0.17's trial helpers) refuse, in one sentence, when used.
"""

from typing import Any, List

from determined.common.experimental import checkpoint, metrics, model
from determined.common.experimental._util import OrderBy
from determined.common.experimental.checkpoint import Checkpoint
from determined.common.experimental.determined import Determined
from determined.common.experimental.experiment import Experiment, ExperimentReference
from determined.common.experimental.model import Model, ModelOrderBy, ModelSortBy, ModelVersion
from determined.common.experimental.trial import Trial, TrialOrderBy, TrialReference, TrialSortBy
from determined.experimental import client

__all__ = ["Checkpoint", "Determined", "Experiment", "ExperimentReference", "Model",
           "ModelOrderBy", "ModelSortBy", "ModelVersion", "OrderBy", "Trial", "TrialOrderBy",
           "TrialReference", "TrialSortBy", "checkpoint", "client", "metrics", "model"]

_REFUSED = {
    "Project": ("projects", "localdet keeps every experiment in one list; use labels"),
    "Session": ("the master's HTTP session", "the SDK reaches localdet's records directly"),
    "test_one_batch": ("running a trial class for one batch in this process",
                       "run `det experiment create --test-mode CONFIG MODEL_DIR`"),
    "create": ("Determined 0.17's experiment launcher",
               "use client.create_experiment(config, model_dir)"),
    "create_trial_instance": ("Determined 0.17's trial builder",
                              "build the trial with determined.keras.TFKerasTrialContext."
                              "from_config(config)"),
    "_load_trial_for_checkpoint_export": ("Determined 0.17's checkpoint loader",
                                          "use determined.keras."
                                          "load_model_from_checkpoint_path"),
}


def __getattr__(name: str) -> Any:
    if name in _REFUSED:
        from determined import errors

        what, instead = _REFUSED[name]
        raise errors.refuse(f"determined.experimental.{name} ({what})", instead)
    raise AttributeError(f"module 'determined.experimental' has no attribute {name!r}")


def __dir__() -> List[str]:
    return sorted([*globals(), *_REFUSED])
