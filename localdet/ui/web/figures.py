"""Plotly figures from what localdet recorded, as plotly JSON for the page's plotly.js:

    curves(db, experiment, trials)       # every metric against batches, the best trial bold
    hyperparameters(experiment, trials)  # parallel coordinates: hyperparameters -> metric
    importance(found)                    # bars: each hyperparameter's importance
    scatter(experiment, trials)          # the metric against each hyperparameter
    compared_curves(found)               # experiments' best trials' searcher metric curves

Built with Plotly's Python package (which ships plotly.js too), so the charts need nothing
from the network.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import threading
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from localdet.operations.importance import hparam_types
from localdet.records.db import Experiment, StateDB
from localdet.ui.views import flat_hparams
from localdet.ui.web import curve_cache, downsample

# The modules plotly uses where they are installed, found in sys.modules as they are (its
# `get_module(..., should_load=False)`) or imported on first use: imported by two request
# threads at once, one of them met the other's half-initialized module ("partially
# initialized module 'numpy' has no attribute 'ndarray'"). `prepare` imports them whole
# before the first request.
PLOTLY_OPTIONAL = ("numpy", "pandas")
_preparing = threading.Lock()
_prepared = False


def prepare() -> None:
    """Import what plotly's figures use (those of PLOTLY_OPTIONAL installed), once a
    process, before the dashboard serves its first request."""
    global _prepared
    with _preparing:
        if _prepared:
            return
        for name in PLOTLY_OPTIONAL:
            if importlib.util.find_spec(name) is not None:
                importlib.import_module(name)
        _prepared = True


BEST = "#d62728"
OTHERS = "#1f77b4"


# How many trials the experiment page's learning curves draw, and how many points: Determined's
# API drew an experiment's best 25 trials by default (TrialsSample's max_trials) and its web UI
# asked for 1,000 to 1,500 points of a trial's series. A panel holds at most PANEL_POINTS
# points (each series at least MIN_SERIES_POINTS); every point stays available on request.
CURVE_TRIALS = 25
PANEL_POINTS = 4000
SERIES_POINTS = 1000
MIN_SERIES_POINTS = 20


def curve_trials(trials: list[dict], metric: str, smaller_is_better: bool,
                 limit: int = CURVE_TRIALS) -> list[int]:
    """The trials an experiment's page draws curves of (`trials`: their facts): the best
    `limit` by their best searcher metric, best first, then those still running (at most
    `limit` more) and, while fewer than `limit` have a metric, those without one."""
    def score(t: dict) -> float | None:
        return _score(t, metric)

    scored = sorted((t for t in trials if score(t) is not None),
                    key=lambda t: score(t) if smaller_is_better else -score(t))  # type: ignore
    chosen = [t["id"] for t in scored[:limit]]
    running = [t["id"] for t in trials if t["state"] == "RUNNING" and t["id"] not in chosen]
    unscored = [t["id"] for t in trials if score(t) is None and t["id"] not in running]
    return chosen + running[:limit] + unscored[:max(0, limit - len(chosen))]


def series_points(trials: int) -> int:
    """Points per series when `trials` trials share a panel."""
    return max(MIN_SERIES_POINTS, min(SERIES_POINTS, PANEL_POINTS // max(1, trials)))


def _series(db: StateDB, trial_ids: list[int], points: int | None
            ) -> tuple[dict[str, dict[int, tuple[list, list]]], bool]:
    """metric name -> trial id -> (batches, values), each series thinned to `points`
    (None: every point), and whether one was; validation names start with val_. The
    trials in id order; an ended trial's points kept between requests (curve_cache)."""
    series: dict[str, dict[int, tuple[list, list]]] = {}
    thinned = False
    by_trial = curve_cache.read(db, trial_ids)
    for trial_id in sorted(by_trial):
        for key, (xs, ys) in by_trial[trial_id].items():
            if points is not None:
                thinned = thinned or len(xs) > points
                xs, ys = downsample.min_max(xs, ys, points)
                # Six digits draw the same line in a fraction of the bytes.
                ys = [float(f"{y:.6g}") for y in ys]
            series.setdefault(key, {})[trial_id] = (xs, ys)
    return series, thinned


