"""CHECK constraints on the enum-like columns: experiments.state, trials.state,
trials.stop_requested and checkpoints.state (experiments.kind and .runner have theirs since
0003), so that SQLite itself refuses a value localdet/records/states.py does not define.

SQLite cannot add a CHECK to an existing table, so each table is rebuilt under the same
name, its rows kept (ids and rowids included), its indexes and triggers made again.
The values are written out here, not read from the enums: a migration states the schema
of its time (tests/test_states.py checks that they still match).

It runs in the migration's transaction, where PRAGMA foreign_keys cannot be turned off:
dropping a table other tables refer to deletes its rows as far as their foreign keys are
concerned, so those checks are deferred to the commit, by when the same rows are back.
"""

EXPERIMENT_STATES = ("ACTIVE", "PAUSED", "COMPLETED", "CANCELED", "ERROR")
TRIAL_STATES = ("QUEUED", "RUNNING", "PAUSED", "WAITING", "COMPLETED", "CANCELED", "ERROR")
STOP_REQUESTS = ("PAUSE", "PAUSING", "REQUEUE")
CHECKPOINT_STATES = ("COMPLETED", "DELETED")


def _among(values):
    return "(" + ", ".join(f"'{value}'" for value in values) + ")"


# The tables as 0001-0004 left them, column for column, with the CHECKs added.
TABLES = {
    # checkpoints first: nothing refers to it; experiments last: everything does.
    "checkpoints": f"""
        CREATE TABLE checkpoints (
            uuid TEXT PRIMARY KEY,
            experiment_id INTEGER NOT NULL REFERENCES experiments(id),
            trial_id INTEGER NOT NULL REFERENCES trials(id),
            batches_trained INTEGER NOT NULL,
            state TEXT NOT NULL DEFAULT 'COMPLETED'
                CHECK (state IN {_among(CHECKPOINT_STATES)}),
            size_bytes INTEGER NOT NULL,
            metadata TEXT NOT NULL,         -- JSON
            manifest TEXT NOT NULL,         -- JSON, see state/checkpoint_manifest.schema.json
            created_at TEXT NOT NULL
        )
        """,
    "trials": f"""
        CREATE TABLE trials (
            id INTEGER PRIMARY KEY,
            experiment_id INTEGER NOT NULL REFERENCES experiments(id),
            request_id INTEGER NOT NULL,    -- the searcher's name for this trial
            state TEXT NOT NULL CHECK (state IN {_among(TRIAL_STATES)}),
            hparams TEXT NOT NULL,          -- JSON
            seed INTEGER NOT NULL,
            target_batches INTEGER NOT NULL,-- train to this length, set by the searcher
            batches_trained INTEGER NOT NULL DEFAULT 0,
            restarts INTEGER NOT NULL DEFAULT 0,
            latest_checkpoint TEXT,
            pid INTEGER,
            slots TEXT,                     -- JSON list of the slots it runs on
            started_at TEXT,
            heartbeat_at TEXT,
            ended_at TEXT,
            error TEXT,
            stop_requested TEXT CHECK (stop_requested IS NULL
                                       OR stop_requested IN {_among(STOP_REQUESTS)}),
            process_start INTEGER,
            UNIQUE (experiment_id, request_id)
        )
        """,
    "experiments": f"""
        CREATE TABLE experiments (
            id INTEGER PRIMARY KEY,
            name TEXT NOT NULL,
            description TEXT NOT NULL DEFAULT '',
            state TEXT NOT NULL CHECK (state IN {_among(EXPERIMENT_STATES)}),
            config TEXT NOT NULL,          -- validated config, defaults filled (JSON)
            original_config TEXT NOT NULL, -- the YAML as submitted
            searcher TEXT NOT NULL,
            metric TEXT NOT NULL,
            smaller_is_better INTEGER NOT NULL,
            experiment_seed INTEGER NOT NULL,
            model_dir TEXT NOT NULL,
            submitted_at TEXT NOT NULL,
            ended_at TEXT,
            error TEXT,
            kind TEXT NOT NULL DEFAULT 'experiment' CHECK (kind IN ('experiment', 'job')),
            runner TEXT NOT NULL DEFAULT 'daemon'
                CHECK (runner IN ('daemon', 'foreground', 'script'))
        )
        """,
}

# (table, key column, checked column, allowed values): read before the rebuild, so that a
# row that would fail a CHECK is named instead of a bare "CHECK constraint failed".
CHECKED = [
    ("checkpoints", "uuid", "state", CHECKPOINT_STATES),
    ("trials", "id", "state", TRIAL_STATES),
    ("trials", "id", "stop_requested", STOP_REQUESTS),
    ("experiments", "id", "state", EXPERIMENT_STATES),
]


def apply(db):
    for table, key, column, values in CHECKED:
        bad = db.execute(f"SELECT {key}, {column} FROM {table} WHERE {column} IS NOT NULL "
                         f"AND {column} NOT IN {_among(values)} LIMIT 1").fetchone()
        if bad is not None:
            raise RuntimeError(
                f"{table} row {bad[0]} has {column} {bad[1]!r}, which is none of "
                f"{', '.join(values)}; correct it in the database before upgrading localdet")
    # Switched off again by SQLite at the end of the transaction.
    db.execute("PRAGMA defer_foreign_keys = ON")
    for table, create in TABLES.items():
        _rebuild(db, table, create)


def _rebuild(db, table, create):
    extras = [sql for (sql,) in db.execute(
        "SELECT sql FROM sqlite_master WHERE tbl_name = ? AND type IN ('index', 'trigger') "
        "AND sql IS NOT NULL ORDER BY type, name", [table]).fetchall()]
    copy = f"rebuild_{table}"
    # rowid too: a table keyed by text (checkpoints) keeps its rows' order as well.
    db.execute(f"CREATE TEMP TABLE {copy} AS SELECT rowid AS rebuild_rowid, * FROM main.{table}")
    db.execute(f"DROP TABLE main.{table}")
    db.execute(create)
    columns = ", ".join(row[1] for row in db.execute(f"PRAGMA main.table_info({table})"))
    db.execute(f"INSERT INTO main.{table} (rowid, {columns}) "
               f"SELECT rebuild_rowid, {columns} FROM temp.{copy} ORDER BY rebuild_rowid")
    db.execute(f"DROP TABLE temp.{copy}")
    for sql in extras:
        db.execute(sql)
