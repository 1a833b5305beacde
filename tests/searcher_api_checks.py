"""What each name of `determined.searcher` does, for tests/test_determined_api.py: a tiny
SearchMethod run by the runners against a stand-in for the records backend (the seam
`determined.common.experimental._backend.call`), which plays a daemon: it answers a Create
with `trial_created`, a ValidateAfter with a validation, a Close with `trial_closed`, and ends
the experiment at Shutdown. The runners against a real daemon: tests/test_custom_search.py."""

from __future__ import annotations

import pathlib
import uuid
from typing import Any, Callable, Dict, List

import pytest


def _method_class():
    from determined import searcher

    class TwoTrials(searcher.SearchMethod):
        """Two trials, each trained to 2 then 4 batches, then Shutdown; counts calls."""

        def __init__(self) -> None:
            self.calls: List[str] = []
            self.saved = 0

        def initial_operations(self, state):
            self.calls.append("initial")
            return [searcher.Create(uuid.uuid4(), {"x": i}, None) for i in range(2)]

        def on_trial_created(self, state, request_id):
            self.calls.append("created")
            return [searcher.ValidateAfter(request_id, 2)]

        def on_validation_completed(self, state, request_id, metric, train_length):
            self.calls.append(f"validated {train_length}")
            if train_length < 4:
                return [searcher.ValidateAfter(request_id, 4)]
            return [searcher.Close(request_id)]

        def on_trial_closed(self, state, request_id):
            self.calls.append("closed")
            return [searcher.Shutdown()] if len(state.trials_closed) == 2 else []

        def on_trial_exited_early(self, state, request_id, exited_reason):
            return []

        def progress(self, state):
            return len(state.trials_closed) / 2

        def save_method_state(self, path: pathlib.Path) -> None:
            self.saved += 1
            (path / "calls.txt").write_text("\n".join(self.calls))

        def load_method_state(self, path: pathlib.Path) -> None:
            self.calls = (path / "calls.txt").read_text().split("\n")

    return TwoTrials


class FakeRecords:
    """The records backend as a daemon with instant trials would answer it."""

    def __init__(self, stop_after_posts: int = 0) -> None:
        self.events: List[Dict[str, Any]] = []
        self.posted: Dict[int, List[dict]] = {}
        self.state = "ACTIVE"
        self.stop_after_posts = stop_after_posts  # raise (a killed runner) after so many

    def _event(self, **event: Any) -> None:
        self.events.append({"id": len(self.events) + 1, **event})

    def call(self, operation: str, **arguments: Any) -> Any:
        if operation == "searcher.create_experiment":
            import yaml

            assert yaml.safe_load(arguments["config_text"])["searcher"]["name"] == "custom"
            self._event(kind="initial_operations")
            return 5
        if operation == "searcher.events":
            return {"state": self.state,
                    "events": [e for e in self.events if e["id"] > arguments["after"]]}
        assert operation == "searcher.post_operations", operation
        if arguments["event_id"] in self.posted:  # applied once, as the records do
            return {"applied": False}
        self.posted[arguments["event_id"]] = arguments["operations"]
        for op in arguments["operations"]:
            if op["type"] == "create":
                self._event(kind="trial_created", request_id=op["request_id"])
            elif op["type"] == "validate_after":
                self._event(kind="validation_completed", request_id=op["request_id"],
                            metric=0.5, length=op["length"])
            elif op["type"] == "close":
                self._event(kind="trial_closed", request_id=op["request_id"])
            elif op["type"] == "shutdown":
                self.state = "COMPLETED"
        if self.stop_after_posts and len(self.posted) >= self.stop_after_posts:
            raise KeyboardInterrupt("the runner is killed")
        return {"applied": True}


def _run(runner_class: Callable, folder: pathlib.Path, records: FakeRecords, **kw) -> Any:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("determined.common.experimental._backend.call", records.call)
        method = _method_class()()
        runner = runner_class(method, searcher_dir=folder, **kw)
        return runner, method, runner.run({"searcher": {"name": "custom", "metric": "m"}},
                                          model_dir=str(folder))


