"""The dashboard keeps an ended trial's curve points between requests (localdet/ui/web/
curve_cache.py): what it serves from them is what it reads afresh, a new row or a trial that
ends or continues is seen at the next request, a running trial is read each time (a metric
merged into a row it recorded shows), and another records file is kept apart. In process on
a real SQLite file, filled as scripts/bench/records.py fills its search."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import records_bench

from localdet.paths import Layout
from localdet.records.db import StateDB
from localdet.ui.web import curve_cache, figures


def _fill(home: Path, trials: int, seed: int = 0) -> int:
    with StateDB.open(Layout(home).ensure().db) as db:
        return records_bench().fill_experiment(db, trials, 30, 3, running=2, seed=seed)


@pytest.fixture
def search(tmp_path):
    curve_cache.forget()
    home = tmp_path / "home"
    experiment_id = _fill(home, 6)
    db = StateDB.open(Layout(home).db)
    yield db, [t.id for t in db.trials(experiment_id)]
    db.close()
    curve_cache.forget()


def _afresh(db: StateDB, trial_ids: list[int]) -> dict:
    curve_cache.forget()
    try:
        return curve_cache.read(db, trial_ids)
    finally:
        curve_cache.forget()


def test_kept_points_are_the_points_read_afresh_and_changes_are_seen(search):
    db, ids = search
    ended, running = ids[0], ids[-1]
    first = curve_cache.read(db, ids)
    assert set(first[ended]) == {"training loss", "training accuracy", "val_loss",
                                 "val_accuracy"}
    assert len(first[ended]["training loss"][0]) == 30
    again = curve_cache.read(db, ids)
    assert again[ended] is first[ended]  # kept: an ended trial
    assert again[running] is not first[running] and again[running] == first[running]
    assert again == _afresh(db, ids)

    # A running trial's row gains a metric (context.evaluate beside a validation).
    batches = first[running]["val_loss"][0][-1]
    db.record_metrics(running, "validation", batches, {"test_loss": 0.5})
    assert curve_cache.read(db, ids)[running]["test_loss"] == ([batches], [0.5])

    # An ended trial continued: its new rows are seen; NaN is left out of a series.
    db.record_metrics(ended, "training", 10_000_000, {"loss": 0.25, "accuracy": float("nan")})
    seen = curve_cache.read(db, ids)[ended]
    assert seen["training loss"][0][-1] == 10_000_000
    assert seen["training accuracy"][0][-1] != 10_000_000
    assert curve_cache.read(db, ids) == _afresh(db, ids)

    # The page's figure is the same from kept points as from points read afresh.
    kept = figures.curves(db, ids, ended)
    assert json.dumps(kept) == json.dumps((curve_cache.forget(), figures.curves(db, ids, ended))[1])


def test_another_records_file_is_kept_apart(search, tmp_path):
    db, ids = search
    curve_cache.read(db, ids)
    other_home = tmp_path / "other"
    other_id = _fill(other_home, 6, seed=1)
    with StateDB.open(Layout(other_home).db) as other:
        other_ids = [t.id for t in other.trials(other_id)]
        assert other_ids == ids  # the same trial ids, other points
        found = curve_cache.read(other, other_ids)
        assert found == _afresh(other, other_ids) and found != curve_cache.read(db, ids)
    assert len(curve_cache._kept) <= curve_cache.KEEP
