"""A recorded checkpoint, as the SDK hands it out: its facts, its files
(`download`), its metadata (`add_metadata`, `remove_metadata`) and `delete`."""

import dataclasses
import enum
import json
import pathlib
from typing import Any, Dict, Iterable, List, Optional

from determined.common.experimental import _backend, _util


class DownloadMode(enum.Enum):
    """How `Checkpoint.download` reaches the files. localdet reads them from the store the
    checkpoint's experiment uses in every mode (there is no master to proxy through)."""

    DIRECT = "direct"
    MASTER = "master"
    AUTO = "auto"

    def __str__(self) -> str:
        return self.value


class ModelFramework(enum.Enum):
    PYTORCH = 1
    TENSORFLOW = 2


class CheckpointState(enum.Enum):
    """COMPLETED: its files are stored; DELETED: deleted (by retention, `gc` or
    `delete()`), its record kept."""

    ACTIVE = "STATE_ACTIVE"
    COMPLETED = "STATE_COMPLETED"
    ERROR = "STATE_ERROR"
    DELETED = "STATE_DELETED"
    PARTIALLY_DELETED = "STATE_PARTIALLY_DELETED"


class CheckpointOrderBy(enum.Enum):
    """Determined's older name of `OrderBy` for checkpoints."""

    ASC = "ORDER_BY_ASC"
    DESC = "ORDER_BY_DESC"


class CheckpointSortBy(enum.Enum):
    """What `list_checkpoints(sort_by=...)` sorts on, beside a validation metric's name."""

    UUID = "SORT_BY_UUID"
    TRIAL_ID = "SORT_BY_TRIAL_ID"
    BATCH_NUMBER = "SORT_BY_BATCH_NUMBER"
    END_TIME = "SORT_BY_END_TIME"
    STATE = "SORT_BY_STATE"
    SEARCHER_METRIC = "SORT_BY_SEARCHER_METRIC"


@dataclasses.dataclass
class CheckpointTrainingMetadata:
    """Where a checkpoint came from: its experiment's config, ids, the trial's
    hyperparameters and the validation recorded at its batch (`{"avgMetrics": {...}}`)."""

    experiment_config: Dict[str, Any]
    experiment_id: int
    trial_id: int
    hparams: Dict[str, Any]
    validation_metrics: Dict[str, Any]


def _sort_arguments(sort_by: Any, order_by: Optional[_util.OrderBy]) -> Dict[str, Any]:
    """The backend's arguments for Determined's `list_checkpoints(sort_by, order_by)`."""
    if (sort_by is None) != (order_by is None):
        raise AssertionError("sort_by and order_by must be either both set, or neither.")
    if sort_by is not None and not isinstance(sort_by, (CheckpointSortBy, str)):
        raise ValueError("sort_by must be of type CheckpointSortBy or str")
    arguments: Dict[str, Any] = {"order": _util.order_name(order_by)}
    if isinstance(sort_by, CheckpointSortBy):
        arguments["sort_by"] = sort_by.name.lower()
    elif isinstance(sort_by, str):
        arguments["metric"] = sort_by
    return arguments


