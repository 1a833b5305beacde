"""What `localdet metrics` shows: an experiment's recorded metrics as a table, CSV or PNG of
learning curves.

    report = collect(db, db.experiment(1), trial_id=None, metric="val_loss")
    console.print(table(report))
    write_csv(report, sys.stdout)
    plot(report, Path("curves.png"), best_trial=3)   # matplotlib, imported only here
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO, TypeGuard

from rich.markup import escape
from rich.table import Table

from localdet.records.db import Experiment, StateDB
from localdet.ui.fast_table import FastTable  # hundreds of rows: rich's Table took 0.2 s

KINDS = ("training", "validation")


class MetricsError(Exception):
    """The user asked for metrics that are not there (one sentence)."""


@dataclass(slots=True)
class Row:
    trial_id: int
    kind: str  # training or validation
    batches: int
    metrics: dict[str, Any]


@dataclass
class Report:
    experiment_id: int
    names: list[str]  # the metric columns, in the order they were first recorded
    rows: list[Row]   # by trial, then batches, training before validation
    trial_id: int | None = None  # the one trial asked for, if any

    def series(self, name: str) -> dict[tuple[int, str], list[tuple[int, float]]]:
        """`{(trial, kind): [(batches, value), ...]}` for one metric's numeric values."""
        lines: dict[tuple[int, str], list[tuple[int, float]]] = {}
        for row in self.rows:
            value = row.metrics.get(name)
            if _numeric(value):
                lines.setdefault((row.trial_id, row.kind), []).append((row.batches, float(value)))
        return lines


def _numeric(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def collect(db: StateDB, experiment: Experiment, trial_id: int | None = None,
            metric: str | None = None) -> Report:
    """The experiment's (or one of its trials') training and validation rows, every metric or
    the one named. Raises MetricsError."""
    trials = db.trials(experiment.id)
    if trial_id is not None:
        if trial_id not in {t.id for t in trials}:
            listed = ", ".join(str(t.id) for t in trials) or "none yet"
            raise MetricsError(f"experiment {experiment.id} has no trial {trial_id} "
                               f"(its trials: {listed})")
        trials = [t for t in trials if t.id == trial_id]
    rows: list[Row] = []
    for t in trials:  # as db.metrics(t.id) orders them, read plainly: 1.1 million rows
        rows.extend(Row(t.id, kind, batches, json.loads(text)) for kind, batches, text in
                    db.db.execute("SELECT kind, batches_trained, metrics FROM metrics WHERE "
                                  "trial_id = ? ORDER BY batches_trained, kind", [t.id])
                    if kind in KINDS)
    what = f"trial {trial_id}" if trial_id is not None else f"experiment {experiment.id}"
    if not rows:
        raise MetricsError(f"{what} has no metrics recorded yet")
    names: list[str] = []
    for row in rows:
        names.extend(name for name in row.metrics if name not in names)
    if metric is not None:
        if metric not in names:
            raise MetricsError(f"{what} never recorded a metric named '{metric}'; "
                               f"recorded: {', '.join(names)}")
        names = [metric]
        rows = [row for row in rows if metric in row.metrics]
    return Report(experiment.id, names, rows, trial_id)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def table(report: Report) -> Table:
    table = FastTable(title=f"Metrics of experiment {report.experiment_id}"
                        + (f", trial {report.trial_id}" if report.trial_id is not None else ""))
    for column in ("Trial", "Kind", "Batches"):
        table.add_column(column, justify="left" if column == "Kind" else "right")
    for name in report.names:
        table.add_column(escape(name), justify="right")
    for row in report.rows:
        table.add_row(str(row.trial_id), row.kind, str(row.batches),
                      *(escape(_cell(row.metrics.get(name))) for name in report.names))
    return table


def write_csv(report: Report, out: TextIO) -> None:
    """Header `trial,kind,batches,<metric>...`; values at full precision (repr), a metric
    a row lacks left empty."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["trial", "kind", "batches", *report.names])
    for row in report.rows:
        writer.writerow([row.trial_id, row.kind, row.batches,
                         *("" if row.metrics.get(name) is None else row.metrics[name]
                           for name in report.names)])


def curves(report: Report, best_trial: int | None = None):
    """The learning curves as a matplotlib Figure (Agg): one subplot per metric, x = batches
    trained, one line per trial and kind (training dashed, validation solid, labelled
    "trial N"), the best trial thicker. Close it with `matplotlib.pyplot.close`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    names = [name for name in report.names if report.series(name)]
    if not names:
        raise MetricsError(f"experiment {report.experiment_id} has no numeric metrics to plot")
    trial_ids = sorted({row.trial_id for row in report.rows})
    colours = plt.get_cmap("tab10" if len(trial_ids) <= 10 else "tab20")
    colour = {t: colours(i % colours.N) for i, t in enumerate(trial_ids)}
    columns = min(3, len(names))
    rows = math.ceil(len(names) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(5.5 * columns, 3.8 * rows),
                                squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):  # the grid may have spare axes
        lines = report.series(name)
        both_kinds = len({kind for _, kind in lines}) > 1
        for (trial, kind), points in sorted(lines.items()):
            best = trial == best_trial
            label = f"trial {trial}" + (" (best)" if best else "")
            if both_kinds and kind == "training":
                label += " (training)"
            xs, ys = zip(*points, strict=True)  # (batches, value) pairs
            ax.plot(xs, ys, linestyle="--" if kind == "training" else "-",
                    linewidth=3.0 if best else 1.3, color=colour[trial], label=label,
                    marker="o" if len(points) <= 20 else None, markersize=3,
                    zorder=3 if best else 2)
        ax.set_title(name)
        ax.set_xlabel("batches trained")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
        if len(lines) <= 12:
            ax.legend(fontsize="small")
    for ax in list(axes.flat)[len(names):]:
        ax.set_visible(False)
    figure.suptitle(f"Experiment {report.experiment_id}"
                    + (f" (best: trial {best_trial})" if best_trial is not None else ""))
    figure.tight_layout()
    return figure


def plot(report: Report, path: Path, best_trial: int | None = None) -> Path:
    """Write `curves` to `path` as a PNG; returns the path."""
    return save_png(curves(report, best_trial), path, MetricsError)


def save_png(figure, path: Path, error: type[Exception]) -> Path:
    """Write a matplotlib figure (made with the Agg backend) to `path` as a PNG and close
    it; a path that cannot be written raises `error`, in one sentence."""
    import matplotlib.pyplot as plt

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, format="png", dpi=100)
    except OSError as problem:
        raise error(f"cannot write {path}: {problem.strerror or problem}") from None
    finally:
        plt.close(figure)
    return path
