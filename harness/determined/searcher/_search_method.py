"""What a custom search method is made of: the state a runner keeps for it
(`SearcherState`), the operations it answers events with, why a trial exited early, and the
`SearchMethod` interface with its save/load of state into a folder."""

from __future__ import annotations

import abc
import dataclasses
import enum
import json
import pathlib
import uuid
from typing import Any, Dict, List, Optional, Set, Tuple

# The runner's state file inside a saved step's folder; the method adds its own files.
STATE_FILE = "searcher_state.json"


@dataclasses.dataclass
class SearcherState:
    """What the runner knows of the search, handed read-only to every event handler:
    the request ids created, closed and failed, and each trial's progress (0..1)."""

    failures: Set[uuid.UUID] = dataclasses.field(default_factory=set)
    trial_progress: Dict[uuid.UUID, float] = dataclasses.field(default_factory=dict)
    trials_closed: Set[uuid.UUID] = dataclasses.field(default_factory=set)
    trials_created: Set[uuid.UUID] = dataclasses.field(default_factory=set)
    last_event_id: int = 0
    experiment_id: Optional[int] = None
    experiment_completed: bool = False
    experiment_failed: bool = False

    def to_dict(self) -> Dict[str, Any]:
        return {
            "failures": sorted(str(r) for r in self.failures),
            "trialProgress": {str(r): p for r, p in self.trial_progress.items()},
            "trialsClosed": sorted(str(r) for r in self.trials_closed),
            "trialsCreated": sorted(str(r) for r in self.trials_created),
            "lastEventId": self.last_event_id,
            "experimentId": self.experiment_id,
            "experimentCompleted": self.experiment_completed,
            "experimentFailed": self.experiment_failed,
        }

    def from_dict(self, d: Dict[str, Any]) -> None:
        self.failures = {uuid.UUID(r) for r in d.get("failures", [])}
        self.trial_progress = {uuid.UUID(r): p for r, p in d.get("trialProgress", {}).items()}
        self.trials_closed = {uuid.UUID(r) for r in d.get("trialsClosed", [])}
        self.trials_created = {uuid.UUID(r) for r in d.get("trialsCreated", [])}
        self.last_event_id = int(d.get("lastEventId", 0))
        self.experiment_id = d.get("experimentId")
        self.experiment_completed = bool(d.get("experimentCompleted", False))
        self.experiment_failed = bool(d.get("experimentFailed", False))


class ExitedReason(enum.Enum):
    """Why a trial ended before its ValidateAfter was done."""

    ERRORED = "ERRORED"
    USER_CANCELED = "USER_CANCELED"
    INVALID_HP = "INVALID_HP"


class Operation(metaclass=abc.ABCMeta):
    """One thing a search method asks of the experiment."""

    @abc.abstractmethod
    def _to_dict(self) -> Dict[str, Any]:
        """The operation as the records backend takes it."""


class Create(Operation):
    """Create a trial named `request_id` with these hyperparameters (`checkpoint` is taken
    and not used, as in Determined, whose master did not send it on)."""

    def __init__(self, request_id: uuid.UUID, hparams: Dict[str, Any],
                 checkpoint: Optional[Any]) -> None:
        self.request_id = request_id
        self.hparams = json.dumps(hparams)  # Determined kept them as JSON text
        self.checkpoint = checkpoint

    def _to_dict(self) -> Dict[str, Any]:
        return {"type": "create", "request_id": str(self.request_id),
                "hparams": json.loads(self.hparams)}

    def __repr__(self) -> str:
        return f"Create({self.request_id}, {self.hparams})"


class ValidateAfter(Operation):
    """Train the trial until it has trained `length` units in all (the searcher's `unit`:
    batches), then validate it."""

    def __init__(self, request_id: uuid.UUID, length: int) -> None:
        self.request_id = request_id
        self.length = length

    def _to_dict(self) -> Dict[str, Any]:
        return {"type": "validate_after", "request_id": str(self.request_id),
                "length": int(self.length)}

    def __repr__(self) -> str:
        return f"ValidateAfter({self.request_id}, {self.length})"


