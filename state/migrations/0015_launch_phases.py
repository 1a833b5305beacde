"""Each launch's timeline: when each phase of a trial's launch began and ended, from the
daemon's decision to launch it to its process's exit (localdet/records/phases.py names the
phases). The daemon writes its own (launch, exit) in the transactions that record the launch
and the exit; a trial's process writes the rest with its reports, never a transaction of
their own. `launch` is the launch's start as `trials.started_at` spells it, which tells a
trial's launches apart (a resume, a restart)."""


def apply(db):
    db.execute(
        """
        CREATE TABLE launch_phases (
            id INTEGER PRIMARY KEY,
            experiment_id INTEGER NOT NULL REFERENCES experiments(id),
            trial_id INTEGER NOT NULL REFERENCES trials(id),
            launch TEXT NOT NULL,            -- the launch's trials.started_at
            phase TEXT NOT NULL,
            started REAL NOT NULL,           -- seconds since the epoch
            ended REAL NOT NULL,
            details TEXT                     -- JSON, or NULL
        )
        """
    )
    db.execute("CREATE INDEX launch_phases_by_experiment ON launch_phases "
               "(experiment_id, trial_id, started)")
