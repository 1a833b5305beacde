"""What `localdet status` and `localdet checkpoints` show: facts as plain dicts (the JSON
output) and rich tables built from those same facts."""

from __future__ import annotations

import datetime
import math
from typing import Any

from rich.markup import escape
from rich.progress_bar import ProgressBar
from rich.table import Table

from localdet.config import keras_choice
from localdet.config.sizes import gigabytes
from localdet.paths import Layout
from localdet.processes.launcher import log_tail
from localdet.records.db import Checkpoint, Experiment, StateDB, Trial
from localdet.records.lifecycle import PAUSING, REQUEUING, TrialPhase
from localdet.records.states import (
    TERMINAL_STATES,
    CheckpointState,
    ExperimentKind,
    ExperimentState,
    Runner,
    TrialState,
)
from localdet.search.driver import replay


def daemon_notice(db: StateDB) -> str | None:
    """What the daemon is holding back and why (free space below its reserve), as its
    latest events say; None when nothing is held."""
    event = db.last_event(("disk_low", "disk_ok", "daemon_started", "daemon_stopped"))
    if event is None or event["kind"] != "disk_low":
        return None
    short = event["payload"]
    return (f"launches held since {event['at'][:19]}: free space on {short['path']} is "
            f"{gigabytes(short['free'])}, below the reserve of {gigabytes(short['needed'])} "
            "(localdet daemon --min-free-space); running trials stopped at their next "
            "boundary and continue on their own when space returns")


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
                launches: list[dict] | None = None) -> dict[str, Any]:
    """`launches`: the trial's launches, oldest first (`launches_by_trial`)."""
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


def _search_facts(db: StateDB, experiment: Experiment, trials: list[dict]) -> dict[str, Any]:
    """Progress and ASHA rungs, from the search method replayed from its events."""
    events = db.searcher_events(experiment.id)
    if experiment.kind == ExperimentKind.JOB or not events:
        targets = sum(t["target_batches"] for t in trials)
        progress = (sum(min(t["batches_trained"], t["target_batches"]) for t in trials)
                    / targets) if targets else 0.0
        return {"progress": progress, "rungs": []}
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


def experiment_facts(db: StateDB, experiment: Experiment) -> dict[str, Any]:
    events = db.events(experiment.id)
    launches = launches_by_trial(events)
    trials = [trial_facts(db, t, experiment, launches.get(t.id))
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
        "warnings": [e["payload"]["message"] for e in events if e["kind"] == "config_warning"],
        "trials": trials,
    }


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


# Experiment, trial and checkpoint states share their strings (PAUSED, COMPLETED), and so
# their styles; PAUSING and REQUEUING are a running trial's phases (TrialPhase.describe).
STATE_STYLES = {ExperimentState.ACTIVE: "cyan", TrialState.RUNNING: "cyan",
                TrialState.QUEUED: "white", TrialState.PAUSED: "yellow",
                TrialState.WAITING: "blue", PAUSING: "yellow", REQUEUING: "cyan",
                TrialState.COMPLETED: "green", TrialState.CANCELED: "magenta",
                TrialState.ERROR: "red", CheckpointState.DELETED: "dim"}


def _state(state: str) -> str:
    return f"[{STATE_STYLES.get(state, 'white')}]{state}[/]"


