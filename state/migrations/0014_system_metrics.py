"""Each trial's system metrics, sampled by the daemon while the trial runs
(localdet/monitoring/system_metrics.py): one row a sample, the trial's process tree's CPU,
memory and disk, and its GPUs' utilisation, memory and power where NVML is present. Rows of
long trials are thinned as they go (localdet/records/system_metrics.py): recent samples kept
as sampled, older ones averaged over longer spans (`samples`: how many one row stands for)."""


def apply(db):
    db.execute(
        """
        CREATE TABLE system_metrics (
            id INTEGER PRIMARY KEY,
            trial_id INTEGER NOT NULL REFERENCES trials(id),
            at REAL NOT NULL,                -- seconds since the epoch (UTC) of the sample
            batches_trained INTEGER NOT NULL,-- the trial's, as recorded when it was written
            samples INTEGER NOT NULL DEFAULT 1,
            metrics TEXT NOT NULL            -- JSON: name -> value
        )
        """
    )
    db.execute("CREATE INDEX system_metrics_by_trial ON system_metrics (trial_id, at)")
