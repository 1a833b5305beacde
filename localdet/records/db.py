"""The SQLite database: one file in WAL mode, created and upgraded by `state/migrations/`.

The daemon and the trial processes open it at once: WAL lets readers run beside one writer,
and the busy timeout makes a writer wait for another instead of failing.

Example:

    with StateDB.open(Layout.from_environment().db) as db:   # closed at the end
        exp_id = db.create_experiment(...)
        for trial in db.trials(exp_id, states=(TrialState.RUNNING,)):
            print(trial.id, trial.state)
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import importlib.util
import json
import sqlite3
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Iterable, cast

from localdet.paths import state_formats_dir
from localdet.records import opening
from localdet.records.backups import (  # noqa: F401  (DamagedDatabase: also imported from here)
    BackupError,
    DamagedDatabase,
    back_up,
)
from localdet.records.opening import (  # noqa: F401  (the errors: also imported from here)
    BUSY_TIMEOUT_S,
    RecordsUnavailable,
    SchemaBehind,
    SchemaTooNew,
    applied_migrations,
    behind_message,
    check_schema,
    connect_readonly,
)
from localdet.records.opening import migration_names as _migration_names  # noqa: F401
from localdet.records.sqlite_utils_without_arrays import (  # without pandas, numpy: fast
    Migrations,
    sqlite_utils,
)
from localdet.records.states import (  # noqa: F401  (the groupings: imported from here too)
    EXPERIMENT_INITIAL_STATE,
    EXPERIMENT_STATES,
    TERMINAL_STATES,
    TRIAL_INITIAL_STATES,
    TRIAL_STATES,
    CheckpointState,
    ExperimentKind,
    Runner,
    TrialState,
    UnknownValue,
    check_experiment_change,
    check_trial_change,
    member,
)


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")


def migrations() -> Migrations:
    """The `localdet` migration set: one module per file in `state/migrations/`, in name order."""
    return _migrations(state_formats_dir() / "migrations")


@functools.lru_cache(maxsize=None)
def _migrations(folder: Path) -> Migrations:
    """Loaded once a process: StateDB.open runs for every connection (the report server
    opens one per trial), and compiling the files was most of its cost."""
    migration_set = Migrations("localdet")
    files = sorted(folder.glob("[0-9]*.py"))
    if not files:
        raise RuntimeError(f"no migrations found under {state_formats_dir()}; reinstall localdet")
    for path in files:
        spec = importlib.util.spec_from_file_location(f"localdet_migration_{path.stem}", path)
        if spec is None or spec.loader is None:  # a .py file always has both
            raise RuntimeError(f"cannot load the migration {path}; reinstall localdet")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        migration_set(name=path.stem)(module.apply)
    return migration_set


class NotFound(LookupError):
    """A user named an experiment, trial or checkpoint that does not exist."""


class CheckpointDeleted(NotFound):
    """A user named a checkpoint that retention deleted: its row is kept, its files are not."""


def _filters(**columns: Any) -> tuple[str | None, list[Any] | None]:
    """A WHERE clause and its arguments for rows_where: `column = value` for a single
    value, `column IN (...)` for an iterable (a str is a single value); None skips it."""
    clauses, args = [], []
    for column, value in columns.items():
        if value is None:
            continue
        if isinstance(value, str) or not isinstance(value, Iterable):
            clauses.append(f"{column} = ?")
            args.append(value)
        else:
            values = list(value)
            clauses.append(f"{column} IN ({', '.join('?' * len(values))})")
            args.extend(values)
    return (" AND ".join(clauses), args) if clauses else (None, None)


@functools.lru_cache(maxsize=None)
def _field_names(cls) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))  # (dataclasses.fields: ~25 us a call)


def _from_row(cls, row: dict, json_fields: Iterable[str] = ()):
    values = {name: row.get(name) for name in _field_names(cls)}
    for name in json_fields:
        text = values[name]
        if text is not None:
            values[name] = json.loads(text)
    return cls(**values)


@dataclass
class Experiment:
    id: int
    name: str
    description: str
    state: str
    config: dict
    searcher: str
    metric: str
    smaller_is_better: bool
    experiment_seed: int
    model_dir: str
    submitted_at: str
    ended_at: str | None
    error: str | None
    kind: str = ExperimentKind.EXPERIMENT   # or JOB
    runner: str = Runner.DAEMON     # or FOREGROUND (`localdet run`), SCRIPT (laptop mode)
    archived: bool = False          # left out of the default listings
    notes: str = ""
    parent_id: int | None = None    # forked from this experiment

    @property
    def managed(self) -> bool:
        """Whether the daemon schedules it."""
        return self.runner == Runner.DAEMON

    @classmethod
    def from_row(cls, row: dict) -> "Experiment":
        experiment = _from_row(cls, row, ["config"])
        experiment.smaller_is_better = bool(experiment.smaller_is_better)
        experiment.archived = bool(experiment.archived)
        return experiment


@dataclass
class Trial:
    id: int
    experiment_id: int
    request_id: int
    state: str
    hparams: dict
    seed: int
    target_batches: int
    batches_trained: int
    restarts: int
    latest_checkpoint: str | None
    pid: int | None
    slots: list | None
    stop_requested: str | None
    process_start: int | None
    started_at: str | None
    heartbeat_at: str | None
    ended_at: str | None
    error: str | None

    @classmethod
    def from_row(cls, row: dict) -> "Trial":
        return _from_row(cls, row, ["hparams", "slots"])


@dataclass
class Checkpoint:
    uuid: str
    experiment_id: int
    trial_id: int
    batches_trained: int
    state: str
    size_bytes: int
    metadata: dict
    manifest: dict
    created_at: str

    @classmethod
    def from_row(cls, row: dict) -> "Checkpoint":
        return _from_row(cls, row, ["metadata", "manifest"])


@dataclass
class MetricRow:
    trial_id: int
    kind: str
    batches_trained: int
    metrics: dict
    recorded_at: str

    @classmethod
    def from_row(cls, row: dict) -> "MetricRow":
        return _from_row(cls, row, ["metrics"])


# Overrides sqlite_utils.Database's table_names/view_names, which its own methods call:
# checked against sqlite-utils 4.2 (pyproject's bound <4.3).
class _Database(sqlite_utils.Database):
    """sqlite_utils reads the table and view names from sqlite_master before nearly every
    row it reads or writes (17 such queries for a metric row, a heartbeat, a trial read and
    an event). localdet's schema is its migrations': once they have run on a connection
    (`fix_schema`), the names are read once."""

    _names: dict | None = None

    def fix_schema(self) -> None:
        self._names = {}

    def table_names(self, fts4: bool = False, fts5: bool = False) -> list[str]:
        if self._names is None:
            return super().table_names(fts4, fts5)
        key = ("table", fts4, fts5)
        if key not in self._names:
            self._names[key] = super().table_names(fts4, fts5)
        return list(self._names[key])

    def view_names(self) -> list[str]:
        if self._names is None:
            return super().view_names()
        if "view" not in self._names:
            self._names["view"] = super().view_names()
        return list(self._names["view"])


class StateDB:
    """The records, open. `open` is a writer's (the daemon's, a trial's, a command that
    changes something); `open_readonly` a reader's, which writes nothing anywhere."""

    def __init__(self, db: sqlite_utils.Database, *, read_only: bool = False,
                 nothing_recorded: bool = False):
        self.db = db
        self.read_only = read_only
        # Opened read-only where nothing is recorded yet: an empty database of this schema.
        self.nothing_recorded = nothing_recorded
        # A context manager shared with this process's other writers of the file (the
        # daemon's and its report server's, `report_server.WriteTurns`): atomic() waits its
        # turn there before SQLite's lock. None: SQLite's lock alone.
        self.turns: contextlib.AbstractContextManager[Any] | None = None

    @classmethod
    def open(cls, path: str | Path, *, migrate: bool = False) -> "StateDB":
        """The records at `path` for reading and writing, created with the current schema
        where nothing is recorded yet. Records of an older schema are migrated (after a
        backup) only with `migrate` (the daemon, `localdet migrate`): SchemaBehind
        otherwise; records of a newer one are refused (SchemaTooNew)."""
        path = Path(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise RecordsUnavailable(
                f"cannot make the state folder {path.parent} ({error.strerror or error}): "
                "set LOCALDET_HOME to a folder this user can write") from None
        if path.is_dir():
            raise RecordsUnavailable(
                f"{path} is a directory where localdet keeps its records file: move it aside "
                "(or set LOCALDET_HOME to another folder)")
        # No sqlite_utils plugins: loading them scans every installed package's entry points.
        db = _Database(path, execute_plugins=False)
        try:
            db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            names = _migration_names()
            applied = applied_migrations(db.conn)
            missing = check_schema(path, applied, names)  # SchemaTooNew: before any write
            if missing and applied:
                if not migrate:
                    raise SchemaBehind(behind_message(path, applied, names))
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA foreign_keys = ON")
            # Durable enough in WAL mode: a power cut may lose the last commits, never
            # consistency.
            db.execute("PRAGMA synchronous = NORMAL")
            if missing:
                if applied:  # an upgrade: keep a copy from before it
                    try:
                        back_up(path, reason="before-migration", source=db.conn)
                    except BackupError as error:  # the copy failed its check: so does this
                        raise DamagedDatabase.of(path, error) from None
                migrations().apply(db)
            db.fix_schema()
        except RecordsUnavailable:
            db.close()
            raise
        except sqlite3.OperationalError:  # locked, read-only, ...: not damage (callers say)
            db.close()
            raise
        except sqlite3.DatabaseError as error:
            db.close()
            raise DamagedDatabase.of(path, error) from None
        return cls(db)

    @classmethod
    def open_readonly(cls, path: str | Path) -> "StateDB":
        """The records at `path` for reading only: never created, migrated, backed up or
        switched to another journal mode. Where nothing is recorded yet, an empty database
        of this schema in memory (`nothing_recorded`). Records of an older schema are read
        as they are (a query of what they lack: SchemaBehind, from `opening.unavailable`);
        a newer one is refused (SchemaTooNew). Every SQLite failure: RecordsUnavailable."""
        conn = connect_readonly(path)
        applied = None
        try:
            applied = applied_migrations(conn) if conn is not None else None
            if applied is not None:
                check_schema(path, applied, _migration_names())
        except sqlite3.Error as error:
            assert conn is not None
            conn.close()
            raise opening.unavailable(path, error) from None
        except RecordsUnavailable:
            assert conn is not None
            conn.close()
            raise
        if conn is None or applied is None:  # nothing recorded yet
            if conn is not None:
                conn.close()
            db = _Database(sqlite3.connect(":memory:", check_same_thread=False),
                           execute_plugins=False)
            migrations().apply(db)
            db.fix_schema()
            return cls(db, read_only=True, nothing_recorded=True)
        db = _Database(conn, execute_plugins=False)
        db.fix_schema()
        return cls(db, read_only=True)

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> StateDB:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @contextlib.contextmanager
    def atomic(self):
        """One write transaction. IMMEDIATE takes the write lock up front: a deferred one
        that read first could not upgrade once another process wrote, and fails at once
        with "database is locked" instead of waiting its turn."""
        conn = self.db.conn
        if conn.in_transaction:
            with self.db.atomic():  # nested: a savepoint
                yield self.db
            return
        with self.turns or contextlib.nullcontext():
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield self.db
            except BaseException:
                conn.rollback()
                raise
            conn.commit()

    @contextlib.contextmanager
    def snapshot(self):
        """Several reads that see one state of the database: a read transaction (WAL keeps
        its snapshot while the daemon writes). Inside a transaction already, that one."""
        conn = self.db.conn
        if conn.in_transaction:
            yield self.db
            return
        conn.execute("BEGIN")
        try:
            yield self.db
        finally:
            conn.execute("COMMIT")  # ends the read; nothing was written

    # -- events -------------------------------------------------------------------------
    def log_event(self, kind: str, *, experiment_id: int | None = None,
                  trial_id: int | None = None, **payload: Any) -> None:
        # Plain SQL: sqlite_utils' insert costs ten times the statement, and every state
        # change writes an event.
        self.db.execute("INSERT INTO events (at, experiment_id, trial_id, kind, payload) "
                        "VALUES (?, ?, ?, ?, ?)", [now(), experiment_id, trial_id, kind,
                                                   json.dumps(payload, default=str)])

    def events(self, experiment_id: int | None = None, *, kinds: Iterable[str] | None = None,
               trial_id: int | None = None) -> list[dict]:
        """The events, oldest first: of one experiment, of these kinds, of one trial, when
        given."""
        clauses, args = _filters(experiment_id=experiment_id or None, kind=kinds,
                                 trial_id=trial_id)
        rows = self.db.table("events").rows_where(clauses, args, order_by="id")
        return [{**row, "payload": json.loads(row["payload"])} for row in rows]

    def last_event(self, kinds: Iterable[str]) -> dict | None:
        """The newest event of one of these kinds (of any experiment), or None."""
        kinds = list(kinds)
        rows = list(self.db.table("events").rows_where(
            f"kind IN ({', '.join('?' for _ in kinds)})", kinds, order_by="id DESC", limit=1))
        return {**rows[0], "payload": json.loads(rows[0]["payload"])} if rows else None

    # -- experiments --------------------------------------------------------------------
    def create_experiment(self, *, name: str, description: str, config: dict,
                          original_config: str, searcher: str, metric: str,
                          smaller_is_better: bool, experiment_seed: int,
                          model_dir: str, kind: str = ExperimentKind.EXPERIMENT,
                          runner: str = Runner.DAEMON) -> int:
        kind = member(ExperimentKind, kind, "an experiment kind")
        runner = member(Runner, runner, "a runner")
        with self.atomic():
            table = self.db.table("experiments").insert({
                "name": name, "description": description, "state": EXPERIMENT_INITIAL_STATE,
                "config": json.dumps(config), "original_config": original_config,
                "searcher": searcher, "metric": metric,
                "smaller_is_better": int(smaller_is_better),
                "experiment_seed": experiment_seed, "model_dir": model_dir,
                "submitted_at": now(), "kind": kind, "runner": runner,
            })
            experiment_id = cast(int, table.last_pk)  # the INTEGER PRIMARY KEY
            self.log_event("experiment_created", experiment_id=experiment_id, name=name,
                           experiment_kind=kind, runner=runner)
        return experiment_id

    def experiment(self, experiment_id: int) -> Experiment:
        rows = list(self.db.table("experiments").rows_where("id = ?", [experiment_id]))
        if not rows:
            raise NotFound(f"there is no experiment {experiment_id}; `localdet status` lists them")
        return Experiment.from_row(rows[0])

    def experiments(self, states: Iterable[str] | None = None,
                    kind: str | None = None) -> list[Experiment]:
        """The experiments and jobs, oldest first: those in these states, of this kind
        ("experiment" or "job"), when given."""
        clauses, args = _filters(state=states, kind=kind)
        rows = self.db.table("experiments").rows_where(clauses, args, order_by="id")
        return [Experiment.from_row(row) for row in rows]

    def set_experiment_state(self, experiment_id: int, state: str,
                             error: str | None = None) -> None:
        """Raises IllegalTransition for a change `states.EXPERIMENT_TRANSITIONS` does not
        list (UnknownValue for no experiment state at all)."""
        with self.atomic():
            # Read in the write transaction: the state the change starts from is current.
            row = self.db.execute("SELECT state FROM experiments WHERE id = ?",
                                  [experiment_id]).fetchone()
            if row is None:
                raise NotFound(f"there is no experiment {experiment_id}; `localdet status` "
                               "lists them")
            state = check_experiment_change(experiment_id, row[0], state)
            update = {"state": state, "error": error}
            if state in TERMINAL_STATES:
                update["ended_at"] = now()
            self.db.table("experiments").update(experiment_id, update)
            self.log_event("experiment_state", experiment_id=experiment_id, state=state,
                           error=error)

    def set_runner(self, experiment_id: int, runner: str) -> None:
        """Hand an experiment to another runner (a daemon takes over from `localdet run`)."""
        runner = member(Runner, runner, "a runner")
        with self.atomic():
            self.db.table("experiments").update(experiment_id, {"runner": runner})
            self.log_event("experiment_runner", experiment_id=experiment_id, runner=runner)

    # -- trials -------------------------------------------------------------------------
    def create_trial(self, *, experiment_id: int, request_id: int, hparams: dict, seed: int,
                     target_batches: int, state: str = TrialState.QUEUED) -> int:
        if state not in TRIAL_INITIAL_STATES:
            raise UnknownValue(f"a trial starts {' or '.join(sorted(TRIAL_INITIAL_STATES))}, "
                               f"not {state}")
        with self.atomic():
            trial_id = cast(int, self.db.execute(
                "INSERT INTO trials (experiment_id, request_id, state, hparams, seed, "
                "target_batches) VALUES (?, ?, ?, ?, ?, ?)",
                [experiment_id, request_id, state, json.dumps(hparams), seed,
                 target_batches]).lastrowid)  # the INTEGER PRIMARY KEY
            self.log_event("trial_created", experiment_id=experiment_id, trial_id=trial_id,
                           request_id=request_id, hparams=hparams)
        return trial_id

    def trial_by_request(self, experiment_id: int, request_id: int) -> Trial | None:
        rows = list(self.db.table("trials").rows_where("experiment_id = ? AND request_id = ?",
                                                 [experiment_id, request_id]))
        return Trial.from_row(rows[0]) if rows else None

    def trial(self, trial_id: int) -> Trial:
        rows = list(self.db.table("trials").rows_where("id = ?", [trial_id]))
        if not rows:
            raise NotFound(f"there is no trial {trial_id}; `localdet status EXPERIMENT` lists them")
        return Trial.from_row(rows[0])

    def trials(self, experiment_id: int | None = None,
               states: Iterable[str] | None = None) -> list[Trial]:
        clauses, args = _filters(experiment_id=experiment_id or None, state=states)
        rows = self.db.table("trials").rows_where(clauses, args, order_by="id")
        return [Trial.from_row(row) for row in rows]

    def update_trial(self, trial_id: int, **changes: Any) -> None:
        """Update a trial's columns; a state change is also written to the event log.
        Raises IllegalTransition for a change `states.TRIAL_TRANSITIONS` does not list
        (UnknownValue for no trial state at all)."""
        with self.atomic():
            if "state" in changes:
                trial = self.trial(trial_id)  # in the write transaction: its current state
                changes["state"] = check_trial_change(trial_id, trial.state, changes["state"])
                if changes["state"] in TERMINAL_STATES:
                    changes.setdefault("ended_at", now())
                self.log_event("trial_state", experiment_id=trial.experiment_id,
                               trial_id=trial_id, state=changes["state"],
                               error=changes.get("error"))
            # One statement: sqlite_utils' update reads the table's columns and the row first.
            unknown = set(changes) - set(_field_names(Trial))
            if unknown:
                raise ValueError(f"trials have no column {', '.join(sorted(unknown))}")
            if changes:
                values = [json.dumps(v) if isinstance(v, (dict, list, tuple)) else v
                          for v in changes.values()]
                updated = self.db.execute(
                    f"UPDATE trials SET {', '.join(f'{name} = ?' for name in changes)} "
                    "WHERE id = ?", [*values, trial_id]).rowcount
                if not updated:
                    raise NotFound(f"there is no trial {trial_id}; `localdet status "
                                   "EXPERIMENT` lists them")

    # -- searcher events -----------------------------------------------------------------
    def add_searcher_event(self, experiment_id: int, kind: str, request_id: int | None = None,
                           metric: float | None = None, length: int | None = None) -> None:
        self.db.execute("INSERT INTO searcher_events (experiment_id, kind, request_id, metric, "
                        "length, at) VALUES (?, ?, ?, ?, ?, ?)",
                        [experiment_id, kind, request_id, metric, length, now()])

    def searcher_events(self, experiment_id: int) -> list[dict]:
        return list(self.db.table("searcher_events").rows_where(
            "experiment_id = ?", [experiment_id], order_by="id"))

    # -- metrics ------------------------------------------------------------------------
    def record_metrics(self, trial_id: int, kind: str, batches_trained: int,
                       metrics: dict[str, float]) -> None:
        """Record one row. A second report for the same (trial, kind, batches) adds only
        the metrics not recorded there yet, so a restarted trial never records a metric
        twice, and `context.evaluate` can add test metrics beside a validation."""
        with self.atomic():
            # Merged in Python: the JSON may hold NaN, which SQLite's JSON functions refuse.
            existing = list(self.db.table("metrics").rows_where(
                "trial_id = ? AND kind = ? AND batches_trained = ?",
                [trial_id, kind, batches_trained]))
            if existing:
                recorded = json.loads(existing[0]["metrics"])
                self.db.table("metrics").update(existing[0]["id"], {
                    "metrics": json.dumps({**metrics, **recorded})})
            else:
                self.db.table("metrics").insert({
                    "trial_id": trial_id, "kind": kind, "batches_trained": batches_trained,
                    "metrics": json.dumps(metrics), "recorded_at": now()})
            self.db.execute(
                "UPDATE trials SET batches_trained = MAX(batches_trained, ?) WHERE id = ?",
                [batches_trained, trial_id],
            )

    def metrics(self, trial_id: int, kind: str | None = None) -> list[MetricRow]:
        where = "trial_id = ?"
        args: list[Any] = [trial_id]
        if kind:
            where, args = where + " AND kind = ?", args + [kind]
        rows = self.db.table("metrics").rows_where(where, args, order_by="batches_trained, kind")
        return [MetricRow.from_row(row) for row in rows]

    # -- checkpoints --------------------------------------------------------------------
    def add_checkpoint(self, manifest: dict) -> None:
        """Commit a checkpoint whose blobs are already durable in the store."""
        with self.atomic():
            self.db.table("checkpoints").insert({
                "uuid": manifest["uuid"], "experiment_id": manifest["experiment_id"],
                "trial_id": manifest["trial_id"],
                "batches_trained": manifest["batches_trained"],
                "size_bytes": manifest["size_bytes"],
                "metadata": json.dumps(manifest["metadata"]),
                "manifest": json.dumps(manifest), "created_at": manifest["created_at"],
            })
            self.db.table("trials").update(manifest["trial_id"],
                                           {"latest_checkpoint": manifest["uuid"]})
            self.log_event("checkpoint", experiment_id=manifest["experiment_id"],
                           trial_id=manifest["trial_id"], uuid=manifest["uuid"],
                           batches_trained=manifest["batches_trained"])

    def checkpoint(self, uuid_or_prefix: str) -> Checkpoint:
        """The live checkpoint with this uuid (or unique prefix); NotFound, or its subclass
        CheckpointDeleted (one sentence naming the retention settings) if retention deleted
        the only match."""
        # A range of the primary key (the uuids starting with the prefix), not a scan: the
        # daemon and the report server look checkpoints up by uuid as trials finish.
        where = "uuid >= :prefix AND uuid < :end AND state = :state"
        span = {"prefix": uuid_or_prefix, "end": uuid_or_prefix + "\U0010ffff"}
        rows = list(self.db.table("checkpoints").rows_where(
            where, {**span, "state": CheckpointState.COMPLETED}, limit=2))
        if not rows:
            deleted = list(self.db.table("checkpoints").rows_where(
                where, {**span, "state": CheckpointState.DELETED}, limit=2))
            if len(deleted) == 1:
                raise CheckpointDeleted(self._deleted_message(Checkpoint.from_row(deleted[0])))
        if len(rows) != 1:
            problem = "no" if not rows else "more than one"
            raise NotFound(f"{problem} checkpoint matches '{uuid_or_prefix}'; "
                           "`localdet checkpoints EXPERIMENT` lists them")
        return Checkpoint.from_row(rows[0])

    def _deleted_message(self, checkpoint: Checkpoint) -> str:
        from localdet.config.typed import CheckpointStorage  # its schema: read when needed

        config = self.experiment(checkpoint.experiment_id).config
        retention = CheckpointStorage.of(config).describe()
        return (f"checkpoint {checkpoint.uuid} was deleted by retention ({retention}), "
                f"so its files are gone; `localdet checkpoints {checkpoint.experiment_id}` "
                "lists the checkpoints that are kept")

    def delete_checkpoint(self, uuid: str, reason: str) -> bool:
        """Mark a live checkpoint DELETED (its row stays; its blobs may then be deleted) and
        log why; False if it was not live."""
        with self.atomic():
            rows = list(self.db.table("checkpoints").rows_where(
                "uuid = ? AND state = ?", [uuid, CheckpointState.COMPLETED]))
            if not rows:
                return False
            self.db.execute("UPDATE checkpoints SET state = ? WHERE uuid = ?",
                            [CheckpointState.DELETED, uuid])
            self.log_event("checkpoint_deleted", experiment_id=rows[0]["experiment_id"],
                           trial_id=rows[0]["trial_id"], uuid=uuid,
                           batches_trained=rows[0]["batches_trained"], reason=reason)
        return True

    def checkpoint_files(self, *, deleted: bool,
                         experiment_id: int | None = None) -> list[tuple[str, str, int]]:
        """``[(uuid, sha256, size), ...]`` for every blob of the live checkpoints (or, with
        `deleted`, of the DELETED ones), optionally of one experiment: a file's chunks, or
        the file itself where it has none (`localdet.checkpoints.store.FileEntry`)."""
        sql = ("SELECT c.uuid, coalesce(json_extract(k.value, '$[0]'), "
               "json_extract(f.value, '$.sha256')), coalesce(json_extract(k.value, '$[1]'), "
               "json_extract(f.value, '$.size')) FROM checkpoints c "
               "JOIN json_each(c.manifest, '$.files') f "
               "LEFT JOIN json_each(f.value, '$.chunks') k WHERE c.state "
               + ("= ?" if deleted else "!= ?"))
        args: list[Any] = [CheckpointState.DELETED]
        if experiment_id is not None:
            sql += " AND c.experiment_id = ?"
            args.append(experiment_id)
        return [tuple(row) for row in self.db.execute(sql, args).fetchall()]

    def checkpoints(self, experiment_id: int | None = None, trial_id: int | None = None,
                    include_deleted: bool = False) -> list[Checkpoint]:
        """Live checkpoints (with `include_deleted`, the DELETED ones too), oldest first."""
        clauses: list[str]
        args: list[Any]
        clauses, args = ([], []) if include_deleted else (["state = ?"],
                                                          [CheckpointState.COMPLETED])
        if experiment_id is not None:
            clauses.append("experiment_id = ?")
            args.append(experiment_id)
        if trial_id is not None:
            clauses.append("trial_id = ?")
            args.append(trial_id)
        rows = self.db.table("checkpoints").rows_where(" AND ".join(clauses) or None,
                                                       args or None,
                                                       order_by="trial_id, batches_trained")
        return [Checkpoint.from_row(row) for row in rows]

    # -- requests (pause, resume, kill) ------------------------------------------------------
    def add_request(self, action: str, *, experiment_id: int | None = None,
                    trial_id: int | None = None) -> int:
        with self.atomic():
            request_id = cast(int, self.db.table("requests").insert({
                "at": now(), "action": action, "experiment_id": experiment_id,
                "trial_id": trial_id}).last_pk)  # the INTEGER PRIMARY KEY
            self.log_event(f"{action}_requested", experiment_id=experiment_id, trial_id=trial_id)
        return request_id

    def pending_requests(self) -> list[dict]:
        return list(self.db.table("requests").rows_where("handled_at IS NULL", order_by="id"))

    def request(self, request_id: int) -> dict:
        return self.db.table("requests").get(request_id)

    def mark_request_handled(self, request_id: int, outcome: str) -> None:
        self.db.table("requests").update(request_id, {"handled_at": now(), "outcome": outcome})
