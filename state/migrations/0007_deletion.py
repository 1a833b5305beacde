"""Deleting experiments: ids are never used twice, and a deletion's unfinished cleanup is
written down.

- experiments and trials get AUTOINCREMENT: SQLite otherwise gives a new row the largest id
  plus one, so deleting the newest experiment would hand its id (and its trials' ids) to the
  next one, which would then inherit the deleted one's events (the event log keeps them) and
  any folder an interrupted deletion left. Each table is rebuilt from its own stored SQL (the
  columns every earlier migration gave it), its rows, indexes and triggers kept, as 0005 does.
- experiment_deletions: one row per deleted experiment whose files and blobs are not all
  removed yet, written in the transaction that removes its rows (localdet/operations/
  deletion.py): the next deletion or `localdet gc` finishes the work and removes the row.
"""

import re


def apply(db):
    # Switched off again by SQLite at the end of the transaction (see 0005).
    db.execute("PRAGMA defer_foreign_keys = ON")
    for table in ("trials", "experiments"):
        (create,) = db.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?",
                               [table]).fetchone()
        create, found = re.subn(r"\bid INTEGER PRIMARY KEY\b(?! AUTOINCREMENT)",
                                "id INTEGER PRIMARY KEY AUTOINCREMENT", create, count=1)
        if found:
            _rebuild(db, table, create)
    db.execute("""
        CREATE TABLE experiment_deletions (
            experiment_id INTEGER PRIMARY KEY,  -- no foreign key: its row is gone
            deleted_at TEXT NOT NULL,
            storage TEXT NOT NULL,              -- JSON: the experiment's checkpoint_storage
            blobs TEXT NOT NULL                 -- JSON: sha256 of its checkpoints' files
        )
        """)


def _rebuild(db, table, create):
    extras = [sql for (sql,) in db.execute(
        "SELECT sql FROM sqlite_master WHERE tbl_name = ? AND type IN ('index', 'trigger') "
        "AND sql IS NOT NULL ORDER BY type, name", [table]).fetchall()]
    copy = f"rebuild_{table}"
    db.execute(f"CREATE TEMP TABLE {copy} AS SELECT * FROM main.{table}")
    db.execute(f"DROP TABLE main.{table}")
    db.execute(create)
    columns = ", ".join(row[1] for row in db.execute(f"PRAGMA main.table_info({table})"))
    # Inserting explicit ids sets the table's sqlite_sequence entry to the largest.
    db.execute(f"INSERT INTO main.{table} ({columns}) SELECT {columns} FROM temp.{copy} "
               "ORDER BY id")
    db.execute(f"DROP TABLE temp.{copy}")
    for sql in extras:
        db.execute(sql)
