"""The model registry, as the SDK hands it out: named models (`Model`) whose numbered
versions (`ModelVersion`) each point at a checkpoint."""

import datetime
import enum
from typing import Any, Dict, Iterable, List, Optional

from determined.common.experimental import _backend, _util, checkpoint, metrics
from determined.common.experimental._util import OrderBy


def _time(text: Optional[str]) -> Optional[datetime.datetime]:
    return datetime.datetime.fromisoformat(text) if text else None


class ModelVersion:
    """One registered version of a model, usually from `Model.register_version()`,
    `Model.get_version()` or `Model.list_versions()`.

    Attributes:
        model_name, model_id: its model.
        model_version: its number (1, 2, ...).
        checkpoint: the `Checkpoint` it registers.
        name, comment, notes, metadata: its texts and metadata.
    """

    def __init__(self, session: Any = None, model_version: int = 0,
                 model_name: str = "") -> None:
        self._session = session  # accepted for Determined's signature; no master here
        self.model_name = model_name
        self.model_version = model_version
        self.model_id: Optional[int] = None
        self.checkpoint: Optional[checkpoint.Checkpoint] = None
        self.metadata: Optional[Dict[str, Any]] = None
        self.name: Optional[str] = None
        self.comment: Optional[str] = None
        self.notes: Optional[str] = None

    def _hydrate(self, facts: Dict[str, Any]) -> None:
        self.model_version = facts["version"]
        self.model_name = facts.get("model_name") or facts.get("model") or self.model_name
        self.model_id = facts.get("model_id")
        self.checkpoint = (checkpoint.Checkpoint._from_facts(facts["checkpoint"])
                           if facts.get("checkpoint") else None)
        self.metadata = facts.get("metadata") or {}
        self.name = facts.get("name") or ""
        self.comment = facts.get("comment") or ""
        self.notes = facts.get("notes") or ""

    @classmethod
    def _from_facts(cls, facts: Dict[str, Any]) -> "ModelVersion":
        version = cls(model_version=facts["version"])
        version._hydrate(facts)
        return version

    def reload(self) -> None:
        facts = _backend.call("model.get_version", model=self.model_name,
                              version=self.model_version)
        if facts is None:
            from determined.common.api import errors

            raise errors.NotFoundException(f"model {self.model_name!r} has no versions")
        self._hydrate(facts)

    def _update(self, **fields: Any) -> None:
        self._hydrate(_backend.call("model.update_version", model=self.model_name,
                                    version=self.model_version, **fields))

    def set_name(self, name: str) -> None:
        self._update(name=name)

    def set_notes(self, notes: str) -> None:
        self._update(notes=notes)

    def delete(self) -> None:
        """Delete this version (its checkpoint is then no longer kept for it)."""
        _backend.call("model.delete_version", model=self.model_name,
                      version=self.model_version)

    def iter_metrics(self, group: Optional[str] = None) -> Iterable[metrics.TrialMetrics]:
        """The metrics of inference tasks that reported using this version: none are
        recorded by localdet, so this yields nothing."""
        return iter(())

    def get_metrics(self, group: Optional[str] = None) -> Iterable[metrics.TrialMetrics]:
        _util.deprecated("ModelVersion.get_metrics()", "ModelVersion.iter_metrics()")
        return self.iter_metrics(group)

    def __repr__(self) -> str:
        return f"ModelVersion(model={self.model_name}, version={self.model_version})"


class ModelSortBy(enum.Enum):
    """What `client.list_models(sort_by=...)` sorts on."""

    NAME = "SORT_BY_NAME"
    DESCRIPTION = "SORT_BY_DESCRIPTION"
    CREATION_TIME = "SORT_BY_CREATION_TIME"
    LAST_UPDATED_TIME = "SORT_BY_LAST_UPDATED_TIME"
    NUM_VERSIONS = "SORT_BY_NUM_VERSIONS"
    WORKSPACE = "SORT_BY_WORKSPACE"


class ModelOrderBy(enum.Enum):
    """Determined's older name of `OrderBy` for models."""

    ASCENDING = "ORDER_BY_ASC"
    ASC = "ORDER_BY_ASC"
    DESCENDING = "ORDER_BY_DESC"
    DESC = "ORDER_BY_DESC"


