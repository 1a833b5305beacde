"""localdet.ui.fast_table.FastTable draws exactly what rich's Table draws: the same
characters and the same styles, or rich's own drawing where it cannot."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from rich.table import Table
from rich.text import Text

from localdet.ui.fast_table import FastTable

CONSOLES = {"plain": {"width": 120},
            "colour": {"width": 120, "force_terminal": True, "color_system": "truecolor"},
            "narrow: cells wrap": {"width": 34, "force_terminal": True,
                                   "color_system": "standard"},
            "too narrow": {"width": 12}}


def _table(cls, rows: int) -> Table:
    table = cls(title="Experiment 7 ([bold]digits[/]) [dim](foreground)[/]",
                caption="Keras 3 (trials 1, 2): rule default", caption_justify="left")
    table.add_column("ID", justify="right")
    table.add_column("Name")
    table.add_column("State", style="bold")
    table.add_column("Batches", justify="center")
    table.add_column("")  # a column of nothing but padding
    for i in range(rows):
        state = "" if i == 2 else "[cyan]ACTIVE[/]" if i % 2 else "[red]ERROR[/]"
        table.add_row(str(i * 37), f"run {i} :smile: \\[x] ", state, "ab " * i, "")
    return table


def _drawn(table: Table, console: dict) -> str:
    out = io.StringIO()
    Console(file=out, **console).print(table)
    return out.getvalue()


@pytest.mark.parametrize("console", CONSOLES.values(), ids=list(CONSOLES))
@pytest.mark.parametrize("rows", [0, 1, 2, 6])
def test_it_draws_what_rich_draws(rows, console):
    assert _drawn(_table(FastTable, rows), console) == _drawn(_table(Table, rows), console)


def test_lines_and_wrapped_cells_are_drawn_as_rich_draws_them():
    tables = []
    for cls in (Table, FastTable):
        table = cls(title="Metrics of a run whose title is longer than the table")
        table.add_column("Name")
        table.add_column("Value", justify="right", style="bold")
        table.add_row("two\nlines", "x")
        table.add_row("a long hyperparameter list, " * 4, "[red]1.5[/]")
        tables.append(table)
    for console in CONSOLES.values():
        assert _drawn(tables[1], console) == _drawn(tables[0], console)
    assert tables[1]._drawn(Console(width=40), Console(width=40).options) is not None


def test_a_renderable_in_a_cell_is_left_to_rich():
    tables = []
    for cls in (Table, FastTable):
        table = cls(title="Metrics")
        table.add_column("Name")
        table.add_row(Text("styled", style="bold"))
        tables.append(table)
    assert _drawn(tables[1], CONSOLES["colour"]) == _drawn(tables[0], CONSOLES["colour"])
    assert tables[1]._drawn(Console(), Console().options) is None
