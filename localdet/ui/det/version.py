"""`det version`: the versions of det (localdet) and of the Determined API it implements."""

from __future__ import annotations

import click


@click.command("version")
def command() -> None:
    """show the version of det and localdet"""
    from localdet import __version__

    click.echo(f"client:\n  version: {__version__} (localdet)\n"
               "master:\n  none: localdet has no master; the state is $LOCALDET_HOME")
