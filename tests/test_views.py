"""Tests of localdet.ui.views: the facts behind `localdet status/checkpoints`, and their tables."""

from __future__ import annotations

import json
import math
import uuid as uuidlib

import pytest
from rich.console import Console

from localdet.checkpoints.manifest import build_manifest
from localdet.checkpoints.store import FileEntry
from localdet.config.experiment import parse_config
from localdet.paths import Layout
from localdet.records.db import StateDB
from localdet.ui import views

EXPERIMENT_KEYS = {"id", "name", "state", "searcher", "trials"}
TRIAL_KEYS = {"id", "state", "hparams", "batches_trained", "restarts", "latest_validation",
              "best_validation", "latest_checkpoint"}
CHECKPOINT_KEYS = {"uuid", "trial_id", "batches_trained", "size_bytes", "metadata"}


def make_experiment(db: StateDB, name: str = "tiny", smaller_is_better: bool = True) -> int:
    config = parse_config({
        "name": name,
        "entrypoint": "model_def:Trial",
        "hyperparameters": {"global_batch_size": 8, "lr": 0.001,
                            "block": {"depth": 2, "act": "relu"}},
        "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 100},
                     "smaller_is_better": smaller_is_better},
    }).config
    return db.create_experiment(
        name=name, description="", config=config, original_config="", searcher="single",
        metric="val_loss", smaller_is_better=smaller_is_better, experiment_seed=1,
        model_dir="/nowhere")


def make_trial(db: StateDB, experiment_id: int, request_id: int, target: int = 100,
               validations: dict[int, float] | None = None, trained: int | None = None) -> int:
    trial_id = db.create_trial(experiment_id=experiment_id, request_id=request_id,
                               hparams={"global_batch_size": 8, "lr": 0.001,
                                        "block": {"depth": 2, "act": "relu"}},
                               seed=5, target_batches=target)
    for batches, loss in (validations or {}).items():
        db.record_metrics(trial_id, "training", batches, {"loss": loss + 0.1})
        db.record_metrics(trial_id, "validation", batches, {"val_loss": loss, "val_acc": 1 - loss})
    if trained is not None:
        db.record_metrics(trial_id, "training", trained, {"loss": 0.0})
    return trial_id


def add_checkpoint(db: StateDB, experiment_id: int, trial_id: int, batches: int,
                   metadata: dict | None = None) -> str:
    manifest = build_manifest(uuid=str(uuidlib.uuid4()), experiment_id=experiment_id,
                              trial_id=trial_id, batches_trained=batches,
                              files={"determined-keras-model.h5": FileEntry("c" * 64, 1_500_000),
                                     "code/model_def.py": FileEntry("d" * 64, 20_000)},
                              metadata=metadata or {})
    db.add_checkpoint(manifest)
    return manifest["uuid"]


def render(table) -> str:
    console = Console(record=True, width=200)
    console.print(table)
    return console.export_text()


# -- facts ----------------------------------------------------------------------------------

def test_facts_have_the_documented_keys_and_are_json(db):
    experiment_id = make_experiment(db)
    trial_id = make_trial(db, experiment_id, 1, validations={50: 0.5})
    uuid = add_checkpoint(db, experiment_id, trial_id, 50, metadata={"note": "first"})
    experiment = db.experiment(experiment_id)

    facts = views.experiment_facts(db, experiment)
    assert EXPERIMENT_KEYS <= set(facts)
    assert (facts["id"], facts["name"], facts["state"], facts["searcher"]) == (
        experiment_id, "tiny", "ACTIVE", "single")
    [trial] = facts["trials"]
    assert TRIAL_KEYS <= set(trial)
    assert trial == views.trial_facts(db, db.trial(trial_id), experiment)
    assert (trial["id"], trial["state"], trial["batches_trained"], trial["restarts"]) == (
        trial_id, "QUEUED", 50, 0)
    assert trial["hparams"] == {"global_batch_size": 8, "lr": 0.001,
                                "block": {"depth": 2, "act": "relu"}}
    assert trial["latest_checkpoint"] == uuid

    checkpoint = views.checkpoint_facts(db.checkpoint(uuid))
    assert CHECKPOINT_KEYS <= set(checkpoint)
    assert (checkpoint["uuid"], checkpoint["trial_id"], checkpoint["batches_trained"]) == (
        uuid, trial_id, 50)
    assert checkpoint["size_bytes"] == 1_520_000
    assert checkpoint["metadata"] == {"note": "first"}
    assert "manifest" not in checkpoint  # the file list is not for the status output

    json.dumps(facts), json.dumps(checkpoint)  # the --json output


