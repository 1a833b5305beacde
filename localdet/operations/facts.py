"""Facts about experiments, trials, jobs and checkpoints as plain dicts: what `localdet
status --json`, `det e describe --json`, the dashboard and the SDK show (the rich tables in
`localdet.ui.views` are built from these same facts)."""

from __future__ import annotations

import datetime
import json
import math
import weakref
from collections.abc import Mapping
from typing import Any

from localdet.paths import Layout
from localdet.records.db import Checkpoint, Experiment, StateDB, Trial
from localdet.records.lifecycle import TrialPhase
from localdet.records.states import TERMINAL_STATES, ExperimentKind, ExperimentState


def _nodes(launch: dict) -> str:
    # One host per node: the daemon records both lists together.
    nodes = zip(launch.get("nodes") or [launch["node"]], launch.get("hosts") or [launch["host"]],
                strict=True)
    return ", ".join(f"{host} ({node[:8]})" for node, host in dict.fromkeys(nodes))


def _best(rows: list[dict], metric: str, smaller_is_better: bool) -> dict | None:
    # A diverged trial reports NaN; it is never the best.
    scored = [r for r in rows if isinstance(r.get(metric), (int, float))
              and math.isfinite(r[metric])]
    if not scored:
        return None
    return (min if smaller_is_better else max)(scored, key=lambda r: r[metric])


def trial_facts(db: StateDB, trial: Trial, experiment: Experiment,
                launches: list[dict] | None = None,
                validations: list[dict] | None = None) -> dict[str, Any]:
    """`launches`: the trial's launches, oldest first (`launches_by_trial`); `validations`:
    its validation metrics, oldest first, read here if not given (or as few as say its best
    and, last, its latest: `validation_summary`)."""
    from localdet.config import keras_choice  # (its rules' modules: only where trials are shown)

    if validations is None:
        validations = [row.metrics for row in db.metrics(trial.id, "validation")]
    launch = launches[-1] if launches else {}
    return {
        "id": trial.id,
        "experiment_id": trial.experiment_id,
        "request_id": trial.request_id,
        "state": trial.state,
        # PAUSING or REQUEUING while a request is under way (localdet/records/lifecycle.py).
        "phase": TrialPhase(trial.state, trial.stop_requested).describe(),
        "hparams": trial.hparams,
        "batches_trained": trial.batches_trained,
        "target_batches": trial.target_batches,
        "restarts": trial.restarts,
        # How it trains on its slots (localdet/config/engines.py), as recorded at its last launch.
        "engine": launch.get("engine"),
        "slots": launch.get("slots"),
        # Which Keras it ran under and why (localdet/config/keras_choice.py), at its last launch.
        "keras_line": launch.get("keras_line"),
        "keras_line_reason": launch.get("keras_line_reason"),
        # The rule that chose it and what decided (a file and line, a package, the config):
        # None for a launch recorded before reasons named their rule.
        "keras_line_rule": keras_choice.rule_of(launch.get("keras_line_reason"))[0],
        "keras_line_source": keras_choice.rule_of(launch.get("keras_line_reason"))[1],
        # Seconds from its latest launch to the end of that launch's first training batch
        # (None until it ends): a slow model folder (imports, data loading) shows here.
        "launch_seconds": launch.get("first_batch_seconds"),
        # Where its latest launch runs, on a Ray cluster: each node's address and id (a
        # trial whose ranks span nodes has several).
        "node": _nodes(launch) if launch.get("node") else None,
        "launches": [{"launched_at": one["launched_at"],
                      "first_batch_seconds": one["first_batch_seconds"],
                      "warm": bool(one.get("warm")),  # forked from a warm process
                      "node": one.get("node"), "host": one.get("host")}
                     for one in launches or []],
        "latest_validation": validations[-1] if validations else None,
        "best_validation": _best(validations, experiment.metric, experiment.smaller_is_better),
        "latest_checkpoint": trial.latest_checkpoint,
        "error": trial.error,
    }


# The searchers whose methods have no rungs (search/methods/full_length.py): a completed
# one's progress is 1.0 and its rungs none, so its search is not replayed (numpy, ~50 ms).
_FULL_LENGTH = ("single", "random", "grid")