def _number(value: Any) -> str:
    return "" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def flat_hparams(hparams: dict, prefix: str = "") -> dict:
    """Nested hyperparameters as dotted names: {"opt": {"lr": 1}} -> {"opt.lr": 1}."""
    flat = {}
    for key, value in hparams.items():
        if isinstance(value, dict):
            flat.update(flat_hparams(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _name(facts: dict) -> str:
    # Who runs it, beside the name, when it is not the daemon: `localdet pause` and friends
    # do not reach a script, and reach a foreground run only while it lives.
    runner = facts.get("runner", Runner.DAEMON)
    return escape(facts["name"]) + (f" [dim]({runner})[/]" if runner != Runner.DAEMON else "")


def _when(text: str | None) -> str:
    return datetime.datetime.fromisoformat(text).astimezone().strftime("%Y-%m-%d %H:%M:%S") \
        if text else ""


def duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"


def experiments_table(facts: list[dict]) -> Table:
    table = Table(title="Experiments")
    for column in ("ID", "Name", "State", "Searcher", "Trials", "Progress", "Best metric"):
        table.add_column(column, justify="right" if column in ("ID", "Trials") else "left")
    for e in facts:
        best = f"{e['metric']}={_number(e['best_metric'])}" if e["best_metric"] is not None else ""
        table.add_row(str(e["id"]), _name(e), _state(e["state"]), e["searcher"],
                      str(len(e["trials"])), f"{e['progress']:.0%}", escape(best))
    return table


def jobs_table(facts: list[dict]) -> Table:
    table = Table(title="Jobs")
    for column in ("ID", "Name", "State", "Started", "Duration"):
        table.add_column(column, justify="right" if column == "ID" else "left")
    for j in facts:
        table.add_row(str(j["id"]), _name(j), _state(j["state"]), _when(j["started_at"]),
                      duration(j["duration_seconds"]))
    return table


def job_table(job: dict) -> Table:
    """One job: a table of its facts (the log tail is printed below it)."""
    table = Table(title=f"Job {job['id']} ({escape(job['name'])})", show_header=False)
    table.add_column("", style="bold")
    table.add_column("")
    for label, value in (("State", _state(job["state"])), ("Slots", str(job["slots"])),
                         ("Started", _when(job["started_at"])),
                         ("Duration", duration(job["duration_seconds"])),
                         ("Restarts", str(job["trials"][0]["restarts"]) if job["trials"] else ""),
                         ("Log", escape(job["log"] or ""))):
        table.add_row(label, value)
    return table


def search_summary(experiment: dict) -> Table:
    """Where one experiment's search stands: progress, trials by state, the best so far."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    bar = Table.grid(padding=(0, 1))
    bar.add_row(ProgressBar(total=1.0, completed=experiment["progress"], width=30),
                f"{experiment['progress']:.0%}")
    table.add_row("Progress", bar)
    table.add_row("Trials", ", ".join(f"{n} {state.lower()}" for state, n
                                      in sorted(experiment["trials_by_state"].items()))
                  or "none yet")
    if experiment["best_trial"] is not None:
        table.add_row("Best", f"trial {experiment['best_trial']}: "
                              f"{escape(experiment['metric'])}={_number(experiment['best_metric'])}")
    return table


def rungs_table(experiment: dict) -> Table:
    """An ASHA search's rungs: how long trials train there, how many got there and on."""
    table = Table(title="Rungs")
    for column in ("Bracket", "Rung", "Batches", "Reached", "Promoted"):
        table.add_column(column, justify="right")
    for r in experiment["rungs"]:
        table.add_row(str(r["bracket"]), str(r["rung"]), str(r["length"]), str(r["reached"]),
                      str(r["promoted"]))
    return table


def trials_table(experiment: dict) -> Table:
    metric = experiment["metric"]
    table = Table(title=f"Experiment {experiment['id']} ({_name(experiment)}): "
                        f"{experiment['state']}, searcher {experiment['searcher']}")
    # The engine matters only where a trial has several slots.
    engines = any(t.get("engine") not in (None, "single") for t in experiment["trials"])
    nodes = any(t.get("node") for t in experiment["trials"])  # on a Ray cluster
    for column in ("Trial", "State", "Batches", "Restarts", *(("Engine",) if engines else ()),
                   *(("Node",) if nodes else ()),
                   "Start", "Hyperparameters", f"Latest {metric}", f"Best {metric}",
                   "Checkpoint"):
        table.add_column(escape(column))
    for t in experiment["trials"]:
        hparams = ", ".join(f"{k}={_number(v)}"
                            for k, v in flat_hparams(t["hparams"]).items())
        latest = (t["latest_validation"] or {}).get(metric)
        best = (t["best_validation"] or {}).get(metric)
        engine = (f"{t['engine'] or ''} x{len(t['slots'] or [])}",) if engines else ()
        # Its latest launch's time to the end of the first batch.
        start = "" if t["launch_seconds"] is None else f"{t['launch_seconds']:.1f} s"
        table.add_row(str(t["id"]), _state(t["phase"]),
                      f"{t['batches_trained']}/{t['target_batches']}", str(t["restarts"]),
                      *engine, *((t.get("node") or "",) if nodes else ()), start,
                      escape(hparams), _number(latest), _number(best),
                      (t["latest_checkpoint"] or "")[:8])
    lines = keras_lines(experiment["trials"])
    if lines:
        table.caption, table.caption_justify = escape("\n".join(lines)), "left"
    return table


def keras_lines(trials: list[dict]) -> list[str]:
    """Which Keras line the trials' latest launches ran under and why, one line per
    distinct choice: `Keras 2 (trials 1-3): rule package, decided by ...`."""
    chosen: dict[tuple[str, str], list[int]] = {}
    for t in trials:
        if t.get("keras_line"):
            chosen.setdefault((t["keras_line"], t.get("keras_line_reason") or ""), []).append(
                t["id"])
    lines = []
    for (line, why), ids in chosen.items():
        name = {"keras2": "Keras 2", "keras3": "Keras 3"}.get(line, line)
        which = f"trial {ids[0]}" if len(ids) == 1 else f"trials {', '.join(map(str, ids))}"
        lines.append(f"{name} ({which}): {why}" if why else f"{name} ({which})")
    return lines


def checkpoints_table(facts: list[dict], experiment_id: int, show_state: bool = False) -> Table:
    """With `show_state`, a State column (COMPLETED, or DELETED by retention)."""
    table = Table(title=f"Checkpoints of experiment {experiment_id}")
    columns = ("UUID", "Trial", "Batches") + (("State",) if show_state else ()) + ("Size",
                                                                                  "Metadata")
    for column in columns:
        table.add_column(column)
    for c in facts:
        user = {k: v for k, v in c["metadata"].items()
                if k not in ("experiment_id", "trial_id", "batches_trained", "format")}
        state = (_state(c.get("state", CheckpointState.COMPLETED)),) if show_state else ()
        table.add_row(c["uuid"], str(c["trial_id"]), str(c["batches_trained"]), *state,
                      f"{c['size_bytes'] / 1e6:.2f} MB",
                      escape(", ".join(f"{k}={v}" for k, v in user.items())))
    return table
