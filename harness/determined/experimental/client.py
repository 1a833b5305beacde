"""The Python SDK, over localdet's records: Determined's `client` module, whose functions
work on a default `Determined()` made at first use.

    from determined.experimental import client
    from determined import keras

    exp = client.create_experiment(config="const.yaml", model_dir=".")
    state = exp.wait()                              # ExperimentState.COMPLETED
    path = exp.top_checkpoint().download()          # checkpoints/<uuid>
    model = keras.load_model_from_checkpoint_path(path)

There is no master: `login()` is accepted and changes nothing, and the records are those
of `$LOCALDET_HOME` (the daemon is started when an experiment is created and none runs).
Users, workspaces, projects, resource pools and OAuth clients refuse, in one sentence, when
used.
"""

import logging
from typing import Any, Callable, Dict, Iterable, List, Optional, TypeVar, Union

from determined.common.experimental._util import OrderBy
from determined.common.experimental.checkpoint import (  # noqa: F401
    Checkpoint,
    CheckpointOrderBy,
    CheckpointSortBy,
    CheckpointState,
    DownloadMode,
)
from determined.common.experimental.determined import Determined
from determined.common.experimental.experiment import (  # noqa: F401
    Experiment,
    ExperimentOrderBy,
    ExperimentReference,
    ExperimentSortBy,
    ExperimentState,
)
from determined.common.experimental.metrics import TrainingMetrics, TrialMetrics, ValidationMetrics
from determined.common.experimental.model import (  # noqa: F401
    Model,
    ModelOrderBy,
    ModelSortBy,
    ModelVersion,
)
from determined.common.experimental.trial import (  # noqa: F401
    Trial,
    TrialOrderBy,
    TrialReference,
    TrialSortBy,
    TrialState,
)

logger = logging.getLogger("determined.client")

_determined: Optional[Determined] = None

# Determined 0.23's name of TrialMetrics.
_TrialMetrics = TrialMetrics
# The type variable of Determined's decorators here.
C = TypeVar("C", bound=Callable[..., Any])

_ONE_PLACE = ("localdet keeps every experiment and model in one place, for the one user "
              "running it; use labels to group them")
_INTERNAL = "the SDK reaches localdet's records directly, with no master session"
# A master's features localdet has not, and the client's internals: they refuse when used
# (see __getattr__), naming what to do instead.
_REFUSED = {
    **{name: (what, _ONE_PLACE) for name, what in {
        "Project": "projects", "Workspace": "workspaces", "User": "users",
        "ResourcePool": "resource pools", "Oauth2ScimClient": "OAuth clients",
        "create_user": "users", "get_user_by_id": "users", "get_user_by_name": "users",
        "get_session_username": "users", "whoami": "users", "list_users": "users",
        "get_workspace": "workspaces", "list_workspaces": "workspaces",
        "create_workspace": "workspaces", "delete_workspace": "workspaces",
        "list_oauth_clients": "OAuth clients", "add_oauth_client": "OAuth clients",
        "remove_oauth_client": "OAuth clients"}.items()},
    **{name: ("the master's session", _INTERNAL) for name in (
        "Session", "_api", "_get_singleton_session", "_require_singleton",
        "_stream_trials_metrics")},
}


def __getattr__(name: str) -> Any:
    if name in _REFUSED:
        from determined import errors

        what, instead = _REFUSED[name]
        raise errors.refuse(f"determined.experimental.client.{name} ({what})", instead)
    raise AttributeError(f"module 'determined.experimental.client' has no attribute {name!r}")


def __dir__() -> List[str]:
    return sorted([*globals(), *_REFUSED])


def _client() -> Determined:
    global _determined
    if _determined is None:
        _determined = Determined()
    return _determined