def _search_facts(db: StateDB, experiment: Experiment, trials: list[dict]) -> dict[str, Any]:
    """Progress and ASHA rungs, from the search method replayed from its events."""
    if experiment.state == ExperimentState.COMPLETED and experiment.searcher in _FULL_LENGTH:
        return {"progress": 1.0, "rungs": []}  # all there is to know, without a replay
    if experiment.searcher == "custom":  # what the runner's SearchMethod last reported
        from localdet.operations import custom_search

        return {"progress": custom_search.progress(db, experiment.id) or 0.0, "rungs": []}
    events = db.searcher_events(experiment.id)
    shortcut = _full_length_progress(experiment, events, trials)
    if shortcut is not None:
        return {"progress": shortcut, "rungs": []}
    if experiment.kind == ExperimentKind.JOB or not events:
        targets = sum(t["target_batches"] for t in trials)
        progress = (sum(min(t["batches_trained"], t["target_batches"]) for t in trials)
                    / targets) if targets else 0.0
        return {"progress": progress, "rungs": []}
    from localdet.search.driver import replay  # (numpy, for the search methods)

    method = replay(experiment, events)
    done = experiment.state == ExperimentState.COMPLETED
    progress = method.progress({t["request_id"]: t["batches_trained"] for t in trials})
    if experiment.state == ExperimentState.ERROR:
        # The searcher counts a trial that exited early as done; an experiment that failed
        # shows what was trained, so one that failed before training shows 0 %.
        targets = sum(t["target_batches"] for t in trials)
        trained = (sum(min(t["batches_trained"], t["target_batches"]) for t in trials)
                   / targets) if targets else 0.0
        progress = min(progress, trained)
    return {"progress": 1.0 if done else min(progress, 1.0), "rungs": method.rungs()}


# The events an experiment's facts are made of (not every trial's state changes).
_FACT_EVENTS = ("trial_launched", "script_run_started", "trial_first_batch", "config_warning",
                "startup_hook_warning")


# A search's events that leave a full-length search's progress what its trials trained.
_PLAIN_EVENTS = {"initialized", "validation_completed", "trial_closed"}


def _full_length_progress(experiment: Experiment, events: list[dict],
                          trials: list[dict]) -> float | None:
    """A running `random` or `single` search's progress without replaying it (the replay
    imports numpy and feeds every event: most of `status ID` for 1,000 trials): what its
    trials trained over `max_trials` full lengths, as the method's `progress` makes it while
    no trial exited early or was continued and every trial has the one length. None where
    that does not hold: the replay answers."""
    if experiment.searcher not in ("random", "single") or experiment.state in (
            ExperimentState.COMPLETED, ExperimentState.ERROR) or not trials \
            or any(e["kind"] not in _PLAIN_EVENTS for e in events):
        return None
    length = trials[0]["target_batches"]
    total = 1 if experiment.searcher == "single" else \
        (experiment.config.get("searcher") or {}).get("max_trials")
    if not length or not isinstance(total, int) or total < len(trials) \
            or any(t["target_batches"] != length for t in trials):
        return None
    return min(1.0, sum(min(t["batches_trained"], length) for t in trials) / (total * length))


def launches_by_trial(events: list[dict]) -> dict[int, list[dict]]:
    """trial id -> its launches, oldest first: the payload of each `trial_launched` event
    (engine, slots, ...; a script run's `script_run_started`) with `launched_at` and
    `first_batch_seconds`, from the launch's `trial_first_batch` event (None: none yet)."""
    launches: dict[int, list[dict]] = {}
    for e in events:
        if e["kind"] in ("trial_launched", "script_run_started"):
            launches.setdefault(e["trial_id"], []).append(
                {**e["payload"], "launched_at": e["at"], "first_batch_seconds": None})
        elif e["kind"] == "trial_first_batch" and launches.get(e["trial_id"]):
            # A launch's process reports it well after the daemon recorded the launch (it
            # waits for that record, then builds its model): the trial's latest launch.
            launches[e["trial_id"]][-1]["first_batch_seconds"] = e["payload"]["seconds"]
    return launches


# StateDB -> the summary it last computed and what it was computed from: the dashboard and
# `status` ask twice (facts, importances) over one connection that nothing wrote in between.
_SUMMARIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def validation_summary(db: StateDB, experiment: Experiment) -> dict[int, dict[str, Any]]:
    """See `_validation_summary`; read again only when this connection, or another, has
    written since (SQLite's data_version and the connection's own changes say), and then
    from the user's cache where it still holds (kept_summaries)."""
    key = (experiment.id, experiment.metric, bool(experiment.smaller_is_better),
           db.db.execute("PRAGMA data_version").fetchone()[0], db.db.conn.total_changes)
    cached = _SUMMARIES.get(db)
    if cached is not None and cached[0] == key:
        return cached[1]
    from localdet.operations import kept_summaries  # (kept between commands past 5,000 rows)

    summary = kept_summaries.summary(db, experiment, _validation_summary)
    _SUMMARIES[db] = (key, summary)
    return summary