def test_latest_and_best_validation_with_smaller_is_better(db):
    experiment_id = make_experiment(db, smaller_is_better=True)
    trial_id = make_trial(db, experiment_id, 1, validations={50: 0.2, 100: 0.6, 25: 0.4})
    trial = views.trial_facts(db, db.trial(trial_id), db.experiment(experiment_id))
    assert trial["latest_validation"]["val_loss"] == 0.6  # by batches, not by insertion
    assert trial["best_validation"]["val_loss"] == 0.2
    assert trial["best_validation"] == {"val_loss": 0.2, "val_acc": pytest.approx(0.8)}


def test_best_validation_with_larger_is_better(db):
    experiment_id = make_experiment(db, smaller_is_better=False)
    trial_id = make_trial(db, experiment_id, 1, validations={50: 0.2, 100: 0.6, 150: 0.4})
    trial = views.trial_facts(db, db.trial(trial_id), db.experiment(experiment_id))
    assert trial["best_validation"]["val_loss"] == 0.6
    assert trial["latest_validation"]["val_loss"] == 0.4


def test_best_metric_across_trials_and_progress(db):
    experiment_id = make_experiment(db)
    make_trial(db, experiment_id, 1, target=100, validations={50: 0.5, 100: 0.3})
    make_trial(db, experiment_id, 2, target=100, validations={40: 0.2, 80: 0.6})
    facts = views.experiment_facts(db, db.experiment(experiment_id))
    assert facts["best_metric"] == 0.2
    assert facts["progress"] == pytest.approx((100 + 80) / 200)
    assert [t["best_validation"]["val_loss"] for t in facts["trials"]] == [0.3, 0.2]


def test_best_metric_across_trials_larger_is_better(db):
    experiment_id = make_experiment(db, smaller_is_better=False)
    make_trial(db, experiment_id, 1, validations={50: 0.5, 100: 0.3})
    make_trial(db, experiment_id, 2, validations={40: 0.2, 80: 0.6})
    assert views.experiment_facts(db, db.experiment(experiment_id))["best_metric"] == 0.6


def test_progress_counts_no_trial_past_its_target(db):
    experiment_id = make_experiment(db)
    make_trial(db, experiment_id, 1, target=100, trained=250)  # overshoot counts as 100
    make_trial(db, experiment_id, 2, target=300, trained=30)
    facts = views.experiment_facts(db, db.experiment(experiment_id))
    assert facts["progress"] == pytest.approx((100 + 30) / 400)
    assert facts["best_metric"] is None


def test_an_experiment_without_trials(db):
    experiment_id = make_experiment(db)
    facts = views.experiment_facts(db, db.experiment(experiment_id))
    assert (facts["trials"], facts["progress"], facts["best_metric"]) == ([], 0.0, None)


def test_validations_without_the_searcher_metric_have_no_best(db):
    experiment_id = make_experiment(db)
    trial_id = make_trial(db, experiment_id, 1)
    db.record_metrics(trial_id, "validation", 10, {"val_accuracy": 0.9})
    trial = views.trial_facts(db, db.trial(trial_id), db.experiment(experiment_id))
    assert trial["latest_validation"] == {"val_accuracy": 0.9}
    assert trial["best_validation"] is None


def test_config_warnings_appear_in_the_facts(db):
    experiment_id = make_experiment(db)
    db.log_event("config_warning", experiment_id=experiment_id, message="ignoring 'x'")
    other = make_experiment(db, "other")
    db.log_event("config_warning", experiment_id=other, message="ignoring 'y'")
    assert views.experiment_facts(db, db.experiment(experiment_id))["warnings"] == ["ignoring 'x'"]


def test_a_nan_validation_is_never_the_best(db):
    experiment_id = make_experiment(db)
    trial_id = make_trial(db, experiment_id, 1, validations={10: float("nan"), 20: 0.4})
    trial = views.trial_facts(db, db.trial(trial_id), db.experiment(experiment_id))
    assert trial["best_validation"]["val_loss"] == 0.4
    assert not math.isnan(views.experiment_facts(db, db.experiment(experiment_id))["best_metric"])


# -- best checkpoint ------------------------------------------------------------------------

