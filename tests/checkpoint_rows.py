"""An experiment, a trial and checkpoints recorded the way a trial records them, for the tests
of the store and the collector (test_chunks.py, test_s3_chunks.py): the rows without a
daemon, the folders without a model."""
from __future__ import annotations

import shutil
import uuid as uuidlib
from pathlib import Path

from localdet.checkpoints.manifest import build_manifest
from localdet.config.experiment import parse_config
from localdet.records.db import StateDB

MODEL = "determined-keras-model.h5"


def make_experiment(db: StateDB, name: str = "chunks", **storage) -> int:
    """An experiment of a grid searcher; `storage` goes into its `checkpoint_storage` (its
    retention settings, a `type` and where), which keeps 100 checkpoints a trial unless told."""
    parsed = parse_config({
        "name": name, "entrypoint": "model_def:Trial",
        "hyperparameters": {"global_batch_size": 8},
        "searcher": {"name": "grid", "metric": "val_loss", "max_length": {"batches": 4}},
        "checkpoint_storage": {"save_trial_latest": 100, **storage}}).config
    return db.create_experiment(
        name=name, description="", config=parsed, original_config="", searcher="grid",
        metric="val_loss", smaller_is_better=True, experiment_seed=1, model_dir="")


def make_trial(db: StateDB, experiment_id: int) -> int:
    request_id = len(db.trials(experiment_id)) + 1
    return db.create_trial(experiment_id=experiment_id, request_id=request_id, hparams={},
                           seed=1, target_batches=4)


def commit(db: StateDB, store, experiment_id: int, trial_id: int, batches: int,
           folder: Path) -> str:
    """A checkpoint folder stored as a trial stores it (sqlite_reporter._store_and_commit):
    its blobs under the writers lease, the folder consumed, then its manifest."""
    uuid = str(uuidlib.uuid4())
    with store.writing():
        files = store.put_directory(folder, consume=True)
        db.add_checkpoint(build_manifest(uuid=uuid, experiment_id=experiment_id,
                                         trial_id=trial_id, batches_trained=batches,
                                         files=files, metadata={"framework": "tensorflow"}))
    shutil.rmtree(folder, ignore_errors=True)
    return uuid


def live_blobs(db: StateDB) -> set[str]:
    """The hashes the live checkpoints name: their chunks, and files stored whole."""
    return {sha for _, sha, _ in db.checkpoint_files(deleted=False)}


def folder_with(folder: Path, weights: bytes) -> Path:
    """A checkpoint folder: the code, the metadata and `weights` as its model file."""
    (folder / "code").mkdir(parents=True)
    (folder / "code" / "model_def.py").write_text("class Trial: ...\n")
    (folder / "metadata.json").write_text('{"framework": "tensorflow"}')
    (folder / MODEL).write_bytes(weights)
    return folder


def kill_rounds(rounds: int, writer, collector, rng, window: tuple[float, float],
                after_round, layout=None, most: int = 12) -> None:
    """`rounds` times: fork a writer (`writer(round)`: its target and arguments) and a
    collector (`collector(round)`), each given an Event as its last argument to set once its
    first pass is done (a commit, a collection); kill each with SIGKILL at a random moment in
    `window` seconds after that, then call `after_round(round)` (which checks the store).
    Counted from the first pass, not the fork: on a loaded machine a collector killed
    within `window` of its start often never collected. With `layout`, more rounds (up to
    `most` in all) until a checkpoint has been committed and another deleted (`collected`).

    Forked by a fork server, not from this process: its other threads (TensorFlow's, an S3
    client's transfers) may hold a lock at the fork, which the child would then wait on
    forever (a writer once never finished its first pass in 60 s; another crashed)."""
    import multiprocessing
    import os
    import signal
    import time

    fork = multiprocessing.get_context("forkserver")
    fork.set_forkserver_preload(sorted({target.__module__ for target, _ in
                                        (writer(0), collector(0))}))
    round_ = 0
    while round_ < rounds or (layout is not None and round_ < most and not collected(layout)):
        ready = [fork.Event(), fork.Event()]
        processes = [fork.Process(target=target, args=(*args, event))
                     for (target, args), event in zip((writer(round_), collector(round_)),
                                                      ready, strict=True)]
        for process in processes:
            process.start()
        for event in ready:
            assert event.wait(60), "a writer or collector did not finish its first pass"
        started = time.monotonic()
        for process, at in sorted([(p, rng.uniform(*window)) for p in processes],
                                  key=lambda pair: pair[1]):
            time.sleep(max(0.0, at - (time.monotonic() - started)))
            # Both loop until killed: an exit here is a crash (or another's kill).
            assert process.is_alive(), \
                f"{process.name} ended before being killed, exit code {process.exitcode}"
            os.kill(process.pid, signal.SIGKILL)
        for process in processes:
            process.join()
        assert [p.exitcode for p in processes] == [-signal.SIGKILL] * 2
        after_round(round_)
        round_ += 1


def collected(layout) -> bool:
    """Whether a checkpoint is listed and another was deleted (by retention)."""
    from localdet.records.db import StateDB

    with StateDB.open(layout.db) as db:
        return len(db.checkpoints(include_deleted=True)) > len(db.checkpoints()) >= 1
