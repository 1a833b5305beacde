"""Determined's custom searcher, localdet's side: a runner script
(`determined.searcher.LocalSearchRunner`) creates a `searcher.name: custom` experiment, reads
its searcher events and posts, for each, the operations its SearchMethod answered. Reached
through the SDK seam (sdk_backend.py: "searcher.create_experiment", "searcher.events",
"searcher.post_operations").

    experiment_id = create_experiment(layout, config_text, Path("."), [])
    events(db, experiment_id, after=0)   # {"state": "ACTIVE", "events": [{"id": 1, ...}]}
    post_operations(layout, db, experiment_id, event_id=1, operations=[
        {"type": "create", "request_id": "9b1e...", "hparams": {"lr": 0.1}}])

A posted batch is carried out here, in the same write transaction that records it under the
event it answers: a runner killed after posting and started again posts the batch again, and
the primary key (experiment, event) makes the second post change nothing. The daemon, which
reads only the records, launches the trials this queues and records what happens to them as
searcher events for the runner to read (search/driver.py; search/methods/custom.py).

Request ids: the runner names trials by UUID; each Create is given the experiment's next
request id (1, 2, 3, ...), kept with its hyperparameters in custom_search_requests until a
ValidateAfter gives the trial a length and the trial is created.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from localdet.operations import creation
from localdet.operations.errors import OperationError
from localdet.paths import Layout
from localdet.records.db import Experiment, StateDB, now
from localdet.records.states import TERMINAL_STATES, ExperimentState, TrialState
from localdet.search.methods.base import derive_seed

# What the runner's events are called (Determined's v1SearcherEvent kinds, snake_case).
_EVENT_KINDS = {
    "initialized": "initial_operations",
    "trial_created": "trial_created",
    "validation_completed": "validation_completed",
    "trial_closed": "trial_closed",
    "trial_exited_early": "trial_exited_early",
}
# The Shutdown event's length holds its flags as bits (search/driver.py reads them).
CANCEL_BIT, FAILURE_BIT = 1, 2


def create_experiment(layout: Layout, config_text: str, model_dir: str | None,
                      includes: Iterable[str], warn: Callable[[str], None] | None = None) -> int:
    """Create the runner's experiment; its config must name `searcher.name: custom`."""
    import yaml

    from localdet.config.experiment import CUSTOM_WAITS

    config = yaml.safe_load(config_text)
    name = (config.get("searcher") or {}).get("name") if isinstance(config, dict) else None
    if name != "custom":
        raise OperationError(f"a search runner's config needs searcher.name custom, not "
                             f"{name!r}; set it in the config")

    def shown(warning: str) -> None:  # the runner is what the waiting sentence asks for
        if warning != CUSTOM_WAITS and warn is not None:
            warn(warning)

    return creation.create_experiment(layout, config_text,
                                      Path(model_dir) if model_dir else None,
                                      includes=[Path(i) for i in includes], warn=shown)


def _custom(db: StateDB, experiment_id: int) -> Experiment:
    experiment = db.experiment(experiment_id)  # NotFound for none
    if experiment.searcher != "custom":
        raise OperationError(f"experiment {experiment_id} has searcher {experiment.searcher}, "
                             "not custom: no search runner drives it")
    return experiment


def _uuids(db: StateDB, experiment_id: int) -> dict[int, str]:
    return dict(db.db.execute("SELECT request_id, request_uuid FROM custom_search_requests "
                              "WHERE experiment_id = ?", [experiment_id]).fetchall())


