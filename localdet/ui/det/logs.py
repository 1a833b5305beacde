"""A trial's log as `det trial logs` and `det e logs` print it."""

from __future__ import annotations

import sys

import click

from localdet.ui.det import output
from localdet.ui.det.state import reading


def show_log(trial_id: int, follow: bool, head: int | None = None,
             tail: int | None = None) -> None:
    """Print the trial's log (`follow`: until it stops running), then Determined's line on
    how to reopen it."""
    import io

    from localdet.ui import trial_logs

    if head is not None and tail is not None:
        output.fail("--head and --tail do not go together; choose one")
    if follow and (head is not None or tail is not None):
        output.fail("--follow does not go with --head or --tail; choose one")
    with reading() as (where, db):
        try:
            sys.stdout.flush()
            if follow:
                trial_logs.follow(where, db, trial_id, sys.stdout.buffer)
            elif head is None and tail is None:
                trial_logs.show(where, db, trial_id, sys.stdout.buffer)
            else:
                buffer = io.BytesIO()
                trial_logs.show(where, db, trial_id, buffer)
                lines = buffer.getvalue().splitlines(keepends=True)
                chosen = lines[:head] if head is not None else lines[-tail:] if tail else []
                sys.stdout.buffer.write(b"".join(chosen))
                sys.stdout.buffer.flush()
        except trial_logs.LogError as error:
            output.fail(str(error))
        except KeyboardInterrupt:
            sys.exit(130)
    click.echo(f"Trial log stream ended. To reopen log stream, run: det trial logs -f {trial_id}")