def login(master: Optional[str] = None, user: Optional[str] = None,
          password: Optional[str] = None, cert_path: Optional[str] = None,
          cert_name: Optional[str] = None, noverify: bool = False) -> None:
    """Accepted for Determined's scripts: localdet has no master and no login, so this
    only makes the default `Determined()` (the arguments are ignored, with a note in the
    log when a master is named)."""
    global _determined
    _determined = Determined(master, user, password, cert_path, cert_name, noverify)


def logout() -> None:
    """Accepted: there is no session to end."""
    global _determined
    _determined = None


def create_experiment(config: Union[str, Any, Dict], model_dir: Optional[str] = None,
                      includes: Optional[Iterable[Any]] = None, project_id: Optional[int] = None,
                      template: Optional[str] = None) -> Experiment:
    """Submit an experiment: `config` is a config file's path or a dict, `model_dir` its
    model folder, `includes` more files or folders to put beside it. The daemon is started
    if none runs; returns the `Experiment` once recorded."""
    return _client().create_experiment(config, model_dir, includes, project_id, template)


def get_experiment(experiment_id: int) -> Experiment:
    return _client().get_experiment(experiment_id)


def list_experiments(sort_by: Optional[ExperimentSortBy] = None,
                     order_by: Optional[OrderBy] = None,
                     experiment_ids: Optional[List[int]] = None,
                     labels: Optional[List[str]] = None, users: Optional[List[str]] = None,
                     states: Optional[List[ExperimentState]] = None, name: Optional[str] = None,
                     project_id: Optional[int] = None) -> List[Experiment]:
    """Experiments, filtered and sorted (see `Determined.list_experiments`)."""
    return _client().list_experiments(sort_by=sort_by, order_by=order_by,
                                      experiment_ids=experiment_ids, labels=labels,
                                      users=users, states=states, name=name,
                                      project_id=project_id)


def get_trial(trial_id: int) -> Trial:
    return _client().get_trial(trial_id)


def get_checkpoint(uuid: str) -> Checkpoint:
    return _client().get_checkpoint(uuid)


def create_model(name: str, description: Optional[str] = "",
                 metadata: Optional[Dict[str, Any]] = None) -> Model:
    """Add a model (its name unique) to the registry."""
    return _client().create_model(name, description, metadata)


def get_model(identifier: Union[str, int]) -> Model:
    """The model with this name, or this numeric id."""
    return _client().get_model(identifier)


def get_model_by_id(model_id: int) -> Model:
    return _client().get_model_by_id(model_id)


def list_models(sort_by: ModelSortBy = ModelSortBy.NAME, order_by: OrderBy = OrderBy.ASCENDING,
                name: Optional[str] = None, description: Optional[str] = None,
                model_id: Optional[int] = None, workspace_names: Optional[List[str]] = None,
                workspace_ids: Optional[List[int]] = None) -> List[Model]:
    return _client().list_models(sort_by=sort_by, order_by=order_by, name=name,
                                 description=description, model_id=model_id,
                                 workspace_names=workspace_names, workspace_ids=workspace_ids)


def get_models(sort_by: ModelSortBy = ModelSortBy.NAME, order_by: OrderBy = OrderBy.ASCENDING,
               name: str = "", description: str = "") -> List[Model]:
    return _client().get_models(sort_by, order_by, name or None, description or None)


def get_model_labels() -> List[str]:
    return _client().get_model_labels()


def iter_trials_metrics(trial_ids: List[int], group: str) -> Iterable[TrialMetrics]:
    """The metric reports of `group` ("training" or "validation") of the trials."""
    return _client().iter_trials_metrics(trial_ids, group=group)


def stream_trials_metrics(trial_ids: List[int], group: str) -> Iterable[TrialMetrics]:
    return _client().stream_trials_metrics(trial_ids, group)


def stream_trials_training_metrics(trial_ids: List[int]) -> Iterable[TrainingMetrics]:
    return _client().stream_trials_training_metrics(trial_ids)


def stream_trials_validation_metrics(trial_ids: List[int]) -> Iterable[ValidationMetrics]:
    return _client().stream_trials_validation_metrics(trial_ids)