@pytest.mark.parametrize("smaller_is_better, expected_batches", [(True, 100), (False, 50)])
def test_best_checkpoint_is_where_the_metric_was_best(db, smaller_is_better, expected_batches):
    experiment_id = make_experiment(db, smaller_is_better=smaller_is_better)
    first = make_trial(db, experiment_id, 1, validations={50: 0.9, 100: 0.1})
    second = make_trial(db, experiment_id, 2, validations={50: 0.5, 75: 0.05})
    by_batches = {(first, 50): add_checkpoint(db, experiment_id, first, 50),
                  (first, 100): add_checkpoint(db, experiment_id, first, 100),
                  (second, 50): add_checkpoint(db, experiment_id, second, 50)}
    # trial 2's 0.05 at 75 batches has no checkpoint, so it cannot be the answer
    best = views.best_checkpoint(db, db.experiment(experiment_id))
    expected = by_batches[(first, expected_batches)]
    assert best is not None and best.uuid == expected


def test_best_checkpoint_without_validations_is_none(db):
    experiment_id = make_experiment(db)
    trial_id = make_trial(db, experiment_id, 1)
    add_checkpoint(db, experiment_id, trial_id, 10)
    assert views.best_checkpoint(db, db.experiment(experiment_id)) is None


# -- tables ---------------------------------------------------------------------------------

def test_experiments_table(db):
    experiment_id = make_experiment(db)
    make_trial(db, experiment_id, 1, target=100, validations={50: 0.25})
    idle = make_experiment(db, "idle")
    db.set_experiment_state(idle, "PAUSED")
    facts = [views.experiment_facts(db, db.experiment(i)) for i in (experiment_id, idle)]
    text = render(views.experiments_table(facts))
    lines = text.splitlines()
    for column in ("ID", "Name", "State", "Searcher", "Trials", "Progress", "Best metric"):
        assert column in text
    [row] = [line for line in lines if "tiny" in line]
    for cell in ("ACTIVE", "single", "50%", "val_loss=0.25"):
        assert cell in row
    [paused] = [line for line in lines if "idle" in line]
    assert "PAUSED" in paused and "0%" in paused and "val_loss=" not in paused
    assert "[" not in text  # the state colours are markup, not text


def test_trials_table(db):
    experiment_id = make_experiment(db)
    trial_id = make_trial(db, experiment_id, 1, target=100, validations={40: 0.05, 80: 0.123456})
    uuid = add_checkpoint(db, experiment_id, trial_id, 80)
    db.update_trial(trial_id, state="RUNNING", restarts=2)
    text = render(views.trials_table(views.experiment_facts(db, db.experiment(experiment_id))))
    assert f"Experiment {experiment_id} (tiny): ACTIVE, searcher single" in text
    assert "Latest val_loss" in text and "Best val_loss" in text
    [row] = [line for line in text.splitlines() if "RUNNING" in line]
    for cell in ("80/100", "lr=0.001", "block.depth=2", "block.act=relu", "0.1235", "0.05"):
        assert cell in row, cell
    assert uuid[:8] in row and uuid not in row  # short uuid
    assert " 2 " in row  # restarts


def test_checkpoints_table(db):
    experiment_id = make_experiment(db)
    trial_id = make_trial(db, experiment_id, 1)
    uuid = add_checkpoint(db, experiment_id, trial_id, 80,
                          metadata={"note": "best so far", "format": "h5", "trial_id": 1})
    facts = [views.checkpoint_facts(c) for c in db.checkpoints(experiment_id)]
    text = render(views.checkpoints_table(facts, experiment_id))
    assert f"Checkpoints of experiment {experiment_id}" in text
    [row] = [line for line in text.splitlines() if uuid in line]
    assert "1.52 MB" in row and " 80 " in row
    assert "note=best so far" in row
    assert "format=" not in row and "trial_id=" not in row  # bookkeeping keys are hidden


def test_user_text_in_tables_is_not_markup(db):
    experiment_id = make_experiment(db, name="mnist [v2]")
    facts = views.experiment_facts(db, db.experiment(experiment_id))
    assert "mnist [v2]" in render(views.experiments_table([facts]))
    assert "mnist [v2]" in render(views.trials_table(facts))


def test_checkpoint_metadata_that_looks_like_markup(db):
    experiment_id = make_experiment(db)
    trial_id = make_trial(db, experiment_id, 1)
    add_checkpoint(db, experiment_id, trial_id, 10, metadata={"saved_from": "[/tmp]"})
    facts = [views.checkpoint_facts(c) for c in db.checkpoints(experiment_id)]
    assert "saved_from=[/tmp]" in render(views.checkpoints_table(facts, experiment_id))


# -- jobs and runners -------------------------------------------------------------------------

