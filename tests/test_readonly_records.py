"""Readers never write, schemas are guarded, and every SQLite failure is one sentence
(localdet/records/opening.py, StateDB.open_readonly), for `localdet`, `det`, the SDK and the
dashboard, in-process (their `main`s, the SDK's client, the app served from a thread).

What the failures cover: a damaged file, a lock held past the busy timeout (shortened here),
a directory where the file should be, a state folder that cannot be made (its parent is a
file), and a read-only folder (a real read-only tmpfs mount, where this test may mount one;
skipped elsewhere). A file unreadable by its permissions cannot be made here: the suite runs
as root, which ignores file modes; it reaches SQLite as the same "unable to open" failure the
directory and the unmakeable folder give."""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from browser import served
from conftest import older_database

from localdet.paths import Layout
from localdet.records import db as db_module
from localdet.records import opening
from localdet.records.db import SchemaBehind, SchemaTooNew, StateDB
from localdet.ui import cli as localdet_cli
from localdet.ui import det as det_cli


def make_records(home: Path) -> Path:
    """Records of two experiments, the first with a trial and its metrics; the database's
    path."""
    layout = Layout(home)
    with StateDB.open(layout.ensure().db) as db:
        experiment_id = db.create_experiment(
            name="kept", description="", config={}, original_config="", searcher="single",
            metric="val_loss", smaller_is_better=True, experiment_seed=1, model_dir="")
        trial_id = db.create_trial(experiment_id=experiment_id, request_id=1,
                                   hparams={"lr": 0.1}, seed=1, target_batches=10)
        db.record_metrics(trial_id, "validation", 10, {"val_loss": 0.5})
        db.create_experiment(
            name="other", description="", config={}, original_config="", searcher="single",
            metric="val_loss", smaller_is_better=True, experiment_seed=1, model_dir="")
    return layout.db


def run(main, argv: list[str], monkeypatch, capsys) -> tuple[int, str, str]:
    """`main` (localdet's or det's) as its console script runs it: exit status, out, err."""
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exited:
        main()
    captured = capsys.readouterr()
    return exited.value.code or 0, captured.out, captured.err


