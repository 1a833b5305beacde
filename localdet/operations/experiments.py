"""What users do to experiments, once for every spelling (`localdet`, `det`, the dashboard,
the SDK): describe and list them, name, describe, annotate and label them, archive them,
pause, activate, cancel or kill them, and change their priority, slot cap and checkpoint
retention.

    list_experiments(db, labels=["baseline"])       # light summaries, archived ones left out
    describe(layout, db, 3)                         # the full facts, labels, notes, lineage
    add_label(db, 3, "baseline"); archive(db, 3)
    act(layout, db, "pause", experiment_id=3)       # "pause requested for experiment 3"
    set_gc_policy(db, 3, save_trial_best=2)

Each returns plain data and raises OperationError (one sentence) or NotFound.
"""

from __future__ import annotations

import copy
import json
import math
from typing import Any, Iterable

from localdet.operations.errors import OperationError
from localdet.operations.facts import experiment_facts, job_facts
from localdet.paths import Layout
from localdet.records import catalog
from localdet.records.actions import ActionError, request
from localdet.records.db import StateDB
from localdet.records.states import TERMINAL_STATES, ExperimentKind, ExperimentState

# Determined's action names -> the requests localdet records (localdet/records/lifecycle.py).
# Determined's cancel stopped an experiment for good, as a kill does here: localdet keeps the
# checkpoints a trial has made either way.
ACTIONS = {"pause": "pause", "activate": "resume", "resume": "resume", "cancel": "kill",
           "kill": "kill"}


# -- reading ----------------------------------------------------------------------------------

def describe(layout: Layout, db: StateDB, experiment_id: int) -> dict[str, Any]:
    """Everything `localdet status EXP --json` shows (a job's facts for a job), with the
    description, config, labels, notes, archived flag and lineage: `parent_id` (forked from),
    `forks` (the experiments forked from this one) and `continued` (each `det e continue`:
    when, from which checkpoint, and what it changed)."""
    experiment = db.experiment(experiment_id)
    facts = job_facts(db, layout, experiment) if experiment.kind == ExperimentKind.JOB \
        else experiment_facts(db, experiment)
    forks = [row[0] for row in db.db.execute(
        "SELECT id FROM experiments WHERE parent_id = ? ORDER BY id", [experiment_id])]
    continued = [{"at": e["at"], **e["payload"]}
                 for e in db.events(experiment_id, kinds=("experiment_continued",))]
    return {
        **facts,
        "description": experiment.description,
        "notes": experiment.notes,
        "labels": catalog.labels_of(db, [experiment_id])[experiment_id],
        "archived": experiment.archived,
        "parent_id": experiment.parent_id,
        "forks": forks,
        "continued": continued,
        "config": experiment.config,
    }


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def list_experiments(db: StateDB, *, archived: bool | None = False, labels: Iterable[str] = (),
                     states: Iterable[str] | None = None,
                     kind: str | None = ExperimentKind.EXPERIMENT,
                     with_best_metric: bool = False) -> list[dict[str, Any]]:
    """One light summary per experiment, oldest first: id, name, kind, state, searcher,
    metric, smaller_is_better, description, labels, archived, parent_id, submitted_at,
    ended_at, num_trials and progress (batches trained over the trials' current targets;
    1.0 once completed); `with_best_metric` adds best_metric (the best finite searcher
    metric validated so far: it reads every validation, tens of milliseconds for 50,000 of
    them, where the rest takes a few).

    `archived`: False leaves archived ones out (the default), True lists only them, None
    both; `labels`: only those with every one of these; `states`, `kind` ("experiment",
    "job", None: both) as given. A handful of queries whatever the number of trials."""
    clauses: list[str] = []
    args: list[Any] = []
    if archived is not None:
        clauses.append("archived = ?")
        args.append(int(archived))
    if kind is not None:
        clauses.append("kind = ?")
        args.append(kind)
    if states is not None:
        wanted = list(states)
        clauses.append(f"state IN ({', '.join('?' * len(wanted))})")
        args.extend(wanted)
    labels = sorted(set(labels))
    if labels:
        clauses.append(f"id IN (SELECT experiment_id FROM experiment_labels WHERE label IN "
                       f"({', '.join('?' * len(labels))}) GROUP BY experiment_id "
                       "HAVING count(*) = ?)")
        args.extend([*labels, len(labels)])
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    rows = db.db.execute(
        "SELECT id, name, kind, state, searcher, metric, smaller_is_better, description, "
        "archived, parent_id, submitted_at, ended_at FROM experiments "
        f"{where} ORDER BY id", args).fetchall()
    ids = [row[0] for row in rows]
    if not ids:
        return []
    selected = "(SELECT value FROM json_each(?))"
    id_list = json.dumps(ids)
    trials = {row[0]: row[1:] for row in db.db.execute(
        "SELECT experiment_id, count(*), sum(min(batches_trained, target_batches)), "
        f"sum(target_batches) FROM trials WHERE experiment_id IN {selected} "
        "GROUP BY experiment_id", [id_list])}
    best = _best_metrics(db, id_list) if with_best_metric else {}
    labels_by_id = catalog.labels_of(db, ids)
    summaries = []
    for (eid, name, kind_, state, searcher, metric, smaller, description, archived_, parent,
         submitted, ended) in rows:
        count, trained, targets = trials.get(eid, (0, 0, 0))
        if state == ExperimentState.COMPLETED:
            progress = 1.0
        else:
            progress = min((trained or 0) / targets, 1.0) if targets else 0.0
        summaries.append({
            "id": eid, "name": name, "kind": kind_, "state": state, "searcher": searcher,
            "metric": metric, "smaller_is_better": bool(smaller), "description": description,
            "labels": labels_by_id[eid], "archived": bool(archived_), "parent_id": parent,
            "submitted_at": submitted, "ended_at": ended, "num_trials": count,
            "progress": progress,
            **({"best_metric": best.get(eid)} if with_best_metric else {}),
        })
    return summaries


