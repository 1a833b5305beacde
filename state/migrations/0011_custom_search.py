"""Determined's custom searcher (`searcher.name: custom`, localdet/operations/custom_search.py):
a runner script answers each searcher event with operations, so searcher_events may also hold
'trial_created' (a Create carried out) and 'shutdown' (a Shutdown carried out); the table is
rebuilt from its own stored SQL with those kinds added, as 0009 did. Two tables hold what the
runner posted: the requests it named (its UUIDs, our request ids, the hyperparameters of a
Create not yet given a length) and each batch of operations, one per event it answers (the
primary key makes a batch posted twice, by a runner restarted, apply once)."""

import re


def apply(db):
    db.execute("PRAGMA defer_foreign_keys = ON")
    (create,) = db.execute("SELECT sql FROM sqlite_master WHERE type = 'table' "
                           "AND name = 'searcher_events'").fetchone()
    create, found = re.subn(r"'trial_continued'\s*\)", "'trial_continued', 'trial_created', "
                            "'shutdown')", create, count=1)
    if not found:
        raise RuntimeError("searcher_events has no list of kinds to add 'trial_created' to")
    extras = [sql for (sql,) in db.execute(
        "SELECT sql FROM sqlite_master WHERE tbl_name = 'searcher_events' "
        "AND type IN ('index', 'trigger') AND sql IS NOT NULL ORDER BY type, name").fetchall()]
    db.execute("CREATE TEMP TABLE rebuild_searcher_events AS SELECT * FROM main.searcher_events")
    db.execute("DROP TABLE main.searcher_events")
    db.execute(create)
    columns = ", ".join(row[1] for row in db.execute("PRAGMA main.table_info(searcher_events)"))
    db.execute(f"INSERT INTO main.searcher_events ({columns}) SELECT {columns} "
               "FROM temp.rebuild_searcher_events ORDER BY id")
    db.execute("DROP TABLE temp.rebuild_searcher_events")
    for sql in extras:
        db.execute(sql)
    db.execute("""
        CREATE TABLE custom_search_requests (
            experiment_id INTEGER NOT NULL REFERENCES experiments(id) ON DELETE CASCADE,
            request_uuid TEXT NOT NULL,
            request_id INTEGER NOT NULL,
            hparams TEXT NOT NULL,
            seed INTEGER NOT NULL,
            PRIMARY KEY (experiment_id, request_uuid),
            UNIQUE (experiment_id, request_id))""")
    db.execute("""
        CREATE TABLE custom_search_batches (
            experiment_id INTEGER NOT NULL REFERENCES experiments(id) ON DELETE CASCADE,
            event_id INTEGER NOT NULL,
            operations TEXT NOT NULL,
            progress REAL,
            at TEXT NOT NULL,
            PRIMARY KEY (experiment_id, event_id))""")