class Model:
    """A named model of the registry, usually from `client.create_model(name)` or
    `client.get_model(name)`.

    Attributes:
        name, model_id, description, metadata, labels, archived.
        creation_time, last_updated_time: datetimes.
        username: "" (localdet has no users); workspace_id: 1.
    """

    def __init__(self, session: Any = None, name: str = "") -> None:
        self._session = session  # accepted for Determined's signature; no master here
        self.name = name
        self.model_id: Optional[int] = None
        self.description: Optional[str] = None
        self.creation_time: Optional[datetime.datetime] = None
        self.last_updated_time: Optional[datetime.datetime] = None
        self.metadata: Optional[Dict[str, Any]] = None
        self.labels: Optional[List[str]] = None
        self.username: Optional[str] = None
        self.workspace_id: Optional[int] = None
        self.archived: Optional[bool] = None
        self.notes: Optional[str] = None

    def _hydrate(self, facts: Dict[str, Any]) -> None:
        self.name = facts["name"]
        self.model_id = facts["id"]
        self.description = facts.get("description") or ""
        self.notes = facts.get("notes") or ""
        self.creation_time = _time(facts.get("creation_time"))
        self.last_updated_time = _time(facts.get("last_updated_time"))
        self.metadata = facts.get("metadata") or {}
        self.labels = list(facts.get("labels") or [])
        self.username = ""
        self.workspace_id = 1
        self.archived = bool(facts.get("archived"))

    @classmethod
    def _from_facts(cls, facts: Dict[str, Any]) -> "Model":
        model = cls(name=facts["name"])
        model._hydrate(facts)
        return model

    def reload(self) -> None:
        self._hydrate(_backend.call("model.get", model=self.name))

    def _update(self, **fields: Any) -> None:
        self._hydrate(_backend.call("model.update", model=self.name, **fields))

    def get_version(self, version: int = -1) -> Optional[ModelVersion]:
        """Version `version`, or with -1 the latest (None when it has no versions)."""
        facts = _backend.call("model.get_version", model=self.name, version=version)
        return ModelVersion._from_facts(facts) if facts is not None else None

    def list_versions(self, order_by: OrderBy = OrderBy.DESC) -> List[ModelVersion]:
        """Its versions, newest first by default."""
        found = _backend.call("model.list_versions", model=self.name,
                              order=_util.order_name(order_by))
        return [ModelVersion._from_facts(f) for f in found]

    def get_versions(self, order_by: OrderBy = OrderBy.DESC) -> List[ModelVersion]:
        _util.deprecated("Model.get_versions()", "Model.list_versions()")
        return self.list_versions(order_by)

    def register_version(self, checkpoint_uuid: str) -> ModelVersion:
        """Register the checkpoint as this model's next version; the checkpoint is kept
        (from retention and `gc`) until the version is deleted."""
        return ModelVersion._from_facts(_backend.call(
            "model.register_version", model=self.name, checkpoint_uuid=checkpoint_uuid))

    def add_metadata(self, metadata: Dict[str, Any]) -> None:
        """Merge `metadata` into the model's (its keys replace those already there)."""
        self._update(metadata={**(self.metadata or {}), **metadata})

    def remove_metadata(self, keys: List[str]) -> None:
        """Remove the top-level `keys` from the model's metadata."""
        if isinstance(keys, str) or not all(isinstance(k, str) for k in keys):
            raise ValueError(f"remove_metadata() requires a list of strings as input but "
                             f"got: {keys}")
        self._update(metadata={k: v for k, v in (self.metadata or {}).items()
                               if k not in keys})

    def set_labels(self, labels: List[str]) -> None:
        if isinstance(labels, str) or not isinstance(labels, Iterable):
            raise ValueError(f"set_labels() requires a list of strings as input but got: "
                             f"{labels}")
        self._update(labels=list(labels))

    def set_description(self, description: str) -> None:
        self._update(description=description)

    def archive(self) -> None:
        _backend.call("model.archive", model=self.name)
        self.archived = True

    def unarchive(self) -> None:
        _backend.call("model.unarchive", model=self.name)
        self.archived = False

    def delete(self) -> None:
        """Delete the model and its versions (their checkpoints are then no longer kept
        for them)."""
        _backend.call("model.delete", model=self.name)

    def move_to_workspace(self, workspace_name: str) -> None:
        from determined import errors

        raise errors.refuse("Model.move_to_workspace (workspaces)",
                            "localdet keeps every model in one registry; use labels")

    def __repr__(self) -> str:
        import json

        return (f"Model(id={self.model_id}, name={self.name}, "
                f"metadata={json.dumps(self.metadata)})")
