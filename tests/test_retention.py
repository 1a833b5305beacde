"""Checkpoint retention (Determined's checkpoint_storage rules) and garbage collection, on a
real SQLite file and a real content-addressed store."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time

import pytest
from conftest import Home
from conftest import save_checkpoint as save

from localdet.checkpoints.gc import GRACE_SECONDS, collect
from localdet.checkpoints.retention import CheckpointRef, checkpoints_to_keep
from localdet.checkpoints.store import Store, StoreError
from localdet.config.experiment import parse_config
from localdet.records.db import CheckpointDeleted, StateDB
from localdet.reporting.sqlite_reporter import CheckpointReader, SQLiteReporter
from localdet.ui import views

CODE = b"class Trial: pass\n"  # the same in every checkpoint: one blob, shared

# -- the pure rules -------------------------------------------------------------------------

# Trial 1: checkpoints at 100..400, validated at 100, 200, 300 (400 has no validation).
# Trial 2: checkpoints at 100, 200, both validated. Trial 3: one checkpoint, never validated.
CHECKPOINTS = [CheckpointRef(f"t{t}-{b}", t, b) for t, b in
               [(1, 100), (1, 200), (1, 300), (1, 400), (2, 100), (2, 200), (3, 100)]]
VALIDATIONS = {(1, 100): {"val_loss": 0.5}, (1, 200): {"val_loss": 0.2},
               (1, 300): {"val_loss": 0.4}, (2, 100): {"val_loss": 0.3},
               (2, 200): {"val_loss": 0.1}, (2, 150): {"val_loss": 0.0}}  # 150: no checkpoint
ENDED = {1: "COMPLETED", 2: "CANCELED", 3: "ERROR"}


def keep(latest: int, best: int, experiment_best: int, smaller_is_better: bool = True,
         states: dict | None = None, checkpoints=CHECKPOINTS, validations=VALIDATIONS,
         resume_from: dict | None = None) -> set[str]:
    config = {"checkpoint_storage": {"save_trial_latest": latest, "save_trial_best": best,
                                     "save_experiment_best": experiment_best}}
    return checkpoints_to_keep(config, "val_loss", smaller_is_better, checkpoints,
                               validations, states or ENDED, resume_from)


@pytest.mark.parametrize("latest, best, experiment_best, expected", [
    (1, 1, 0, {"t1-400", "t1-200", "t2-200", "t3-100"}),  # Determined's defaults
    (0, 0, 0, set()),
    (1, 0, 0, {"t1-400", "t2-200", "t3-100"}),
    (2, 0, 0, {"t1-400", "t1-300", "t2-200", "t2-100", "t3-100"}),
    (0, 1, 0, {"t1-200", "t2-200"}),                       # trial 3 has no validated one
    (0, 2, 0, {"t1-200", "t1-300", "t2-200", "t2-100"}),
    (0, 0, 2, {"t2-200", "t1-200"}),
    (1, 0, 2, {"t1-400", "t2-200", "t3-100", "t1-200"}),
    (2, 2, 2, {"t1-400", "t1-300", "t1-200", "t2-200", "t2-100", "t3-100"}),
])
def test_smaller_is_better(latest, best, experiment_best, expected):
    assert keep(latest, best, experiment_best) == expected


@pytest.mark.parametrize("latest, best, experiment_best, expected", [
    (1, 1, 0, {"t1-400", "t1-100", "t2-200", "t2-100", "t3-100"}),
    (0, 1, 0, {"t1-100", "t2-100"}),
    (0, 2, 0, {"t1-100", "t1-300", "t2-100", "t2-200"}),
    (0, 0, 2, {"t1-100", "t1-300"}),
])
def test_larger_is_better(latest, best, experiment_best, expected):
    assert keep(latest, best, experiment_best, smaller_is_better=False) == expected


def test_defaults_apply_to_a_config_without_checkpoint_storage():
    assert checkpoints_to_keep({}, "val_loss", True, CHECKPOINTS, VALIDATIONS, ENDED) == \
        keep(1, 1, 0)


@pytest.mark.parametrize("state", ["QUEUED", "RUNNING", "PAUSED", "WAITING"])
def test_a_trial_that_has_not_ended_keeps_its_latest_even_with_all_settings_zero(state):
    assert keep(0, 0, 0, states={**ENDED, 1: state}) == {"t1-400"}
    # and the one it will resume from, if the database says another
    assert keep(0, 0, 0, states={**ENDED, 1: state},
                resume_from={1: "t1-300", 2: "t2-100"}) == {"t1-400", "t1-300"}


def test_a_nan_or_missing_metric_is_never_best():
    validations = {**VALIDATIONS, (1, 100): {"val_loss": float("nan")},
                   (2, 200): {"val_accuracy": 0.9}, (2, 100): {"val_loss": "n/a"}}
    assert keep(0, 1, 0, validations=validations) == {"t1-200"}
    assert keep(0, 0, 9, validations=validations) == {"t1-200", "t1-300"}


def test_ties_are_broken_by_batches_then_uuid_whatever_the_input_order():
    tied = [CheckpointRef("b", 1, 100), CheckpointRef("a", 1, 200), CheckpointRef("c", 1, 200),
            CheckpointRef("d", 2, 50), CheckpointRef("e", 2, 50)]
    validations = {(1, 100): {"val_loss": 0.3}, (1, 200): {"val_loss": 0.3},
                   (2, 50): {"val_loss": 0.3}}
    for _ in range(10):
        shuffled = random.sample(tied, len(tied))
        # equal metric: more batches first, then the smaller uuid
        assert keep(0, 1, 0, checkpoints=shuffled, validations=validations) == {"a", "d"}
        assert keep(1, 0, 0, checkpoints=shuffled, validations=validations) == {"a", "d"}
        assert keep(0, 0, 1, checkpoints=shuffled, validations=validations) == {"a"}
        assert keep(0, 2, 0, checkpoints=shuffled, validations=validations) == {"a", "c", "d", "e"}


# -- garbage collection on a real database and store ----------------------------------------

@pytest.fixture
def store(layout) -> Store:
    return Store(layout.store)


def make_experiment(db: StateDB, smaller_is_better: bool = True, **storage) -> int:
    config = parse_config({
        "name": "retained", "entrypoint": "model_def:Trial",
        "hyperparameters": {"global_batch_size": 8},
        "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 400},
                     "smaller_is_better": smaller_is_better},
        "checkpoint_storage": storage,
    }).config
    return db.create_experiment(
        name="retained", description="", config=config, original_config="", searcher="single",
        metric="val_loss", smaller_is_better=smaller_is_better, experiment_seed=1,
        model_dir="/nowhere")


def make_trial(db: StateDB, experiment_id: int, request_id: int = 1,
               validations: dict[int, float] | None = None) -> int:
    trial_id = db.create_trial(experiment_id=experiment_id, request_id=request_id,
                               hparams={"global_batch_size": 8}, seed=1, target_batches=400)
    for batches, loss in (validations or {}).items():
        db.record_metrics(trial_id, "validation", batches, {"val_loss": loss})
    return trial_id


def blobs_of(db: StateDB, uuid: str) -> dict[str, str]:
    manifest = db.checkpoints(include_deleted=True)
    [checkpoint] = [c for c in manifest if c.uuid == uuid]
    return {name: entry["sha256"] for name, entry in checkpoint.manifest["files"].items()}


def state_of(db: StateDB, uuid: str) -> str:
    return db.db.execute("SELECT state FROM checkpoints WHERE uuid = ?", [uuid]).fetchone()[0]


@pytest.fixture
def three(db, store, tmp_path):
    """Defaults (latest 1, best 1): of 100 (0.5), 200 (0.2), 300 (0.4), 100 goes."""
    experiment_id = make_experiment(db)
    trial_id = make_trial(db, experiment_id, validations={100: 0.5, 200: 0.2, 300: 0.4})
    uuids = {b: save(db, store, tmp_path, experiment_id, trial_id, b) for b in (100, 200, 300)}
    db.update_trial(trial_id, state="COMPLETED")
    return experiment_id, trial_id, uuids


WEIGHTS = "determined-keras-model.h5"


def test_gc_marks_rows_deleted_and_frees_only_unshared_blobs(layout, db, store, tmp_path, three):
    experiment_id, trial_id, uuids = three
    # Another experiment's checkpoint holds the same weights bytes as the doomed one; it
    # keeps nothing but a running trial's latest checkpoint.
    other = make_experiment(db, save_trial_best=0, save_trial_latest=0)
    other_trial = make_trial(db, other)
    twin = save(db, store, tmp_path, other, other_trial, 100,
                weights=f"weights of {trial_id} at 100".encode())
    db.update_trial(other_trial, state="RUNNING")
    doomed_blobs = blobs_of(db, uuids[100])
    assert doomed_blobs[WEIGHTS] == blobs_of(db, twin)[WEIGHTS]

    report = collect(layout, db, experiment_id)
    assert [d.uuid for d in report.deleted] == [uuids[100]] and not report.held
    assert report.blobs == []  # its weights are shared with `twin`, its code with 200/300
    assert state_of(db, uuids[100]) == "DELETED"  # the row is kept
    assert [c.batches_trained for c in db.checkpoints(experiment_id)] == [200, 300]
    assert store.has(doomed_blobs[WEIGHTS]) and store.has(doomed_blobs["code/model_def.py"])
    [event] = [e for e in db.events(experiment_id) if e["kind"] == "checkpoint_deleted"]
    assert event["payload"]["uuid"] == uuids[100]
    assert "save_trial_best: 1" in event["payload"]["reason"]

    # Once the other trial ends, its twin goes, and the shared weights blob is freed too.
    db.update_trial(other_trial, state="COMPLETED")
    report = collect(layout, db)
    assert [d.uuid for d in report.deleted] == [twin]
    size = len(f"weights of {trial_id} at 100".encode())
    assert report.blobs == [doomed_blobs[WEIGHTS]] and report.bytes_freed == size
    assert not store.has(doomed_blobs[WEIGHTS])
    assert store.has(doomed_blobs["code/model_def.py"])  # 200 and 300 still use it
    for uuid in (uuids[200], uuids[300]):
        assert store.verify(files_of_uuid(db, uuid)) == []
    # Nothing left to do: a second collection changes nothing.
    again = collect(layout, db)
    assert (again.deleted, again.held, again.blobs) == ([], [], [])


def files_of_uuid(db: StateDB, uuid: str):
    from localdet.checkpoints.manifest import files_of
    return files_of(db.checkpoint(uuid).manifest)


def test_unshared_blobs_are_freed_with_their_bytes(layout, db, store, tmp_path, three):
    experiment_id, _, uuids = three
    weights = blobs_of(db, uuids[100])[WEIGHTS]
    size = store.blob_path(weights).stat().st_size
    report = collect(layout, db, experiment_id)
    assert report.blobs == [weights] and report.bytes_freed == size
    assert not store.has(weights)
    assert report.summary() == "deleted 1 checkpoint, freed 1 blob (0.0 MB)"


def test_a_checkpoint_a_reader_holds_is_skipped_without_waiting(layout, db, store, three):
    experiment_id, _, uuids = three
    weights = blobs_of(db, uuids[100])[WEIGHTS]
    with store.reading(uuids[100]):
        started = time.monotonic()
        report = collect(layout, db, experiment_id)
        assert time.monotonic() - started < 5
        assert report.held == [uuids[100]] and report.deleted == [] and report.blobs == []
        assert "held by a reader" in report.summary()
        assert state_of(db, uuids[100]) == "COMPLETED" and store.has(weights)
    report = collect(layout, db, experiment_id)
    assert [d.uuid for d in report.deleted] == [uuids[100]] and not store.has(weights)
    # No one can read a deleted checkpoint, so its lease file goes; live ones' stay.
    assert not store.lease_path(uuids[100]).exists()
    with store.reading(uuids[200]):
        pass
    collect(layout, db, experiment_id)
    assert store.lease_path(uuids[200]).exists()


def test_a_checkpoint_held_by_another_process_is_skipped(layout, db, store, three):
    experiment_id, _, uuids = three
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys; from localdet.checkpoints.store import Store\n"
         f"with Store({str(store.root)!r}).reading({uuids[100]!r}):\n"
         "    print('held', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        report = collect(layout, db, experiment_id)
        assert report.held == [uuids[100]] and state_of(db, uuids[100]) == "COMPLETED"
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert [d.uuid for d in collect(layout, db, experiment_id).deleted] == [uuids[100]]


def test_a_reader_that_waited_on_a_collector_finds_the_checkpoint_deleted(layout, db, store,
                                                                         tmp_path, three):
    _, _, uuids = three
    outcome = {}

    def read():
        try:
            CheckpointReader(layout).materialize(uuids[100], tmp_path / "out")
            outcome["result"] = "read"
        except CheckpointDeleted as error:
            outcome["result"] = str(error)

    collector = store.try_exclusive(uuids[100])  # what collect() holds while deciding
    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(0.5)
    assert reader.is_alive()  # it looked the checkpoint up (live), then waits for the lease
    db.delete_checkpoint(uuids[100], reason="test")
    collector.release(remove=True)
    reader.join(timeout=30)
    assert outcome["result"].startswith(f"checkpoint {uuids[100]} was deleted by retention")
    assert not (tmp_path / "out").exists()


def test_blobs_wait_while_a_checkpoint_is_being_written(layout, db, store, three):
    experiment_id, _, uuids = three
    weights = blobs_of(db, uuids[100])[WEIGHTS]
    with store.writing():  # a trial between its first blob and its manifest commit
        report = collect(layout, db, experiment_id)
        assert [d.uuid for d in report.deleted] == [uuids[100]]
        assert report.blobs_deferred and report.blobs == [] and store.has(weights)
        assert "deferred" in report.summary()
    report = collect(layout, db, experiment_id)
    assert report.deleted == [] and report.blobs == [weights] and not store.has(weights)


def test_a_writer_reusing_a_deleted_checkpoints_blob_keeps_it(layout, db, store, tmp_path,
                                                              three):
    experiment_id, trial_id, uuids = three
    weights = blobs_of(db, uuids[100])[WEIGHTS]
    with store.writing():  # another trial saving the very same bytes
        assert collect(layout, db, experiment_id).blobs_deferred
        # Reopened behind StateDB's back, which refuses to take a trial out of COMPLETED.
        db.db.execute("UPDATE trials SET state = 'RUNNING' WHERE id = ?", [trial_id])
        again = save(db, store, tmp_path, experiment_id, trial_id, 400,
                     weights=f"weights of {trial_id} at 100".encode())
    assert blobs_of(db, again)[WEIGHTS] == weights
    report = collect(layout, db, experiment_id)  # (300 goes now: 400 is the latest)
    assert [d.uuid for d in report.deleted] == [uuids[300]]
    assert weights not in report.blobs and store.verify(files_of_uuid(db, again)) == []


def test_a_trial_saving_a_checkpoint_holds_off_blob_deletion(layout, db, store, tmp_path,
                                                            three):
    _, trial_id, _ = three
    reporter = SQLiteReporter(layout, trial_id)
    putting, proceed = threading.Event(), threading.Event()
    put_directory = reporter.store.put_directory

    def slow_put(directory, **kwargs):
        putting.set()
        proceed.wait(30)
        return put_directory(directory, **kwargs)

    reporter.store.put_directory = slow_put
    folder = tmp_path / "to-save"
    folder.mkdir()
    (folder / WEIGHTS).write_bytes(b"new weights")
    uuid = reporter.save_checkpoint(folder, 500, {})
    assert putting.wait(30)
    assert store.try_sweeping() is None  # blobs put, manifest not committed yet
    proceed.set()
    reporter.wait_for_checkpoints()
    assert db.checkpoint(uuid).batches_trained == 500
    lease = store.try_sweeping()
    assert lease is not None
    lease.release()
    reporter.db.close()


def test_a_fresh_unreferenced_blob_survives_the_grace_period(layout, db, store, three):
    in_flight = store.put_bytes(b"a blob whose manifest is not committed yet")
    leftover = store.tmp / "put-crashed.tmp"
    leftover.write_bytes(b"half")
    collect(layout, db)  # a full collection sweeps orphans, but only old ones
    assert store.has(in_flight.sha256) and leftover.exists()
    old = time.time() - GRACE_SECONDS - 60
    os.utime(store.blob_path(in_flight.sha256), (old, old))
    os.utime(leftover, (old, old))
    report = collect(layout, db, three[0])  # one experiment: no orphan sweep
    assert store.has(in_flight.sha256)
    report = collect(layout, db)
    assert in_flight.sha256 in report.blobs
    assert not store.has(in_flight.sha256) and not leftover.exists()


def test_dry_run_deletes_nothing_and_says_what_it_would(layout, db, store, three):
    experiment_id, _, uuids = three
    weights = blobs_of(db, uuids[100])[WEIGHTS]
    report = collect(layout, db, experiment_id, dry_run=True)
    assert [d.uuid for d in report.deleted] == [uuids[100]] and report.blobs == [weights]
    assert report.summary().startswith("would delete 1 checkpoint and free 1 blob")
    assert state_of(db, uuids[100]) == "COMPLETED" and store.has(weights)
    assert not [e for e in db.events(experiment_id) if e["kind"] == "checkpoint_deleted"]


def test_deleted_checkpoints_cannot_be_read_and_are_never_best(layout, db, store, tmp_path):
    # latest 1, best 0: the best-validated checkpoint (100) goes, the latest (200) stays
    experiment_id = make_experiment(db, save_trial_best=0)
    trial_id = make_trial(db, experiment_id, validations={100: 0.1, 200: 0.5})
    first = save(db, store, tmp_path, experiment_id, trial_id, 100)
    last = save(db, store, tmp_path, experiment_id, trial_id, 200)
    db.update_trial(trial_id, state="COMPLETED")
    assert views.best_checkpoint(db, db.experiment(experiment_id)).uuid == first
    collect(layout, db, experiment_id)
    assert views.best_checkpoint(db, db.experiment(experiment_id)).uuid == last
    with pytest.raises(CheckpointDeleted) as deleted:
        CheckpointReader(layout).materialize(first[:8], tmp_path / "out")
    assert str(deleted.value).startswith(
        f"checkpoint {first} was deleted by retention (checkpoint_storage.save_trial_best: 0, "
        "save_trial_latest: 1")
    assert CheckpointReader(layout).materialize(last, tmp_path / "kept").is_dir()


def test_a_running_trial_keeps_its_latest_checkpoint_with_all_settings_zero(layout, db, store,
                                                                           tmp_path):
    experiment_id = make_experiment(db, save_trial_best=0, save_trial_latest=0)
    trial_id = make_trial(db, experiment_id, validations={100: 0.1})
    uuids = [save(db, store, tmp_path, experiment_id, trial_id, b) for b in (100, 200)]
    db.update_trial(trial_id, state="RUNNING")
    assert [d.uuid for d in collect(layout, db, experiment_id).deleted] == [uuids[0]]
    db.update_trial(trial_id, state="WAITING")  # may still be promoted: resumes from it
    assert collect(layout, db, experiment_id).deleted == []
    db.update_trial(trial_id, state="COMPLETED")
    assert [d.uuid for d in collect(layout, db, experiment_id).deleted] == [uuids[1]]


def test_a_trial_restore_holds_the_checkpoint_until_its_files_are_verified(layout, db, store,
                                                                           tmp_path, three):
    experiment_id, trial_id, uuids = three
    reporter = SQLiteReporter(layout, trial_id)
    release = threading.Event()
    verification = reporter.store.verification

    def slow_verification(files):
        check = verification(files)
        run = check.run
        check.run = lambda *worker: (release.wait(30), run(*worker))[1]
        return check

    reporter.store.verification = slow_verification
    folder = reporter.restore_checkpoint(uuids[100], tmp_path / "restore")
    assert (folder / WEIGHTS).is_file()
    assert collect(layout, db, experiment_id).held == [uuids[100]]
    release.set()
    reporter.verify_restored_checkpoint()
    assert [d.uuid for d in collect(layout, db, experiment_id).deleted] == [uuids[100]]
    reporter.db.close()


def test_a_file_read_in_place_holds_the_checkpoint_until_the_restore_is_verified(
        layout, db, store, tmp_path):
    experiment_id = make_experiment(db, save_trial_best=0, save_trial_latest=0)
    trial_id = make_trial(db, experiment_id, validations={100: 0.5})
    weights = random.Random(7).randbytes(3 << 20)  # many chunks
    uuid = save(db, store, tmp_path, experiment_id, trial_id, 100, weights)
    db.update_trial(trial_id, state="COMPLETED")
    reporter = SQLiteReporter(layout, trial_id)
    folder = reporter.restore_checkpoint(uuid, tmp_path / "restore", read_in_place=[WEIGHTS])
    assert not (folder / WEIGHTS).exists() and (folder / "code" / "model_def.py").is_file()
    with reporter.open_restored(WEIGHTS) as f:
        assert f.read(1000) == weights[:1000]
        f.seek(-5000, os.SEEK_END)
        assert f.read() == weights[-5000:]
    time.sleep(0.2)  # the background check is long done: the file read in place holds it
    assert collect(layout, db, experiment_id).held == [uuid]
    reporter.verify_restored_checkpoint()
    assert [d.uuid for d in collect(layout, db, experiment_id).deleted] == [uuid]
    reporter.db.close()


def test_a_corrupt_chunk_of_a_file_read_in_place_fails_the_restore(layout, db, store,
                                                                   tmp_path):
    experiment_id = make_experiment(db)
    trial_id = make_trial(db, experiment_id, validations={100: 0.5})
    weights = random.Random(8).randbytes(3 << 20)
    uuid = save(db, store, tmp_path, experiment_id, trial_id, 100, weights)
    chunk = db.checkpoint(uuid).manifest["files"][WEIGHTS]["chunks"][3][0]
    blob = store.blob_path(chunk)
    blob.chmod(0o644)
    blob.write_bytes(b"x" * blob.stat().st_size)
    reporter = SQLiteReporter(layout, trial_id)
    reporter.restore_checkpoint(uuid, tmp_path / "restore", read_in_place=[WEIGHTS])
    with reporter.open_restored(WEIGHTS) as f:
        assert f.read() != weights  # read as it lies: the check says it is bad
    with pytest.raises(StoreError, match=f"checkpoint files {WEIGHTS} are corrupt"):
        reporter.verify_restored_checkpoint()
    reporter.db.close()


def test_two_collectors_at_once_delete_each_checkpoint_once(layout, db, store, tmp_path):
    experiment_id = make_experiment(db, save_trial_best=0)
    kept, doomed = [], []
    for request_id in range(1, 5):
        trial_id = make_trial(db, experiment_id, request_id)
        uuids = [save(db, store, tmp_path, experiment_id, trial_id, b) for b in range(10, 210, 10)]
        doomed += uuids[:-1]
        kept.append(uuids[-1])
        db.update_trial(trial_id, state="COMPLETED")
    start = time.time() + 3  # all start together, once their imports are done
    script = ("import sys, time\n"
              "from localdet.records.db import StateDB\n"
              "from localdet.checkpoints.gc import collect\n"
              "from pathlib import Path\nfrom localdet.paths import Layout\n"
              "layout = Layout(Path(sys.argv[1])); db = StateDB.open(layout.db)\n"
              "time.sleep(max(0, float(sys.argv[2]) - time.time()))\n"
              "report = collect(layout, db)\n"
              "print(len(report.deleted), len(report.held))\n")
    processes = [subprocess.Popen([sys.executable, "-c", script, str(layout.home), str(start)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(4)]
    counts = []
    for process in processes:
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
        counts.append([int(n) for n in out.split()])
    assert sum(deleted for deleted, _ in counts) == len(doomed)  # each by exactly one
    mine = collect(layout, db)  # and whatever a collector deferred
    assert mine.deleted == []
    events = [e["payload"]["uuid"] for e in db.events(experiment_id)
              if e["kind"] == "checkpoint_deleted"]
    assert sorted(events) == sorted(doomed)  # each once, whoever did it
    assert {c.uuid for c in db.checkpoints(experiment_id)} == set(kept)
    for uuid in kept:
        assert store.verify(files_of_uuid(db, uuid)) == []
    for uuid in doomed:
        assert not store.has(blobs_of(db, uuid)[WEIGHTS])


# -- the command line -----------------------------------------------------------------------

def test_gc_command_dry_run_then_for_real(layout, db, store, tmp_path, three):
    experiment_id, _, uuids = three
    weights = blobs_of(db, uuids[100])[WEIGHTS]
    home = Home(layout.home)

    dry = home.cli("gc", experiment_id, "--dry-run")
    assert f"would delete checkpoint {uuids[100]} (experiment {experiment_id}" in dry.stdout
    assert f"would delete blob {weights}" in dry.stdout
    assert dry.stdout.splitlines()[-1].startswith("would delete 1 checkpoint and free 1 blob")
    assert state_of(db, uuids[100]) == "COMPLETED" and store.has(weights)

    real = home.cli("gc", experiment_id)
    assert real.stdout.strip().splitlines() == ["deleted 1 checkpoint, freed 1 blob (0.0 MB)"]
    assert state_of(db, uuids[100]) == "DELETED" and not store.has(weights)
    assert home.cli("gc").stdout.strip() == "deleted 0 checkpoints, freed 0 blobs (0.0 MB)"

    live = home.json("checkpoints", experiment_id)
    assert [c["uuid"] for c in live] == [uuids[200], uuids[300]]
    every = home.json("checkpoints", experiment_id, "--all")
    assert [(c["uuid"], c["state"]) for c in every] == [
        (uuids[100], "DELETED"), (uuids[200], "COMPLETED"), (uuids[300], "COMPLETED")]
    table = home.cli("checkpoints", experiment_id, "--all").stdout
    assert "State" in table and "DELETED" in table
    assert uuids[100] not in home.cli("checkpoints", experiment_id).stdout

    failed = home.cli("checkpoint", "export", uuids[100], tmp_path / "export", check=False)
    assert failed.returncode == 1 and "Traceback" not in failed.stderr
    assert failed.stderr.count("\n") == 1
    assert failed.stderr.startswith(f"error: checkpoint {uuids[100]} was deleted by retention "
                                    "(checkpoint_storage.save_trial_best: 1")
    assert not (tmp_path / "export").exists()
    exported = home.cli("checkpoint", "export", uuids[300][:8], tmp_path / "kept")
    assert "written to" in exported.stdout
    assert (tmp_path / "kept" / "code" / "model_def.py").read_bytes() == CODE

    missing = home.cli("gc", "99", check=False)
    assert missing.returncode == 1 and "no experiment 99" in missing.stderr
