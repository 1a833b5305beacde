"""Content-defined chunks in the checkpoint store (localdet/checkpoints/chunking.py, store.py,
rechunk.py): a frozen-base search stores its base once, stores written before chunking are
read and converted, doctor checks chunks, and a writer and a collector killed at random
points never leave a listed checkpoint with a missing chunk."""
from __future__ import annotations

import hashlib
import random
import time
from pathlib import Path

import pytest
from checkpoint_rows import (
    MODEL,
    commit,
    folder_with,
    kill_rounds,
    live_blobs,
    make_experiment,
    make_trial,
)
from click.testing import CliRunner

from localdet.checkpoints import gc
from localdet.checkpoints.manifest import files_of
from localdet.checkpoints.rechunk import rechunk, stored_bytes
from localdet.checkpoints.store import FileEntry, Store
from localdet.operations import doctor
from localdet.paths import Layout
from localdet.records.db import StateDB
from localdet.ui.cli import cli


def stored(store: Store) -> set[str]:
    return {blob.name for blob in store.objects.glob("??/*")}


# -- the frozen-base search --------------------------------------------------------------------

def test_a_frozen_base_search_stores_the_base_once(layout, db, tmp_path):
    """4 trials fine-tune a head on the same frozen base (~9 MB of weights), 4 checkpoints
    each, all kept: real Keras .h5 files through the store's write path take at most twice
    one checkpoint (stored whole, they took 16 times); retention then deletes 12 of them and
    gc frees only chunks no kept checkpoint uses."""
    import numpy as np
    import tensorflow as tf

    inputs = tf.keras.Input((256,))
    features = inputs
    tf.keras.utils.set_random_seed(0)
    for i in range(3):  # 3 x (256 or 1024) x 1024 float32: 9.4 MB, frozen
        features = tf.keras.layers.Dense(1024, activation="relu", name=f"base{i}",
                                         trainable=False)(features)
    x = np.random.default_rng(0).random((16, 256), dtype=np.float32)
    y = np.arange(16, dtype="int32") % 10
    store = Store(layout.store)
    experiment_id = make_experiment(db)
    sizes, last = [], {}
    for trial in range(4):  # a grid over the head's learning rate
        tf.keras.utils.set_random_seed(trial)
        model = tf.keras.Model(inputs, tf.keras.layers.Dense(10, activation="softmax",
                                                             name=f"head{trial}")(features))
        model.compile(optimizer=tf.keras.optimizers.Adam(10 ** -(trial + 1)),
                      loss="sparse_categorical_crossentropy", run_eagerly=True)  # no tracing
        trial_id = make_trial(db, experiment_id)
        for batches in range(1, 5):
            model.train_on_batch(x, y)
            folder = folder_with(tmp_path / f"t{trial}b{batches}", b"")
            model.save(folder / MODEL)
            last[trial] = (folder / MODEL).read_bytes()
            uuid = commit(db, store, experiment_id, trial_id, batches, folder)
            sizes.append(db.checkpoint(uuid).size_bytes)
    one = max(sizes)
    whole_files = {(e.sha256, e.size) for c in db.checkpoints() for e in
                   files_of(c.manifest).values()}
    assert len(db.checkpoints()) == 16 and one > 9_000_000
    assert sum(size for _, size in whole_files) > 15 * one  # what storing files whole takes
    assert stored_bytes(store) <= 2 * one, (stored_bytes(store), one)
    assert stored(store) == live_blobs(db)

    exported = store.materialize(files_of(db.checkpoints()[-1].manifest), tmp_path / "export")
    assert (exported / MODEL).read_bytes() == last[3]

    before = stored_bytes(store)
    for checkpoint in db.checkpoints():
        if checkpoint.batches_trained < 4:
            db.delete_checkpoint(checkpoint.uuid, reason="test")
    report = gc.collect(layout, db, experiment_id)
    assert report.blobs_deleted > 0 and stored_bytes(store) < before
    assert stored(store) == live_blobs(db)  # what a kept checkpoint uses stayed
    for checkpoint in db.checkpoints():
        assert store.verify(files_of(checkpoint.manifest)) == []


# -- stores written before chunking ----------------------------------------------------------

def test_a_store_written_whole_is_read_as_it_is_and_rechunked_once(layout, db, tmp_path):
    rng = random.Random(7)
    base = rng.randbytes(2_000_000)
    store_whole = Store(layout.store, chunked=False)  # how localdet stored files before
    experiment_id = make_experiment(db)
    trial_id = make_trial(db, experiment_id)
    originals = {}
    for batches in range(1, 4):
        weights = base[:500_000] + rng.randbytes(20_000) + base[500_000:]
        uuid = commit(db, store_whole, experiment_id, trial_id, batches,
                      folder_with(tmp_path / f"b{batches}", weights))
        originals[uuid] = weights
        assert not files_of(db.checkpoint(uuid).manifest)[MODEL].chunks
    assert doctor.check(layout).healthy
    whole = stored_bytes(store_whole)

    report = rechunk(layout, db)
    assert (report.files, report.checkpoints, report.deferred) == (3, 3, False)
    assert report.stored_before == whole and report.stored_after < whole / 2
    assert "MB saved" in report.summary()
    store = Store(layout.store)
    for uuid, weights in originals.items():
        entry = files_of(db.checkpoint(uuid).manifest)[MODEL]
        assert entry.chunks and entry.sha256 == hashlib.sha256(weights).hexdigest()
        out = store.materialize(files_of(db.checkpoint(uuid).manifest), tmp_path / uuid)
        assert (out / MODEL).read_bytes() == weights
    assert stored(store) == live_blobs(db)  # the whole-file blobs are gone
    again = CliRunner().invoke(cli, ["gc", "--rechunk"], env={"LOCALDET_HOME": str(layout.home)})
    assert again.exit_code == 0, again.output  # idempotent: nothing left to convert
    assert f"rechunked 0 files of 0 checkpoints; the stores went from " \
        f"{report.stored_after / 1e6:.1f} MB" in again.output
    assert doctor.check(layout).healthy


