"""`localdet status EXP` of a large search (issue 34, item 5): past views.SHORT_TABLE trials it
shows the best, the running and the latest few with a line counting the rest, `--all` every
row (`--json`: every trial's facts, as before); the validation summary SQLite computes equals
the one Python computes from every row. In process, on a search recorded as
scripts/bench/records.py records its 1,000 trials (`fill_experiment`), at 40 trials."""

from __future__ import annotations

import json
import math
import re

import pytest
from click.testing import CliRunner
from conftest import records_bench

from localdet.operations import facts as facts_module
from localdet.records.db import StateDB
from localdet.ui import views
from localdet.ui.cli import cli

TRIALS = 40


@pytest.fixture(scope="module")
def search(tmp_path_factory):
    from localdet.paths import Layout

    layout = Layout(tmp_path_factory.mktemp("status") / "home").ensure()
    with StateDB.open(layout.db) as db:
        experiment_id = records_bench().fill_experiment(db, TRIALS, 20, 4)
        with db.atomic():  # one completed trial failed instead (a state no search ends in)
            db.db.execute("UPDATE trials SET state = 'ERROR', error = 'it broke' WHERE id = ?",
                          [db.trials(experiment_id)[3].id])
    return layout, experiment_id


def _status(layout, *args: str) -> str:
    done = CliRunner().invoke(cli, ["status", *args], env={"LOCALDET_HOME": str(layout.home),
                                                           "COLUMNS": "200"})
    assert done.exit_code == 0, done.output
    return done.output


def _rows(text: str) -> list[int]:
    """The trial ids of the table's rows (a row's first cell)."""
    return [int(m.group(1)) for m in re.finditer(r"^│ (\d+) +│", text, re.MULTILINE)]


def test_a_large_search_shows_the_best_the_running_and_the_latest_and_counts_the_rest(search):
    layout, experiment_id = search
    with StateDB.open_readonly(layout.db) as db:
        facts = views.experiment_facts(db, db.experiment(experiment_id))
    trials = facts["trials"]
    running = [t["id"] for t in trials if t["state"] == "RUNNING"]
    assert len(running) == 4 and facts["best_trial"] not in running
    others = [t["id"] for t in trials if t["id"] not in running and t["id"] != facts["best_trial"]]
    expected = sorted({facts["best_trial"], *running, *others[-views.LATEST_TRIALS:]})

    text = _status(layout, str(experiment_id))
    assert _rows(text) == expected
    rest = TRIALS - len(expected)
    states = {t["state"] for t in trials if t["id"] not in expected}
    assert states == {"COMPLETED", "ERROR"}
    errors = sum(t["state"] == "ERROR" for t in trials if t["id"] not in expected)
    assert (f"{rest} more trials ({rest - errors} completed, {errors} error): "
            f"`localdet status {experiment_id} --all` lists every one") in text
    assert f"Best      trial {facts['best_trial']}:" in text
    assert "it broke" not in text  # a hidden trial's error: --all shows it

    every = _status(layout, str(experiment_id), "--all")
    assert _rows(every) == [t["id"] for t in trials]
    assert "more trial" not in every and "it broke" in every
    # (`--json` prints every trial's facts, untouched: tests/test_cli.py, test_importance.py;
    # here it would cost an importance computation.)


def test_a_small_search_lists_every_trial(search):
    layout, experiment_id = search
    with StateDB.open_readonly(layout.db) as db:
        facts = views.experiment_facts(db, db.experiment(experiment_id))
    few = {**facts, "trials": facts["trials"][:views.SHORT_TABLE]}
    assert views.shown_trials(few) == few["trials"]
    assert views.rest_line(few, few["trials"]) is None


# -- the validation summary ---------------------------------------------------------------

def _python_summary(db: StateDB, experiment) -> dict[int, dict]:
    """What the summary stands for, computed from every validation row in Python."""
    metric, smaller = experiment.metric, experiment.smaller_is_better
    found = {}
    for trial in db.trials(experiment.id):
        rows = db.metrics(trial.id, "validation")
        if not rows:
            continue
        scored = [(row.metrics[metric], row.batches_trained, row.metrics) for row in rows
                  if isinstance(row.metrics.get(metric), (int, float))
                  and not isinstance(row.metrics.get(metric), bool)
                  and math.isfinite(row.metrics[metric])]
        best = min(scored, key=lambda s: (s[0] if smaller else -s[0], s[1]))[2] \
            if scored else None
        found[trial.id] = {"latest": rows[-1].metrics, "best": best, "counted": len(scored)}
    return found


# Each trial's validations, batches -> the row's metrics: NaN, infinities, the metric missing,
# a string, a boolean, ties (the earliest wins), rows out of batch order, none at all.
TRIALS_ROWS = [
    {10: {"val_loss": 0.5}, 20: {"val_loss": 0.3}, 30: {"val_loss": 0.4}},
    {10: {"val_loss": math.nan}, 20: {"val_loss": 0.9}, 30: {"val_loss": math.nan}},
    {10: {"val_loss": math.inf}, 20: {"val_loss": -math.inf}, 30: {"val_acc": 0.2}},
    {10: {"val_acc": 0.1}, 20: {"val_loss": "low"}, 30: {"val_loss": True}},
    {30: {"val_loss": 0.2, "val_acc": math.nan}, 10: {"val_loss": 0.2}, 20: {"val_loss": 0.7}},
    {10: {"val_loss": 2}, 20: {"val_loss": 1.0}, 40: {"val_loss": 1}, 30: {"val_loss": 7}},
    {},
    {10: {"val_loss": -0.0}, 20: {"NaN_count": 1, "val_loss": 0.01}},
]


