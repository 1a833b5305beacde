"""An experiment, as the SDK hands it out: its facts, its trials and checkpoints, and what
can be done to it (pause, activate, kill, archive, delete, labels, ...)."""

import enum
import sys
import time
from typing import Any, Dict, Iterator, List, Optional, Set, Union

from determined.common.experimental import _backend, _util, checkpoint, trial
from determined.common.experimental._util import OrderBy


class ExperimentState(enum.Enum):
    """An experiment's state under Determined's names (localdet records ACTIVE, PAUSED,
    COMPLETED, CANCELED and ERROR)."""

    ACTIVE = "STATE_ACTIVE"
    PAUSED = "STATE_PAUSED"
    STOPPING_COMPLETED = "STATE_STOPPING_COMPLETED"
    STOPPING_CANCELED = "STATE_STOPPING_CANCELED"
    STOPPING_ERROR = "STATE_STOPPING_ERROR"
    COMPLETED = "STATE_COMPLETED"
    CANCELED = "STATE_CANCELED"
    ERROR = "STATE_ERROR"
    DELETED = "STATE_DELETED"
    DELETING = "STATE_DELETING"
    DELETE_FAILED = "STATE_DELETE_FAILED"
    STOPPING_KILLED = "STATE_STOPPING_KILLED"
    QUEUED = "STATE_QUEUED"
    PULLING = "STATE_PULLING"
    STARTING = "STATE_STARTING"
    RUNNING = "STATE_RUNNING"


TERMINAL_STATES = {ExperimentState.COMPLETED, ExperimentState.CANCELED,
                   ExperimentState.DELETED, ExperimentState.ERROR}


class ExperimentSortBy(enum.Enum):
    """What `client.list_experiments(sort_by=...)` sorts on."""

    ID = "SORT_BY_ID"
    DESCRIPTION = "SORT_BY_DESCRIPTION"
    START_TIME = "SORT_BY_START_TIME"
    END_TIME = "SORT_BY_END_TIME"
    STATE = "SORT_BY_STATE"
    NUM_TRIALS = "SORT_BY_NUM_TRIALS"
    PROGRESS = "SORT_BY_PROGRESS"
    USER = "SORT_BY_USER"
    NAME = "SORT_BY_NAME"
    FORKED_FROM = "SORT_BY_FORKED_FROM"
    RESOURCE_POOL = "SORT_BY_RESOURCE_POOL"
    PROJECT_ID = "SORT_BY_PROJECT_ID"
    CHECKPOINT_SIZE = "SORT_BY_CHECKPOINT_SIZE"
    CHECKPOINT_COUNT = "SORT_BY_CHECKPOINT_COUNT"
    SEARCHER_METRIC_VAL = "SORT_BY_SEARCHER_METRIC_VAL"


class ExperimentOrderBy(enum.Enum):
    """Determined's older name of `OrderBy` for experiments."""

    ASCENDING = "ORDER_BY_ASC"
    DESCENDING = "ORDER_BY_DESC"


# The facts each sort reads (others sort by id).
_SORT_KEYS = {"ID": "id", "DESCRIPTION": "description", "START_TIME": "submitted_at",
              "END_TIME": "ended_at", "STATE": "state", "PROGRESS": "progress", "NAME": "name",
              "FORKED_FROM": "parent_id", "SEARCHER_METRIC_VAL": "best_metric"}


def _sort_key(facts: Dict[str, Any], sort_by: ExperimentSortBy) -> Any:
    value: Any
    if sort_by is ExperimentSortBy.NUM_TRIALS:
        value = facts.get("num_trials", len(facts.get("trials") or []))
    else:
        value = facts.get(_SORT_KEYS.get(sort_by.name, "id"))
    return (value is None, value if value is not None else 0, facts["id"])


