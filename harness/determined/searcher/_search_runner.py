"""Running a SearchMethod against an experiment: `SearchRunner` turns each searcher event
into the method's call and its answer into operations; `LocalSearchRunner` creates the
experiment, loops until it ends, and keeps in `searcher_dir` what a restart resumes from.

Resuming: before posting the operations that answer an event, the runner saves the event's
id, its own state, the method's state and those operations (in a new folder, made current by
an atomic rename of one file). A runner started again on the same `searcher_dir` loads the
current folder, posts its operations again (the records apply a batch once per event, so a
batch posted before the kill changes nothing) and goes on from the next event."""

from __future__ import annotations

import json
import logging
import os
import pathlib
import shutil
import time
import uuid
from typing import Any, Dict, Iterable, List, Optional, Union

from determined.common.experimental import _backend
from determined.searcher._search_method import (
    ExitedReason,
    Operation,
    Progress,
    SearcherState,
    SearchMethod,
)

logger = logging.getLogger("determined.searcher")

EXPERIMENT_ID_FILE = "experiment_id.txt"
_CURRENT = "current"  # names the folder of the last saved step
_ENDED = ("COMPLETED", "CANCELED", "ERROR", "DELETED")
POLL_SECONDS = 0.5  # how often the runner looks for new events


class SearchRunner:
    """Feeds a SearchMethod the experiment's searcher events and collects its operations."""

    def __init__(self, search_method: SearchMethod) -> None:
        self.search_method = search_method
        self.state = SearcherState()

    def _operations_for(self, event: Dict[str, Any]) -> List[Operation]:
        """The method's answer to one event (plus its progress after a trial's news), the
        runner's state updated first, as the method expects to see it."""
        kind, method, state = event["kind"], self.search_method, self.state
        request_id = uuid.UUID(event["request_id"]) if event.get("request_id") else None
        if kind == "initial_operations":
            return list(method.initial_operations(state))
        if request_id is None:
            raise RuntimeError(f"searcher event {event['id']} ({kind}) names no request")
        if kind == "trial_created":
            state.trials_created.add(request_id)
            state.trial_progress[request_id] = 0.0
            return list(method.on_trial_created(state, request_id))
        if kind == "validation_completed":
            operations = list(method.on_validation_completed(
                state, request_id, event["metric"], int(event["length"])))
        elif kind == "trial_closed":
            state.trials_closed.add(request_id)
            operations = list(method.on_trial_closed(state, request_id))
        elif kind == "trial_exited_early":
            reason = ExitedReason(event.get("exited_reason", "ERRORED"))
            if reason == ExitedReason.ERRORED:
                state.failures.add(request_id)
            elif reason == ExitedReason.INVALID_HP:
                state.trial_progress.pop(request_id, None)
            operations = list(method.on_trial_exited_early(state, request_id, reason))
        else:
            raise RuntimeError(f"searcher event {event['id']} has an unknown kind {kind!r}; "
                               "update determined and localdet together")
        return operations + [Progress(method.progress(state))]

    def run_experiment(self, experiment_id: int,
                       prior_operations: Optional[List[Operation]] = None,
                       sleep_time: Optional[float] = None) -> None:
        """Answer the experiment's events until it ends. `prior_operations`: those saved for
        `state.last_event_id`, posted again (the records take a batch once)."""
        if prior_operations is not None and self.state.last_event_id:
            self._post(experiment_id, self.state.last_event_id, prior_operations)
        told_paused = False
        while True:
            reply = _backend.call("searcher.events", experiment_id=experiment_id,
                                  after=self.state.last_event_id)
            for event in reply["events"]:
                operations = self._operations_for(event)
                self.state.last_event_id = int(event["id"])
                self.save_state(experiment_id, operations)
                self._post(experiment_id, self.state.last_event_id, operations)
            if reply["events"]:
                continue
            if reply["state"] in _ENDED:
                self.state.experiment_completed = reply["state"] == "COMPLETED"
                self.state.experiment_failed = reply["state"] == "ERROR"
                logger.info(f"experiment {experiment_id} ended {reply['state']}")
                return
            if reply["state"] == "PAUSED" and not told_paused:
                logger.warning(f"experiment {experiment_id} is paused; the search goes on "
                               "when it is activated (`localdet resume`)")
            told_paused = reply["state"] == "PAUSED"
            time.sleep(POLL_SECONDS if sleep_time is None else sleep_time)

    def _post(self, experiment_id: int, event_id: int, operations: List[Operation]) -> None:
        _backend.call("searcher.post_operations", experiment_id=experiment_id,
                      event_id=event_id, operations=[op._to_dict() for op in operations])

    def save_state(self, experiment_id: int, operations: List[Operation]) -> None:
        """Keep what a restart resumes from (nothing by default)."""


