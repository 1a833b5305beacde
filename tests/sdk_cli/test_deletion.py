"""Deleting an experiment (localdet/operations/deletion.py): what is refused, what goes and
what stays, and a deleting process killed at each step: the experiment is then either whole
or gone with nothing naming a missing blob, and the next deletion or `localdet gc` finishes
the cleanup."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import uuid as uuidlib

import pytest

from localdet.checkpoints.manifest import build_manifest
from localdet.checkpoints.store import FileEntry, Store
from localdet.config.experiment import parse_config
from localdet.operations import deletion
from localdet.operations.errors import NotFound, OperationError
from localdet.paths import Layout
from localdet.records import catalog
from localdet.records.db import StateDB

SHARED = b"model code that both experiments' checkpoints hold"
TABLES = ("experiments", "trials", "metrics", "checkpoints", "requests", "searcher_events",
          "experiment_labels")


def make_experiment(db: StateDB, name: str, **storage) -> int:
    parsed = parse_config({
        "name": name, "entrypoint": "model_def:Trial",
        "hyperparameters": {"global_batch_size": 8},
        "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 400}},
        "checkpoint_storage": storage}).config
    return db.create_experiment(
        name=name, description="", config=parsed, original_config="", searcher="single",
        metric="val_loss", smaller_is_better=True, experiment_seed=1, model_dir="")


def save(db: StateDB, store: Store, experiment_id: int, trial_id: int, batches: int) -> str:
    """A checkpoint as a trial stores it: its blobs, then its row (one blob shared)."""
    uuid = str(uuidlib.uuid4())
    with store.writing():
        files = {"code/model_def.py": store.put_bytes(SHARED),
                 "weights.h5": store.put_bytes(f"{uuid} weights".encode())}
        db.add_checkpoint(build_manifest(uuid=uuid, experiment_id=experiment_id,
                                         trial_id=trial_id, batches_trained=batches,
                                         files=files, metadata={}))
    return uuid


def populate(layout: Layout, db: StateDB, name: str = "doomed", **storage) -> int:
    """An ended experiment with every kind of row, two checkpoints and its folders."""
    store = Store(layout.store) if not storage else Store(storage["host_path"])
    experiment_id = make_experiment(db, name, **storage)
    trial_id = db.create_trial(experiment_id=experiment_id, request_id=1, hparams={}, seed=1,
                               target_batches=400)
    for batches in (100, 200):
        db.record_metrics(trial_id, "validation", batches, {"val_loss": 1 / batches})
        save(db, store, experiment_id, trial_id, batches)
    db.add_searcher_event(experiment_id, "initialized")
    db.add_request("pause", experiment_id=experiment_id)
    catalog.add_label(db, experiment_id, "old")
    db.update_trial(trial_id, state="COMPLETED")
    db.set_experiment_state(experiment_id, "COMPLETED")
    for folder in deletion.folders(layout, experiment_id):
        (folder / "trials" / str(trial_id)).mkdir(parents=True)
        (folder / "trials" / str(trial_id) / "trial.log").write_text("trained\n")
    (layout.model_dir(experiment_id) / "model_def.py").parent.mkdir(parents=True)
    (layout.model_dir(experiment_id) / "model_def.py").write_text("class Trial: ...\n")
    return experiment_id


def rows_of(db: StateDB, experiment_id: int) -> dict[str, int]:
    trials = "(SELECT id FROM trials WHERE experiment_id = :e)"
    where = {"experiments": "id = :e", "metrics": f"trial_id IN {trials}"}
    return {table: db.db.execute(f"SELECT count(*) FROM {table} WHERE "
                                 f"{where.get(table, 'experiment_id = :e')}",
                                 {"e": experiment_id}).fetchone()[0] for table in TABLES}


def dangling(db: StateDB, layout: Layout) -> list[str]:
    """Files of live checkpoints missing from their store (there must be none)."""
    missing = []
    for checkpoint in db.checkpoints():
        config = db.experiment(checkpoint.experiment_id).config
        storage = config["checkpoint_storage"]
        store = Store(storage["host_path"]) if storage.get("type") else Store(layout.store)
        files = {name: FileEntry(entry["sha256"], entry["size"])
                 for name, entry in checkpoint.manifest["files"].items()}
        missing += store.verify(files)
    return missing


def blobs(db: StateDB, experiment_id: int) -> set[str]:
    return {sha for _, sha, _ in db.checkpoint_files(deleted=False, experiment_id=experiment_id)}


@pytest.fixture
def two(layout, db):
    """The experiment to delete, and a kept one whose checkpoints share a blob with it."""
    doomed = populate(layout, db)
    kept = populate(layout, db, "kept")
    return doomed, kept


def test_delete_removes_rows_folders_and_unshared_blobs(layout, db, two):
    doomed, kept = two
    store = Store(layout.store)
    own, others = blobs(db, doomed), blobs(db, kept)
    shared = own & others
    assert len(shared) == 1 and len(own) == 3  # the code file, and two weights

    result = deletion.delete_experiment(layout, db, doomed)
    assert result["rows"] == {"metrics": 2, "system_metrics": 0, "checkpoints": 2,
                              "requests": 1, "searcher_events": 1, "experiment_labels": 1,
                              "launch_phases": 0, "trials": 1, "experiments": 1}
    assert (result["blobs_deleted"], result["blobs_deferred"]) == (2, False)
    assert rows_of(db, doomed) == dict.fromkeys(TABLES, 0)
    assert not any(folder.exists() for folder in deletion.folders(layout, doomed))
    assert not any(store.has(sha) for sha in own - shared)
    assert dangling(db, layout) == [] and all(store.has(sha) for sha in others)
    assert catalog.pending_deletions(db) == []
    assert db.events(doomed, kinds=["experiment_deleted"])  # the history stays
    with pytest.raises(NotFound):
        deletion.delete_experiment(layout, db, doomed)
    # Ids are never used twice: the next experiment and trial get new ones.
    newest_trial = max(t.id for t in db.trials())
    kept_too = make_experiment(db, "next")
    assert kept_too == kept + 1
    assert db.create_trial(experiment_id=kept_too, request_id=1, hparams={}, seed=1,
                           target_batches=1) == newest_trial + 1


def test_blobs_in_a_shared_fs_store_are_freed_there(layout, db, tmp_path):
    shared_fs = tmp_path / "mount"
    shared_fs.mkdir()
    doomed = populate(layout, db, host_path=str(shared_fs), type="shared_fs")
    own = blobs(db, doomed)
    deletion.delete_experiment(layout, db, doomed)
    assert not any(Store(shared_fs).has(sha) for sha in own)


def test_refusals(layout, db, two):
    doomed, kept = two
    running = make_experiment(db, "running")
    trial = db.create_trial(experiment_id=running, request_id=1, hparams={}, seed=1,
                            target_batches=1)
    db.update_trial(trial, state="RUNNING")
    with pytest.raises(OperationError) as refused:
        deletion.delete_experiment(layout, db, running)
    assert str(refused.value) == (f"experiment {running} is ACTIVE (1 of its trials have not "
                                  "ended); kill it first and delete it once it has ended")

    uuid = db.checkpoints(doomed)[0].uuid
    db.db.execute("INSERT INTO models (name, created_at, updated_at) VALUES ('prod', '', '')")
    db.db.execute("INSERT INTO model_versions (model_id, version, checkpoint_uuid, created_at, "
                  "updated_at) VALUES (1, 1, ?, '', '')", [uuid])
    with pytest.raises(OperationError) as refused:
        deletion.delete_experiment(layout, db, doomed)
    assert str(refused.value) == (f"checkpoint {uuid} of experiment {doomed} is version 1 of "
                                  "model 'prod'; delete those model versions first")
    db.db.execute("DELETE FROM model_versions")

    with Store(layout.store).reading(db.checkpoints(kept)[1].uuid):
        with pytest.raises(OperationError, match=r"^checkpoint \S+ is being read \(a download "
                                                 r"or export\); delete the experiment once"):
            deletion.delete_experiment(layout, db, kept)
    assert rows_of(db, doomed)["checkpoints"] == 2 and dangling(db, layout) == []
    # The lease it had taken on the first checkpoint was let go: once the reader is done,
    # the deletion goes through.
    deletion.delete_experiment(layout, db, kept)
    assert rows_of(db, kept)["experiments"] == 0


# -- a deleting process killed at each step ---------------------------------------------------

KILLER = textwrap.dedent("""
    import os, signal, sys
    from localdet.checkpoints import store as store_module
    from localdet.operations import deletion
    from localdet.paths import Layout
    from localdet.records.db import StateDB

    at, experiment_id = sys.argv[1], int(sys.argv[2])

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    def before(name):
        original = getattr(deletion, name)
        setattr(deletion, name, lambda *a, **k: (die(), original(*a, **k))[1])

    def after(name):
        original = getattr(deletion, name)
        setattr(deletion, name, lambda *a, **k: (original(*a, **k), die()))

    if at == "before_rows":
        before("remove_rows")
    elif at == "in_rows":       # its rows deleted, the transaction not committed
        after("remove_rows")
    elif at == "after_rows":
        before("clean_up")
    elif at == "mid_folders":   # the model folder gone, the logs not yet
        rmtree = deletion.shutil.rmtree
        def half(path, *a, **k):
            rmtree(os.path.join(path, "model"))
            die()
        deletion.shutil.rmtree = half
    elif at == "after_folders":
        after("remove_folders")
    elif at == "mid_blobs":     # one blob deleted, the other not
        delete_blobs = store_module.Store.delete_blobs
        def one(self, hashes, **k):
            delete_blobs(self, set(sorted(hashes)[:1]), **k)
            die()
        store_module.Store.delete_blobs = one
    elif at == "after_blobs":
        before("finish")
    layout = Layout.from_environment()
    with StateDB.open(layout.db) as db:
        deletion.delete_experiment(layout, db, experiment_id)