def events(db: StateDB, experiment_id: int, after: int = 0) -> dict[str, Any]:
    """The experiment's state and its searcher events newer than event id `after`, as the
    runner reads them: {"id", "kind", "request_id" (the runner's UUID), "metric", "length",
    "exited_reason"}."""
    experiment = _custom(db, experiment_id)
    uuids = _uuids(db, experiment_id)
    # A Close of a trial still training stops it (a kill request): that is its close, not an
    # early exit, as under Determined, whose trials stopped at the Close.
    closed = dict(db.db.execute(
        "SELECT request_id, MIN(id) FROM searcher_events WHERE experiment_id = ? AND "
        "kind = 'trial_closed' GROUP BY request_id", [experiment_id]).fetchall())
    found = []
    for row in db.db.execute(
            "SELECT id, kind, request_id, metric, length FROM searcher_events "
            "WHERE experiment_id = ? AND id > ? ORDER BY id", [experiment_id, after]):
        event_id, kind, request_id, metric, length = row
        if kind not in _EVENT_KINDS:
            continue  # the runner's own Shutdown
        if kind == "trial_exited_early" and closed.get(request_id, event_id) < event_id:
            continue
        event: dict[str, Any] = {"id": event_id, "kind": _EVENT_KINDS[kind]}
        if request_id is not None:
            event["request_id"] = uuids.get(request_id)
        if kind == "validation_completed":
            event.update(metric=metric, length=length)
        if kind == "trial_exited_early":
            trial = db.trial_by_request(experiment_id, request_id)
            event["exited_reason"] = (
                "USER_CANCELED" if trial is not None and trial.state == TrialState.CANCELED
                # the daemon's words for a trial that raised det.InvalidHP (daemon/exits.py)
                else "INVALID_HP" if trial is not None and "raised InvalidHP" in (trial.error or "")
                else "ERRORED")
        found.append(event)
    return {"state": experiment.state, "events": found}


def post_operations(layout: Layout, db: StateDB, experiment_id: int, event_id: int,
                    operations: list[dict[str, Any]]) -> dict[str, Any]:
    """Carry out the operations the runner's method answered to event `event_id`, once:
    {"applied": False} when that event's batch was posted before."""
    with db.atomic():
        experiment = _custom(db, experiment_id)
        if db.db.execute("SELECT 1 FROM custom_search_batches WHERE experiment_id = ? AND "
                         "event_id = ?", [experiment_id, event_id]).fetchone():
            return {"applied": False}
        if event_id and db.db.execute(
                "SELECT 1 FROM searcher_events WHERE experiment_id = ? AND id = ?",
                [experiment_id, event_id]).fetchone() is None:
            raise OperationError(f"experiment {experiment_id} has no searcher event {event_id} "
                                 "to answer; the runner's searcher_dir belongs to another "
                                 "experiment or home")
        progress = None
        shut_down = db.db.execute("SELECT 1 FROM searcher_events WHERE experiment_id = ? AND "
                                  "kind = 'shutdown'", [experiment_id]).fetchone()
        # After a Shutdown (or the experiment's end) the method's answers change nothing:
        # they are recorded, as every batch is, and not carried out.
        if experiment.state not in TERMINAL_STATES and not shut_down:
            for operation in operations:
                progress = _apply(db, experiment, operation, progress)
        db.db.execute("INSERT INTO custom_search_batches (experiment_id, event_id, operations, "
                      "progress, at) VALUES (?, ?, ?, ?, ?)",
                      [experiment_id, event_id, json.dumps(operations), progress, now()])
    return {"applied": True}


def progress(db: StateDB, experiment_id: int) -> float | None:
    """The latest progress the runner's method reported (0..1), None before any."""
    row = db.db.execute("SELECT progress FROM custom_search_batches WHERE experiment_id = ? "
                        "AND progress IS NOT NULL ORDER BY event_id DESC LIMIT 1",
                        [experiment_id]).fetchone()
    return row[0] if row else None


def _request_id(db: StateDB, experiment_id: int, request_uuid: str) -> tuple[int, dict, int]:
    row = db.db.execute("SELECT request_id, hparams, seed FROM custom_search_requests "
                        "WHERE experiment_id = ? AND request_uuid = ?",
                        [experiment_id, str(request_uuid)]).fetchone()
    if row is None:
        raise OperationError(f"the search method named request {request_uuid}, which no Create "
                             "made; create a trial before training or closing it")
    return row[0], json.loads(row[1]), row[2]


