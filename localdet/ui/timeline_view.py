"""`localdet status ID --timeline`: where a search's time went (localdet/operations/timeline.py).

    experiment 3: 4 trials, 4 launches on 1 slot over 9.8 s (9.8 slot-seconds)
      training      5.1 s   52.0%
      ...
"""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.table import Table

from localdet.operations import timeline
from localdet.records.db import NotFound, StateDB

LABELS = {"training": "training", "start-up": "start-up (launch to first batch)",
          "validation": "validation", "checkpoints": "checkpoints (training paused, stored)",
          "shut-down": "shut-down (last work to the process's end)",
          "daemon": "the daemon (deciding, launching, recording exits)",
          "untracked": "untracked (in a trial, between phases)", "idle": "idle slots"}


def show_timeline(console: Console, db: StateDB, experiment_id: int | None,
                  as_json: bool) -> None:
    if experiment_id is None:
        raise click.UsageError("--timeline needs an experiment: localdet status ID --timeline")
    try:
        db.experiment(experiment_id)
    except NotFound as error:
        raise click.ClickException(str(error)) from None
    summary = timeline.summarize(db, experiment_id)
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    if not summary:
        console.print(f"experiment {experiment_id} has no timeline: none of its trials was "
                      "launched by a localdet that records one")
        return
    slots = summary["slots"]
    console.print(
        f"experiment {experiment_id}: {summary['trials']} trial(s), {summary['launches']} "
        f"launch(es) ({summary['warm_launches']} warm, {summary['cold_launches']} cold"
        + (f"; {summary['ahead_launches']} started ahead of the slot"
           if summary.get("ahead_launches") else "") + ") on "
        f"{slots} slot{'s' if slots != 1 else ''} over {summary['wall_seconds']:.1f} s "
        f"({summary['slot_seconds']:.1f} slot-seconds)"
        + (f"; {summary['running']} still running" if summary["running"] else ""))
    shares = Table(box=None, show_header=True, pad_edge=False)
    shares.add_column("where the slot-seconds went")
    shares.add_column("seconds", justify="right")
    shares.add_column("share", justify="right")
    for name, label in LABELS.items():
        shares.add_row(label, f"{summary['seconds'][name]:.2f}", f"{summary['shares'][name]:.1f}%")
    shares.add_row("total", f"{sum(summary['seconds'].values()):.2f}",
                   f"{sum(summary['shares'].values()):.1f}%")
    console.print(shares)
    each = Table(box=None, show_header=True, pad_edge=False)
    each.add_column("phase")
    each.add_column("count", justify="right")
    each.add_column("mean s", justify="right")
    each.add_column("max s", justify="right")
    each.add_column("total s", justify="right")
    for name, stats in summary["phases"].items():
        each.add_row(name, str(stats["count"]), f"{stats['mean']:.3f}", f"{stats['max']:.3f}",
                     f"{stats['total']:.2f}")
    console.print(each)
    for key, label in (("launch_to_first_batch", "launch to first batch"),
                       ("last_batch_to_slot_free", "last batch to the slot free")):
        stats = summary[key]
        if stats:
            console.print(f"{label}: mean {stats['mean']:.2f} s (min {stats['min']:.2f}, "
                          f"max {stats['max']:.2f})")