def curves(db: StateDB, trial_ids: list[int], best_trial: int | None = None,
           title: str = "", full: bool = False) -> dict[str, Any]:
    """One panel per metric, one line per trial; the best trial drawn bold in red. Each
    series thinned to `series_points(len(trial_ids))` points (downsample.min_max), or every
    point with `full`; `thinned` says whether a series was."""
    series, thinned = _series(db, trial_ids, None if full else series_points(len(trial_ids)))
    names = sorted(series, key=lambda n: (n.startswith("training"), n))
    if not names:
        return _empty("no metrics recorded yet")
    columns = min(2, len(names))
    rows = math.ceil(len(names) / columns)
    figure = make_subplots(rows=rows, cols=columns, subplot_titles=names,
                           horizontal_spacing=0.08, vertical_spacing=0.12)
    traces = []
    for index, name in enumerate(names):
        row, column = index // columns + 1, index % columns + 1
        axis = "" if index == 0 else str(index + 1)  # make_subplots numbers them row by row
        # The best trial last, so that it is drawn on top.
        for trial_id in sorted(series[name], key=lambda t: t == best_trial):
            xs, ys = series[name][trial_id]
            best = trial_id == best_trial
            # Plain data, as plotly's Scatter would write it: its checks of every point took
            # most of the page's time for thousands of points.
            traces.append({
                "type": "scatter", "x": xs, "y": ys,
                "mode": "lines+markers" if len(xs) < 30 else "lines",
                "name": f"trial {trial_id}" + (" (best)" if best else ""),
                "legendgroup": str(trial_id), "showlegend": index == 0,
                "line": {"color": BEST if best else OTHERS, "width": 3 if best else 1.2},
                "opacity": 1.0 if best or best_trial is None else 0.55,
                "hovertemplate": f"trial {trial_id}<br>batches %{{x}}<br>{name} %{{y:.4g}}"
                                 "<extra></extra>",
                "xaxis": f"x{axis}", "yaxis": f"y{axis}"})
        figure.update_xaxes(title_text="batches", row=row, col=column)
    figure.update_layout(title=title or None, height=300 * rows + 80, margin=_MARGIN,
                         uirevision="keep", legend={"orientation": "h", "y": -0.12})
    plain = _plain(figure)
    plain["data"] = traces
    plain["thinned"] = thinned  # (beside plotly's data and layout: the page says so)
    return plain


def hyperparameters(experiment: Experiment, trials: list[dict]) -> dict[str, Any]:
    """Parallel coordinates: one axis per hyperparameter that varies, then the searcher
    metric (each trial's best value); lines coloured by the metric."""
    scored = [t for t in trials if (t.get("best_validation") or {}).get(experiment.metric)
              is not None]
    if not scored:
        return _empty("no validation metrics yet")
    dimensions = []
    for name in sorted({k for t in scored for k in flat_hparams(t["hparams"])}):
        values = [flat_hparams(t["hparams"]).get(name) for t in scored]
        if len({repr(v) for v in values}) < 2:
            continue  # a constant says nothing here
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            dimensions.append({"label": name, "values": values})
        else:  # categories: positions with their names as ticks
            labels = sorted({str(v) for v in values})
            dimensions.append({"label": name, "values": [labels.index(str(v)) for v in values],
                               "tickvals": list(range(len(labels))), "ticktext": labels})
    metric = [t["best_validation"][experiment.metric] for t in scored]
    dimensions.append({"label": experiment.metric, "values": metric})
    # Made by plotly without the values, which are put in after: its checks of each value
    # took most of the chart's time for 1,000 trials.
    figure = go.Figure(go.Parcoords(
        line={"colorscale": "Viridis", "showscale": True,
              "reversescale": bool(experiment.smaller_is_better)},
        dimensions=[{k: v for k, v in d.items() if k != "values"} for d in dimensions]))
    figure.update_layout(height=360, margin={"l": 60, "r": 60, "t": 50, "b": 30},
                         uirevision="keep")
    plain = _plain(figure)
    (trace,) = plain["data"]
    trace["line"]["color"] = metric
    for made, given in zip(trace["dimensions"], dimensions, strict=True):
        made["values"] = given["values"]
    return plain


def importance(found: dict[str, Any] | None) -> dict[str, Any]:
    """Horizontal bars, the most important hyperparameter on top; the answer's note (too
    few trials, constants left out) as the title."""
    if not found or not found["importances"]:
        return _empty((found or {}).get("note") or "no validation metrics yet")
    names = list(found["importances"])[::-1]  # plotly draws the first bar at the bottom
    values = [found["importances"][name] for name in names]
    figure = go.Figure(go.Bar(x=values, y=names, orientation="h", marker={"color": OTHERS},
                              text=[f"{v:.2f}" for v in values], textposition="auto",
                              hovertemplate="%{y}: %{x:.3f}<extra></extra>"))
    figure.update_layout(
        height=120 + 32 * len(names), margin={"l": 140, "r": 20, "t": 50, "b": 40},
        title={"text": f"importance for {found['metric']} ({found['evaluator']}, "
                       f"{found['trials']} trials)" + (f"<br><sub>{found['note']}</sub>"
                                                       if found["note"] else ""),
               "font": {"size": 14}},
        xaxis={"title": {"text": "importance (sums to 1)"}, "rangemode": "tozero"},
        uirevision="keep")
    return _plain(figure)


