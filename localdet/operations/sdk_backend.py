"""localdet's side of the SDK seam (`determined.common.experimental._backend`),
registered in pyproject.toml under the entry point group `determined.client_backends`: the
`determined` package imports nothing of localdet and finds this class through the entry
point. Each named operation is a call into the operations below, on the records of
`$LOCALDET_HOME` (read at each call); nothing is done here that they do not do.

    SDKBackend().call("experiment.get", experiment_id=7)     # experiments.describe(...)

`NotFound` becomes Determined's `NotFoundException` and `OperationError` its
`APIException`, each with the operation's one sentence.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any, Callable

from determined.common.api import errors
from localdet.operations import (
    checkpoints,
    creation,
    custom_search,
    deletion,
    experiments,
    model_def,
    registry,
    trials,
)
from localdet.operations.errors import NotFound, OperationError
from localdet.paths import Layout
from localdet.records.db import StateDB
from localdet.records.opening import RecordsUnavailable, unavailable
from localdet.records.states import ExperimentKind

logger = logging.getLogger("determined.client")

Operation = Callable[..., Any]


def _create(layout: Layout, db: StateDB, config_text: str, model_dir: str | None,
            includes: list[str]) -> dict[str, Any]:
    experiment_id = creation.create_experiment(
        layout, config_text, Path(model_dir) if model_dir else None,
        includes=[Path(i) for i in includes], warn=logger.warning)
    return experiments.describe(layout, db, experiment_id)


def _list(layout: Layout, db: StateDB, labels: list[str],
          states: list[str] | None) -> list[dict[str, Any]]:
    # Determined's SDK listed archived experiments too, and matched any of the labels.
    found = experiments.list_experiments(db, archived=None, states=states,
                                         kind=ExperimentKind.EXPERIMENT,
                                         with_best_metric=True)
    if labels:
        found = [f for f in found if set(f["labels"]) & set(labels)]
    return found


def _act(action: str) -> Operation:
    def act(layout: Layout, db: StateDB, experiment_id: int) -> str:
        return experiments.act(layout, db, action, experiment_id=experiment_id)
    return act


OPERATIONS: dict[str, Operation] = {
    "experiment.create": _create,
    "experiment.get": lambda layout, db, experiment_id: experiments.describe(
        layout, db, experiment_id),
    "experiment.list": _list,
    "experiment.trials": lambda layout, db, experiment_id: trials.experiment_trials(
        db, experiment_id),
    "experiment.set_name": lambda layout, db, experiment_id, name: experiments.set_name(
        db, experiment_id, name),
    "experiment.set_description": lambda layout, db, experiment_id, description:
        experiments.set_description(db, experiment_id, description),
    "experiment.set_notes": lambda layout, db, experiment_id, notes: experiments.set_notes(
        db, experiment_id, notes),
    "experiment.add_label": lambda layout, db, experiment_id, label: experiments.add_label(
        db, experiment_id, label),
    "experiment.remove_label": lambda layout, db, experiment_id, label:
        experiments.remove_label(db, experiment_id, label),
    "experiment.set_labels": lambda layout, db, experiment_id, labels:
        experiments.set_labels(db, experiment_id, labels),
    "experiment.archive": lambda layout, db, experiment_id: experiments.archive(
        db, experiment_id),
    "experiment.unarchive": lambda layout, db, experiment_id: experiments.unarchive(
        db, experiment_id),
    "experiment.pause": _act("pause"),
    "experiment.activate": _act("activate"),
    "experiment.cancel": _act("cancel"),
    "experiment.kill": _act("kill"),
    "experiment.delete": lambda layout, db, experiment_id: deletion.delete_experiment(
        layout, db, experiment_id),
    "experiment.download_code": lambda layout, db, experiment_id, output_dir: str(
        model_def.download_model_def(layout, db, experiment_id, Path(output_dir))),
    # determined.searcher's runner (custom_search.py)
    "searcher.create_experiment": lambda layout, db, config_text, model_dir, includes:
        custom_search.create_experiment(layout, config_text, model_dir, includes,
                                        warn=logger.warning),
    "searcher.events": lambda layout, db, experiment_id, after: custom_search.events(
        db, experiment_id, after),
    "searcher.post_operations": lambda layout, db, experiment_id, event_id, operations:
        custom_search.post_operations(layout, db, experiment_id, event_id, operations),
    "trial.get": lambda layout, db, trial_id: trials.describe_trial(db, trial_id),
    "trial.kill": lambda layout, db, trial_id: experiments.act(layout, db, "kill",
                                                               trial_id=trial_id),
    "trial.metrics": lambda layout, db, trial_ids, group: trials.trial_metrics(
        db, trial_ids, group),
    "trial.logs": lambda layout, db, trial_id, head, tail: trials.trial_logs(
        layout, db, trial_id, head, tail),
    "checkpoint.get": checkpoints.describe_checkpoint,
    "checkpoint.list": lambda layout, db, **arguments: checkpoints.list_checkpoints(
        db, **arguments),
    "checkpoint.download": lambda layout, db, uuid, path: str(
        checkpoints.download_checkpoint(layout, db, uuid, Path(path))),
    "checkpoint.delete": checkpoints.delete_checkpoint,
    "checkpoint.add_metadata": lambda layout, db, uuid, metadata: checkpoints.add_metadata(
        db, uuid, metadata),
    "checkpoint.remove_metadata": lambda layout, db, uuid, keys:
        checkpoints.remove_metadata(db, uuid, keys),
    "model.create": lambda layout, db, **arguments: registry.create_model(db, **arguments),
    "model.get": lambda layout, db, model: registry.get_model(db, model),
    # Determined's SDK listed archived models too.
    "model.list": lambda layout, db, name, sort_by, order: registry.list_models(
        db, archived=None, name=name, sort_by=sort_by, order=order or "asc"),
    "model.update": lambda layout, db, model, **fields: registry.update_model(
        db, model, **fields),
    "model.archive": lambda layout, db, model: registry.archive_model(db, model),
    "model.unarchive": lambda layout, db, model: registry.unarchive_model(db, model),
    "model.delete": lambda layout, db, model: registry.delete_model(db, model),
    "model.register_version": lambda layout, db, model, checkpoint_uuid:
        registry.register_version(db, model, checkpoint_uuid),
    "model.get_version": lambda layout, db, model, version: registry.get_version(
        db, model, version),  # None: -1 asked of a model with no versions
    "model.list_versions": lambda layout, db, model, order: registry.list_versions(
        db, model, order or "desc"),
    "model.update_version": lambda layout, db, model, version, **fields:
        registry.update_version(db, model, version, **fields),
    "model.delete_version": lambda layout, db, model, version: registry.delete_version(
        db, model, version),
}

# Creations may come first; listings answer [] before anything is recorded; other reads
# say there is nothing.
_CREATIONS = {"experiment.create", "searcher.create_experiment"}
_LISTINGS = {"experiment.list", "model.list"}
# The operations that only read: they open the records read-only (never created,
# migrated or backed up by a reader).
_READS = {"experiment.get", "experiment.list", "experiment.trials", "experiment.download_code",
          "trial.get", "trial.metrics", "trial.logs", "checkpoint.get", "checkpoint.list",
          "checkpoint.download", "model.get", "model.list", "model.get_version",
          "model.list_versions"}


class SDKBackend:
    """Implements `determined.common.experimental._backend.ClientBackend`."""

    def call(self, operation: str, **arguments: Any) -> Any:
        run = OPERATIONS.get(operation)
        if run is None:
            raise errors.APIException(f"localdet's SDK backend has no operation "
                                      f"{operation!r}; update localdet and determined "
                                      "together")
        layout = Layout.from_environment()
        try:
            if operation in _READS:
                with StateDB.open_readonly(layout.db) as db:
                    if db.nothing_recorded:
                        if operation in _LISTINGS:
                            return []
                        raise errors.NotFoundException(f"nothing is recorded at {layout.home} "
                                                       "yet; create an experiment first")
                    return run(layout, db, **arguments)
            if operation not in _CREATIONS and not layout.db.exists():
                raise errors.NotFoundException(f"nothing is recorded at {layout.home} yet; "
                                               "create an experiment first")
            try:
                layout.ensure()
            except OSError as error:  # a state folder that cannot be made
                raise RecordsUnavailable(str(unavailable(layout.db, error))) from None
            with StateDB.open(layout.db) as db:
                return run(layout, db, **arguments)
        except NotFound as error:
            raise errors.NotFoundException(str(error)) from None
        except OperationError as error:
            raise errors.APIException(str(error)) from None
        except RecordsUnavailable as error:  # damaged, a newer schema, a directory, ...
            raise errors.APIException(str(error)) from None
        except sqlite3.Error as error:  # met past the open: locked, read-only, ...
            raise errors.APIException(str(unavailable(layout.db, error))) from None