class Experiment:
    """An experiment, usually from `client.create_experiment(...)` or
    `client.get_experiment(id)`.

    Attributes:
        id: its id.
        config: its experiment config (as recorded, defaults filled in).
        state: an `ExperimentState`.
        archived: whether it is archived (left out of the default listings).
        name, description, notes: its texts.
        progress: 0.0 to 1.0.
        labels: its labels (a set; None when it has none).
        project_id, workspace_id: 1 (localdet has one of each).
    """

    def __init__(self, experiment_id: int, session: Any = None) -> None:
        self._id = experiment_id
        self._session = session  # accepted for Determined's signature; no master here
        self.config: Optional[Dict[str, Any]] = None
        self.state: Optional[ExperimentState] = None
        self.labels: Optional[Set[str]] = None
        self.archived: Optional[bool] = None
        self.name: Optional[str] = None
        self.progress: Optional[float] = None
        self.description: Optional[str] = None
        self.notes: Optional[str] = None
        self.project_id: Optional[int] = None
        self.workspace_id: Optional[int] = None

    @property
    def id(self) -> int:
        return self._id

    def _hydrate(self, facts: Dict[str, Any]) -> None:
        self.config = facts.get("config")
        self.state = ExperimentState[facts["state"]]
        self.archived = bool(facts.get("archived"))
        self.name = facts.get("name")
        self.progress = facts.get("progress")
        self.description = facts.get("description")
        self.notes = facts.get("notes")
        self.labels = set(facts.get("labels") or []) or None
        self.project_id = self.workspace_id = 1

    @classmethod
    def _from_facts(cls, facts: Dict[str, Any]) -> "Experiment":
        experiment = cls(facts["id"])
        experiment._hydrate(facts)
        return experiment

    def reload(self) -> None:
        """Read its facts again."""
        self._hydrate(_backend.call("experiment.get", experiment_id=self._id))

    def _set(self, operation: str, **arguments: Any) -> None:
        _backend.call(operation, experiment_id=self._id, **arguments)
        self.reload()

    def set_name(self, name: str) -> None:
        self._set("experiment.set_name", name=name)

    def set_description(self, description: str) -> None:
        self._set("experiment.set_description", description=description)

    def set_notes(self, notes: str) -> None:
        self._set("experiment.set_notes", notes=notes)

    def add_label(self, label: str) -> None:
        """Add a label (a label already there is left as it is)."""
        self._set("experiment.add_label", label=label)

    def remove_label(self, label: str) -> None:
        """Remove a label (one that is not there is no error)."""
        self._set("experiment.remove_label", label=label)

    def set_labels(self, labels: Set[str]) -> None:
        """Replace its labels."""
        self._set("experiment.set_labels", labels=sorted(labels))

    def activate(self) -> None:
        """Resume a paused experiment."""
        _backend.call("experiment.activate", experiment_id=self._id)

    def pause(self) -> None:
        """Checkpoint its running trials at their next boundary and stop them."""
        _backend.call("experiment.pause", experiment_id=self._id)

    def cancel(self) -> None:
        """Stop its trials at their next boundary, with a checkpoint, and end it CANCELED."""
        _backend.call("experiment.cancel", experiment_id=self._id)

    def kill(self) -> None:
        """Stop its trials at once, without a checkpoint."""
        _backend.call("experiment.kill", experiment_id=self._id)

    def archive(self) -> None:
        """Leave it out of the default listings, keeping everything (an ended one only)."""
        _backend.call("experiment.archive", experiment_id=self._id)
        self.archived = True

    def unarchive(self) -> None:
        _backend.call("experiment.unarchive", experiment_id=self._id)
        self.archived = False

    def delete(self) -> None:
        """Delete it: its records, logs, TensorBoard files, model folder and the stored
        checkpoint files no other experiment shares (refused while trials run, or while a
        model version registers one of its checkpoints)."""
        _backend.call("experiment.delete", experiment_id=self._id)

    def download_code(self, output_dir: Optional[str] = None) -> str:
        """Write its model folder, as submitted, to `exp-<id>_model_def.tar.gz` in
        `output_dir` (default: the current folder); returns the file's path."""
        import pathlib

        folder = pathlib.Path(output_dir).expanduser() if output_dir else pathlib.Path(".")
        return str(_backend.call("experiment.download_code", experiment_id=self._id,
                                 output_dir=str(folder.absolute())))

    def list_trials(self, sort_by: trial.TrialSortBy = trial.TrialSortBy.ID,
                    order_by: OrderBy = OrderBy.ASCENDING) -> List[trial.Trial]:
        """Its trials, sorted."""
        return list(self.iter_trials(sort_by, order_by))

    def get_trials(self, sort_by: trial.TrialSortBy = trial.TrialSortBy.ID,
                   order_by: OrderBy = OrderBy.ASCENDING) -> List[trial.Trial]:
        _util.deprecated("Experiment.get_trials()", "Experiment.list_trials()")
        return self.list_trials(sort_by, order_by)

    def iter_trials(self, sort_by: trial.TrialSortBy = trial.TrialSortBy.ID,
                    order_by: OrderBy = OrderBy.ASCENDING,
                    limit: Optional[int] = None) -> Iterator[trial.Trial]:
        """Its trials, sorted (`limit` is a page size for a master: accepted, unused)."""
        found = _backend.call("experiment.trials", experiment_id=self._id)
        keys = {"ID": "id", "START_TIME": "started_at", "END_TIME": "ended_at",
                "STATE": "state", "BATCHES_PROCESSED": "batches_trained",
                "RESTARTS": "restarts"}
        key = keys.get(sort_by.name, "id")
        found.sort(key=lambda t: (t.get(key) is None, t.get(key) or 0, t["id"]),
                   reverse=_util.order_name(order_by) == "desc")
        for facts in found:
            yield trial.Trial._from_facts(facts)

    def await_first_trial(self, interval: float = 0.1) -> trial.Trial:
        """Wait until its first trial exists; RuntimeError if it ends without one."""
        while True:
            self.reload()
            found = _backend.call("experiment.trials", experiment_id=self._id)
            if found:
                return trial.Trial._from_facts(min(found, key=lambda t: t["id"]))
            if self.state in TERMINAL_STATES:
                raise RuntimeError(f"experiment {self._id} ended ({self.state}) before a "
                                   "trial started.")
            time.sleep(interval)

    def wait(self, interval: float = 5.0) -> ExperimentState:
        """Wait until it is COMPLETED, CANCELED or ERROR, and return that state; ValueError
        if it is paused (activate it first)."""
        waited = 0.0
        while True:
            self.reload()
            if self.state in TERMINAL_STATES:
                return self.state  # type: ignore[return-value]
            if self.state is ExperimentState.PAUSED:
                raise ValueError(f"Experiment {self._id} is in paused state. Make sure the "
                                 "experiment is active.")
            time.sleep(interval)
            waited += interval
            if waited % 60 == 0:
                print(f"Waiting for Experiment {self._id} to complete. Elapsed "
                      f"{waited / 60} minutes", file=sys.stderr)

    def list_checkpoints(self, sort_by: Optional[Union[str, checkpoint.CheckpointSortBy]] = None,
                         order_by: Optional[OrderBy] = None,
                         max_results: Optional[int] = None) -> List[checkpoint.Checkpoint]:
        """Its live checkpoints, sorted by `sort_by` (a `CheckpointSortBy` or a validation
        metric's name) in `order_by` order (both or neither; neither: by the searcher
        metric, best first), at most `max_results`."""
        arguments = checkpoint._checkpoint._sort_arguments(sort_by, order_by)
        found = _backend.call("checkpoint.list", experiment_id=self._id,
                              max_results=max_results, **arguments)
        return [checkpoint.Checkpoint._from_facts(f) for f in found]

    def top_checkpoint(self, sort_by: Optional[str] = None,
                       smaller_is_better: Optional[bool] = None) -> checkpoint.Checkpoint:
        """Its best checkpoint: by the searcher metric, or by the validation metric
        `sort_by` (`smaller_is_better` None: the experiment's setting)."""
        _util.deprecated("Experiment.top_checkpoint()",
                         "Experiment.list_checkpoints(max_results=1)")
        found = self._best(1, sort_by, smaller_is_better)
        if not found:
            raise AssertionError(f"No checkpoints found for experiment {self._id}")
        return found[0]

    def top_n_checkpoints(self, limit: int, sort_by: Optional[str] = None,
                          smaller_is_better: Optional[bool] = None
                          ) -> List[checkpoint.Checkpoint]:
        """The best checkpoint of each of its `limit` best trials, best first."""
        _util.deprecated("Experiment.top_n_checkpoints()",
                         "Experiment.list_checkpoints(max_results=n)")
        found = self._best(None, sort_by, smaller_is_better)
        if not found:
            raise AssertionError(f"No checkpoint found for experiment {self._id}")
        trials: Set[int] = set()
        best = []
        for c in found:
            if c.training is not None and c.training.trial_id not in trials:
                trials.add(c.training.trial_id)
                best.append(c)
        return best[:limit]

    def _best(self, max_results: Optional[int], metric: Optional[str],
              smaller_is_better: Optional[bool]) -> List[checkpoint.Checkpoint]:
        # As Determined: smaller_is_better applies to a named metric only.
        order = None if metric is None or smaller_is_better is None else (
            "asc" if smaller_is_better else "desc")
        found = _backend.call("checkpoint.list", experiment_id=self._id, metric=metric,
                              order=order, max_results=max_results)
        return [checkpoint.Checkpoint._from_facts(f) for f in found]

    def delete_tensorboard_files(self) -> None:
        from determined import errors

        raise errors.refuse("Experiment.delete_tensorboard_files",
                            "its TensorBoard files go with Experiment.delete()")

    def move_to_project(self, workspace_name: str, project_name: str) -> None:
        from determined import errors

        raise errors.refuse("Experiment.move_to_project (workspaces and projects)",
                            "localdet keeps every experiment in one list; use labels")

    def get_pachyderm_config(self) -> Dict[str, Any]:
        if self.config is None:
            self.reload()
        try:
            return dict((self.config or {})["integrations"]["pachyderm"])
        except (KeyError, TypeError):
            raise ValueError(f"No Pachyderm configuration found for experiment "
                             f"{self._id}.") from None

    def __repr__(self) -> str:
        return f"Experiment(id={self._id})"


trial.Trial._experiment_class = Experiment


class ExperimentReference(Experiment):
    """Determined's older name of `Experiment`."""

    def __init__(self, experiment_id: int, session: Any = None) -> None:
        _util.deprecated("ExperimentReference", "Experiment")
        super().__init__(experiment_id, session)
