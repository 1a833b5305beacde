"""Records that survive damage: a real database and a real store are damaged, and every
command says so in one line; the daemon refuses the file; `localdet doctor` finds what is
wrong and `--restore` brings back the newest good backup (localdet/records/backups.py,
localdet/operations/doctor.py)."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Home, older_database, one_error_line
from conftest import save_checkpoint as save

from localdet.checkpoints.store import Store
from localdet.config.experiment import parse_config
from localdet.operations import doctor
from localdet.operations.errors import OperationError
from localdet.paths import Layout
from localdet.pids import DaemonLock
from localdet.records import backups
from localdet.records import db as db_module
from localdet.records.db import DamagedDatabase, StateDB


def make_experiment(db: StateDB) -> int:
    config = parse_config({
        "name": "kept", "entrypoint": "model_def:Trial",
        "hyperparameters": {"global_batch_size": 8},
        "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 400}},
    }).config
    return db.create_experiment(
        name="kept", description="", config=config, original_config="", searcher="single",
        metric="val_loss", smaller_is_better=True, experiment_seed=1, model_dir="/nowhere")


def weights_blob(store: Store, db: StateDB, uuid: str) -> Path:
    [checkpoint] = [c for c in db.checkpoints() if c.uuid == uuid]
    return store.blob_path(checkpoint.manifest["files"]["determined-keras-model.h5"]["sha256"])


def damage_table(path: Path, table: str) -> None:
    """Overwrite the root page of `table`'s b-tree in the middle of the file (the database
    closed, its write-ahead log folded in)."""
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        [root] = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?",
                              [table]).fetchone()
    conn.close()
    with open(path, "r+b") as file:
        file.seek((root - 1) * page_size)
        file.write(b"\xa5" * page_size)


def test_a_damaged_database_and_store_are_found_refused_and_restored(tmp_path):
    home = Home(tmp_path / "home")
    layout = Layout(home.path).ensure()
    store = Store(layout.store)
    with StateDB.open(layout.db) as db:
        experiment_id = make_experiment(db)
        trial_id = db.create_trial(experiment_id=experiment_id, request_id=1,
                                   hparams={"global_batch_size": 8}, seed=1, target_batches=400)
        corrupt_uuid = save(db, store, tmp_path, experiment_id, trial_id, 100)
        missing_uuid = save(db, store, tmp_path, experiment_id, trial_id, 200)
        backups.back_up(layout.db, reason="periodic")  # what the daemon keeps
        later_uuid = save(db, store, tmp_path, experiment_id, trial_id, 300)  # after it
        corrupt, missing = (weights_blob(store, db, corrupt_uuid),
                            weights_blob(store, db, missing_uuid))
        later = weights_blob(store, db, later_uuid)
    corrupt.chmod(0o644)
    with open(corrupt, "r+b") as file:
        file.seek(5)
        file.write(b"XX")
    missing.unlink()

    checked = home.cli("doctor", check=False)
    assert checked.returncode == 1, checked
    assert f"checkpoint {corrupt_uuid} (experiment {experiment_id}): " \
        f"determined-keras-model.h5: corrupt" in checked.stdout
    assert f"checkpoint {missing_uuid} (experiment {experiment_id}): " \
        f"determined-keras-model.h5: missing" in checked.stdout
    assert later_uuid not in checked.stdout and "not healthy" in checked.stdout

    damage_table(layout.db, "experiments")
    assert backups.quick_check(layout.db) is not None  # the damage is real
    status = one_error_line(home.cli("status", check=False))
    assert "damaged" in status and "localdet doctor --restore" in status
    listed = one_error_line(_det(home, "e", "list"))
    assert "localdet doctor --restore" in listed
    status_code, body = _dashboard_get(layout, "/api/experiments")
    assert status_code == 503 and b"localdet doctor --restore" in body, body
    refused = one_error_line(home.cli("daemon", check=False))
    assert "damaged" in refused and "localdet doctor --restore" in refused
    assert len(backups.backups(layout.db)) == 1  # refused before its first copy

    assert "database: damaged" in home.cli("doctor", check=False).stdout
    restored = home.cli("doctor", "--restore")
    assert "moved the damaged records aside" in restored.stdout
    assert later_uuid in restored.stdout  # read from the damaged file, said
    assert "1 file(s)" in restored.stdout and "localdet gc" in restored.stdout
    assert later.exists()  # reported, not deleted
    [aside] = layout.home.glob("localdet.db.damaged-*Z")
    assert backups.quick_check(aside) is not None  # kept as it was
    assert backups.quick_check(layout.db) is None
    assert "kept" in home.cli("status").stdout


def _dashboard_get(layout: Layout, path: str) -> tuple[int, bytes]:
    """One request to the dashboard's app, in process (ASGI, no server)."""
    from localdet.ui.web.app import create_app

    app, sent = create_app(layout, token=None), []
    scope = {"type": "http", "method": "GET", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "scheme": "http", "http_version": "1.1",
             "headers": [(b"host", b"127.0.0.1:8090")], "server": ("127.0.0.1", 8090),
             "client": ("127.0.0.1", 50000)}

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


