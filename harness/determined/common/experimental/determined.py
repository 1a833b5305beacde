"""`Determined`: the SDK's entry point, whose methods `determined.experimental.client`
offers as functions. Determined's connected to a master; this one reaches localdet's
records through the backend seam (`_backend`), so the master and login arguments are
accepted and mean nothing."""

import logging
import os
import pathlib
from typing import Any, Dict, Iterable, List, Optional, Sequence, Union

from determined.common.experimental import (
    _backend,
    _util,
    checkpoint,
    experiment,
    metrics,
    model,
    trial,
)
from determined.common.experimental._util import OrderBy

logger = logging.getLogger("determined.client")


def _no_users(what: str) -> Exception:
    from determined import errors

    return errors.refuse(what, "localdet has one user, the one running it, and no login")


def _no_workspaces(what: str) -> Exception:
    from determined import errors

    return errors.refuse(what, "localdet keeps every experiment and model in one place; "
                               "use labels to group them")


def _config_text(config: Union[str, pathlib.Path, Dict]) -> str:
    import yaml

    if isinstance(config, (str, pathlib.Path)):
        text = pathlib.Path(config).read_text()
        yaml.safe_load(text)  # a YAML error names the file's line here, before submitting
        return text
    if isinstance(config, dict):
        return yaml.safe_dump(config, sort_keys=False)
    raise ValueError("config parameter must be dictionary or path")