def one_sentence(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    return lines[0]


def sdk_error(call) -> str:
    from determined.common.api import errors

    with pytest.raises(errors.APIException) as raised:
        call()
    assert "\n" not in str(raised.value)
    return str(raised.value)


def dashboard(layout: Layout, *paths: str) -> list[tuple[int, dict | list]]:
    from localdet.ui.web.app import create_app

    answers = []
    with served(create_app(layout, token=None)) as url:
        for path in paths:
            try:
                with urllib.request.urlopen(url.rstrip("/") + path, timeout=30) as response:
                    answers.append((response.status, json.loads(response.read())))
            except urllib.error.HTTPError as error:
                answers.append((error.code, json.loads(error.read())))
    return answers


def fingerprint(folder: Path) -> dict[str, str]:
    """Every file under `folder` and its bytes' hash (SQLite's -wal and -shm aside: a reader
    of a WAL database may make them, empty)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.name.endswith(("-wal", "-shm"))}


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("LOCALDET_HOME", str(home))
    return home


READERS = [["localdet", "status"], ["localdet", "status", "1"], ["localdet", "checkpoints", "1"],
           ["localdet", "metrics", "1"], ["localdet", "describe", "1"],
           ["localdet", "compare", "1", "2"]]
DET_READERS = [["det", "e", "list"], ["det", "e", "describe", "1"], ["det", "t", "describe", "1"],
               ["det", "checkpoint", "list", "1"], ["det", "model", "list"]]


def test_readers_leave_the_records_as_they_were(home, monkeypatch, capsys):
    path = make_records(home)
    with sqlite3.connect(path) as conn:  # as an older localdet left it: not in WAL yet
        conn.execute("PRAGMA journal_mode = DELETE")
    conn.close()
    before = fingerprint(home)
    for argv in READERS:
        status, out, err = run(localdet_cli.main, argv, monkeypatch, capsys)
        assert status == 0, (argv, err)
    for argv in DET_READERS:
        status, out, err = run(det_cli.main, argv, monkeypatch, capsys)
        assert status == 0, (argv, err)
    from determined.experimental import client

    assert client.get_experiment(1).name == "kept"
    assert [e.id for e in client.list_experiments()] == [1, 2]
    answers = dashboard(Layout(home), "/api/experiments", "/api/experiments/1", "/api/trials/1")
    assert [status for status, _ in answers] == [200, 200, 200]
    assert fingerprint(home) == before  # nothing written, no backup, no new file
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    conn.close()


def test_nothing_recorded_reads_as_no_experiments_and_creates_nothing(home, monkeypatch,
                                                                      capsys):
    status, out, err = run(localdet_cli.main, ["localdet", "status"], monkeypatch, capsys)
    assert status == 0 and "no experiments yet" in out and "`localdet daemon start`" in out
    status, out, err = run(det_cli.main, ["det", "e", "list"], monkeypatch, capsys)
    assert status == 0
    status, out, err = run(localdet_cli.main, ["localdet", "metrics", "3"], monkeypatch, capsys)
    assert status == 1 and "no experiment 3" in one_sentence(err)
    from determined.experimental import client

    assert client.list_experiments() == []
    assert dashboard(Layout(home), "/api/experiments") == [(200, [])]
    assert not home.exists()
    home.mkdir()
    (home / "localdet.db").touch()  # an empty file: read as nothing recorded, left empty
    status, out, err = run(localdet_cli.main, ["localdet", "status"], monkeypatch, capsys)
    assert status == 0 and "no experiments yet" in out
    assert (home / "localdet.db").stat().st_size == 0 and sorted(home.iterdir()) == [
        home / "localdet.db"]


def test_older_records_are_read_and_never_migrated_but_by_the_daemon_or_migrate(
        home, monkeypatch, capsys):
    home.mkdir()
    path = older_database(home / "localdet.db")
    names = db_module._migration_names()
    before = fingerprint(home)
    status, out, err = run(localdet_cli.main, ["localdet", "status"], monkeypatch, capsys)
    assert status == 0, err
    assert fingerprint(home) == before
    with pytest.raises(SchemaBehind, match=f"schema version {len(names) - 1}, from an older "
                                           f"localdet.*uses version {len(names)}"):
        StateDB.open(path)  # a writer other than the daemon
    assert fingerprint(home) == before
    status, out, err = run(localdet_cli.main, ["localdet", "migrate"], monkeypatch, capsys)
    assert status == 0 and f"from schema version {len(names) - 1} to {len(names)}" in out
    assert [p.name for p in (home / "backups").iterdir()][0].endswith("-before-migration.db")
    with sqlite3.connect(path) as conn:
        assert [n for (n,) in conn.execute("SELECT name FROM _sqlite_migrations "
                                           "ORDER BY name")] == names
    conn.close()


def test_a_query_of_what_older_records_lack_is_one_sentence(home, monkeypatch, capsys):
    home.mkdir()
    older = sqlite3.connect(home / "localdet.db")
    import sqlite_utils

    db_module.migrations().apply(sqlite_utils.Database(older),
                                 stop_before="0006_catalog_and_registry")
    older.close()
    status, out, err = run(det_cli.main, ["det", "model", "list"], monkeypatch, capsys)
    assert status == 1
    line = one_sentence(err)
    assert "from an older localdet" in line and "`localdet migrate`" in line


def newer_records(home: Path) -> Path:
    path = make_records(home)
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO _sqlite_migrations (migration_set, name, applied_at) "
                     "VALUES ('localdet', '0999_from_the_future', 'then')")
    conn.close()
    return path


def test_newer_records_are_refused_by_every_command_naming_both_versions(home, monkeypatch,
                                                                         capsys):
    path = newer_records(home)
    known = len(db_module._migration_names())
    expected = f"schema version 999 .*knows schema version {known} at most"
    for main, argv in [(localdet_cli.main, ["localdet", "status"]),
                       (localdet_cli.main, ["localdet", "pause", "1"]),
                       (localdet_cli.main, ["localdet", "migrate"]),
                       (det_cli.main, ["det", "e", "list"])]:
        status, out, err = run(main, argv, monkeypatch, capsys)
        assert status == 1
        assert re.search(expected, one_sentence(err))
    from determined.experimental import client

    assert "knows schema version" in sdk_error(lambda: client.get_experiment(1))
    [(status, body)] = dashboard(Layout(home), "/api/experiments/1")
    assert status == 503 and "knows schema version" in body["error"]
    for migrate in (False, True):  # a writer, and the daemon's open
        with pytest.raises(SchemaTooNew):
            StateDB.open(path, migrate=migrate)


def test_the_daemon_refuses_newer_records_in_one_sentence(home):
    newer_records(home)
    done = subprocess.run([str(Path(sys.executable).parent / "localdet"), "daemon"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "knows schema version" in one_sentence(done.stderr)


def failure_sentences(home: Path, monkeypatch, capsys) -> list[str]:
    """What localdet, det, the SDK and the dashboard say of the records as they are."""
    from determined.experimental import client

    said = []
    for main, argv in [(localdet_cli.main, ["localdet", "status"]),
                       (localdet_cli.main, ["localdet", "pause", "1"]),
                       (det_cli.main, ["det", "e", "list"])]:
        status, out, err = run(main, argv, monkeypatch, capsys)
        assert status == 1
        said.append(one_sentence(err))
    said.append(sdk_error(lambda: client.get_experiment(1)))
    [(status, body)] = dashboard(Layout(home), "/api/experiments/1")
    assert status == 503
    said.append(body["error"])
    return said


def test_a_damaged_file_is_one_sentence_everywhere(home, monkeypatch, capsys):
    home.mkdir()
    (home / "localdet.db").write_bytes(b"not a database at all" * 300)
    for sentence in failure_sentences(home, monkeypatch, capsys):
        assert "are damaged" in sentence and "localdet doctor --restore" in sentence


def test_a_directory_where_the_file_should_be_is_one_sentence_everywhere(home, monkeypatch,
                                                                          capsys):
    (home / "localdet.db").mkdir(parents=True)
    for sentence in failure_sentences(home, monkeypatch, capsys):
        assert "localdet.db is a directory" in sentence


def test_a_state_folder_that_cannot_be_made_is_one_sentence(tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("LOCALDET_HOME", str(tmp_path / "file" / "home"))
    status, out, err = run(localdet_cli.main, ["localdet", "status"], monkeypatch, capsys)
    assert status == 1 and "Not a directory" in one_sentence(err)
    from determined.experimental import client

    assert "Not a directory" in sdk_error(lambda: client.get_experiment(1))
    with pytest.raises(opening.RecordsUnavailable, match="cannot make the state folder"):
        StateDB.open(tmp_path / "file" / "home" / "localdet.db")


def test_a_lock_held_past_the_timeout_is_one_sentence_everywhere(home, monkeypatch, capsys):
    path = make_records(home)
    monkeypatch.setattr(opening, "BUSY_TIMEOUT_S", 0.2)
    monkeypatch.setattr(db_module, "BUSY_TIMEOUT_S", 0.2)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA journal_mode = DELETE")  # (in WAL, readers pass a writer)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        for sentence in failure_sentences(home, monkeypatch, capsys):
            assert "stayed locked by another process for 0.2 seconds" in sentence
    finally:
        holder.execute("ROLLBACK")
        holder.close()


@pytest.fixture
def read_only_home(tmp_path, monkeypatch):
    """Records in a folder on a tmpfs then mounted read-only (root may mount here; else
    skipped)."""
    mount = tmp_path / "mount"
    mount.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(mount)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()})")
    try:
        make_records(mount / "home")
        with sqlite3.connect(mount / "home" / "localdet.db") as conn:
            conn.execute("PRAGMA journal_mode = DELETE")  # a WAL reader would need its -shm
        conn.close()
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        monkeypatch.setenv("LOCALDET_HOME", str(mount / "home"))
        yield mount / "home"
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_a_read_only_folder_is_read_and_a_write_is_one_sentence(read_only_home, monkeypatch,
                                                                 capsys):
    status, out, err = run(localdet_cli.main, ["localdet", "status"], monkeypatch, capsys)
    assert status == 0 and "kept" in out  # a reader needs nothing written
    status, out, err = run(det_cli.main, ["det", "e", "describe", "1"], monkeypatch, capsys)
    assert status == 0, err
    status, out, err = run(localdet_cli.main, ["localdet", "pause", "1"], monkeypatch, capsys)
    assert status == 1
    line = one_sentence(err)
    assert "read-only" in line or "cannot open" in line
    from determined.experimental import client

    assert client.get_experiment(1).name == "kept"
    sentence = sdk_error(lambda: client.get_experiment(1).pause())
    assert "read-only" in sentence or "cannot open" in sentence
