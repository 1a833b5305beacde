"""The read-only commands start fast (issue 23, item 6; `scripts/bench/cli.py` times them):
what they import leaves out TensorFlow, pandas, numpy and jsonschema, and the open that
skips the migrations when every one is applied still applies one that is missing."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

import pytest
from conftest import older_database

from localdet.records import db as db_module
from localdet.records.db import StateDB

HEAVY = ("tensorflow", "keras", "pandas", "numpy", "jsonschema")


def _imported(statement: str) -> set[str]:
    """The top-level packages a fresh interpreter holds after `statement`."""
    code = f"{statement}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    return {name.split(".")[0] for name in json.loads(done.stdout.splitlines()[-1])}


@pytest.mark.parametrize("module", ["localdet.ui.cli", "localdet.ui.det"])
def test_the_commands_import_nothing_heavy(module):
    try:
        __import__(module)
    except ImportError:
        pytest.skip(f"{module} is not in this checkout")
    assert not _imported(f"import {module}") & set(HEAVY)


def _experiment(home) -> None:
    """One completed random search with a validated trial, in the state folder `home`."""
    from localdet.config.experiment import parse_config

    config = parse_config({
        "entrypoint": "model_def:Trial", "hyperparameters": {"global_batch_size": 8},
        "searcher": {"name": "random", "metric": "val_loss", "max_trials": 1,
                     "max_length": {"batches": 10}}}).config
    with StateDB.open(home / "localdet.db") as db:
        experiment_id = db.create_experiment(
            name="tiny", description="", config=config, original_config="",
            searcher="random", metric="val_loss", smaller_is_better=True, experiment_seed=1,
            model_dir="/nowhere")
        trial_id = db.create_trial(experiment_id=experiment_id, request_id=1, hparams={},
                                   seed=1, target_batches=10)
        db.record_metrics(trial_id, "validation", 10, {"val_loss": 0.5})
        db.update_trial(trial_id, state="COMPLETED")
        db.set_experiment_state(experiment_id, "COMPLETED")


@pytest.mark.parametrize("command", [["localdet", "status"], ["localdet", "status", "1"],
                                     ["det", "e", "list"]], ids=" ".join)
def test_reading_a_completed_search_imports_nothing_heavy(tmp_path, command):
    main = "localdet.ui.cli" if command[0] == "localdet" else "localdet.ui.det"
    try:
        __import__(main)
    except ImportError:
        pytest.skip(f"{main} is not in this checkout")
    _experiment(tmp_path)
    code = ("import atexit, json, sys\n"
            "atexit.register(lambda: print(json.dumps(sorted(sys.modules)), file=sys.stderr))\n"
            f"sys.argv = {command!r}\n"
            f"from {main} import main\n"
            "main()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "LOCALDET_HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert "tiny" in done.stdout
    imported = {name.split(".")[0] for name in json.loads(done.stderr.splitlines()[-1])}
    assert not imported & set(HEAVY)


def test_a_process_that_imported_numpy_first_keeps_it_for_sqlite_utils():
    """sqlite_utils is kept from importing numpy only when nothing imported it before: a
    trial's process (TensorFlow first) keeps its column types for numpy's scalars."""
    code = ("import numpy\n"
            "import localdet.records.db\n"
            "import sqlite_utils.db as d\n"
            "print(d.COLUMN_TYPE_MAPPING.get(numpy.float32))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip() == "REAL"


def _schema(path) -> list[tuple]:
    with sqlite3.connect(path) as conn:
        return sorted(conn.execute("SELECT type, name, sql FROM sqlite_master "
                                   "WHERE name != '_sqlite_migrations'").fetchall())


def test_an_open_applies_the_newest_migration_a_database_lacks(tmp_path):
    names = db_module._migration_names()
    older = older_database(tmp_path / "older.db")
    StateDB.open(older, migrate=True).close()
    fresh = tmp_path / "fresh.db"
    StateDB.open(fresh).close()
    assert _schema(older) == _schema(fresh)
    with sqlite3.connect(older) as conn:
        applied = [row[0] for row in conn.execute(
            "SELECT name FROM _sqlite_migrations WHERE migration_set = 'localdet'")]
    assert applied == names


def test_an_open_of_an_up_to_date_database_leaves_the_migrations_unloaded(tmp_path,
                                                                           monkeypatch):
    StateDB.open(tmp_path / "state.db").close()

    def not_again():
        raise AssertionError("the migrations were loaded for a database that has them all")

    monkeypatch.setattr(db_module, "migrations", not_again)
    with StateDB.open(tmp_path / "state.db") as db:
        assert db.experiments() == []