def _apply(db: StateDB, experiment: Experiment, operation: dict[str, Any],
           progress: float | None) -> float | None:
    kind = operation.get("type")
    eid = experiment.id
    queued = (TrialState.PAUSED if db.experiment(eid).state == ExperimentState.PAUSED
              else TrialState.QUEUED)
    if kind == "create":
        request_uuid = str(operation["request_id"])
        if db.db.execute("SELECT 1 FROM custom_search_requests WHERE experiment_id = ? AND "
                         "request_uuid = ?", [eid, request_uuid]).fetchone():
            raise OperationError(f"the search method created request {request_uuid} twice; "
                                 "give each Create a new uuid.uuid4()")
        (last,) = db.db.execute("SELECT COALESCE(MAX(request_id), 0) FROM "
                                "custom_search_requests WHERE experiment_id = ?",
                                [eid]).fetchone()
        request_id = last + 1
        db.db.execute("INSERT INTO custom_search_requests (experiment_id, request_uuid, "
                      "request_id, hparams, seed) VALUES (?, ?, ?, ?, ?)",
                      [eid, request_uuid, request_id, json.dumps(operation["hparams"]),
                       derive_seed(experiment.experiment_seed, request_id)])
        db.add_searcher_event(eid, "trial_created", request_id)
    elif kind == "validate_after":
        request_id, hparams, seed = _request_id(db, eid, operation["request_id"])
        length = int(operation["length"])
        if length < 1:
            raise OperationError(f"ValidateAfter asked for length {length}; a trial trains "
                                 "at least 1 batch")
        trial = db.trial_by_request(eid, request_id)
        if trial is not None and trial.state not in TERMINAL_STATES \
                and length <= trial.batches_trained:
            raise OperationError(f"ValidateAfter asked request {operation['request_id']} to "
                                 f"train to {length} batches, but it has trained "
                                 f"{trial.batches_trained}; ask for a longer length")
        if trial is None:
            db.create_trial(experiment_id=eid, request_id=request_id, hparams=hparams,
                            seed=seed, target_batches=length, state=queued)
        elif trial.state == TrialState.WAITING:
            db.update_trial(trial.id, state=queued, target_batches=length)
        elif trial.state not in TERMINAL_STATES:
            db.update_trial(trial.id, target_batches=length)
    elif kind == "close":
        request_id, _, _ = _request_id(db, eid, operation["request_id"])
        trial = db.trial_by_request(eid, request_id)
        if trial is not None and trial.state == TrialState.RUNNING:
            db.add_request("kill", trial_id=trial.id)  # its process must end
        elif trial is not None and trial.state not in TERMINAL_STATES:
            db.update_trial(trial.id, state=TrialState.COMPLETED)
        db.add_searcher_event(eid, "trial_closed", request_id)
    elif kind == "progress":
        progress = min(1.0, max(0.0, float(operation["progress"])))
    elif kind == "shutdown":
        cancel, failure = bool(operation.get("cancel")), bool(operation.get("failure"))
        db.add_searcher_event(eid, "shutdown", length=(CANCEL_BIT if cancel else 0)
                              | (FAILURE_BIT if failure else 0))
        for trial in db.trials(eid):
            if trial.state == TrialState.RUNNING:
                if cancel or failure:
                    db.add_request("kill", trial_id=trial.id)
                # otherwise it finishes its length, then the driver closes it
            elif trial.state == TrialState.WAITING and not (cancel or failure):
                db.update_trial(trial.id, state=TrialState.COMPLETED)
            elif trial.state not in TERMINAL_STATES:
                db.update_trial(trial.id, state=TrialState.CANCELED)
    else:
        raise OperationError(f"unknown searcher operation {kind!r}; update localdet and "
                             "determined together")
    return progress