def make_job(db: StateDB, name: str = "infer", slots: int = 2) -> int:
    from localdet.config.experiment import parse_job_config
    config = parse_job_config({"name": name, "entrypoint_script": "python3 infer.py",
                               "resources": {"slots": slots}}).config
    job_id = db.create_experiment(name=name, description="", config=config, original_config="",
                                  searcher="none", metric="", smaller_is_better=True,
                                  experiment_seed=1, model_dir="/nowhere", kind="job")
    db.create_trial(experiment_id=job_id, request_id=0, hparams={}, seed=1, target_batches=0)
    return job_id


def test_facts_say_the_kind_and_the_runner(db):
    experiment_id = make_experiment(db)
    facts = views.experiment_facts(db, db.experiment(experiment_id))
    assert (facts["kind"], facts["runner"]) == ("experiment", "daemon")
    job = views.experiment_facts(db, db.experiment(make_job(db)))
    assert (job["kind"], job["runner"]) == ("job", "daemon")


def test_job_facts_have_slots_times_and_the_log(db, tmp_path):
    layout = Layout(tmp_path / "home")
    job_id = make_job(db)
    [trial] = db.trials(job_id)
    facts = views.job_facts(db, layout, db.experiment(job_id), tail_lines=5)
    assert (facts["slots"], facts["started_at"], facts["duration_seconds"]) == (2, None, None)
    assert facts["log"] == str(layout.trial_log(job_id, trial.id)) and facts["log_tail"] == ""
    db.update_trial(trial.id, state="RUNNING", started_at="2025-01-01T00:00:00.000+00:00")
    db.set_experiment_state(job_id, "COMPLETED")
    db.db["experiments"].update(job_id, {"ended_at": "2025-01-01T00:01:05.000+00:00"})
    log = layout.trial_log(job_id, trial.id)
    log.parent.mkdir(parents=True)
    log.write_text("one\ntwo\nthree\n")
    facts = views.job_facts(db, layout, db.experiment(job_id), tail_lines=2)
    assert facts["duration_seconds"] == 65.0 and facts["log_tail"] == "two\nthree"
    json.dumps(facts)


def test_jobs_table_and_job_table(db, tmp_path):
    layout = Layout(tmp_path / "home")
    job_id = make_job(db, "infer [v1]")
    [trial] = db.trials(job_id)
    db.update_trial(trial.id, state="RUNNING", started_at="2025-01-01T00:00:00.000+00:00")
    db.set_experiment_state(job_id, "ERROR", error="boom")
    db.db["experiments"].update(job_id, {"ended_at": "2025-01-01T02:03:00.000+00:00"})
    facts = views.job_facts(db, layout, db.experiment(job_id))
    text = render(views.jobs_table([facts]))
    for cell in ("Jobs", "ID", "Started", "Duration", "infer [v1]", "ERROR", "2h 03m"):
        assert cell in text, cell
    detail = render(views.job_table(facts))
    assert "Slots" in detail and " 2 " in detail
    assert str(layout.trial_log(job_id, trial.id)) in detail


def test_experiments_not_run_by_the_daemon_are_marked(db):
    scripted = make_experiment(db, "laptop")
    db.set_runner(scripted, "script")
    managed = make_experiment(db, "queued")
    facts = [views.experiment_facts(db, db.experiment(i)) for i in (scripted, managed)]
    lines = render(views.experiments_table(facts)).splitlines()
    assert "laptop (script)" in next(line for line in lines if "laptop" in line)
    assert "(" not in next(line for line in lines if "queued" in line)
    assert "(script)" in render(views.trials_table(facts[0]))


@pytest.mark.parametrize(("seconds", "text"), [(None, ""), (5.4, "5s"), (65, "1m 05s"),
                                               (7380, "2h 03m")])
def test_durations(seconds, text):
    assert views.duration(seconds) == text


def test_an_experiment_that_failed_before_training_shows_its_real_progress(db):
    from localdet.search.driver import Search

    experiment_id = make_experiment(db)
    search = Search(db, log=lambda *_: None)
    search.start(db.experiment(experiment_id))
    [trial] = db.trials(experiment_id)
    db.update_trial(trial.id, state="ERROR", error="ImportError: x")
    search.exited_early(db.experiment(experiment_id), db.trial(trial.id))
    # The searcher counts a trial that exited early as done...
    assert views.experiment_facts(db, db.experiment(experiment_id))["progress"] == 1.0
    db.set_experiment_state(experiment_id, "ERROR", error="ImportError: x")
    facts = views.experiment_facts(db, db.experiment(experiment_id))
    assert facts["progress"] == 0.0  # ...but nothing was trained
    assert "100%" not in render(views.experiments_table([facts]))


