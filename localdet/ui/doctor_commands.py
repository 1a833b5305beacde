"""`localdet doctor`: check the records and the store; `--restore` brings back a backup.

    localdet doctor              # exit status 0 when healthy, 1 otherwise
    localdet doctor --restore    # with no daemon running
"""

from __future__ import annotations

import sys

import click

from localdet.paths import Layout


@click.command()
@click.option("--restore", is_flag=True,
              help="Move the damaged records aside (kept) and bring back the newest backup "
                   "that passes its check; refused while a daemon runs.")
def doctor(restore: bool) -> None:
    """Check the records (SQLite's quick_check) and every kept checkpoint's files in its
    store; list stored files no record names."""
    from localdet.operations import doctor as operation
    from localdet.operations.errors import OperationError

    layout = Layout.from_environment()
    try:
        if restore:
            for line in operation.restore(layout).lines():
                click.echo(line)
            return
        report = operation.check(layout)
    except OperationError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(1)
    for line in report.lines():
        click.echo(line)
    sys.exit(0 if report.healthy else 1)