def _best_metrics(db: StateDB, id_list: str) -> dict[int, float]:
    """experiment id -> its best finite searcher metric over all validations. SQLite reads
    the metric out of each row's JSON, once; a row holding NaN or Infinity (Python's JSON,
    which SQLite refuses) is read here instead."""
    best: dict[int, float] = {}

    def offer(eid: int, smaller: bool, value: Any) -> None:
        value = _finite(value)
        if value is not None and (eid not in best
                                  or (value < best[eid] if smaller else value > best[eid])):
            best[eid] = value

    # The validations' own index (migration 0012): the training rows' pages are not read.
    joined = ("FROM metrics m INDEXED BY metrics_validations JOIN trials t ON t.id = m.trial_id "
              "JOIN experiments e ON e.id = t.experiment_id "
              "WHERE m.kind = 'validation' AND e.metric != '' "
              "AND t.experiment_id IN (SELECT value FROM json_each(?))")
    unreadable = "(m.metrics GLOB '*NaN*' OR m.metrics GLOB '*Infinity*')"
    # The best is the least of the metric, or of its negation where larger is better; a
    # value that is no number (text, a list) is no metric.
    value = "m.metrics ->> ('$.\"' || replace(e.metric, '\"', '') || '\"')"
    for eid, smaller, least in db.db.execute(
            "SELECT eid, smaller, min(CASE WHEN typeof(v) IN ('integer', 'real') THEN "
            "CASE WHEN smaller THEN v ELSE -v END END) FROM (SELECT t.experiment_id AS eid, "
            f"e.smaller_is_better AS smaller, {value} AS v {joined} AND NOT {unreadable}) "
            "GROUP BY eid", [id_list]):
        if least is not None:
            offer(eid, bool(smaller), least if smaller else -least)
    for eid, smaller, metric, text in db.db.execute(
            f"SELECT t.experiment_id, e.smaller_is_better, e.metric, m.metrics {joined} "
            f"AND {unreadable}", [id_list]):
        offer(eid, bool(smaller), json.loads(text).get(metric))
    return best


# -- what users write ------------------------------------------------------------------------

def _text(what: str, value: Any, *, empty_ok: bool = True) -> str:
    if not isinstance(value, str):
        raise OperationError(f"the {what} must be text, not {type(value).__name__}")
    if not empty_ok and not value.strip():
        raise OperationError(f"the {what} must not be empty")
    return value


def set_name(db: StateDB, experiment_id: int, name: str) -> dict[str, Any]:
    catalog.set_fields(db, experiment_id, name=_text("name", name, empty_ok=False))
    return {"id": experiment_id, "name": name}


def set_description(db: StateDB, experiment_id: int, text: str) -> dict[str, Any]:
    catalog.set_fields(db, experiment_id, description=_text("description", text))
    return {"id": experiment_id, "description": text}


def set_notes(db: StateDB, experiment_id: int, text: str) -> dict[str, Any]:
    catalog.set_fields(db, experiment_id, notes=_text("notes", text))
    return {"id": experiment_id, "notes": text}


def _label(label: Any) -> str:
    # Determined took any non-empty string as a label.
    return _text("label", label, empty_ok=False)


def add_label(db: StateDB, experiment_id: int, label: str) -> dict[str, Any]:
    catalog.add_label(db, experiment_id, _label(label))
    return {"id": experiment_id, "labels": catalog.labels_of(db, [experiment_id])[experiment_id]}