def _config_text(exp_config: Union[Dict[str, Any], str, os.PathLike]) -> str:
    import yaml

    if isinstance(exp_config, dict):
        return yaml.safe_dump(exp_config)
    return pathlib.Path(exp_config).read_text(encoding="utf-8")


class LocalSearchRunner(SearchRunner):
    """Runs a SearchMethod in this process against an experiment it creates (or, with a
    `searcher_dir` from an earlier run, the experiment that run created)."""

    def __init__(self, search_method: SearchMethod,
                 searcher_dir: Optional[Union[str, pathlib.Path]] = None,
                 session: Any = None) -> None:
        super().__init__(search_method)
        self.session = session  # Determined's API session: unused, the records are local
        self.searcher_dir = pathlib.Path(searcher_dir) if searcher_dir else pathlib.Path.cwd()
        if self.searcher_dir.exists() and not self.searcher_dir.is_dir():
            raise FileExistsError(f"searcher_dir {self.searcher_dir} is a file; name a folder")
        self.searcher_dir.mkdir(parents=True, exist_ok=True)

    def run(self, exp_config: Union[Dict[str, Any], str],
            model_dir: Optional[str] = None,
            includes: Optional[Iterable[Union[str, pathlib.Path]]] = None) -> int:
        """Create the experiment (config: a dict or a YAML file's path; `model_dir`: the
        model folder, the current one by default) or resume the one `searcher_dir` holds,
        and run the search until it ends; returns the experiment's id."""
        id_file = self.searcher_dir / EXPERIMENT_ID_FILE
        operations: Optional[List[Operation]] = None
        if id_file.exists():
            experiment_id = int(id_file.read_text().strip())
            operations = self.load_state(experiment_id)
            logger.info(f"resuming the search of experiment {experiment_id} after event "
                        f"{self.state.last_event_id}")
        else:
            experiment_id = int(_backend.call(
                "searcher.create_experiment", config_text=_config_text(exp_config),
                model_dir=str(model_dir or os.getcwd()),
                includes=[str(i) for i in includes or ()]))
            self.state.experiment_id = experiment_id
            self.save_state(experiment_id, [])
            _replace(id_file, str(experiment_id))
            logger.info(f"Created experiment {experiment_id}")
        self.run_experiment(experiment_id, operations)
        return experiment_id

    def _experiment_dir(self, experiment_id: int) -> pathlib.Path:
        return self.searcher_dir / f"exp_{experiment_id}"

    def save_state(self, experiment_id: int, operations: List[Operation]) -> None:
        folder = self._experiment_dir(experiment_id)
        step = folder / f"event_{self.state.last_event_id}"
        if step.exists():
            shutil.rmtree(step)  # a save interrupted before it became current
        step.mkdir(parents=True)
        self.search_method.save(self.state, step, experiment_id=experiment_id)
        (step / "operations.json").write_text(
            json.dumps([op._to_dict() for op in operations]), encoding="utf-8")
        previous = _current(folder)
        _replace(folder / _CURRENT, step.name)
        if previous is not None and previous != step.name:
            shutil.rmtree(folder / previous, ignore_errors=True)

    def load_state(self, experiment_id: int) -> List[Operation]:
        """Restore the runner's and the method's state; returns the operations saved with
        them (to post again)."""
        folder = self._experiment_dir(experiment_id)
        name = _current(folder)
        if name is None:
            raise FileNotFoundError(f"{folder} holds no saved search state; remove "
                                    f"{self.searcher_dir / EXPERIMENT_ID_FILE} to start anew")
        step = folder / name
        self.state, saved_id = self.search_method.load(step)
        if saved_id != experiment_id:
            raise RuntimeError(f"{step} holds the search of experiment {saved_id}, not "
                               f"{experiment_id}; use a searcher_dir of its own per search")
        return [_operation(d) for d in json.loads((step / "operations.json").read_text())]


def _current(folder: pathlib.Path) -> Optional[str]:
    path = folder / _CURRENT
    return path.read_text().strip() if path.exists() else None


def _replace(path: pathlib.Path, text: str) -> None:
    """Write `text` to `path` atomically: the old content or the new, never a mix."""
    temporary = path.with_name(path.name + ".new")
    with temporary.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)


def _operation(d: Dict[str, Any]) -> Operation:
    from determined.searcher._search_method import Close, Create, Shutdown, ValidateAfter

    kind = d["type"]
    if kind == "create":
        return Create(uuid.UUID(d["request_id"]), d["hparams"], None)
    if kind == "validate_after":
        return ValidateAfter(uuid.UUID(d["request_id"]), d["length"])
    if kind == "close":
        return Close(uuid.UUID(d["request_id"]))
    if kind == "progress":
        return Progress(d["progress"])
    if kind == "shutdown":
        return Shutdown(cancel=d["cancel"], failure=d["failure"])
    raise ValueError(f"unknown saved operation {kind!r}")
