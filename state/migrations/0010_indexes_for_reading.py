"""Indexes for what the commands read (`localdet status ID`, `det e describe`, `localdet
checkpoints ID`, the dashboard): an experiment's events, a trial's events, the newest event of
a kind, an experiment's checkpoints. Each was a scan of the whole table (45,000 events and
10,000 checkpoints for 200 experiments of 5,000 trials)."""


def apply(db):
    db.execute("CREATE INDEX IF NOT EXISTS events_by_experiment ON events (experiment_id, id)")
    db.execute("CREATE INDEX IF NOT EXISTS events_by_trial ON events (trial_id, id)")
    db.execute("CREATE INDEX IF NOT EXISTS events_by_kind ON events (kind, id)")
    db.execute("CREATE INDEX IF NOT EXISTS checkpoints_by_experiment "
               "ON checkpoints (experiment_id, trial_id, batches_trained)")