""")
STEPS = ("before_rows", "in_rows", "after_rows", "mid_folders", "after_folders", "mid_blobs",
         "after_blobs")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A state folder with the two experiments, made once and copied for each step."""
    home = tmp_path_factory.mktemp("prepared") / "home"
    layout = Layout(home).ensure()
    with StateDB.open(layout.db) as db:
        doomed = populate(layout, db)
        kept = populate(layout, db, "kept")
        before = {"rows": rows_of(db, doomed), "blobs": blobs(db, doomed),
                  "kept": blobs(db, kept)}
    return home, doomed, before


@pytest.mark.slow
@pytest.mark.parametrize("step", STEPS)
def test_a_deletion_killed_at_each_step_leaves_it_whole_or_gone(prepared, tmp_path, step):
    template, doomed, before = prepared
    layout = Layout(tmp_path / "home")
    shutil.copytree(template, layout.home)
    env = {**os.environ, "LOCALDET_HOME": str(layout.home)}
    killed = subprocess.run([sys.executable, "-c", KILLER, step, str(doomed)], env=env,
                            capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    store = Store(layout.store)
    own = before["blobs"] - before["kept"]
    with StateDB.open(layout.db) as db:
        assert dangling(db, layout) == []  # whatever happened, no record names a lost blob
        if step in ("before_rows", "in_rows"):  # whole: rows, blobs and files
            assert rows_of(db, doomed) == before["rows"]
            assert all(store.has(sha) for sha in before["blobs"])
            assert (layout.model_dir(doomed) / "model_def.py").exists()
            assert catalog.pending_deletions(db) == []
            deletion.delete_experiment(layout, db, doomed)  # a retried delete finishes
        else:  # gone from the records, the rest pending
            assert rows_of(db, doomed) == dict.fromkeys(TABLES, 0)
            assert [p["experiment_id"] for p in catalog.pending_deletions(db)] == [doomed]
            assert deletion.finish_pending(layout, db) == [doomed]  # what `localdet gc` runs
        assert catalog.pending_deletions(db) == []
        assert not any(folder.exists() for folder in deletion.folders(layout, doomed))
        assert not any(store.has(sha) for sha in own)
        assert all(store.has(sha) for sha in before["kept"]) and dangling(db, layout) == []