def test_doctor_names_a_missing_and_a_corrupt_chunk_and_unnamed_files(layout, db, tmp_path):
    store = Store(layout.store)
    experiment_id = make_experiment(db)
    trial_id = make_trial(db, experiment_id)
    rng = random.Random(3)
    uuids = [commit(db, store, experiment_id, trial_id, b,
                    folder_with(tmp_path / f"b{b}", rng.randbytes(600_000))) for b in (1, 2)]
    first, second = (files_of(db.checkpoint(u).manifest)[MODEL] for u in uuids)
    store.blob_path(first.chunks[1][0]).unlink()
    corrupt = store.blob_path(second.chunks[-1][0])
    corrupt.chmod(0o644)
    corrupt.write_bytes(b"not the chunk")
    store.put_bytes(b"a file no record names")
    report = doctor.check(layout)
    assert not report.healthy and report.checkpoints == 2
    assert {(b.uuid, tuple(b.missing), tuple(b.corrupt)) for b in report.bad} == {
        (uuids[0], (MODEL,), ()), (uuids[1], (), (MODEL,))}
    lines = "\n".join(report.lines())
    assert f"checkpoint {uuids[0]} (experiment {experiment_id}): {MODEL}: missing" in lines
    assert "1 file(s)" in lines and "named by no kept checkpoint" in lines


# -- a writer and a collector killed at random points -------------------------------------------

def _write_forever(home: str, experiment_id: int, trial_id: int, seed: int, ready) -> None:
    layout = Layout(Path(home))
    store, rng = Store(layout.store), random.Random(seed)
    base = random.Random(0).randbytes(1_500_000)
    with StateDB.open(layout.db) as db:
        for n in range(10**6):
            at = rng.randrange(len(base))
            folder = folder_with(Path(home) / f"w{seed}-{n}",
                                 base[:at] + rng.randbytes(rng.randrange(1, 80_000)) + base[at:])
            commit(db, store, experiment_id, trial_id, n + 1, folder)
            ready.set()
            time.sleep(rng.random() * 0.02)  # room for the collector's sweeping lease


def _collect_forever(home: str, experiment_id: int, ready) -> None:
    layout = Layout(Path(home))
    with StateDB.open(layout.db) as db:
        while True:
            gc.collect(layout, db, experiment_id, writer_wait_seconds=0.05)
            gc.collect(layout, db, grace_seconds=0, writer_wait_seconds=0.05)  # orphans too
            ready.set()


@pytest.mark.timeout(120)
def test_a_writer_and_a_collector_killed_at_random_points_leave_every_chunk_listed(
        layout, tmp_path):
    """Each round a writer (checkpoints sharing most chunks) and a collector (retention
    keeps each trial's latest, then every unused blob and orphan goes) run side by side and
    are killed with SIGKILL at random moments. After each: every listed checkpoint's chunks
    are present and sound. At the end a clean collection leaves exactly the chunks the kept
    checkpoints use."""
    seed = random.randrange(10**6)
    rng = random.Random(seed)
    with StateDB.open(layout.db) as db:
        experiment_id = make_experiment(db, save_trial_latest=1, save_trial_best=0,
                                        save_experiment_best=0)
        trial_id = make_trial(db, experiment_id)
    store = Store(layout.store)
    home = str(layout.home)

    def checked(round_: int) -> None:
        with StateDB.open(layout.db) as db:
            for checkpoint in db.checkpoints():
                assert store.verify(files_of(checkpoint.manifest)) == [], \
                    f"seed {seed}, round {round_}: checkpoint {checkpoint.uuid} lost a chunk"

    kill_rounds(5, lambda r: (_write_forever, (home, experiment_id, trial_id, seed + r)),
                lambda r: (_collect_forever, (home, experiment_id)), rng, (0.15, 0.5), checked,
                layout=layout)
    with StateDB.open(layout.db) as db:
        assert len(db.checkpoints(include_deleted=True)) > len(db.checkpoints()) >= 1, seed
        gc.collect(layout, db, grace_seconds=0)
        assert stored(store) == live_blobs(db), seed
        for checkpoint in db.checkpoints():
            assert store.verify(files_of(checkpoint.manifest)) == [], seed


def test_file_entries_are_equal_by_bytes_however_stored():
    chunked = FileEntry("a" * 64, 10, (("b" * 64, 4), ("c" * 64, 6)))
    assert chunked == FileEntry("a" * 64, 10) and chunked.blobs == chunked.chunks
    assert FileEntry("a" * 64, 10).blobs == (("a" * 64, 10),)