class Determined:
    """The SDK's entry point: `Determined().get_experiment(7)`, as `client.get_experiment(7)`.

    `master`, `user`, `password`, `cert_path`, `cert_name` and `noverify` are accepted for
    Determined's signature; localdet has no master (nor users) and works on the records of
    `$LOCALDET_HOME`."""

    def __init__(self, master: Optional[str] = None, user: Optional[str] = None,
                 password: Optional[str] = None, cert_path: Optional[str] = None,
                 cert_name: Optional[str] = None, noverify: bool = False) -> None:
        self._master = master or os.environ.get("DET_MASTER") or os.environ.get(
            "DET_MASTER_ADDR")
        if self._master:
            logger.info("localdet has no master: %s is ignored, and the records of "
                        "$LOCALDET_HOME are used", self._master)

    # -- experiments --------------------------------------------------------------------
    def create_experiment(self, config: Union[str, pathlib.Path, Dict],
                          model_dir: Optional[Union[str, pathlib.Path]] = None,
                          includes: Optional[Iterable[Union[str, pathlib.Path]]] = None,
                          project_id: Optional[int] = None,
                          template: Optional[str] = None) -> experiment.Experiment:
        """Submit an experiment (a config file's path or a dict, and its model folder plus
        `includes`), starting the localdet daemon if none runs; returns it once recorded."""
        if template is not None:
            from determined import errors

            raise errors.refuse("create_experiment(template=...) (config templates)",
                                "merge the template's keys into the config itself")
        facts = _backend.call(
            "experiment.create", config_text=_config_text(config),
            model_dir=str(pathlib.Path(model_dir).absolute()) if model_dir is not None
            else None, includes=[str(pathlib.Path(i).absolute()) for i in includes or []])
        return experiment.Experiment._from_facts(facts)

    def get_experiment(self, experiment_id: int) -> experiment.Experiment:
        return experiment.Experiment._from_facts(
            _backend.call("experiment.get", experiment_id=experiment_id))

    def list_experiments(self, sort_by: Optional[experiment.ExperimentSortBy] = None,
                         order_by: Optional[OrderBy] = None,
                         experiment_ids: Optional[List[int]] = None,
                         labels: Optional[List[str]] = None,
                         users: Optional[List[str]] = None,
                         states: Optional[List[experiment.ExperimentState]] = None,
                         name: Optional[str] = None,
                         project_id: Optional[int] = None) -> List[experiment.Experiment]:
        """Experiments (archived ones included, as Determined's SDK listed them), filtered
        by ids, labels (any of them), states and name (a part of it), sorted by `sort_by`
        (default: id)."""
        found = _backend.call("experiment.list", labels=list(labels or []),
                              states=[s.name for s in states] if states else None)
        if experiment_ids is not None:
            found = [f for f in found if f["id"] in set(experiment_ids)]
        if name is not None:
            found = [f for f in found if name in (f.get("name") or "")]
        key = sort_by or experiment.ExperimentSortBy.ID
        found.sort(key=lambda f: experiment._sort_key(f, key),
                   reverse=_util.order_name(order_by) == "desc")
        return [experiment.Experiment._from_facts(f) for f in found]

    # -- trials and checkpoints -----------------------------------------------------------
    def get_trial(self, trial_id: int) -> trial.Trial:
        return trial.Trial._from_facts(_backend.call("trial.get", trial_id=trial_id))

    def get_checkpoint(self, uuid: str) -> checkpoint.Checkpoint:
        """The checkpoint with this uuid (a unique prefix works too)."""
        return checkpoint.Checkpoint._from_facts(_backend.call("checkpoint.get", uuid=uuid))

    def iter_trials_metrics(self, trial_ids: List[int],
                            group: str) -> Iterable[metrics.TrialMetrics]:
        """The metric reports of `group` ("training" or "validation") of the trials, by
        trial then oldest first."""
        return trial._trial_metrics(list(trial_ids), group)

    def stream_trials_metrics(self, trial_ids: List[int],
                              group: str) -> Iterable[metrics.TrialMetrics]:
        _util.deprecated("Determined.stream_trials_metrics()",
                         "Determined.iter_trials_metrics()")
        return self.iter_trials_metrics(trial_ids, group)

    def stream_trials_training_metrics(self, trial_ids: List[int]
                                       ) -> Iterable[metrics.TrainingMetrics]:
        _util.deprecated("Determined.stream_trials_training_metrics()",
                         "Determined.iter_trials_metrics(group='training')")
        return trial._legacy_metrics(list(trial_ids), metrics.TrainingMetrics)

    def stream_trials_validation_metrics(self, trial_ids: List[int]
                                         ) -> Iterable[metrics.ValidationMetrics]:
        _util.deprecated("Determined.stream_trials_validation_metrics()",
                         "Determined.iter_trials_metrics(group='validation')")
        return trial._legacy_metrics(list(trial_ids), metrics.ValidationMetrics)

    # -- the model registry ---------------------------------------------------------------
    def create_model(self, name: str, description: Optional[str] = "",
                     metadata: Optional[Dict[str, Any]] = None,
                     labels: Optional[List[str]] = None,
                     workspace_name: Optional[str] = None) -> model.Model:
        """Add a model (its name unique) to the registry."""
        return model.Model._from_facts(_backend.call(
            "model.create", name=name, description=description or "",
            metadata=metadata, labels=labels))

    def get_model(self, identifier: Union[str, int]) -> model.Model:
        """The model with this name, or this numeric id."""
        return model.Model._from_facts(_backend.call("model.get", model=identifier))

    def get_model_by_id(self, model_id: int) -> model.Model:
        _util.deprecated("Determined.get_model_by_id()", "Determined.get_model()")
        return self.get_model(model_id)

    def list_models(self, sort_by: model.ModelSortBy = model.ModelSortBy.NAME,
                    order_by: OrderBy = OrderBy.ASCENDING, name: Optional[str] = None,
                    description: Optional[str] = None, model_id: Optional[int] = None,
                    workspace_names: Optional[List[str]] = None,
                    workspace_ids: Optional[List[int]] = None) -> List[model.Model]:
        """The registry's models (archived ones included), filtered by name, description
        (a part of it) and id, sorted."""
        found = _backend.call("model.list", name=name, sort_by=sort_by.name.lower(),
                              order=_util.order_name(order_by))
        if description is not None:
            found = [f for f in found if description in (f.get("description") or "")]
        if model_id is not None:
            found = [f for f in found if f["id"] == model_id]
        return [model.Model._from_facts(f) for f in found]

    def get_models(self, sort_by: model.ModelSortBy = model.ModelSortBy.NAME,
                   order_by: OrderBy = OrderBy.ASCENDING, name: Optional[str] = None,
                   description: Optional[str] = None, model_id: Optional[int] = None,
                   workspace_names: Optional[List[str]] = None,
                   workspace_ids: Optional[List[int]] = None) -> List[model.Model]:
        _util.deprecated("Determined.get_models()", "Determined.list_models()")
        return self.list_models(sort_by, order_by, name, description, model_id)

    def get_model_labels(self) -> List[str]:
        """The labels of the registry's models, most used first."""
        counts: Dict[str, int] = {}
        for found in _backend.call("model.list", name=None, sort_by="name", order="asc"):
            for label in found.get("labels") or []:
                counts[label] = counts.get(label, 0) + 1
        return sorted(counts, key=lambda label: (-counts[label], label))

    # -- what a master had and localdet has not -------------------------------------------
    def logout(self) -> None:
        """Nothing to log out of: accepted."""

    def create_user(self, username: str, admin: bool, password: Optional[str] = None,
                    remote: bool = False) -> Any:
        raise _no_users("Determined.create_user")

    def get_user_by_id(self, user_id: int) -> Any:
        raise _no_users("Determined.get_user_by_id")

    def get_user_by_name(self, user_name: str) -> Any:
        raise _no_users("Determined.get_user_by_name")

    def whoami(self) -> Any:
        raise _no_users("Determined.whoami")

    def get_session_username(self) -> str:
        raise _no_users("Determined.get_session_username")

    def list_users(self, active: Optional[bool] = None) -> List[Any]:
        raise _no_users("Determined.list_users")

    def get_workspace(self, name: str) -> Any:
        raise _no_workspaces("Determined.get_workspace")

    def list_workspaces(self) -> List[Any]:
        raise _no_workspaces("Determined.list_workspaces")

    def create_workspace(self, name: str) -> Any:
        raise _no_workspaces("Determined.create_workspace")

    def delete_workspace(self, name: str) -> None:
        raise _no_workspaces("Determined.delete_workspace")

    def list_oauth_clients(self) -> Sequence[Any]:
        raise _no_users("Determined.list_oauth_clients")

    def add_oauth_client(self, domain: str, name: str) -> Any:
        raise _no_users("Determined.add_oauth_client")

    def remove_oauth_client(self, client_id: str) -> None:
        raise _no_users("Determined.remove_oauth_client")
