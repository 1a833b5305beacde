"""Where a search's time went: its launches' phases (localdet/records/phases.py) summed over
the slots it ran on, for `localdet status ID --timeline` and the dashboard's strips.

    summary = summarize(db, 7)
    summary["shares"]      # {"training": 61.2, "start-up": 22.0, ..., "idle": 3.1}: add to 100

The search's wall time runs from its first launch's decision to its last exit; its capacity
is that wall time on every slot it used (slot-seconds). Each launch holds its slots from the
daemon's decision to launch it to the record of its exit; within that, each moment counts
once, under the first of CATEGORIES whose phase covers it (a checkpoint stored beside
training counts as training), or as untracked. A slot between two launches counts as the
daemon's while a trial of the search waited for it (queued, the searcher having made it),
else as idle, as is a slot after its last launch until the search's end.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from typing import Any

from localdet.records import phases
from localdet.records.db import StateDB

# Where a moment covered by several phases counts: the first listed.
CATEGORIES = ("checkpoints", "validation", "start-up", "training", "shut-down", "daemon")
# Stored beside training, a checkpoint's files count only where nothing else runs.
_BACKGROUND = "checkpoint_store"
ORDER = ("training", "start-up", "validation", "checkpoints", "shut-down", "daemon",
         "untracked", "idle")


def launches(rows: list[dict]) -> list[dict]:
    """The rows grouped by launch: ``[{"trial_id", "launch", "started", "ended", "slots",
    "warm", "ahead", "running", "phases": [row, ...]}, ...]`` in order of start (a launch
    started ahead of its slot has phases before its start: they overlap the slot's last)."""
    grouped: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        grouped[(row["trial_id"], row["launch"])].append(row)
    found = []
    for (trial_id, launch), its in grouped.items():
        named = {row["phase"]: row for row in its}
        begun = named.get("launch")
        exited = named.get("exit")
        slots = (begun or {}).get("details", {}).get("slots") or []
        ready = named.get("process_ready")
        found.append({
            "trial_id": trial_id, "launch": launch,
            "started": begun["started"] if begun else min(r["started"] for r in its),
            "ended": exited["ended"] if exited else max(r["ended"] for r in its),
            "slots": slots, "running": exited is None,
            "warm": (ready or begun or {}).get("details", {}).get("warm"),
            "ahead": bool((begun or {}).get("details", {}).get("ahead")),
            "phases": sorted(its, key=lambda r: (r["started"], r["ended"]))})
    return sorted(found, key=lambda launch: (launch["started"], launch["trial_id"]))


def segments(launch: dict) -> list[tuple[float, float, str]]:
    """The launch's time from its start to its end as (start, end, category) pieces, each
    moment once (see the module's docstring), neighbours of one category joined."""
    start, end = launch["started"], launch["ended"]
    edges: list[tuple[float, int, str]] = []
    for row in launch["phases"]:
        category = phases.PHASES.get(row["phase"])
        if category is None:
            continue
        if row["phase"] == _BACKGROUND:
            category = "background"
        lo, hi = max(row["started"], start), min(row["ended"], end)
        if hi > lo:
            edges += [(lo, 1, category), (hi, -1, category)]
    edges.sort(key=lambda edge: (edge[0], edge[1]))
    ranked = (*CATEGORIES[:4], "background", *CATEGORIES[4:])
    active: dict[str, int] = defaultdict(int)
    pieces: list[tuple[float, float, str]] = []

    def add(lo: float, hi: float, category: str) -> None:
        category = "checkpoints" if category == "background" else category
        if pieces and pieces[-1][2] == category and pieces[-1][1] == lo:
            pieces[-1] = (pieces[-1][0], hi, category)
        else:
            pieces.append((lo, hi, category))

    at = start
    for when, step, category in edges:
        if when > at:
            add(at, when, next((c for c in ranked if active[c] > 0), "untracked"))
            at = when
        active[category] += step
    if end > at:
        add(at, end, "untracked")
    return pieces


def _attribute(launch: dict) -> dict[str, float]:
    """Seconds of the launch under each category (and 'untracked'), each moment once."""
    seconds: dict[str, float] = defaultdict(float)
    for lo, hi, category in segments(launch):
        seconds[category] += hi - lo
    return seconds


def _waiting_since(db: StateDB, experiment_id: int) -> dict[int, list[float]]:
    """Trial id -> the moments it began to wait for a slot (made by the searcher, queued
    again), from the event log."""
    since: dict[int, list[float]] = defaultdict(list)
    for trial_id, kind, at, payload in db.db.execute(
            "SELECT trial_id, kind, at, payload FROM events WHERE experiment_id = ? AND "
            "kind IN ('trial_created', 'trial_state')", [experiment_id]):
        if trial_id is None:
            continue
        if kind == "trial_created" or json.loads(payload or "{}").get("state") == "QUEUED":
            since[trial_id].append(phases.seconds(at))
    return since


def summarize(db: StateDB, experiment_id: int, now: float | None = None) -> dict[str, Any]:
    """The experiment's timeline summed (see the module's docstring); {} when none of its
    launches recorded a timeline."""
    found = launches(phases.of_experiment(db, experiment_id))
    if not found:
        return {}
    now = now or time.time()
    for launch in found:
        if launch["running"]:
            launch["ended"] = max(launch["ended"], now)
    wall_start = min(launch["started"] for launch in found)
    wall_end = max(launch["ended"] for launch in found)
    wall = max(wall_end - wall_start, 0.0)
    seconds: dict[str, float] = defaultdict(float)
    lanes: dict[Any, list[dict]] = defaultdict(list)
    for launch in found:
        width = len(launch["slots"]) or 1
        for category, spent in _attribute(launch).items():
            seconds[category] += spent * width
        for slot in launch["slots"] or [("trial", launch["trial_id"])]:
            lanes[slot].append(launch)
    waiting = _waiting_since(db, experiment_id)
    for lane in lanes.values():
        at = wall_start
        for launch in sorted(lane, key=lambda launch: launch["started"]):
            if launch["started"] > at:  # the slot was free: was the trial waiting for it?
                since = max([t for t in waiting.get(launch["trial_id"], [])
                             if t <= launch["started"]], default=launch["started"])
                daemon = launch["started"] - max(at, since)
                seconds["daemon"] += daemon
                seconds["idle"] += launch["started"] - at - daemon
            at = max(at, launch["ended"])
        seconds["idle"] += max(wall_end - at, 0.0)
    capacity = wall * len(lanes)
    total = sum(seconds.values()) or 1.0
    return {
        "experiment_id": experiment_id,
        "trials": len({launch["trial_id"] for launch in found}),
        "launches": len(found),
        "slots": len(lanes),
        "wall_seconds": round(wall, 3),
        "slot_seconds": round(capacity, 3),
        "seconds": {name: round(seconds.get(name, 0.0), 3) for name in ORDER},
        # Of the seconds counted: the capacity, but for moments where two launches overlap
        # on a slot (an exit and the next launch recorded in one pass).
        "shares": {name: round(100.0 * seconds.get(name, 0.0) / total, 1) for name in ORDER},
        "phases": _phase_stats(found),
        "warm_launches": sum(1 for launch in found if launch["warm"]),
        "cold_launches": sum(1 for launch in found if launch["warm"] is False),
        "ahead_launches": sum(1 for launch in found if launch["ahead"]),  # started ahead
        "launch_to_first_batch": _stats(_spans(found, "launch", "first_batch")),
        "last_batch_to_slot_free": _stats(_last_batch_to_exit(found)),
        "running": sum(1 for launch in found if launch["running"]),
    }


def _phase_stats(found: list[dict]) -> dict[str, dict[str, float]]:
    """Each phase's count, total and mean seconds (phases of one launch may overlap)."""
    spans: dict[str, list[float]] = defaultdict(list)
    for launch in found:
        for row in launch["phases"]:
            spans[row["phase"]].append(row["ended"] - row["started"])
    ordered = [name for name in phases.PHASES if name in spans]
    return {name: {"count": len(spans[name]), **_stats(spans[name])} for name in ordered}


def _stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {"total": round(sum(values), 3), "mean": round(sum(values) / len(values), 3),
            "min": round(min(values), 3), "max": round(max(values), 3)}


def _spans(found: list[dict], first: str, last: str) -> list[float]:
    """Per launch: from the start of its phase `first` to the end of its phase `last`."""
    spans = []
    for launch in found:
        begun = next((r for r in launch["phases"] if r["phase"] == first), None)
        done = next((r for r in launch["phases"] if r["phase"] == last), None)
        if begun and done:
            spans.append(done["ended"] - begun["started"])
    return spans


def _last_batch_to_exit(found: list[dict]) -> list[float]:
    """Per ended launch: from its last training phase's end to its exit's record."""
    spans = []
    for launch in found:
        trained = [r["ended"] for r in launch["phases"] if r["phase"] == "training"]
        exited = [r["ended"] for r in launch["phases"] if r["phase"] == "exit"]
        if trained and exited:
            spans.append(exited[0] - max(trained))
    return spans


def strips(db: StateDB, experiment_id: int, trial_id: int | None = None) -> list[dict]:
    """The launches with their phases, for drawing (the dashboard): times as seconds since
    the epoch, each phase with its category."""
    found = launches(phases.of_experiment(db, experiment_id, trial_id))
    return [{**{k: v for k, v in launch.items() if k != "phases"},
             "phases": [{"phase": r["phase"], "category": phases.PHASES.get(r["phase"], "other"),
                         "started": r["started"], "ended": r["ended"],
                         "details": r["details"]} for r in launch["phases"]]}
            for launch in found]
