"""Tests of localdet.daemon.submissions: the queue folder, settling, rejection, submit and recovery.

Real folders and a real SQLite file; the settle time is made small and poll() is called
repeatedly, as the daemon loop does.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import localdet.daemon.submissions as submissions
from localdet.config.experiment import ConfigError
from localdet.daemon.submissions import (
    SUBMITTED_CONFIG,
    Intake,
    SubmissionError,
    find_config,
    submit,
)
from localdet.paths import Layout
from localdet.pids import DaemonLock
from localdet.scheduling.slots import Slot, cpu_only, write_slot_file

SETTLE = 0.05

CONFIG = """\
name: tiny
description: a tiny experiment
entrypoint: model_def:Trial
hyperparameters:
  global_batch_size: 8
  lr:
    type: log
    minval: -3
    maxval: -1
searcher:
  name: single
  metric: val_loss
  max_length:
    batches: 10
"""
MODEL_DEF = "class Trial:\n    pass\n"


@pytest.fixture
def intake(layout, db) -> Intake:
    return Intake(layout, db, settle_seconds=SETTLE)


def make_folder(parent: Path, name: str = "exp", config: str | None = CONFIG,
                config_name: str = "const.yaml") -> Path:
    folder = parent / name
    (folder / "lib").mkdir(parents=True)
    (folder / "model_def.py").write_text(MODEL_DEF)
    (folder / "lib" / "util.py").write_text("X = 1\n")
    if config is not None:
        (folder / config_name).write_text(config)
    return folder


def poll_until_settled(intake: Intake, polls: int = 1) -> list[int]:
    """Poll, wait past the settle time, poll again (a few times): what the daemon loop does."""
    created = intake.poll()
    for _ in range(polls):
        time.sleep(SETTLE * 1.5)
        created += intake.poll()
    return created


def queue_entries(layout: Layout) -> list[str]:
    return sorted(p.name for p in layout.queue.iterdir()
                  if p not in (layout.rejected, layout.job_queue))


# -- settling -------------------------------------------------------------------------------

def test_a_folder_is_ingested_only_after_it_has_settled(layout, db):
    intake = Intake(layout, db, settle_seconds=0.3)  # room for two quick polls within it
    make_folder(layout.queue)
    assert intake.poll() == []  # first sight: remember it
    assert intake.poll() == []  # unchanged, but not for settle_seconds yet
    assert db.experiments() == []
    assert queue_entries(layout) == ["exp"]

    time.sleep(0.4)
    created = intake.poll()
    assert len(created) == 1
    assert [e.id for e in db.experiments()] == created
    assert queue_entries(layout) == []
    assert intake.poll() == []  # never ingested twice


def test_a_file_growing_between_polls_delays_ingestion(layout, db, intake):
    folder = make_folder(layout.queue)
    data = folder / "data.csv"
    data.write_text("a,b\n")
    assert intake.poll() == []
    for n in range(3):  # still being copied: each poll sees a change and starts the clock again
        time.sleep(SETTLE * 1.5)
        with data.open("a") as f:
            f.write(f"{n},{n}\n")
        assert intake.poll() == []
        assert db.experiments() == []
    time.sleep(SETTLE * 1.5)
    [experiment_id] = intake.poll()
    copied = layout.model_dir(experiment_id) / "data.csv"
    assert copied.read_text() == "a,b\n0,0\n1,1\n2,2\n"  # whole, not half-written


def test_a_new_file_in_the_folder_delays_ingestion(layout, db, intake):
    folder = make_folder(layout.queue)
    assert intake.poll() == []
    time.sleep(SETTLE * 1.5)
    (folder / "late.py").write_text("Y = 2\n")
    assert intake.poll() == []
    time.sleep(SETTLE * 1.5)
    [experiment_id] = intake.poll()
    assert (layout.model_dir(experiment_id) / "late.py").is_file()


def test_hidden_entries_and_other_files_are_not_candidates(layout, db, intake):
    make_folder(layout.queue, ".in-progress")  # how `submit` copies before its rename
    (layout.queue / "notes.txt").write_text("not a submission\n")
    assert poll_until_settled(intake) == []
    assert db.experiments() == []
    assert sorted(queue_entries(layout)) == [".in-progress", "notes.txt"]


# -- ingestion ------------------------------------------------------------------------------

def test_an_accepted_folder_lands_in_its_model_dir(layout, db, intake):
    make_folder(layout.queue)
    [experiment_id] = poll_until_settled(intake)
    experiment = db.experiment(experiment_id)
    model_dir = layout.model_dir(experiment_id)
    assert experiment.model_dir == str(model_dir)
    assert (experiment.name, experiment.description) == ("tiny", "a tiny experiment")
    assert (experiment.searcher, experiment.metric, experiment.smaller_is_better) == (
        "single", "val_loss", True)
    assert db.db["experiments"].get(experiment_id)["original_config"] == CONFIG
    assert experiment.config["hyperparameters"]["global_batch_size"] == {"type": "const", "val": 8}
    assert (model_dir / "model_def.py").read_text() == MODEL_DEF
    assert (model_dir / "lib" / "util.py").read_text() == "X = 1\n"
    assert (model_dir / "const.yaml").read_text() == CONFIG
    assert queue_entries(layout) == []
    assert not any(intake.incoming.iterdir())  # nothing left staged
    kinds = [e["kind"] for e in db.events(experiment_id)]
    assert "submission_ingested" in kinds


def test_a_bare_yaml_file_becomes_an_experiment(layout, db, intake):
    (layout.queue / "quick.yaml").write_text(CONFIG)
    [experiment_id] = poll_until_settled(intake)
    assert db.experiment(experiment_id).name == "tiny"
    assert (layout.model_dir(experiment_id) / "quick.yaml").read_text() == CONFIG
    assert queue_entries(layout) == []


def test_a_yml_file_is_a_config_too(layout, db, intake):
    (layout.queue / "quick.yml").write_text(CONFIG)
    assert len(poll_until_settled(intake)) == 1


def test_an_experiment_seed_is_chosen_and_recorded_when_the_config_has_none(layout, db, intake):
    (layout.queue / "a.yaml").write_text(CONFIG)
    (layout.queue / "b.yaml").write_text(CONFIG + "reproducibility:\n  experiment_seed: 1234\n")
    created = poll_until_settled(intake)
    assert len(created) == 2
    by_source = {e["payload"]["source"]: e["experiment_id"] for e in db.events()
                 if e["kind"] == "submission_ingested"}
    chosen = db.experiment(by_source["a.yaml"])
    assert isinstance(chosen.experiment_seed, int) and 0 <= chosen.experiment_seed < 2**31
    assert chosen.config["reproducibility"]["experiment_seed"] == chosen.experiment_seed
    given = db.experiment(by_source["b.yaml"])
    assert given.experiment_seed == 1234
    assert given.config["reproducibility"]["experiment_seed"] == 1234


def test_config_warnings_are_recorded_as_events(layout, db, intake):
    (layout.queue / "w.yaml").write_text(CONFIG + "environment:\n  image: some/image:tag\n")
    [experiment_id] = poll_until_settled(intake)
    warnings = [e["payload"]["message"] for e in db.events(experiment_id)
                if e["kind"] == "config_warning"]
    assert len(warnings) == 1 and "environment.image" in warnings[0]


# -- rejection ------------------------------------------------------------------------------

@pytest.mark.parametrize("bad, key_path", [
    (CONFIG.replace("metric: val_loss", "metric: 5"), "searcher.metric"),       # wrong type
    (CONFIG.replace("max_length", "max_lenght"), "max_lenght"),                 # unknown key
    (CONFIG.replace("batches: 10", "batches: ten"), "searcher.max_length.batches"),
    ("name: [unclosed\n", "invalid YAML"),
])
def test_a_bad_config_is_rejected_with_an_error_naming_the_key(layout, db, intake, bad, key_path):
    make_folder(layout.queue, "bad", config=bad)
    assert poll_until_settled(intake) == []
    assert db.experiments() == []
    assert queue_entries(layout) == []
    rejected = layout.rejected / "bad"
    assert (rejected / "model_def.py").read_text() == MODEL_DEF  # the user's files are kept
    assert (rejected / "const.yaml").read_text() == bad
    error = (rejected / "error.txt").read_text()
    assert key_path in error
    assert error.endswith("\n") and error.count("\n") == 1  # one sentence
    [event] = [e for e in db.events() if e["kind"] == "submission_rejected"]
    assert event["payload"]["source"] == "bad" and key_path in event["payload"]["reason"]
    assert not any(intake.incoming.iterdir())


def test_a_bad_bare_yaml_is_rejected(layout, db, intake):
    (layout.queue / "bad.yaml").write_text(CONFIG.replace("metric: val_loss", "metric: 5"))
    assert poll_until_settled(intake) == []
    assert db.experiments() == []
    assert "searcher.metric" in (layout.rejected / "bad.yaml" / "error.txt").read_text()
    assert (layout.rejected / "bad.yaml" / "bad.yaml").is_file()


def test_a_folder_with_two_yaml_files_is_rejected_naming_them(layout, db, intake):
    folder = make_folder(layout.queue, "two")
    (folder / "adaptive.yaml").write_text(CONFIG)
    assert poll_until_settled(intake) == []
    assert db.experiments() == []
    error = (layout.rejected / "two" / "error.txt").read_text()
    assert "adaptive.yaml" in error and "const.yaml" in error


def test_a_folder_with_no_yaml_file_is_rejected(layout, db, intake):
    make_folder(layout.queue, "none", config=None)
    assert poll_until_settled(intake) == []
    assert db.experiments() == []
    error = (layout.rejected / "none" / "error.txt").read_text()
    assert "no experiment YAML" in error and "none" in error


@pytest.mark.parametrize("extra_yaml", [False, True])
def test_a_rejection_names_the_folder_as_the_user_named_it(layout, db, intake, extra_yaml):
    folder = make_folder(layout.queue, "none", config="name: x\n" if extra_yaml else None)
    if extra_yaml:
        (folder / "other.yaml").write_text(CONFIG)
    poll_until_settled(intake)
    error = (layout.rejected / "none" / "error.txt").read_text()
    assert error.startswith("'none' holds"), error


def test_a_second_rejection_of_the_same_name_keeps_the_first(layout, db, intake):
    make_folder(layout.queue, "bad", config="name: [\n")
    poll_until_settled(intake)
    make_folder(layout.queue, "bad", config=CONFIG.replace("metric: val_loss", "metric: 5"))
    poll_until_settled(intake)
    entries = sorted(p.name for p in layout.rejected.iterdir())
    assert len(entries) == 2 and entries[0] == "bad" and entries[1].startswith("bad.")
    assert "invalid YAML" in (layout.rejected / "bad" / "error.txt").read_text()


def test_many_rejections_of_the_same_name_never_collide(layout, db, intake, monkeypatch):
    monkeypatch.setattr(submissions.time, "strftime", lambda fmt: "20250101-000000")
    for _ in range(3):
        make_folder(layout.queue, "bad", config="name: [\n")
        assert intake.ingest(layout.queue / "bad") is None
    assert len(list(layout.rejected.iterdir())) == 3


# -- find_config ----------------------------------------------------------------------------

def test_find_config(tmp_path):
    one = make_folder(tmp_path, "one", config_name="whatever.yml")
    assert find_config(one).name == "whatever.yml"

    chosen = make_folder(tmp_path, "chosen")
    (chosen / SUBMITTED_CONFIG).write_text(CONFIG)
    assert find_config(chosen).name == SUBMITTED_CONFIG  # submit's name wins over others

    nested = make_folder(tmp_path, "nested", config=None)
    (nested / "lib" / "deep.yaml").write_text(CONFIG)  # only the top level counts
    with pytest.raises(SubmissionError, match="no experiment YAML"):
        find_config(nested)

    several = make_folder(tmp_path, "several")
    (several / "adaptive.yaml").write_text(CONFIG)
    with pytest.raises(SubmissionError, match=r"several YAML files \(adaptive.yaml, const.yaml\)"):
        find_config(several)


# -- submit ---------------------------------------------------------------------------------

def test_submit_refuses_a_bad_config_before_writing_anything(tmp_path, layout):
    bad = tmp_path / "bad.yaml"
    bad.write_text(CONFIG.replace("metric: val_loss", "metric: 5"))
    model = make_folder(tmp_path, "model", config=None)
    with pytest.raises(ConfigError) as error:
        submit(layout, bad, model)
    assert error.value.path == "searcher.metric"
    # Nothing new, nothing hidden:
    assert sorted(layout.queue.iterdir()) == [layout.job_queue, layout.rejected]


def test_submit_refuses_missing_paths(tmp_path, layout):
    config = tmp_path / "const.yaml"
    config.write_text(CONFIG)
    with pytest.raises(SubmissionError, match="does not exist"):
        submit(layout, tmp_path / "missing.yaml", None)
    with pytest.raises(SubmissionError, match="model folder .* does not exist"):
        submit(layout, config, tmp_path / "no-such-model")
    assert sorted(layout.queue.iterdir()) == [layout.job_queue, layout.rejected]


def test_submit_copies_atomically_without_other_yaml_files(tmp_path, layout, db, intake):
    make_folder(layout.queue, "someone-elses")  # already queued
    model = make_folder(tmp_path, "model")  # holds const.yaml, the config we submit
    (model / "adaptive.yaml").write_text(CONFIG)
    (model / "__pycache__").mkdir()
    (model / "__pycache__" / "model_def.cpython-311.pyc").write_bytes(b"\0")
    before = set(queue_entries(layout))

    path, warnings = submit(layout, model / "const.yaml", model)
    assert warnings == []

    after = set(queue_entries(layout))
    assert after - before == {path.name} and before <= after  # exactly one new entry
    assert path.parent == layout.queue and path.is_dir()
    assert not [name for name in after if name.startswith(".")]  # no hidden copy left
    assert path.name.startswith("tiny-")
    copied = sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file())
    assert copied == [SUBMITTED_CONFIG, "lib/util.py", "model_def.py"]
    assert (path / SUBMITTED_CONFIG).read_text() == CONFIG
    assert (model / "adaptive.yaml").is_file()  # the source folder is untouched

    # And the daemon side takes it whole.
    created = poll_until_settled(intake)
    assert len(created) == 2
    names = {Path(db.experiment(i).model_dir).joinpath(SUBMITTED_CONFIG).is_file() for i in created}
    assert names == {True, False}  # ours got experiment.yaml; the other kept const.yaml


def test_submit_without_a_model_dir(tmp_path, layout, db, intake):
    config = tmp_path / "const.yaml"
    config.write_text(CONFIG)
    path, _ = submit(layout, config, None)
    assert sorted(p.name for p in path.iterdir()) == [SUBMITTED_CONFIG]
    [experiment_id] = poll_until_settled(intake)
    assert db.db["experiments"].get(experiment_id)["original_config"] == CONFIG


def test_submit_returns_the_config_warnings(tmp_path, layout):
    config = tmp_path / "const.yaml"
    config.write_text(CONFIG + "environment:\n  image: some/image:tag\n")
    path, warnings = submit(layout, config, None)
    assert path.parent == layout.queue
    assert len(warnings) == 1 and "environment.image" in warnings[0]


def test_two_submits_of_the_same_config_are_two_entries(tmp_path, layout):
    config = tmp_path / "const.yaml"
    config.write_text(CONFIG)
    first, _ = submit(layout, config, None)
    second, _ = submit(layout, config, None)
    assert first != second
    assert len(queue_entries(layout)) == 2


def test_submit_keeps_yaml_files_in_subfolders(tmp_path, layout):
    model = make_folder(tmp_path, "model")
    (model / "lib" / "layers.yaml").write_text("units: 4\n")
    path, _ = submit(layout, model / "const.yaml", model)
    assert (path / "lib" / "layers.yaml").read_text() == "units: 4\n"


def test_submit_with_a_slash_in_the_name(tmp_path, layout):
    config = tmp_path / "const.yaml"
    config.write_text(CONFIG.replace("name: tiny", "name: team/mnist"))
    try:
        path, _ = submit(layout, config, make_folder(tmp_path, "model", config=None))
    except (SubmissionError, ConfigError):
        path = None  # refusing it with one clear sentence would also be fine
    entries = [p for p in layout.queue.iterdir() if p not in (layout.rejected, layout.job_queue)]
    assert not [p.name for p in entries if p.name.startswith(".")]
    if path is not None:
        assert path.parent == layout.queue and (path / SUBMITTED_CONFIG).is_file()


# -- recovery after a killed daemon ---------------------------------------------------------

class Killed(BaseException):
    """Stands in for the daemon being killed at this instant."""


def test_recover_moves_a_recorded_submission_into_its_model_dir(layout, db, intake, monkeypatch):
    make_folder(layout.queue)
    real_rename = submissions.os.rename

    def rename(src, dst):
        if Path(dst).name == "model":  # the last step of ingest: killed just before it
            raise Killed()
        real_rename(src, dst)

    monkeypatch.setattr(submissions.os, "rename", rename)
    intake.poll()
    time.sleep(SETTLE * 1.5)
    with pytest.raises(Killed):
        intake.poll()
    monkeypatch.undo()

    [experiment] = db.experiments()  # recorded...
    model_dir = layout.model_dir(experiment.id)
    assert not model_dir.exists()  # ...but its files are still staged
    assert len(list(intake.incoming.iterdir())) == 1

    Intake(layout, db, settle_seconds=SETTLE).recover()  # the restarted daemon
    assert (model_dir / "model_def.py").read_text() == MODEL_DEF
    assert (model_dir / "const.yaml").is_file()
    assert list(intake.incoming.iterdir()) == []
    assert queue_entries(layout) == []
    assert len(db.experiments()) == 1  # not ingested twice


@pytest.mark.parametrize("bare", [False, True])
def test_recover_puts_an_unrecorded_submission_back_in_the_queue(layout, db, intake,
                                                                  monkeypatch, bare):
    if bare:
        (layout.queue / "quick.yaml").write_text(CONFIG)
    else:
        make_folder(layout.queue, "exp")

    def killed(text):
        raise Killed()

    monkeypatch.setattr(submissions, "load_config_text", killed)
    intake.poll()
    time.sleep(SETTLE * 1.5)
    with pytest.raises(Killed):
        intake.poll()
    monkeypatch.undo()
    assert queue_entries(layout) == []
    assert len(list(intake.incoming.iterdir())) == 1
    assert db.experiments() == []

    fresh = Intake(layout, db, settle_seconds=SETTLE)
    fresh.recover()
    assert queue_entries(layout) == (["quick.yaml"] if bare else ["exp"])
    assert list(fresh.incoming.iterdir()) == []

    [experiment_id] = poll_until_settled(fresh)  # and it is ingested as if new
    model_dir = layout.model_dir(experiment_id)
    assert (model_dir / "quick.yaml").is_file() if bare else (model_dir / "model_def.py").is_file()


def test_recover_with_nothing_staged_does_nothing(layout, db, intake):
    intake.recover()  # no .incoming folder yet
    intake.incoming.mkdir(parents=True)
    intake.recover()
    assert queue_entries(layout) == [] and db.experiments() == []


# -- jobs: queue/jobs -----------------------------------------------------------------------

JOB_CONFIG = """\
name: infer
entrypoint_script: python3 batch_inference.py
data: {trial_id: 777, batch_size: 64}
resources: {slots: 2}
hyperparameters: {lr: 0.1}
"""


def test_a_folder_in_queue_jobs_becomes_a_job_with_its_one_trial(layout, db, intake):
    folder = layout.job_queue / "infer"
    folder.mkdir()
    (folder / "batch_inference.py").write_text("print('hi')\n")
    (folder / "job.yaml").write_text(JOB_CONFIG)
    [job_id] = poll_until_settled(intake)
    job = db.experiment(job_id)
    assert (job.kind, job.runner, job.name, job.searcher, job.metric) == (
        "job", "daemon", "infer", "none", "")
    assert job.config["resources"]["slots_per_trial"] == 2
    assert job.config["script_command"] == "python3 batch_inference.py"
    assert job.config["data"] == {"trial_id": 777, "batch_size": 64}
    [trial] = db.trials(job_id)
    assert (trial.request_id, trial.hparams, trial.target_batches, trial.state) == \
        (0, {}, 0, "QUEUED")
    assert (layout.model_dir(job_id) / "batch_inference.py").is_file()
    assert list(layout.job_queue.iterdir()) == []
    warnings = [e["payload"]["message"] for e in db.events(job_id) if e["kind"] == "config_warning"]
    assert len(warnings) == 1 and "hyperparameters" in warnings[0]


def test_a_bare_yaml_in_queue_jobs_is_a_job_and_queue_jobs_itself_is_not_a_submission(
        layout, db, intake):
    (layout.job_queue / "quick.yaml").write_text(JOB_CONFIG)
    make_folder(layout.queue)  # an experiment beside it
    created = poll_until_settled(intake)
    kinds = sorted(db.experiment(i).kind for i in created)
    assert kinds == ["experiment", "job"]
    assert layout.job_queue.is_dir() and list(layout.job_queue.iterdir()) == []
    assert not layout.rejected.exists() or list(layout.rejected.iterdir()) == []


@pytest.mark.parametrize("bad, fragment", [
    ("entrypoint: model_def:Trial\n", "a job runs a script"),
    ("entrypoint: python3 x.py\nresources: {slots: 0}\n", "resources.slots"),
    (CONFIG, "a job runs a script"),  # an experiment dropped in the wrong folder
])
def test_a_bad_job_config_is_rejected_like_an_experiment(layout, db, intake, bad, fragment):
    (layout.job_queue / "bad.yaml").write_text(bad)
    assert poll_until_settled(intake) == []
    assert db.experiments() == []
    error = (layout.rejected / "bad.yaml" / "error.txt").read_text()
    assert fragment in error and error.count("\n") == 1


def test_a_job_folder_without_yaml_is_rejected_naming_a_job_yaml(layout, db, intake):
    (layout.job_queue / "empty").mkdir()
    (layout.job_queue / "empty" / "run.py").write_text("")
    poll_until_settled(intake)
    assert "no job YAML" in (layout.rejected / "empty" / "error.txt").read_text()


def test_submit_a_job_goes_to_queue_jobs(tmp_path, layout, db, intake):
    config = tmp_path / "job.yaml"
    config.write_text(JOB_CONFIG)
    code = tmp_path / "code"
    code.mkdir()
    (code / "batch_inference.py").write_text("")
    queued, warnings = submit(layout, config, code, kind=submissions.JOB)
    assert queued.parent == layout.job_queue and queued.name.startswith("infer-")
    assert (queued / SUBMITTED_CONFIG).read_text() == JOB_CONFIG
    assert warnings and "hyperparameters" in warnings[0]
    [job_id] = poll_until_settled(intake)
    assert db.experiment(job_id).kind == "job"
    assert submissions.ingested_as(db, queued.name) == ("accepted", job_id)
    assert submissions.ingested_as(db, "never-queued") is None


def test_submit_refuses_a_trial_class_job_before_writing_anything(tmp_path, layout):
    config = tmp_path / "job.yaml"
    config.write_text("entrypoint: model_def:Trial\n")
    with pytest.raises(ConfigError, match="a job runs a script"):
        submit(layout, config, None, kind=submissions.JOB)
    assert list(layout.job_queue.iterdir()) == []


def test_ingested_as_reports_a_rejection(layout, db, intake):
    (layout.job_queue / "bad.yaml").write_text("entrypoint: m:T\n")
    poll_until_settled(intake)
    status, reason = submissions.ingested_as(db, "bad.yaml")
    assert status == "rejected" and "a job runs a script" in reason


def test_recover_puts_an_unrecorded_job_back_in_queue_jobs(layout, db, intake, monkeypatch):
    (layout.job_queue / "quick.yaml").write_text(JOB_CONFIG)

    def killed(text):
        raise Killed()

    monkeypatch.setattr(submissions, "load_job_config_text", killed)
    intake.poll()
    time.sleep(SETTLE * 1.5)
    with pytest.raises(Killed):
        intake.poll()
    monkeypatch.undo()
    assert len(list(intake.incoming_jobs.iterdir())) == 1
    Intake(layout, db).recover()
    assert [p.name for p in layout.job_queue.iterdir()] == ["quick.yaml"]
    [job_id] = poll_until_settled(intake)
    assert db.experiment(job_id).kind == "job" and len(db.trials(job_id)) == 1


def test_recover_drops_what_a_dead_localdet_run_staged_and_keeps_a_live_ones(layout, db, intake):
    import subprocess
    import sys
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    intake.incoming_foreground.mkdir(parents=True)
    (intake.incoming_foreground / f"{dead}-abcd").mkdir()
    (intake.incoming_foreground / f"{os.getpid()}-abcd").mkdir()
    intake.recover()
    assert [p.name for p in intake.incoming_foreground.iterdir()] == [f"{os.getpid()}-abcd"]
    assert queue_entries(layout) == [] and list(layout.job_queue.iterdir()) == []


def test_submissions_settling_together_are_ingested_in_the_order_they_were_queued(
        layout, db, intake):
    (layout.queue / "zzz-first.yaml").write_text(CONFIG.replace("name: tiny", "name: first"))
    os.utime(layout.queue / "zzz-first.yaml", ns=(1_000_000_000, 1_000_000_000))
    (layout.queue / "aaa-second.yaml").write_text(CONFIG.replace("name: tiny", "name: second"))
    created = poll_until_settled(intake)
    assert [db.experiment(i).name for i in sorted(created)] == ["first", "second"]


# -- more slots than the machine has ----------------------------------------------------------

def test_intake_rejects_more_slots_per_trial_than_the_daemon_has(layout, db):
    intake = Intake(layout, db, settle_seconds=SETTLE, slots=2)
    make_folder(layout.queue, "wide", config=CONFIG + "resources:\n  slots_per_trial: 4\n")
    make_folder(layout.queue, "fits", config=CONFIG + "resources:\n  slots_per_trial: 2\n")
    [experiment_id] = poll_until_settled(intake)
    assert db.experiment(experiment_id).config["resources"]["slots_per_trial"] == 2
    error = (layout.rejected / "wide" / "error.txt").read_text()
    assert error == ("resources.slots_per_trial is 4 but this machine has 2 CPU slots; lower "
                     "resources.slots_per_trial or start `localdet daemon --slots 4`\n")
    assert (layout.rejected / "wide" / "model_def.py").read_text() == MODEL_DEF
    assert queue_entries(layout) == [] and not any(intake.incoming.iterdir())


def test_intake_rejects_a_job_asking_for_more_gpus_than_there_are(layout, db):
    gpus = [Slot(0, "gpu", "NVIDIA H100 80GB HBM3", 81559, "0")]
    intake = Intake(layout, db, settle_seconds=SETTLE, slots=gpus)
    (layout.job_queue / "infer.yaml").write_text(JOB_CONFIG)  # resources.slots: 2
    assert poll_until_settled(intake) == []
    assert db.experiments() == []
    error = (layout.rejected / "infer.yaml" / "error.txt").read_text()
    assert error == ("resources.slots is 2 but this machine has 1 GPU; lower resources.slots "
                     "to 1 or fewer\n")
    status, reason = submissions.ingested_as(db, "infer.yaml")
    assert status == "rejected" and reason == error.strip()


def test_intake_without_slots_accepts_any_slots_per_trial(layout, db, intake):
    make_folder(layout.queue, "wide", config=CONFIG + "resources:\n  slots_per_trial: 64\n")
    assert len(poll_until_settled(intake)) == 1


def test_submit_refuses_more_slots_than_the_slot_file_lists(tmp_path, layout):
    model = make_folder(tmp_path, "model", config=None)
    wide = tmp_path / "wide.yaml"
    wide.write_text(CONFIG + "resources:\n  slots_per_trial: 3\n")
    submit(layout, wide, model)  # no slot file yet: nothing to check against
    write_slot_file(layout.slot_file, cpu_only(2))
    submit(layout, wide, model)  # no daemon running: the next one may have more slots
    queued = queue_entries(layout)
    lock = DaemonLock(layout.daemon_lock)
    lock.acquire()  # a daemon with those 2 slots runs
    with pytest.raises(SubmissionError) as error:
        submit(layout, wide, model)
    assert str(error.value) == ("resources.slots_per_trial is 3 but this machine has 2 CPU "
                                "slots; lower resources.slots_per_trial or start `localdet "
                                "daemon --slots 3`")
    assert queue_entries(layout) == queued  # nothing new
    assert [p.name for p in layout.queue.iterdir() if p.name.startswith(".")] == []
    job = tmp_path / "job.yaml"
    job.write_text(JOB_CONFIG.replace("slots: 2", "slots: 3"))
    with pytest.raises(SubmissionError, match=r"^resources\.slots is 3 .* 2 CPU slots"):
        submit(layout, job, None, kind=submissions.JOB)
    assert list(layout.job_queue.iterdir()) == []
    fits = tmp_path / "fits.yaml"
    fits.write_text(CONFIG + "resources:\n  slots_per_trial: 2\n")
    submit(layout, fits, model)
    lock.release()
    assert len(queue_entries(layout)) == 3
