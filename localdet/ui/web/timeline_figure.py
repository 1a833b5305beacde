"""The timeline strips: one row per trial, its launches' phases as coloured pieces on one
time axis (seconds since the search's first launch), so a search's idle slots and slow
starts show at a glance (localdet/operations/timeline.py cuts each launch into pieces).

    strips(db, experiment_id)             # the experiment page: every trial, one under another
    strips(db, experiment_id, trial_id)   # the trial page: its own strip
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from localdet.operations import timeline
from localdet.records import phases
from localdet.records.db import StateDB
from localdet.ui.web.figures import _empty, _plain

COLOURS = {"training": "#2ca02c", "start-up": "#ff7f0e", "validation": "#1f77b4",
           "checkpoints": "#9467bd", "shut-down": "#8c564b", "daemon": "#d62728",
           "untracked": "#c7c7c7"}
MAX_TRIALS = 200  # the latest trials of a larger search: the page stays quick


def strips(db: StateDB, experiment_id: int, trial_id: int | None = None) -> dict[str, Any]:
    found = timeline.launches(phases.of_experiment(db, experiment_id, trial_id))
    if not found:
        return _empty("no timeline recorded yet")
    trials = sorted({launch["trial_id"] for launch in found})
    shown = set(trials[-MAX_TRIALS:])
    found = [launch for launch in found if launch["trial_id"] in shown]
    origin = min(launch["started"] for launch in found)
    bars: dict[str, dict[str, list]] = {c: {"x": [], "base": [], "y": [], "text": []}
                                        for c in COLOURS}
    for launch in found:
        row = f"trial {launch['trial_id']}"
        for lo, hi, category in timeline.segments(launch):
            bar = bars[category]
            bar["x"].append(round(hi - lo, 3))
            bar["base"].append(round(lo - origin, 3))
            bar["y"].append(row)
            bar["text"].append(_hover(launch, lo, hi, category))
    figure = go.Figure([
        go.Bar(name=category, orientation="h", x=bar["x"], base=bar["base"], y=bar["y"],
               marker={"color": COLOURS[category]}, hovertext=bar["text"],
               hoverinfo="text") for category, bar in bars.items() if bar["x"]])
    rows = len(shown)
    title = "each launch's phases" + (f" (the latest {MAX_TRIALS} of {len(trials)} trials)"
                                      if len(trials) > MAX_TRIALS else "")
    figure.update_layout(
        barmode="overlay", height=110 + 24 * rows, bargap=0.25,
        margin={"l": 80, "r": 20, "t": 40, "b": 40}, title={"text": title, "font": {"size": 14}},
        xaxis={"title": {"text": "seconds since the first launch"}, "rangemode": "tozero"},
        yaxis={"autorange": "reversed", "type": "category",
               "categoryarray": [f"trial {t}" for t in sorted(shown)]},
        legend={"orientation": "h", "y": 1.02, "x": 1, "xanchor": "right", "yanchor": "bottom"},
        uirevision="keep")
    return _plain(figure)


def _hover(launch: dict, lo: float, hi: float, category: str) -> str:
    """The piece's category and length, and the phases of that category in it."""
    named = [f"{row['phase']} {row['ended'] - row['started']:.2f} s"
             + (" (warm)" if row["details"].get("warm") else
                " (cold)" if row["details"].get("warm") is False else "")
             for row in launch["phases"]
             if phases.PHASES.get(row["phase"]) == category
             and row["started"] < hi and row["ended"] > lo][:8]
    return (f"trial {launch['trial_id']}: {category} {hi - lo:.2f} s"
            + ("<br>" + "<br>".join(named) if named else ""))
