"""Chunks in an S3 checkpoint store (localdet/checkpoints/s3_store.py, s3_leases.py) under
a writer and a collector killed at random points, as test_chunks.py does for the local store:
no listed checkpoint is ever left with a missing or bad chunk, and in the end the bucket holds
exactly the chunks the kept checkpoints use. S3 is moto's server in a process of its own."""
from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from checkpoint_rows import (
    commit,
    folder_with,
    kill_rounds,
    live_blobs,
    make_experiment,
    make_trial,
)
from s3_server import blob_keys, s3_config, s3_store, start_process

from localdet.checkpoints import gc
from localdet.checkpoints.manifest import files_of
from localdet.checkpoints.storage import experiment_store
from localdet.paths import Layout
from localdet.records.db import StateDB


def _forget_marks(store) -> None:
    """Delete the writing and sweeping marks of killed processes, which would otherwise stop
    the next round's writer and collector for `s3_leases.MARK_SECONDS` until they go stale
    (test_storage.py shows they do)."""
    for kind in ("writing", "sweeping"):
        for key in store._list_keys(f"{store.prefix}{kind}/"):
            store._delete(key)


def _write_forever(home: str, experiment_id: int, trial_id: int, seed: int, ready) -> None:
    layout = Layout(Path(home))
    rng = random.Random(seed)
    base = random.Random(0).randbytes(1_500_000)
    with StateDB.open(layout.db) as db:
        store = experiment_store(layout, db, experiment_id)
        for n in range(10**6):
            at = rng.randrange(len(base))
            folder = folder_with(Path(home) / f"w{seed}-{n}",
                                 base[:at] + rng.randbytes(rng.randrange(1, 80_000)) + base[at:])
            commit(db, store, experiment_id, trial_id, n + 1, folder)
            ready.set()


def _collect_forever(home: str, experiment_id: int, seed: int, ready) -> None:
    layout = Layout(Path(home))
    rng = random.Random(seed)
    with StateDB.open(layout.db) as db:
        while True:  # no grace period: only the marks keep the writer's chunks
            gc.collect(layout, db, experiment_id, grace_seconds=0, writer_wait_seconds=0.05)
            gc.collect(layout, db, grace_seconds=0, writer_wait_seconds=0.05)  # orphans too
            ready.set()
            time.sleep(rng.random() * 0.1)  # room for the writer: it waits while we sweep


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_s3_writer_and_collector_killed_at_random_points_leave_every_chunk_listed(
        layout, processes):
    """Each round a writer (checkpoints sharing most chunks) and a collector (retention
    keeps each trial's latest, then every unused chunk and orphan goes, with no grace
    period) run side by side against one bucket and are killed with SIGKILL at random
    moments. After each: every listed checkpoint's chunks are in the bucket and sound. At
    the end a clean collection leaves exactly the chunks the kept checkpoints use."""
    endpoint = start_process(processes)
    seed = random.randrange(10**6)
    rng = random.Random(seed)
    storage = s3_config(endpoint, f"kill-{seed}")
    with StateDB.open(layout.db) as db:
        experiment_id = make_experiment(db, **storage, save_trial_latest=1,
                                        save_trial_best=0, save_experiment_best=0)
        trial_id = make_trial(db, experiment_id)
    store = s3_store(endpoint, storage["prefix"])  # this process's own client, never forked
    home = str(layout.home)

    def checked(round_: int) -> None:
        _forget_marks(store)
        with StateDB.open(layout.db) as db:
            for checkpoint in db.checkpoints():
                assert store.verify(files_of(checkpoint.manifest)) == [], \
                    f"seed {seed}, round {round_}: checkpoint {checkpoint.uuid} lost a chunk"

    kill_rounds(4, lambda r: (_write_forever, (home, experiment_id, trial_id, seed + r)),
                lambda r: (_collect_forever, (home, experiment_id, seed + r)), rng,
                (0.5, 2.5), checked, layout=layout)
    with StateDB.open(layout.db) as db:
        assert len(db.checkpoints(include_deleted=True)) > len(db.checkpoints()) >= 1, seed
        assert not gc.collect(layout, db, grace_seconds=0).blobs_deferred
        kept = live_blobs(db)
        assert {key.rsplit("/", 1)[-1] for key in blob_keys(store)} == kept, seed
        for checkpoint in db.checkpoints():
            assert store.verify(files_of(checkpoint.manifest)) == [], seed