def remove_label(db: StateDB, experiment_id: int, label: str) -> dict[str, Any]:
    """Removing a label the experiment does not have changes nothing, as Determined's did."""
    catalog.remove_label(db, experiment_id, _label(label))
    return {"id": experiment_id, "labels": catalog.labels_of(db, [experiment_id])[experiment_id]}


def set_labels(db: StateDB, experiment_id: int, labels: Iterable[str]) -> dict[str, Any]:
    catalog.set_labels(db, experiment_id, [_label(label) for label in labels])
    return {"id": experiment_id, "labels": catalog.labels_of(db, [experiment_id])[experiment_id]}


def archive(db: StateDB, experiment_id: int) -> dict[str, Any]:
    """Leave it out of the default listings; everything it recorded stays. Refused while it
    has not ended, as Determined refused it."""
    experiment = db.experiment(experiment_id)
    if experiment.state not in TERMINAL_STATES:
        raise OperationError(f"{experiment.kind} {experiment_id} is {experiment.state}; only an "
                             "ended one can be archived (pause does not end it: kill it first)")
    catalog.set_fields(db, experiment_id, archived=True)
    return {"id": experiment_id, "archived": True}


def unarchive(db: StateDB, experiment_id: int) -> dict[str, Any]:
    db.experiment(experiment_id)
    catalog.set_fields(db, experiment_id, archived=False)
    return {"id": experiment_id, "archived": False}


# -- pause, activate, cancel, kill -----------------------------------------------------------

def act(layout: Layout, db: StateDB, action: str, experiment_id: int | None = None,
        trial_id: int | None = None) -> str:
    """Request "pause", "activate" (or "resume"), "cancel" or "kill" for an experiment or
    one trial; returns what was requested, in one line."""
    if action not in ACTIONS:
        raise OperationError(f"unknown action {action!r}; it is one of "
                             f"{', '.join(sorted(ACTIONS))}")
    try:
        return request(layout, db, ACTIONS[action], experiment_id=experiment_id,
                       trial_id=trial_id, said_as=action)
    except ActionError as error:
        raise OperationError(str(error)) from None


# -- settings of the recorded config ----------------------------------------------------------

def _count(key: str, value: Any, *, nullable: bool = False, minimum: int | None = 0) -> Any:
    """Checked as a submitted config's value is (state/expconf.schema.json)."""
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise OperationError(f"{key}: expected an integer{' or null' if nullable else ''}, "
                             f"got {shown}")
    if minimum is not None and value < minimum:
        raise OperationError(f"{key}: expected at least {minimum}, got {value}")
    return value


def _change_config(db: StateDB, experiment_id: int, section: str,
                   values: dict[str, Any]) -> dict[str, Any]:
    experiment = db.experiment(experiment_id)
    config = copy.deepcopy(experiment.config)
    config.setdefault(section, {}).update(values)
    catalog.set_config(db, experiment_id, config,
                       {f"{section}.{key}": value for key, value in values.items()})
    return {"id": experiment_id, section: config[section]}


def set_priority(db: StateDB, experiment_id: int, priority: int) -> dict[str, Any]:
    """resources.priority: the scheduler's next pass places this experiment's waiting trials
    by it (lower first, as Determined's priority scheduler)."""
    return _change_config(db, experiment_id, "resources",
                          {"priority": _count("resources.priority", priority, minimum=None)})


def set_max_slots(db: StateDB, experiment_id: int, max_slots: int | None) -> dict[str, Any]:
    """resources.max_slots (None: no cap), obeyed from the scheduler's next pass; trials
    already running keep their slots."""
    return _change_config(db, experiment_id, "resources", {
        "max_slots": _count("resources.max_slots", max_slots, nullable=True)})


def set_gc_policy(db: StateDB, experiment_id: int, *, save_experiment_best: int | None = None,
                  save_trial_best: int | None = None,
                  save_trial_latest: int | None = None) -> dict[str, Any]:
    """checkpoint_storage.save_*: what the next retention pass (after a trial, or
    `localdet gc`) keeps; the checkpoints it no longer keeps are deleted then."""
    given = {"save_experiment_best": save_experiment_best, "save_trial_best": save_trial_best,
             "save_trial_latest": save_trial_latest}
    values = {key: _count(f"checkpoint_storage.{key}", value)
              for key, value in given.items() if value is not None}
    if not values:
        raise OperationError("name at least one of save_experiment_best, save_trial_best and "
                             "save_trial_latest to change")
    return _change_config(db, experiment_id, "checkpoint_storage", values)
