"""The `det` command: Determined's command line, spelled as its users type it, over the same
`$LOCALDET_HOME` as `localdet` (and the same operations, localdet/operations/*).

    det experiment create const.yaml . -f     # det e create ...
    det e list --all
    det t logs 3 -f
    det c download 1b2c3d4e -o ./best
    det m register-version mnist 1b2c3d4e
    det job run batch_inference.yaml .

Each noun lives in its own module, imported only when it is used, so that a read-only
command starts fast. There is no master: `-m/--master`, `-u/--user` and `DET_MASTER` are
accepted and ignored (with a one-line notice), and the cluster's nouns (agent, slot, user,
notebook, shell, cmd, ...) answer in one line what to use instead.
"""

from __future__ import annotations

import importlib
import os
import sqlite3
import sys

import click

from localdet.paths import Layout

# name -> (module, short help, Determined's aliases)
NOUNS = {
    "experiment": ("experiment", "manage experiments", ("e",)),
    "trial": ("trial", "manage trials", ("t",)),
    "checkpoint": ("checkpoint", "manage checkpoints", ("c",)),
    "model": ("model", "manage models", ("m",)),
    "job": ("job", "run and list jobs (batch inference)", ("j",)),
    "version": ("version", "show the version of det and localdet", ()),
}


def _resolve(name: str) -> str | None:
    from localdet.ui.det import cluster

    if name in NOUNS:
        return name
    for noun, (_, _, aliases) in NOUNS.items():
        if name in aliases:
            return noun
    if name in cluster.ALIASES:
        return cluster.ALIASES[name]
    return None


class DetGroup(click.Group):
    """Nouns loaded on first use, under their names and Determined's aliases."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(NOUNS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        from localdet.ui.det import cluster

        name = _resolve(cmd_name)
        if name is None:
            return None
        if name in NOUNS:
            module = importlib.import_module(f"localdet.ui.det.{NOUNS[name][0]}")
            command: click.Command = module.command
            return command
        return cluster.refusal(name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(", ".join((*aliases, name)) if aliases else name, text)
                for name, (_, text, aliases) in NOUNS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)
        with formatter.section("Cluster commands (no cluster here: each says what to use)"):
            from localdet.ui.det import cluster

            formatter.write_text(", ".join(cluster.NAMES))


def _version(ctx: click.Context, _: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from localdet import __version__

    click.echo(f"det {__version__} (localdet; Determined's command line, "
               "no cluster)")
    ctx.exit()


def _ignored_master(ctx: click.Context, parameter: click.Parameter, value: str | None) -> None:
    if value:
        click.echo(f"det: ignoring {'-m/--master' if parameter.name == 'master' else '-u/--user'}"
                   f" {value}: localdet has no master; commands work on the state folder "
                   "$LOCALDET_HOME", err=True)


@click.group(cls=DetGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-m", "--master", metavar="ADDRESS", expose_value=False,
              callback=_ignored_master, help="Accepted and ignored: there is no master.")
@click.option("-u", "--user", metavar="USERNAME", expose_value=False,
              callback=_ignored_master, help="Accepted and ignored: there are no users.")
@click.option("-v", "--version", is_flag=True, expose_value=False, is_eager=True,
              callback=_version, help="Print the version and exit.")
def det() -> None:
    """Determined's command line on one machine (localdet): experiments, trials,
    checkpoints, models and jobs in $LOCALDET_HOME."""


def main() -> None:
    if os.environ.get("DET_MASTER"):
        click.echo(f"det: ignoring DET_MASTER={os.environ['DET_MASTER']}: localdet has no "
                   "master; commands work on the state folder $LOCALDET_HOME", err=True)
    from localdet.records.opening import RecordsUnavailable, unavailable

    try:
        det(prog_name="det")
    except KeyboardInterrupt:
        click.echo("Interrupting...", err=True)
        sys.exit(3)
    except RecordsUnavailable as error:  # damaged, a newer schema, a directory, ...
        click.echo(f"error: {error}", err=True)
        sys.exit(1)
    except sqlite3.Error as error:  # met past the open: locked, read-only, a damaged page
        click.echo(f"error: {unavailable(Layout.from_environment().db, error)}", err=True)
        sys.exit(1)
