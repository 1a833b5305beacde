"""`det e continue` (localdet/operations/lineage.py) tells an experiment's search that its
trial trains on: searcher_events may hold the kind 'trial_continued'. SQLite cannot change a
CHECK in place, so the table is rebuilt from its own stored SQL with that kind added, its
rows, indexes and triggers kept (as 0005 and 0007 rebuild theirs)."""

import re


def apply(db):
    # Switched off again by SQLite at the end of the transaction (see 0005).
    db.execute("PRAGMA defer_foreign_keys = ON")
    (create,) = db.execute("SELECT sql FROM sqlite_master WHERE type = 'table' "
                           "AND name = 'searcher_events'").fetchone()
    create, found = re.subn(r"'trial_exited_early'\s*\)", "'trial_exited_early', "
                            "'trial_continued')", create, count=1)
    if not found:
        raise RuntimeError("searcher_events has no list of kinds to add 'trial_continued' to")
    extras = [sql for (sql,) in db.execute(
        "SELECT sql FROM sqlite_master WHERE tbl_name = 'searcher_events' "
        "AND type IN ('index', 'trigger') AND sql IS NOT NULL ORDER BY type, name").fetchall()]
    db.execute("CREATE TEMP TABLE rebuild_searcher_events AS SELECT * FROM main.searcher_events")
    db.execute("DROP TABLE main.searcher_events")
    db.execute(create)
    columns = ", ".join(row[1] for row in db.execute("PRAGMA main.table_info(searcher_events)"))
    # Explicit ids keep the AUTOINCREMENT sequence at the largest.
    db.execute(f"INSERT INTO main.searcher_events ({columns}) SELECT {columns} "
               "FROM temp.rebuild_searcher_events ORDER BY id")
    db.execute("DROP TABLE temp.rebuild_searcher_events")
    for sql in extras:
        db.execute(sql)
