"""Searcher events, and what identifies a trial's process beyond its pid.

A search is replayed from its events (see localdet/search/driver.py), so they are its whole
state: recorded in the same transaction as the operations they caused, never rewritten.
"""


def apply(db):
    db.execute(
        """
        CREATE TABLE searcher_events (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            experiment_id INTEGER NOT NULL REFERENCES experiments(id),
            kind TEXT NOT NULL CHECK (kind IN ('initialized', 'validation_completed',
                                               'trial_closed', 'trial_exited_early')),
            request_id INTEGER,
            metric REAL,
            length INTEGER,
            at TEXT NOT NULL
        )
        """
    )
    db.execute("CREATE INDEX searcher_events_by_experiment ON searcher_events (experiment_id, id)")
    db.execute(
        "CREATE TRIGGER searcher_events_no_update BEFORE UPDATE ON searcher_events "
        "BEGIN SELECT RAISE(ABORT, 'searcher events are append-only'); END"
    )
    # The kernel's start time of the trial's process (clock ticks since boot, from
    # /proc/PID/stat): a restarted daemon adopts a pid only if it is still that process,
    # not a stranger that reused the number.
    db.execute("ALTER TABLE trials ADD COLUMN process_start INTEGER")
