"""How the records are opened: read-only for readers, the schema guard every open passes,
and SQLite's failures said in one sentence.

    conn = connect_readonly(path)            # None: nothing is recorded there yet
    behind = check_schema(path, applied_migrations(conn), known)   # SchemaTooNew if newer
    raise unavailable(path, error)           # any sqlite3.Error or OSError, as one sentence

A reader opens the file with SQLite's `mode=ro`: it never creates the file, changes its
journal mode, migrates or backs it up. In WAL mode SQLite's readers coordinate through the
`-shm` file: where no writer has the database open (no `-shm` yet), SQLite makes the `-wal`
and `-shm` files beside it, empty, as any reader does; the records themselves are untouched.
"""

from __future__ import annotations

import os
import re
import sqlite3
from pathlib import Path
from urllib.parse import quote

from localdet.paths import state_formats_dir

BUSY_TIMEOUT_S = 30.0  # how long an open or a statement waits for another process's lock

# How the first command that starts the records is spelled, for "nothing recorded yet".
START = "`localdet daemon start`, then `localdet submit CONFIG MODEL_DIR`"


def migration_names() -> list[str]:
    """The migrations' names (their files' stems), without loading them."""
    return [path.stem for path in sorted((state_formats_dir() / "migrations").glob("[0-9]*.py"))]


class RecordsUnavailable(RuntimeError):
    """The records cannot be opened or read; the message says why and what to do, in one
    sentence."""


class DamagedDatabase(RecordsUnavailable):
    """The database file is damaged (SQLite: "malformed", "not a database"); the message
    says what to do, in one sentence."""

    @classmethod
    def of(cls, path: str | Path, error: BaseException | str) -> "DamagedDatabase":
        return cls(f"the records in {path} are damaged ({error}): run `localdet doctor "
                   "--restore` to bring back the newest backup, or move the file aside to "
                   "start afresh")


class SchemaTooNew(RecordsUnavailable):
    """The records were written by a newer localdet than this one."""


class SchemaBehind(RecordsUnavailable):
    """The records are an older localdet's, and this open would have to migrate them."""


def localdet_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("localdet")
    except PackageNotFoundError:  # a checkout that was never installed
        return "(not installed)"


def schema_number(names: list[str]) -> int:
    """The schema version that a list of migration names reaches: the highest number that
    prefixes one of them (`0013_live_trial_indexes`: 13)."""
    numbers = [int(match.group()) for name in names if (match := re.match(r"\d+", name))]
    return max(numbers, default=0)


def applied_migrations(conn: sqlite3.Connection) -> list[str] | None:
    """The names of the migrations applied to the open database, in name order; None where
    it holds no records at all (a new or empty file)."""
    try:
        rows = conn.execute("SELECT name FROM _sqlite_migrations "
                            "WHERE migration_set = 'localdet' ORDER BY name").fetchall()
    except sqlite3.OperationalError as error:
        if "no such table" not in str(error):
            raise
        return None
    return [name for (name,) in rows]


def check_schema(path: str | Path, applied: list[str] | None, known: list[str]) -> list[str]:
    """The migrations this localdet knows that the records at `path` lack (none: current);
    SchemaTooNew where they hold one it does not know."""
    if not applied:
        return list(known)
    unknown = sorted(set(applied) - set(known))
    if unknown:
        raise SchemaTooNew(
            f"the records in {path} have schema version {schema_number(applied)} "
            f"(migration {unknown[-1]}), written by a newer localdet; this localdet "
            f"({localdet_version()}) knows schema version {schema_number(known)} at most: "
            "upgrade localdet (`pip install -U localdet`) to use them")
    return [name for name in known if name not in set(applied)]


def behind_message(path: str | Path, applied: list[str], known: list[str]) -> str:
    return (f"the records in {path} have schema version {schema_number(applied)}, from an "
            f"older localdet, and this localdet ({localdet_version()}) uses version "
            f"{schema_number(known)}; it upgrades them only where no older daemon runs on "
            "them: stop that daemon, then run `localdet migrate` (it backs them up first) "
            "or start this localdet's daemon")


