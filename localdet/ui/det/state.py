"""The state folder `det` works on, and running an operation with its errors printed as
one line:

    with records() as (layout, db):
        facts = run(describe, layout, db, 3)      # OperationError/NotFound: printed, exit 1
    with reading() as (layout, db):             # a command that only reads
        ...
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from localdet.ui.det.output import fail

if TYPE_CHECKING:
    from localdet.paths import Layout
    from localdet.records.db import StateDB

T = TypeVar("T")


def layout() -> Layout:
    from localdet.paths import Layout

    return Layout.from_environment()


def exists() -> bool:
    """Whether anything was ever recorded in the state folder."""
    return layout().db.exists()


@contextlib.contextmanager
def records(create: bool = False) -> Iterator[tuple[Layout, StateDB]]:
    """The layout and its database, open; without `create`, a state folder with nothing
    recorded yet is an error saying how to start."""
    from localdet.records.db import StateDB

    where = layout()
    if not where.db.exists() and not create:
        fail(f"nothing is recorded in {where.home} yet; create an experiment with "
             "`det e create CONFIG MODEL_DIR` (or set LOCALDET_HOME)")
    if create:
        where.ensure()
    db = StateDB.open(where.db)
    try:
        yield where, db
    finally:
        db.close()


@contextlib.contextmanager
def reading(empty_ok: bool = False) -> Iterator[tuple[Layout, StateDB]]:
    """The layout and its database, open read-only (a command that only reads never
    creates, migrates or backs up the records); without `empty_ok`, a state folder with
    nothing recorded yet is an error saying how to start."""
    from localdet.records.db import StateDB

    where = layout()
    db = StateDB.open_readonly(where.db)
    try:
        if db.nothing_recorded and not empty_ok:
            fail(f"nothing is recorded in {where.home} yet; create an experiment with "
                 "`det e create CONFIG MODEL_DIR` (or set LOCALDET_HOME)")
        yield where, db
    finally:
        db.close()


def run(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`function(*args, **kwargs)`; an OperationError, NotFound or the records' one-sentence
    errors are printed as one line, exit status 1."""
    from localdet.operations.errors import NotFound, OperationError
    from localdet.records.actions import ActionError

    try:
        return function(*args, **kwargs)
    except (OperationError, NotFound, ActionError) as error:
        fail(str(error))


def start_daemon_if_needed(where: Layout, what: str) -> None:
    """Start the daemon (detached) when none runs, so that `what` (a request, a new
    experiment) is carried out now, as on a cluster; says so on stderr."""
    import click

    from localdet.operations.creation import ensure_daemon
    from localdet.pids import DaemonLock

    if DaemonLock.holder(where.daemon_lock) is None:
        pid = run(ensure_daemon, where)
        click.echo(f"det: started a localdet daemon (pid {pid}) on {where.home} to carry "
                   f"out {what} (`localdet daemon stop` stops it)", err=True)
