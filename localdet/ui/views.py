"""What `localdet status` and `localdet checkpoints` show: rich tables built from the facts
of `localdet.operations.facts` (plain dicts, the JSON output), re-exported here."""

from __future__ import annotations

import datetime
from typing import Any

from rich.markup import escape
from rich.progress_bar import ProgressBar
from rich.table import Table

from localdet.config.sizes import gigabytes
from localdet.operations.facts import (  # noqa: F401  (views' names, used by the CLI and tests)
    best_checkpoint,
    checkpoint_facts,
    experiment_facts,
    flat_hparams,
    job_facts,
    launches_by_trial,
    trial_facts,
)
from localdet.records.db import StateDB
from localdet.records.lifecycle import PAUSING, REQUEUING
from localdet.records.states import CheckpointState, ExperimentState, Runner, TrialState
from localdet.ui.fast_table import FastTable  # rich's Table, drawn fast where it can be


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


def _name(facts: dict) -> str:
    # Who runs it, beside the name, when it is not the daemon: `localdet pause` and friends
    # do not reach a script, and reach a foreground run only while it lives.
    runner = facts.get("runner", Runner.DAEMON)
    forked = f" [dim](fork of {facts['parent_id']})[/]" if facts.get("parent_id") else ""
    return escape(facts["name"]) + forked + (f" [dim]({runner})[/]" if runner != Runner.DAEMON
                                             else "")


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
    table = FastTable(title="Experiments")
    for column in ("ID", "Name", "State", "Searcher", "Trials", "Progress", "Best metric"):
        table.add_column(column, justify="right" if column in ("ID", "Trials") else "left")
    for e in facts:
        # (a light summary has the best metric only when it was asked for)
        best = f"{e['metric']}={_number(e['best_metric'])}" \
            if e.get("best_metric") is not None else ""
        table.add_row(str(e["id"]), _name(e), _state(e["state"]), e["searcher"],
                      # a light summary's count (list_experiments), or the facts' trials
                      str(e["num_trials"] if "num_trials" in e else len(e["trials"])),
                      f"{e['progress']:.0%}", escape(best))
    return table


def jobs_table(facts: list[dict]) -> Table:
    table = FastTable(title="Jobs")
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
    for row in _catalog_rows(experiment):
        table.add_row(*row)
    return table


def _catalog_rows(experiment: dict) -> list[tuple[str, str]]:
    """Labels, notes and lineage, where `describe` gave them (operations/experiments.py)."""
    rows = []
    if experiment.get("labels"):
        rows.append(("Labels", escape(", ".join(experiment["labels"]))))
    if experiment.get("archived"):
        rows.append(("Archived", "yes (`localdet unarchive` lists it again)"))
    if experiment.get("parent_id") is not None:
        rows.append(("Forked from", f"experiment {experiment['parent_id']}"))
    if experiment.get("forks"):
        rows.append(("Forks", ", ".join(f"experiment {i}" for i in experiment["forks"])))
    for continued in experiment.get("continued", []):
        source = continued.get("checkpoint")
        rows.append(("Continued", f"{_when(continued['at'])}: from "
                     + (f"checkpoint {source[:8]} at {continued.get('batches')} batches"
                        if source else "the start")
                     + f" to {continued.get('target')} batches"))
    if experiment.get("notes"):
        rows.append(("Notes", escape(experiment["notes"])))
    return rows


def rungs_table(experiment: dict) -> Table:
    """An ASHA search's rungs: how long trials train there, how many got there and on."""
    table = FastTable(title="Rungs")
    for column in ("Bracket", "Rung", "Batches", "Reached", "Promoted"):
        table.add_column(column, justify="right")
    for r in experiment["rungs"]:
        table.add_row(str(r["bracket"]), str(r["rung"]), str(r["length"]), str(r["reached"]),
                      str(r["promoted"]))
    return table


# `localdet status EXP` lists every trial up to this many; past it, the best trial, the
# running ones and the latest few, and a line counting the rest (`--all`: every row). Drawing
# 1,000 rows took most of a second, and no one reads them in a terminal.
SHORT_TABLE = 20
LATEST_TRIALS = 5


def shown_trials(experiment: dict, every: bool = False) -> list[dict]:
    """The trials whose rows `localdet status EXP` shows, in id order: all of them with
    `every` or up to SHORT_TABLE, else the best, the running and the LATEST_TRIALS newest
    of the others."""
    trials = experiment["trials"]
    if every or len(trials) <= SHORT_TABLE:
        return trials
    chosen = {t["id"] for t in trials if t["state"] == TrialState.RUNNING}
    chosen.add(experiment["best_trial"])
    others = [t["id"] for t in trials if t["id"] not in chosen]
    chosen.update(others[-LATEST_TRIALS:])
    return [t for t in trials if t["id"] in chosen]


def rest_line(experiment: dict, shown: list[dict]) -> str | None:
    """`980 more trials (975 completed, 5 error): localdet status 1 --all lists every
    one`, or None when every trial is shown."""
    ids = {t["id"] for t in shown}
    rest: dict[str, int] = {}
    for t in experiment["trials"]:
        if t["id"] not in ids:
            rest[t["state"]] = rest.get(t["state"], 0) + 1
    if not rest:
        return None
    count = sum(rest.values())
    states = ", ".join(f"{n} {state.lower()}" for state, n in sorted(rest.items()))
    return (f"{count} more trial{'s' if count > 1 else ''} ({states}): "
            f"`localdet status {experiment['id']} --all` lists every one")


def trials_table(experiment: dict, shown: list[dict] | None = None) -> Table:
    """The rows of `shown` (every trial when None); a caption names the rest, then the
    Keras lines of every trial."""
    metric = experiment["metric"]
    shown = experiment["trials"] if shown is None else shown
    table = FastTable(title=f"Experiment {experiment['id']} ({_name(experiment)}): "
                        f"{experiment['state']}, searcher {experiment['searcher']}")
    # The engine matters only where a trial has several slots.
    engines = any(t.get("engine") not in (None, "single") for t in experiment["trials"])
    nodes = any(t.get("node") for t in experiment["trials"])  # on a Ray cluster
    for column in ("Trial", "State", "Batches", "Restarts", *(("Engine",) if engines else ()),
                   *(("Node",) if nodes else ()),
                   "Start", "Hyperparameters", f"Latest {metric}", f"Best {metric}",
                   "Checkpoint"):
        table.add_column(escape(column))
    for t in shown:
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
    rest = rest_line(experiment, shown)
    lines = ([rest] if rest else []) + keras_lines(experiment["trials"])
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
        which = f"trial {ids[0]}" if len(ids) == 1 else f"trials {id_runs(ids)}"
        lines.append(f"{name} ({which}): {why}" if why else f"{name} ({which})")
    return lines


def id_runs(ids: list[int]) -> str:
    """`1, 3, 7-12`: a run of three or more consecutive ids as its ends (a caption naming
    each of 1,000 trials ran to 6,000 characters)."""
    parts: list[str] = []
    start = 0
    for index in range(1, len(ids) + 1):
        if index == len(ids) or ids[index] != ids[index - 1] + 1:
            run = ids[start:index]
            parts.extend([f"{run[0]}-{run[-1]}"] if len(run) >= 3 else map(str, run))
            start = index
    return ", ".join(parts)


def checkpoints_table(facts: list[dict], experiment_id: int, show_state: bool = False) -> Table:
    """With `show_state`, a State column (COMPLETED, or DELETED by retention)."""
    table = FastTable(title=f"Checkpoints of experiment {experiment_id}")
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