class Checkpoint:
    """A checkpoint of a trained model, usually from `client.get_checkpoint(uuid)`,
    `Experiment.top_checkpoint()` or `Trial.list_checkpoints()`.

    Attributes:
        uuid: its id.
        task_id, allocation_id: `trial-<id>`, where its trial ran.
        report_time: when it was recorded (ISO 8601).
        resources: its files, by name, with their sizes in bytes.
        metadata: its metadata (the keys it was saved with and any added since).
        state: a `CheckpointState`.
        training: a `CheckpointTrainingMetadata`.
    """

    def __init__(self, session: Any = None, uuid: str = "") -> None:
        self._session = session  # accepted for Determined's signature; no master here
        self.uuid = uuid
        self.task_id: Optional[str] = None
        self.allocation_id: Optional[str] = None
        self.report_time: Optional[str] = None
        self.resources: Optional[Dict[str, Any]] = None
        self.metadata: Optional[Dict[str, Any]] = None
        self.state: Optional[CheckpointState] = None
        self.training: Optional[CheckpointTrainingMetadata] = None

    def _hydrate(self, facts: Dict[str, Any]) -> None:
        self.uuid = facts["uuid"]
        self.task_id = self.allocation_id = f"trial-{facts['trial_id']}"
        self.report_time = facts["created_at"]
        if "resources" in facts:
            self.resources = facts["resources"]
        self.metadata = dict(facts["metadata"])
        self.state = CheckpointState[facts["state"]]
        config = facts.get("experiment_config")
        if config is None and self.training is not None:
            config = self.training.experiment_config
        self.training = CheckpointTrainingMetadata(
            experiment_config=config or {}, experiment_id=facts["experiment_id"],
            trial_id=facts["trial_id"], hparams=facts.get("hparams") or {},
            validation_metrics={"avgMetrics": facts.get("validation_metrics") or {}})

    @classmethod
    def _from_facts(cls, facts: Dict[str, Any]) -> "Checkpoint":
        checkpoint = cls(uuid=facts["uuid"])
        checkpoint._hydrate(facts)
        return checkpoint

    def reload(self) -> None:
        """Read its facts again."""
        self._hydrate(_backend.call("checkpoint.get", uuid=self.uuid))

    def download(self, path: Optional[str] = None,
                 mode: DownloadMode = DownloadMode.AUTO) -> str:
        """Write the checkpoint's files into `path` (default `checkpoints/<uuid>` under the
        current folder) and return that path; a folder already holding its
        `metadata.json` is returned as it is. Load a Keras checkpoint with
        `determined.keras.load_model_from_checkpoint_path(path)`."""
        if not isinstance(mode, DownloadMode):
            raise ValueError(f"Unknown download mode {mode}")
        if self.state is None:
            self.reload()
        if self.state not in (CheckpointState.COMPLETED, CheckpointState.PARTIALLY_DELETED):
            raise ValueError(
                f"checkpoint {self.uuid} is {self.state.name if self.state else 'unknown'}, "
                "and only a COMPLETED one can be downloaded (localdet)")
        target = pathlib.Path(path) if path is not None else pathlib.Path("checkpoints",
                                                                         self.uuid)
        # An absolute path: a backend in another process has another working folder.
        _backend.call("checkpoint.download", uuid=self.uuid, path=str(target.absolute()))
        return str(target)

    def load(self, path: Optional[str] = None, tags: Optional[List[str]] = None,
             **kwargs: Any) -> Any:
        """Determined 0.17's one step: `download(path)`, then the Keras model from it
        (`determined.keras.load_model_from_checkpoint_path`; `kwargs` were for PyTorch and
        are not used)."""
        return Checkpoint.load_from_path(self.download(path), tags=tags, **kwargs)

    @staticmethod
    def load_from_path(path: str, tags: Optional[List[str]] = None, **kwargs: Any) -> Any:
        """The Keras model of a downloaded checkpoint folder (Determined 0.17's name of
        `determined.keras.load_model_from_checkpoint_path`)."""
        from determined import keras

        return keras.load_model_from_checkpoint_path(path, tags=tags)

    def write_metadata_file(self, path: str) -> None:
        """Write the checkpoint's metadata, as JSON, to the file `path`."""
        if self.metadata is None:
            self.reload()
        with open(path, "w") as f:
            json.dump(self.metadata, f, indent=2)

    def add_metadata(self, metadata: Dict[str, Any]) -> None:
        """Merge `metadata` (a JSON-able dict) into the checkpoint's recorded metadata; its
        keys replace those already there. The stored files are not changed."""
        self.metadata = _backend.call("checkpoint.add_metadata", uuid=self.uuid,
                                      metadata=metadata)

    def remove_metadata(self, keys: List[str]) -> None:
        """Remove the top-level `keys` from the checkpoint's recorded metadata."""
        self.metadata = _backend.call("checkpoint.remove_metadata", uuid=self.uuid,
                                      keys=list(keys))

    def delete(self) -> None:
        """Delete the checkpoint: its record is marked deleted at once and its files go
        when `localdet gc` (or the daemon) collects them. Refused while a model version
        registers it."""
        facts = _backend.call("checkpoint.delete", uuid=self.uuid)
        self.state = CheckpointState[facts["state"]]

    def remove_files(self, globs: List[str]) -> None:
        from determined import errors

        raise errors.refuse("Checkpoint.remove_files (deleting some files of a stored "
                            "checkpoint)", "a checkpoint's files are kept whole; "
                            "download it and keep the files you need")

    def get_metrics(self, group: Optional[str] = None) -> Iterable[Any]:
        """The metrics of the inference tasks that reported using this checkpoint: none
        are recorded by localdet, so this yields nothing."""
        return iter(())

    def get_pachyderm_commit(self) -> str:
        if self.training is None:
            self.reload()
        config = self.training.experiment_config if self.training else {}
        try:
            return str(config["integrations"]["pachyderm"]["dataset"]["commit"])
        except (KeyError, TypeError):
            raise ValueError(f"checkpoint {self.uuid}'s experiment config has no "
                             "integrations.pachyderm.dataset.commit") from None

    def __repr__(self) -> str:
        trial = f", trial_id={self.training.trial_id}" if self.training else ""
        return f"Checkpoint(uuid={self.uuid}, task_id={self.task_id}{trial})"
