"""`localdet migrate`: upgrade the records to this localdet's schema, after a backup.

    localdet migrate        # no daemon may run on the state folder meanwhile

Readers never migrate (they open the records read-only); the daemon migrates at its start.
This command is for upgrading without starting a daemon, e.g. before `localdet run`.
"""

from __future__ import annotations

import sys

import click


@click.command()
def migrate() -> None:
    """Upgrade the records (localdet.db) to this localdet's schema, after a backup; no
    daemon may run on them meanwhile."""
    from localdet.paths import Layout
    from localdet.pids import DaemonAlreadyRunning, DaemonLock
    from localdet.records import backups
    from localdet.records.db import StateDB, _migration_names
    from localdet.records.opening import (
        applied_migrations,
        check_schema,
        connect_readonly,
        schema_number,
    )

    layout = Layout.from_environment()
    known = _migration_names()
    conn = connect_readonly(layout.db)
    applied = applied_migrations(conn) if conn is not None else None
    if conn is not None:
        conn.close()
    if applied is None:
        click.echo(f"nothing is recorded in {layout.home} yet: nothing to migrate")
        return
    if not check_schema(layout.db, applied, known):  # SchemaTooNew for a newer one
        click.echo(f"the records in {layout.db} are up to date (schema version "
                   f"{schema_number(applied)})")
        return
    # Held while migrating: a daemon cannot start on the records halfway through.
    lock = DaemonLock(layout.daemon_lock)
    try:
        lock.acquire()
    except DaemonAlreadyRunning:
        click.echo(f"error: a localdet daemon (pid {DaemonLock.holder(layout.daemon_lock)}) "
                   f"runs on {layout.home}; stop it first (`localdet daemon stop`), then run "
                   "`localdet migrate` again", err=True)
        sys.exit(1)
    try:
        StateDB.open(layout.db, migrate=True).close()
    finally:
        lock.release()
    copies = [copy for copy in backups.backups(layout.db) if "before-migration" in copy.name]
    kept = f"; the records from before are in {copies[0]}" if copies else ""
    click.echo(f"migrated the records in {layout.db} from schema version "
               f"{schema_number(applied)} to {schema_number(known)}{kept}")