def _readable_file(path: Path) -> bool:
    """Whether `path` is a file with something in it (False: nothing recorded yet);
    RecordsUnavailable for what is not a file."""
    try:
        if path.is_dir():
            raise RecordsUnavailable(
                f"{path} is a directory where localdet keeps its records file: move it aside "
                "(or set LOCALDET_HOME to another folder)")
        return path.stat().st_size > 0
    except FileNotFoundError:
        return False
    except OSError as error:  # a parent that is a file, permission on a parent, ...
        raise unavailable(path, error) from None


def connect_readonly(path: str | Path) -> sqlite3.Connection | None:
    """A read-only connection to the records at `path`, or None where nothing is recorded
    there yet (no file, an empty file)."""
    path = Path(path)
    if not _readable_file(path):
        return None
    uri = f"file:{quote(str(path.absolute()))}?mode=ro"
    try:
        # Any thread may close it (the dashboard opens one per request in a worker thread).
        conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S, check_same_thread=False)
    except sqlite3.Error as error:
        raise unavailable(path, error) from None
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        conn.execute("PRAGMA query_only = ON")  # a write by mistake fails, never lands
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # reads the header
    except sqlite3.Error as error:
        conn.close()
        raise unavailable(path, error) from None
    return conn


def _folder_problem(path: Path) -> str | None:
    folder = path.parent
    if not folder.exists():
        return f"its folder {folder} does not exist"
    if not folder.is_dir():
        return f"{folder} is not a folder"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"its folder {folder} is read-only for this user"
    if path.exists() and not os.access(path, os.R_OK):
        return "the file is unreadable for this user"
    if path.exists() and not os.access(path, os.W_OK):
        return "the file is read-only for this user"
    return None


def unavailable(path: str | Path, error: BaseException) -> RecordsUnavailable:
    """`error` (a sqlite3.Error or OSError met opening or using the records at `path`) as
    one sentence that says what to do."""

    if isinstance(error, RecordsUnavailable):
        return error
    path = Path(path)
    if path.is_dir():
        return RecordsUnavailable(
            f"{path} is a directory where localdet keeps its records file: move it aside "
            "(or set LOCALDET_HOME to another folder)")
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    code = getattr(error, "sqlite_errorname", "") or ""
    if isinstance(error, OSError):
        return RecordsUnavailable(f"cannot use the records in {path} ({text}): make the "
                                  "folder writable for this user, or set LOCALDET_HOME to "
                                  "one that is")
    if code.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in text:
        return RecordsUnavailable(
            f"the records in {path} stayed locked by another process for "
            f"{BUSY_TIMEOUT_S:g} seconds ({text}): try again once it is done (`localdet "
            "doctor` names processes that hold the state folder)")
    if code.startswith("SQLITE_READONLY") or "readonly" in text:
        problem = _folder_problem(path) or "the file or its folder is read-only"
        return RecordsUnavailable(
            f"cannot write the records in {path}: {problem}; make them writable for this "
            "user, or set LOCALDET_HOME to a folder that is")
    if code.startswith(("SQLITE_CANTOPEN", "SQLITE_PERM", "SQLITE_AUTH")) \
            or "unable to open" in text:
        problem = _folder_problem(path) or text
        return RecordsUnavailable(
            f"cannot open the records in {path}: {problem}; make them readable and writable "
            "for this user, or set LOCALDET_HOME to a folder that is")
    if code.startswith("SQLITE_FULL"):
        return RecordsUnavailable(f"the disk holding {path} is full ({text}): free some space "
                                  "and try again")
    if text.startswith(("no such column", "no such table")):
        behind = _behind(path)
        if behind:
            return SchemaBehind(behind)
    if isinstance(error, sqlite3.OperationalError) and not code.startswith(
            ("SQLITE_CORRUPT", "SQLITE_NOTADB")):
        if code.startswith("SQLITE_IOERR"):
            return RecordsUnavailable(f"cannot read the records in {path} ({text}): check the "
                                      "disk and that the file is a regular file")
        return RecordsUnavailable(f"the records in {path} could not be used ({text})")
    return DamagedDatabase.of(path, text)


def _behind(path: Path) -> str | None:
    """The SchemaBehind sentence where the records at `path` are an older localdet's."""
    try:
        conn = connect_readonly(path)
    except RecordsUnavailable:
        return None
    if conn is None:
        return None
    try:
        applied = applied_migrations(conn) or []
    except sqlite3.Error:
        return None
    finally:
        conn.close()
    known = migration_names()
    if set(known) - set(applied) and not set(applied) - set(known):
        return behind_message(path, applied, known)
    return None