class Close(Operation):
    """The trial trains no further."""

    def __init__(self, request_id: uuid.UUID) -> None:
        self.request_id = request_id

    def _to_dict(self) -> Dict[str, Any]:
        return {"type": "close", "request_id": str(self.request_id)}

    def __repr__(self) -> str:
        return f"Close({self.request_id})"


class Progress(Operation):
    """How far the search is, from 0 to 1."""

    def __init__(self, progress: float) -> None:
        self.progress = progress

    def _to_dict(self) -> Dict[str, Any]:
        return {"type": "progress", "progress": float(self.progress)}

    def __repr__(self) -> str:
        return f"Progress({self.progress})"


class Shutdown(Operation):
    """End the search: completed, or canceled (`cancel`), or failed (`failure`)."""

    def __init__(self, cancel: bool = False, failure: bool = False) -> None:
        self.cancel = cancel
        self.failure = failure

    def _to_dict(self) -> Dict[str, Any]:
        return {"type": "shutdown", "cancel": bool(self.cancel), "failure": bool(self.failure)}

    def __repr__(self) -> str:
        return f"Shutdown(cancel={self.cancel}, failure={self.failure})"


class SearchMethod:
    """A hyperparameter search of your own: each handler gets the runner's read-only
    `SearcherState` and returns the operations to carry out (`progress` returns a number).
    A method that keeps state of its own saves it in `save_method_state(path)` and reads it
    back in `load_method_state(path)`, so a restarted runner resumes it."""

    @abc.abstractmethod
    def initial_operations(self, searcher_state: SearcherState) -> List[Operation]:
        """The first operations, once, when the experiment starts."""

    @abc.abstractmethod
    def on_trial_created(self, searcher_state: SearcherState,
                         request_id: uuid.UUID) -> List[Operation]:
        """A Create was carried out."""

    @abc.abstractmethod
    def on_validation_completed(self, searcher_state: SearcherState, request_id: uuid.UUID,
                                metric: Any, train_length: int) -> List[Operation]:
        """The trial trained `train_length` units in all and validated: `metric` is the
        searcher metric's value."""

    @abc.abstractmethod
    def on_trial_closed(self, searcher_state: SearcherState,
                        request_id: uuid.UUID) -> List[Operation]:
        """A Close was carried out."""

    @abc.abstractmethod
    def progress(self, searcher_state: SearcherState) -> float:
        """How far the search is, 0..1."""

    @abc.abstractmethod
    def on_trial_exited_early(self, searcher_state: SearcherState, request_id: uuid.UUID,
                              exited_reason: ExitedReason) -> List[Operation]:
        """The trial ended before its ValidateAfter was done; it is already closed."""

    def save(self, searcher_state: SearcherState, path: pathlib.Path, *,
             experiment_id: int) -> None:
        """Write the runner's state and then the method's own into the folder `path`."""
        state = searcher_state.to_dict()
        state["experimentId"] = experiment_id
        path.joinpath(STATE_FILE).write_text(json.dumps(state), encoding="utf-8")
        self.save_method_state(path)

    def save_method_state(self, path: pathlib.Path) -> None:
        """Write the method's own state into the folder `path` (nothing by default)."""

    def load(self, path: pathlib.Path) -> Tuple[SearcherState, int]:
        """Read back what `save` wrote; returns the runner's state and the experiment id."""
        state = json.loads(path.joinpath(STATE_FILE).read_text(encoding="utf-8"))
        searcher_state = SearcherState()
        searcher_state.from_dict(state)
        self.load_method_state(path)
        return searcher_state, int(state["experimentId"])

    def load_method_state(self, path: pathlib.Path) -> None:
        """Read the method's own state back from the folder `path` (nothing by default)."""
