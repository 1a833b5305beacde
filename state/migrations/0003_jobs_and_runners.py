"""Jobs beside experiments, and who runs an experiment: the daemon, `localdet run` in the
foreground, or a training script on its own (laptop mode, recorded but unmanaged)."""


def apply(db):
    # 'experiment': trials made by a searcher. 'job': one process (`localdet job run`), kept
    # as an experiment with a single trial row so that it shares scheduling, logs and status.
    db.execute("ALTER TABLE experiments ADD COLUMN kind TEXT NOT NULL DEFAULT 'experiment' "
               "CHECK (kind IN ('experiment', 'job'))")
    # The daemon schedules only its own; 'foreground' belongs to a `localdet run` process and
    # 'script' to a `python3 train.py` that recorded itself.
    db.execute("ALTER TABLE experiments ADD COLUMN runner TEXT NOT NULL DEFAULT 'daemon' "
               "CHECK (runner IN ('daemon', 'foreground', 'script'))")
