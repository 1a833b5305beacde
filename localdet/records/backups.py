"""Rotating copies of the database, made with SQLite's online backup API, and its check.

    problem = quick_check(layout.db)              # None when healthy, else SQLite's words
    back_up(layout.db, reason="periodic")         # into $LOCALDET_HOME/backups/
    backups(layout.db)                            # the copies, newest first

The backup API copies a consistent snapshot while other connections keep writing (WAL), so
the daemon makes one at start, every few minutes and before a migration runs. A copy is
quick_checked before it counts: only then does the oldest one go, so the copies kept are
always `keep` good ones.
"""

from __future__ import annotations

import datetime
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from localdet.records.opening import DamagedDatabase  # noqa: F401  (also imported from here)

KEEP = 3  # copies kept; a new good one replaces the oldest


def copy_database(source: sqlite3.Connection, target: Path) -> None:
    """SQLite's online backup of the open `source` into the file `target`: a consistent
    copy even while other connections write."""
    copy = sqlite3.connect(target)
    try:
        source.backup(copy)
    finally:
        copy.close()


class BackupError(RuntimeError):
    """A copy could not be made, or was not sound; the copies kept are untouched."""


def backups_dir(db_path: Path) -> Path:
    """``$LOCALDET_HOME/backups``, beside the database."""
    return Path(db_path).parent / "backups"


def quick_check(path: Path) -> str | None:
    """None when SQLite's `PRAGMA quick_check` finds `path` sound, else what it found
    (its first lines, or the error opening the file gave)."""
    try:
        conn = sqlite3.connect(path, timeout=30)
        try:
            rows = [row[0] for row in conn.execute("PRAGMA quick_check").fetchall()]
        finally:
            conn.close()
    except sqlite3.OperationalError:
        raise  # locked, unreadable: not damage
    except sqlite3.DatabaseError as error:  # "file is not a database", "malformed"
        return str(error)
    if rows == ["ok"]:
        return None
    return "; ".join(str(row) for row in rows[:3])


def backups(db_path: Path) -> list[Path]:
    """The copies kept, newest first (their names sort by time)."""
    return sorted(backups_dir(db_path).glob("localdet-*.db"), reverse=True)


def back_up(db_path: Path, *, reason: str, keep: int = KEEP,
            source: sqlite3.Connection | None = None) -> Path:
    """Copy the database at `db_path` (through `source` when given: a connection already
    open on it) into the backups folder; returns the copy. Raises BackupError, keeping the
    older copies, when the copy fails its quick_check."""
    folder = backups_dir(db_path)
    folder.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    target = folder / f"localdet-{stamp}-{reason}.db"
    partial = target.with_name(target.name + ".partial")
    src = source or sqlite3.connect(db_path, timeout=30)
    try:
        copy_database(src, partial)
    except sqlite3.OperationalError:
        partial.unlink(missing_ok=True)
        raise
    except sqlite3.DatabaseError as error:
        partial.unlink(missing_ok=True)
        raise BackupError(f"the database {db_path} could not be copied ({error})") from None
    finally:
        if source is None:
            src.close()
    problem = quick_check(partial)
    if problem is not None:
        partial.unlink(missing_ok=True)
        raise BackupError(f"a copy of {db_path} failed its check ({problem}); the older "
                          "copies are kept")
    os.replace(partial, target)
    for old in backups(db_path)[keep:]:
        old.unlink(missing_ok=True)
    return target


def check_at_start(db_path: Path) -> None:
    """Refuse a damaged database (DamagedDatabase) before a daemon runs on it."""

    if not Path(db_path).exists():
        return  # a first start: the daemon creates it
    problem = quick_check(db_path)
    if problem is not None:
        raise DamagedDatabase.of(db_path, problem)


class Schedule:
    """The daemon's copies: one at its first `maybe`, then one every `interval` seconds.

        copies = Schedule(layout.db, 30 * 60, log)
        copies.maybe(db.db.conn)        # in the daemon's loop: cheap unless one is due
    """

    def __init__(self, db_path: Path, interval: float, log: Callable[[str], None],
                 keep: int = KEEP) -> None:
        self.db_path = Path(db_path)
        self.interval = interval
        self.log = log
        self.keep = keep
        self._due = 0.0  # the first call makes one
        self._reason = "start"

    def maybe(self, source: sqlite3.Connection | None = None) -> Path | None:
        if time.monotonic() < self._due:
            return None
        self._due = time.monotonic() + self.interval
        reason, self._reason = self._reason, "periodic"
        try:
            return back_up(self.db_path, reason=reason, keep=self.keep, source=source)
        except (BackupError, sqlite3.DatabaseError) as error:
            # The copies kept stay; the next try is an interval away, not every pass.
            self.log(f"localdet daemon: no backup of the records this time: {error}")
            return None
