"""How `det` prints, as Determined's CLI did: tables in tabulate's "presto" style (numbers
right-aligned, text left), `--csv` with the same headers, `--json` sorted and indented by
two, times in UTC as `2024-05-01 12:00:00+0000`, progress as `42.0%`; errors one line on
stderr and a non-zero exit status.

    table(["ID", "Name"], [[1, "mnist"]], as_csv=False)
"""

from __future__ import annotations

import csv
import datetime
import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

import click


def fail(message: str, code: int = 1) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value)
    return str(value)


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], as_csv: bool = False) -> None:
    """Print rows under headers: presto-style, or CSV with a header row."""
    rows = [list(row) for row in rows]
    if as_csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(headers)
        writer.writerows([[_cell(v) for v in row] for row in rows])
        return
    # A cell may hold several lines (JSON of hyperparameters): each row is as tall as its
    # tallest cell, as tabulate printed it.
    cells = [[_cell(v).split("\n") for v in row] for row in rows]
    head = [h.split("\n") for h in headers]
    widths = [max([len(line) for line in head[i]]
                  + [len(line) for row in cells for line in row[i]] + [0])
              for i in range(len(headers))]
    columns = range(len(headers))
    # A column is right-aligned when every value in it is a number (tabulate's rule).
    right = [bool(rows) and all(_numeric(row[i]) or row[i] is None for row in rows)
             and any(_numeric(row[i]) for row in rows) for i in columns]

    def line(parts: list[list[str]], aligned: list[bool]) -> list[str]:
        height = max([len(p) for p in parts] + [1])
        out = []
        for k in range(height):
            texts = [(p[k] if k < len(p) else "") for p in parts]
            out.append("|".join(f" {t.rjust(widths[i]) if aligned[i] else t.ljust(widths[i])} "
                                for i, t in enumerate(texts)).rstrip())
        return out

    printed = line(head, [False] * len(headers))
    printed.append("+".join("-" * (w + 2) for w in widths))
    for row in cells:
        printed.extend(line(row, right))
    click.echo("\n".join(printed))


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def format_time(text: str | None) -> str | None:
    """An ISO time as Determined showed it: UTC, `%Y-%m-%d %H:%M:%S%z`."""
    if not text:
        return None
    moment = datetime.datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return moment.astimezone(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S%z")


def format_percent(value: float | None) -> str | None:
    return None if value is None else f"{value:.1%}"


def json_cell(value: Any, indent: int = 4) -> str:
    return json.dumps(value, indent=indent)


def yes_or_no(prompt: str) -> bool:
    """Ask until y/yes or n/no; Ctrl-C or end of input is no."""
    try:
        while True:
            answer = input(f"{prompt} [y/n]: ").strip().lower()
            if answer in ("y", "yes"):
                return True
            if answer in ("n", "no"):
                return False
            click.echo("Please respond with 'y' or 'yes' or 'n' or 'no'")
    except (KeyboardInterrupt, EOFError):
        click.echo()
        return False


def size(bytes_: float) -> str:
    """Bytes as Determined's `sizeof_fmt` wrote them (1.2MB)."""
    for unit in ("", "K", "M", "G", "T"):
        if abs(bytes_) < 1024.0:
            return f"{bytes_:3.1f}{unit}B"
        bytes_ /= 1024.0
    return f"{bytes_:.1f}PB"