def _det(home: Home, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from localdet.ui.det import main; main()",
                           *args], env=home.env, capture_output=True, text=True, timeout=120)



def test_a_damaged_header_is_refused_at_the_open_in_one_sentence(tmp_path):
    path = tmp_path / "localdet.db"
    StateDB.open(path).close()
    with open(path, "r+b") as file:
        file.write(b"not an SQLite file at all")
    assert backups.quick_check(path) is not None
    with pytest.raises(DamagedDatabase, match="localdet doctor --restore"):
        StateDB.open(path)


def test_backups_rotate_keeping_the_newest_good_ones(tmp_path, monkeypatch):
    path = tmp_path / "localdet.db"
    with StateDB.open(path) as db:
        made = []
        for batch in range(5):
            db.log_event("note", batch=batch)
            made.append(backups.back_up(path, reason="periodic", keep=3))
    assert backups.backups(path) == made[:1:-1]  # the newest three, newest first
    with sqlite3.connect(made[-1]) as conn:
        assert conn.execute("SELECT count(*) FROM events WHERE kind = 'note'").fetchone() == (5,)
    conn.close()
    # A copy that fails its check replaces nothing.
    monkeypatch.setattr(backups, "quick_check", lambda _: "Tree 2 page 2: btreeInitPage()")
    with pytest.raises(backups.BackupError, match="older copies are kept"):
        backups.back_up(path, reason="periodic", keep=3)
    assert backups.backups(path) == made[:1:-1]
    assert not list(backups.backups_dir(path).glob("*.partial"))


def test_the_daemon_schedule_copies_at_start_then_every_interval(tmp_path):
    path = tmp_path / "localdet.db"
    StateDB.open(path).close()
    said: list[str] = []
    schedule = backups.Schedule(path, 3600, said.append)
    first = schedule.maybe()
    assert first is not None and first.name.endswith("-start.db")
    assert schedule.maybe() is None  # not due for an hour
    schedule.interval, schedule._due = 0, 0.0
    second = schedule.maybe()
    assert second is not None and second.name.endswith("-periodic.db") and not said


def test_a_pending_migration_is_preceded_by_a_backup(tmp_path):
    names = db_module._migration_names()
    path = older_database(tmp_path / "localdet.db")
    StateDB.open(path, migrate=True).close()
    [copy] = backups.backups(path)
    assert copy.name.endswith("-before-migration.db")
    with sqlite3.connect(copy) as conn:
        applied = [row[0] for row in conn.execute("SELECT name FROM _sqlite_migrations")]
    conn.close()
    assert applied == names[:-1]
    StateDB.open(path).close()  # up to date now: no second copy
    assert len(backups.backups(path)) == 1


def test_restore_is_refused_while_a_daemon_runs(tmp_path):
    layout = Layout(tmp_path / "home").ensure()
    StateDB.open(layout.db).close()
    backups.back_up(layout.db, reason="periodic")
    lock = DaemonLock(layout.daemon_lock)
    lock.acquire()
    try:
        with pytest.raises(OperationError, match="stop it before restoring"):
            doctor.restore(layout)
    finally:
        lock.release()
    assert layout.db.exists() and not list(layout.home.glob("localdet.db.damaged-*"))
