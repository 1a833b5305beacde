"""`localdet compare 3 7 [...]`: experiments side by side, each by its best trial
(localdet/operations/compare.py): a table whose rows are the best trials' facts,
hyperparameters and validation metrics and whose columns are the experiments; `--json` the
same facts; `--plot FILE.png` the best trials' validation curves of the searcher metric, one
line per experiment."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from localdet.operations.errors import NotFound, OperationError
from localdet.paths import Layout
from localdet.records.db import StateDB

console = Console(width=None if sys.stdout.isatty() else 160)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


def table(found: dict[str, Any]) -> Table:
    columns = found["experiments"]
    out = Table(title="Experiments by their best trials")
    out.add_column("")
    for c in columns:
        out.add_column(escape(f"{c['id']}: {c['name']}"), justify="right")

    def row(label: str, values: list[Any], style: str | None = None) -> None:
        out.add_row(escape(label), *(escape(_cell(v)) for v in values), style=style)

    row("state", [c["state"] for c in columns])
    row("searcher", [c["searcher"] for c in columns])
    row("trials", [c["num_trials"] for c in columns])
    row("best trial", [c["best_trial"] for c in columns])
    row("searcher metric", [c["metric"] for c in columns])
    row("best", [c["best_metric"] for c in columns], style="bold")
    row("at batches", [c["best_batches"] for c in columns])
    row("batches trained", [c["batches"] for c in columns])
    out.add_section()
    for name in found["hyperparameters"]:
        row(name, [c["hparams"].get(name) for c in columns])
    out.add_section()
    for name in found["metrics"]:
        row(name, [c["validation"].get(name) for c in columns])
    return out


def plot(found: dict[str, Any], path: Path) -> Path:
    """The best trials' validation curves of their searcher metrics (one panel per metric
    name, one line per experiment) as a PNG. Raises OperationError."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = [c for c in found["experiments"] if c["curve"]]
    if not drawn:
        raise OperationError("none of these experiments has a validated trial to plot")
    names = list(dict.fromkeys(c["metric"] for c in drawn))
    columns = min(2, len(names))
    figure, axes = plt.subplots(math.ceil(len(names) / columns), columns,
                                figsize=(7 * columns, 4.2 * math.ceil(len(names) / columns)),
                                squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        for c in drawn:
            if c["metric"] != name:
                continue
            xs, ys = zip(*c["curve"], strict=True)
            ax.plot(xs, ys, marker="o" if len(xs) <= 20 else None, markersize=3,
                    label=f"experiment {c['id']}: {c['name']} (trial {c['best_trial']})")
        ax.set_title(f"{name} of each best trial")
        ax.set_xlabel("batches trained")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    for ax in list(axes.flat)[len(names):]:
        ax.set_visible(False)
    figure.tight_layout()
    from localdet.ui.metrics_report import save_png

    return save_png(figure, path, OperationError)


@click.command()
@click.argument("experiment_ids", nargs=-1, type=int, metavar="ID ID [ID...]")
@click.option("--json", "as_json", is_flag=True, help="Print the facts as JSON.")
@click.option("--plot", "plot_to", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the best trials' validation curves to this PNG.")
def compare(experiment_ids: tuple[int, ...], as_json: bool, plot_to: Path | None) -> None:
    """Experiments side by side: each one's best trial, its hyperparameters, metrics and
    validation curve (two or more IDs)."""
    _run(experiment_ids, as_json, plot_to)


def _run(experiment_ids: tuple[int, ...], as_json: bool, plot_to: Path | None) -> None:
    from localdet.operations.compare import compare as compare_experiments

    layout = Layout.from_environment()
    if not layout.db.exists():
        _fail(f"no localdet state at {layout.home}; submit an experiment first")
    with StateDB.open_readonly(layout.db) as db:
        try:
            found = compare_experiments(db, experiment_ids)
        except (NotFound, OperationError) as error:
            _fail(str(error))
    if plot_to is not None:
        try:
            click.echo(f"learning curves written to {plot(found, plot_to)}", err=as_json)
        except OperationError as error:
            _fail(str(error))
    if as_json:
        click.echo(json.dumps(found, indent=2))
    else:
        console.print(table(found))


def _fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(1)