def test_each_trial_says_which_keras_line_it_ran_under_and_why(db):
    experiment_id = make_experiment(db)
    trial_id = make_trial(db, experiment_id, 1)
    assert views.experiment_facts(db, db.experiment(experiment_id))["trials"][0][
        "keras_line"] is None  # never launched
    for line, reason in (("keras3", "the default"),
                         ("keras2", "model_def.py:3 uses tf_keras, which only Keras 2 has")):
        db.log_event("trial_launched", experiment_id=experiment_id, trial_id=trial_id,
                     slots=[0], engine="single", keras_line=line, keras_line_reason=reason)
    [trial] = views.experiment_facts(db, db.experiment(experiment_id))["trials"]
    assert (trial["keras_line"], trial["keras_line_reason"]) == (
        "keras2", "model_def.py:3 uses tf_keras, which only Keras 2 has")


def test_each_launch_shows_how_long_its_first_batch_took(db):
    experiment_id = make_experiment(db)
    trial_id = make_trial(db, experiment_id, 1)
    other = make_trial(db, experiment_id, 2)
    [never] = [t for t in views.experiment_facts(db, db.experiment(experiment_id))["trials"]
               if t["id"] == trial_id]
    assert (never["launch_seconds"], never["launches"]) == (None, [])
    # Three launches: the first trained (6.8 s to its first batch), the second failed
    # before any batch, the third trained (3.31 s); the other trial's report is its own.
    for seconds in (6.8, None, 3.31):
        db.log_event("trial_launched", experiment_id=experiment_id, trial_id=trial_id,
                     slots=[0], engine="single")
        if seconds is not None:
            db.log_event("trial_first_batch", experiment_id=experiment_id, trial_id=trial_id,
                         seconds=seconds)
    db.log_event("trial_launched", experiment_id=experiment_id, trial_id=other, slots=[1])
    db.log_event("trial_first_batch", experiment_id=experiment_id, trial_id=other, seconds=9.0)
    facts = views.experiment_facts(db, db.experiment(experiment_id))
    trial = next(t for t in facts["trials"] if t["id"] == trial_id)
    assert trial["launch_seconds"] == 3.31
    assert [launch["first_batch_seconds"] for launch in trial["launches"]] == [6.8, None, 3.31]
    assert all(launch["launched_at"] for launch in trial["launches"])
    assert trial == views.trial_facts(db, db.trial(trial_id), db.experiment(experiment_id),
                                      views.launches_by_trial(db.events(experiment_id))[trial_id])
    json.dumps(facts)
    text = render(views.trials_table(facts))
    assert "Start" in text
    [row] = [line for line in text.splitlines() if f" {trial_id} " in line[:8]]
    assert "3.3 s" in row and "6.8 s" not in row  # the latest launch's
    # A script run (laptop mode) counts from its start.
    db.log_event("script_run_started", experiment_id=experiment_id, trial_id=other)
    db.log_event("trial_first_batch", experiment_id=experiment_id, trial_id=other, seconds=1.5)
    facts = views.experiment_facts(db, db.experiment(experiment_id))
    assert [t["launch_seconds"] for t in facts["trials"] if t["id"] == other] == [1.5]


def test_the_summary_shows_labels_notes_and_lineage(db, layout):
    from localdet.operations import experiments as ops
    from localdet.records.catalog import add_label

    parent = make_experiment(db, "parent")
    child = make_experiment(db, "child")
    db.db.execute("UPDATE experiments SET parent_id = ? WHERE id = ?", [parent, child])
    add_label(db, child, "[bold]baseline")
    ops.set_notes(db, child, "tried a smaller net")
    db.log_event("experiment_continued", experiment_id=child, checkpoint="0123456789abcdef",
                 batches=300, target=600)
    text = render(views.search_summary(ops.describe(layout, db, child)))
    assert "Labels       [bold]baseline" in text  # user text, not markup
    assert f"Forked from  experiment {parent}" in text
    assert "from checkpoint 01234567 at 300 batches to 600 batches" in text
    assert "Notes        tried a smaller net" in text
    assert f"Forks     experiment {child}" in render(
        views.search_summary(ops.describe(layout, db, parent)))
    listed = render(views.experiments_table(ops.list_experiments(db)))
    assert f"child (fork of {parent})" in listed
