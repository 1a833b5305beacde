"""A click group whose subcommands also answer to Determined's second names (`ls`, `lt`,
`lc`, `unpause`), shown beside them in the help."""

from __future__ import annotations

from typing import Any

import click


class AliasedGroup(click.Group):
    def __init__(self, *args: Any, aliases: dict[str, str] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.aliases = aliases or {}  # alias -> command name

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return super().get_command(ctx, self.aliases.get(cmd_name, cmd_name))

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        second = {name: alias for alias, name in self.aliases.items()}
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is None or command.hidden:
                continue
            shown = f"{name}, {second[name]}" if name in second else name
            rows.append((shown, command.get_short_help_str(limit=52)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)