def scatter(experiment: Experiment, trials: list[dict]) -> dict[str, Any]:
    """One small chart per hyperparameter that varies: each trial's best value of the
    searcher metric against its value; a log axis for a `log` hyperparameter, a band of
    categories for a categorical (or any non-numeric) one."""
    scored = [t for t in trials if _score(t, experiment.metric) is not None]
    if not scored:
        return _empty("no validation metrics yet")
    types = hparam_types(experiment.config)
    columns_of = {t["id"]: flat_hparams(t["hparams"]) for t in scored}
    names = [name for name in sorted({k for f in columns_of.values() for k in f})
             if len({json.dumps(f.get(name), sort_keys=True, default=str)
                     for f in columns_of.values()}) > 1]
    if not names:
        return _empty("no hyperparameter varied")
    columns = min(3, len(names))
    rows = math.ceil(len(names) / columns)
    figure = make_subplots(rows=rows, cols=columns, subplot_titles=names,
                           horizontal_spacing=0.07, vertical_spacing=0.18 if rows > 1 else 0.1,
                           shared_yaxes=True)
    metric = [_score(t, experiment.metric) for t in scored]
    ids = [t["id"] for t in scored]
    given = []  # each trace's points, put in after plotly made it (as in `hyperparameters`)
    for index, name in enumerate(names):
        row, column = index // columns + 1, index % columns + 1
        values = [columns_of[t["id"]].get(name) for t in scored]
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        xs = values if numeric else [v if isinstance(v, str) else json.dumps(v) for v in values]
        given.append(xs)
        figure.add_trace(go.Scatter(
            x=[], y=[], mode="markers", name=name, showlegend=False,
            marker={"colorscale": "Viridis", "size": 8,
                    "reversescale": bool(experiment.smaller_is_better)},
            hovertemplate=f"trial %{{customdata}}<br>{name} %{{x}}<br>{experiment.metric} "
                          "%{y:.4g}<extra></extra>"), row=row, col=column)
        if not numeric:
            figure.update_xaxes(type="category", categoryorder="category ascending",
                                row=row, col=column)
        elif types.get(name) == "log" and all(v > 0 for v in values if v is not None):
            figure.update_xaxes(type="log", row=row, col=column)
        if column == 1:
            figure.update_yaxes(title_text=experiment.metric, row=row, col=column)
    figure.update_layout(height=260 * rows + 60, margin=_MARGIN, uirevision="keep")
    plain = _plain(figure)
    for trace, xs in zip(plain["data"], given, strict=True):
        trace.update(x=xs, y=metric, customdata=ids)
        trace["marker"]["color"] = metric
    return plain


def _score(trial: dict, metric: str) -> float | None:
    value = (trial.get("best_validation") or {}).get(metric)
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def compared_curves(found: dict[str, Any]) -> dict[str, Any]:
    """Each experiment's best trial's validation curve of its searcher metric (compare's
    columns), one line per experiment; a panel per searcher metric name."""
    drawn = [c for c in found["experiments"] if c["curve"]]
    if not drawn:
        return _empty("none of these experiments has a validated trial")
    names = list(dict.fromkeys(c["metric"] for c in drawn))
    figure = make_subplots(rows=1, cols=len(names), subplot_titles=names,
                           horizontal_spacing=0.08)
    for index, name in enumerate(names):
        for c in drawn:
            if c["metric"] != name:
                continue
            xs, ys = zip(*c["curve"], strict=True)
            figure.add_trace(go.Scatter(
                x=xs, y=ys, mode="lines+markers" if len(xs) < 30 else "lines",
                name=f"experiment {c['id']}: {c['name']} (trial {c['best_trial']})",
                hovertemplate=f"experiment {c['id']}<br>batches %{{x}}<br>{name} %{{y:.4g}}"
                              "<extra></extra>"), row=1, col=index + 1)
        figure.update_xaxes(title_text="batches", row=1, col=index + 1)
    figure.update_layout(height=420, margin=_MARGIN, uirevision="keep",
                         legend={"orientation": "h", "y": -0.2})
    return _plain(figure)


_MARGIN = {"l": 50, "r": 20, "t": 60, "b": 40}


def _plain(figure: go.Figure) -> dict[str, Any]:
    # Plotly's own encoder turns NumPy values into JSON; the API then sends plain data.
    return json.loads(figure.to_json())


def _empty(message: str) -> dict[str, Any]:
    figure = go.Figure()
    figure.update_layout(height=200, xaxis={"visible": False}, yaxis={"visible": False},
                         annotations=[{"text": message, "showarrow": False,
                                       "font": {"size": 16}}])
    return _plain(figure)