def _validation_summary(db: StateDB, experiment: Experiment) -> dict[int, dict[str, Any]]:
    """trial id -> {"latest": its latest validation, "best": the one with its best finite
    searcher metric (None if none), "counted": how many carry a finite searcher metric}, for
    the experiment's trials with a validation. SQLite finds the rows in the validations'
    index (migration 0012) and reads the metric out of each row's JSON; only the rows it
    picks are parsed here (an experiment of 1,000 trials has 100,000 validations). A row
    holding NaN or Infinity (Python's JSON, which SQLite refuses) is read here instead.
    Its three reads see one snapshot: a trial's first validation recorded between them
    would otherwise be counted for a trial the first one did not find."""
    with db.snapshot():
        return _summary_of_snapshot(db, experiment)


def _summary_of_snapshot(db: StateDB, experiment: Experiment) -> dict[int, dict[str, Any]]:
    trials = "(SELECT id FROM trials WHERE experiment_id = ?)"
    rows = (f"FROM metrics INDEXED BY metrics_validations WHERE kind = 'validation' AND "
            f"trial_id IN {trials}")
    unreadable = "(metrics GLOB '*NaN*' OR metrics GLOB '*Infinity*')"  # (instr: twice as slow)
    path = '$."' + experiment.metric.replace('"', "") + '"'
    summary: dict[int, dict[str, Any]] = {}
    # The latest: one step into the index a trial, at its largest batches (a GROUP BY with
    # max() read every validation, a sixth of the summary's time at 1,000 trials).
    for trial_id, text in db.db.execute(
            "SELECT id, (SELECT metrics FROM metrics INDEXED BY metrics_validations "
            "WHERE trial_id = trials.id AND kind = 'validation' ORDER BY batches_trained DESC "
            "LIMIT 1) FROM trials WHERE experiment_id = ? ORDER BY id", [experiment.id]):
        if text is not None:
            summary[trial_id] = {"latest": json.loads(text), "best": None, "counted": 0}
    pick = "min" if experiment.smaller_is_better else "max"
    found: dict[int, list[tuple[float, int, str]]] = {}  # trial -> (value, batches, row)
    for trial_id, text, batches, _, counted in db.db.execute(
            f"SELECT trial_id, metrics, batches_trained, {pick}(metrics ->> ?), count(*) "
            f"{rows} AND NOT {unreadable} AND json_type(metrics, ?) IN ('integer', 'real') "
            "GROUP BY trial_id", [path, experiment.id, path]):
        row = json.loads(text)
        found.setdefault(trial_id, []).append((row[experiment.metric], batches, text))
        summary[trial_id]["counted"] += counted
    for trial_id, text, batches in db.db.execute(
            f"SELECT trial_id, metrics, batches_trained {rows} AND {unreadable}",
            [experiment.id]):
        value = json.loads(text).get(experiment.metric)
        if isinstance(value, (int, float)) and not isinstance(value, bool) \
                and math.isfinite(value):
            found.setdefault(trial_id, []).append((value, batches, text))
            summary[trial_id]["counted"] += 1
    for trial_id, candidates in found.items():  # the best; the earliest of equals
        best = min(candidates, key=lambda c: (c[0] if experiment.smaller_is_better else -c[0],
                                              c[1]))
        summary[trial_id]["best"] = json.loads(best[2])
    return summary


def experiment_facts(db: StateDB, experiment: Experiment) -> dict[str, Any]:
    events = db.events(experiment.id, kinds=_FACT_EVENTS)
    launches = launches_by_trial(events)
    summary = validation_summary(db, experiment)

    def validations(trial_id: int) -> list[dict]:
        # All trial_facts needs of them: the best and, last, the latest.
        found = summary.get(trial_id)
        if not found:
            return []
        return [found["best"], found["latest"]] if found["best"] is not None \
            else [found["latest"]]

    trials = [trial_facts(db, t, experiment, launches.get(t.id), validations(t.id))
              for t in db.trials(experiment.id)]
    scored = [t for t in trials if t["best_validation"]]
    best = _best([t["best_validation"] for t in scored],
                 experiment.metric, experiment.smaller_is_better)
    best_trial = next((t["id"] for t in scored if t["best_validation"] is best), None)
    by_state: dict[str, int] = {}
    for t in trials:
        by_state[t["state"]] = by_state.get(t["state"], 0) + 1
    return {
        "id": experiment.id,
        "name": experiment.name,
        "kind": experiment.kind,
        "runner": experiment.runner,
        "state": experiment.state,
        "searcher": experiment.searcher,
        "metric": experiment.metric,
        "smaller_is_better": experiment.smaller_is_better,
        "best_metric": best[experiment.metric] if best else None,
        "best_trial": best_trial,
        "trials_by_state": by_state,
        **_search_facts(db, experiment, trials),
        "submitted_at": experiment.submitted_at,
        "ended_at": experiment.ended_at,
        "error": experiment.error,
        "warnings": _warnings(db, experiment, events),
        "trials": trials,
    }