def _local_runs_to_shutdown(tmp: pathlib.Path) -> bool:
    from determined import searcher

    records = FakeRecords()
    runner, method, experiment_id = _run(searcher.LocalSearchRunner, tmp / "local", records)
    kinds = [op["type"] for ops in records.posted.values() for op in ops]
    return (experiment_id == 5 and kinds.count("create") == 2 and kinds.count("close") == 2
            and kinds[-2:] == ["shutdown", "progress"] and len(runner.state.trials_closed) == 2
            and runner.state.experiment_completed and method.saved == len(records.events) + 1
            and (tmp / "local" / "experiment_id.txt").read_text() == "5")


def _local_resumes(tmp: pathlib.Path) -> bool:
    """Killed after its 3rd post, started again on the same folder: it goes on from its
    saved state, posts nothing twice, and its method has seen each event once."""
    from determined import searcher

    records = FakeRecords(stop_after_posts=3)
    try:
        _run(searcher.LocalSearchRunner, tmp / "resume", records)
    except KeyboardInterrupt:
        pass
    records.stop_after_posts = 0
    runner, method, experiment_id = _run(searcher.LocalSearchRunner, tmp / "resume", records)
    return (experiment_id == 5 and records.state == "COMPLETED"
            and sorted(records.posted) == [e["id"] for e in records.events]
            and method.calls.count("initial") == 1 and method.calls.count("closed") == 2)


def _remote_runs_here(tmp: pathlib.Path) -> bool:
    from determined import searcher

    records = FakeRecords()
    runner, _, experiment_id = _run(searcher.RemoteSearchRunner, tmp / "remote", records,
                                    context=None)
    return experiment_id == 5 and records.state == "COMPLETED"


def _state_round_trip(tmp: pathlib.Path) -> bool:
    from determined import searcher

    state = searcher.SearcherState()
    a, b = uuid.uuid4(), uuid.uuid4()
    state.trials_created |= {a, b}
    state.trials_closed.add(a)
    state.failures.add(b)
    state.trial_progress[a] = 0.5
    state.last_event_id = 9
    method = _method_class()()
    folder = tmp / "state"
    folder.mkdir()
    method.save(state, folder, experiment_id=3)
    loaded, experiment_id = _method_class()().load(folder)
    return loaded == dataclass_copy(state, experiment_id=3) and experiment_id == 3


def dataclass_copy(state, **changes):
    import dataclasses

    return dataclasses.replace(state, **changes)


def searcher_checks(w) -> Dict[str, Callable[[], bool]]:
    from determined import searcher

    request = uuid.uuid4()
    return {
        "SearchMethod": lambda: _local_runs_to_shutdown(w.tmp),
        "LocalSearchRunner": lambda: _local_resumes(w.tmp),
        "RemoteSearchRunner": lambda: _remote_runs_here(w.tmp),
        "SearchRunner": lambda: issubclass(searcher.LocalSearchRunner, searcher.SearchRunner),
        "SearcherState": lambda: _state_round_trip(w.tmp),
        "Operation": lambda: all(issubclass(c, searcher.Operation) for c in (
            searcher.Create, searcher.ValidateAfter, searcher.Close, searcher.Progress,
            searcher.Shutdown)),
        "Create": lambda: searcher.Create(request, {"lr": 0.1}, None)._to_dict() == {
            "type": "create", "request_id": str(request), "hparams": {"lr": 0.1}},
        "ValidateAfter": lambda: searcher.ValidateAfter(request, 8)._to_dict() == {
            "type": "validate_after", "request_id": str(request), "length": 8},
        "Close": lambda: searcher.Close(request)._to_dict() == {
            "type": "close", "request_id": str(request)},
        "Progress": lambda: searcher.Progress(0.25)._to_dict() == {
            "type": "progress", "progress": 0.25},
        "Shutdown": lambda: searcher.Shutdown(failure=True)._to_dict() == {
            "type": "shutdown", "cancel": False, "failure": True}
        and searcher.Shutdown()._to_dict()["cancel"] is False,
        "ExitedReason": lambda: {r.value for r in searcher.ExitedReason} == {
            "ERRORED", "USER_CANCELED", "INVALID_HP"},
    }