@pytest.mark.parametrize("smaller_is_better", [True, False])
def test_the_summary_sqlite_computes_is_the_one_python_computes(db, smaller_is_better):
    experiment_id = db.create_experiment(
        name="summary", description="", config={"searcher": {"name": "random"}},
        original_config="", searcher="random", metric="val_loss",
        smaller_is_better=smaller_is_better, experiment_seed=1, model_dir="/nowhere")
    for request_id, rows in enumerate(TRIALS_ROWS, 1):
        trial_id = db.create_trial(experiment_id=experiment_id, request_id=request_id,
                                   hparams={}, seed=1, target_batches=50)
        for batches, metrics in rows.items():
            db.record_metrics(trial_id, "validation", batches, metrics)
            db.record_metrics(trial_id, "training", batches, {"loss": 1.0})
    experiment = db.experiment(experiment_id)
    expected = _python_summary(db, experiment)
    found = facts_module.validation_summary(db, experiment)
    assert json.dumps(found, sort_keys=True) == json.dumps(expected, sort_keys=True)
    assert len(found) == len(TRIALS_ROWS) - 1  # the trial with none has no entry
    first = min(found)
    assert found[first + 1]["best"] == {"val_loss": 0.9} and found[first + 1]["counted"] == 1
    assert found[first + 2]["best"] is None and found[first + 3]["best"] is None


def test_a_validation_recorded_while_the_summary_reads_waits_for_the_next_summary(
        db, layout):
    """The daemon records a trial's first validation between the summary's reads (as it
    did under the SDK's test, a KeyError): the summary is of the state its first read saw."""
    experiment_id = db.create_experiment(
        name="race", description="", config={"searcher": {"name": "random"}},
        original_config="", searcher="random", metric="val_loss", smaller_is_better=True,
        experiment_seed=1, model_dir="/nowhere")
    first, second = (db.create_trial(experiment_id=experiment_id, request_id=n, hparams={},
                                     seed=1, target_batches=50) for n in (1, 2))
    db.record_metrics(first, "validation", 10, {"val_loss": 0.5})
    reader = StateDB.open_readonly(layout.db)
    reads = []
    execute = reader.db.execute

    def execute_then_the_daemon_records(*args, **kwargs):
        cursor = execute(*args, **kwargs)
        if str(args[0]).startswith("SELECT"):
            reads.append(args[0])
            if len(reads) == 1:
                db.record_metrics(second, "validation", 10, {"val_loss": 0.25})
        return cursor

    reader.db.execute = execute_then_the_daemon_records  # type: ignore[method-assign]
    try:
        experiment = reader.experiment(experiment_id)
        found = facts_module._validation_summary(reader, experiment)
        assert len(reads) == 3
        assert found == {first: {"latest": {"val_loss": 0.5}, "best": {"val_loss": 0.5},
                                 "counted": 1}}
        assert second in facts_module._validation_summary(reader, experiment)  # the next
    finally:
        reader.close()


def test_a_kept_summary_is_used_only_while_it_is_the_one_sqlite_would_compute(
        db, tmp_path, monkeypatch):
    from localdet.operations import kept_summaries

    monkeypatch.setenv("LOCALDET_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(kept_summaries, "KEEP_FROM", 1)
    experiment_id = db.create_experiment(
        name="kept", description="", config={"searcher": {"name": "random"}},
        original_config="", searcher="random", metric="val_loss", smaller_is_better=True,
        experiment_seed=1, model_dir="/nowhere")
    trial_ids = [db.create_trial(experiment_id=experiment_id, request_id=n, hparams={},
                                 seed=1, target_batches=50) for n in (1, 2)]
    for batches in (10, 20):
        db.record_metrics(trial_ids[0], "validation", batches, {"val_loss": 1.0 / batches})
    db.record_metrics(trial_ids[1], "validation", 10, {"val_acc": 0.5})
    experiment = db.experiment(experiment_id)
    computed = []

    def compute(db, experiment):
        computed.append(1)
        return facts_module._validation_summary(db, experiment)

    def check():
        found = kept_summaries.summary(db, experiment, compute)
        assert found == facts_module._validation_summary(db, experiment)
        return found

    check()
    check()
    assert len(computed) == 1  # the second from the kept file
    [kept] = (tmp_path / "cache" / "summaries").glob("*/*.json")
    # A metric merged into a recorded row (it lengthens it), a new row, a damaged file:
    # computed again each time.
    db.record_metrics(trial_ids[1], "validation", 10, {"val_loss": 0.01})
    assert check()[trial_ids[1]]["best"] == {"val_loss": 0.01, "val_acc": 0.5}
    db.record_metrics(trial_ids[0], "validation", 30, {"val_loss": 0.001})
    assert check()[trial_ids[0]]["latest"] == {"val_loss": 0.001}
    kept.write_text("{not json")
    check()
    assert len(computed) == 4
    monkeypatch.setattr(kept_summaries, "KEEP_FROM", 10)  # too few to keep: no file read
    kept.write_text("{not json")
    check()
    assert len(computed) == 5 and kept.read_text() == "{not json"