def _warnings(db: StateDB, experiment: Experiment, events: list[dict]) -> list[str]:
    """The config's warnings, then its trials' startup-hook.sh lines that failed or were
    not run (localdet/processes/startup_hook.py; each once, however many launches ran
    it); a custom searcher's "waits for a search method" only while no runner has posted to
    it (the runner's own experiment never waited)."""
    found = [e["payload"]["message"] for e in events if e["kind"] == "config_warning"]
    found += dict.fromkeys(e["payload"]["message"] for e in events
                           if e["kind"] == "startup_hook_warning")
    if experiment.searcher == "custom" and db.db.execute(
            "SELECT 1 FROM custom_search_batches WHERE experiment_id = ? LIMIT 1",
            [experiment.id]).fetchone():
        from localdet.config.experiment import CUSTOM_WAITS

        found = [w for w in found if w != CUSTOM_WAITS]
    return found


def _time(text: str | None) -> datetime.datetime | None:
    return datetime.datetime.fromisoformat(text) if text else None


def job_facts(db: StateDB, layout: Layout, experiment: Experiment,
              tail_lines: int = 0) -> dict[str, Any]:
    """An experiment's facts plus what a job has: its slots, when its process started, how
    long it ran (so far), its log and, with `tail_lines`, the log's last lines."""
    facts = experiment_facts(db, experiment)
    trial = facts["trials"][0] if facts["trials"] else None
    started = _time(db.trial(trial["id"]).started_at) if trial else None
    ended = _time(experiment.ended_at)
    if started and not ended and experiment.state not in TERMINAL_STATES:
        ended = datetime.datetime.now(datetime.timezone.utc)
    log = layout.trial_log(experiment.id, trial["id"]) if trial else None
    facts.update({
        "slots": experiment.config["resources"]["slots_per_trial"],
        "started_at": started.isoformat() if started else None,
        "duration_seconds": round((ended - started).total_seconds(), 1)
                            if started and ended else None,
        "log": str(log) if log else None,
    })
    if tail_lines:
        from localdet.processes.launcher import log_tail

        facts["log_tail"] = log_tail(log, tail_lines) if log else ""
    return facts


def best_checkpoint(db: StateDB, experiment: Experiment) -> Checkpoint | None:
    """The live checkpoint taken where the searcher metric was best (validated at the same
    batch); checkpoints deleted by retention are never the answer, and neither is a NaN."""
    scored = []
    for checkpoint in db.checkpoints(experiment.id):  # live ones only
        for row in db.metrics(checkpoint.trial_id, "validation"):
            value = row.metrics.get(experiment.metric)
            if (row.batches_trained == checkpoint.batches_trained
                    and isinstance(value, (int, float)) and math.isfinite(value)):
                scored.append((value, checkpoint))
    if not scored:
        return None
    pick = min if experiment.smaller_is_better else max
    return pick(scored, key=lambda pair: pair[0])[1]


def checkpoint_facts(checkpoint: Checkpoint) -> dict[str, Any]:
    return {
        "uuid": checkpoint.uuid,
        "experiment_id": checkpoint.experiment_id,
        "trial_id": checkpoint.trial_id,
        "batches_trained": checkpoint.batches_trained,
        "size_bytes": checkpoint.size_bytes,
        "metadata": checkpoint.metadata,
        "created_at": checkpoint.created_at,
        "state": checkpoint.state,  # COMPLETED, or DELETED by retention
    }


def flat_hparams(hparams: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested hyperparameters as dotted names: {"opt": {"lr": 1}} -> {"opt.lr": 1}."""
    flat: dict[str, Any] = {}
    for key, value in hparams.items():
        if isinstance(value, Mapping):
            flat.update(flat_hparams(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
