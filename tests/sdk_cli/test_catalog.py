"""The catalog operations (localdet/operations/experiments.py) on a real database and store:
labels, description, notes, archive, the light listing, pause/activate/cancel/kill requests,
and the config settings the scheduler and retention read."""

from __future__ import annotations

import json
import uuid as uuidlib

import pytest

from localdet.checkpoints.gc import collect
from localdet.checkpoints.manifest import build_manifest
from localdet.checkpoints.store import Store
from localdet.config.experiment import parse_config
from localdet.operations import experiments as ops
from localdet.operations.errors import NotFound, OperationError
from localdet.records.db import StateDB


def make_experiment(db: StateDB, name: str = "exp", **config) -> int:
    parsed = parse_config({
        "name": name, "entrypoint": "model_def:Trial",
        "hyperparameters": {"global_batch_size": 8},
        "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 400}},
        **config}).config
    return db.create_experiment(
        name=name, description="", config=parsed, original_config="", searcher="single",
        metric="val_loss", smaller_is_better=True, experiment_seed=1, model_dir="/nowhere")


def make_trial(db: StateDB, experiment_id: int, validations=None, request_id: int = 1) -> int:
    trial_id = db.create_trial(experiment_id=experiment_id, request_id=request_id,
                               hparams={"global_batch_size": 8}, seed=1, target_batches=400)
    for batches, loss in (validations or {}).items():
        db.record_metrics(trial_id, "validation", batches, {"val_loss": loss})
    return trial_id


def end(db: StateDB, experiment_id: int, state: str = "COMPLETED") -> None:
    for trial in db.trials(experiment_id):
        db.update_trial(trial.id, state=state)
    db.set_experiment_state(experiment_id, state)


def save(db: StateDB, store: Store, experiment_id: int, trial_id: int, batches: int) -> str:
    uuid = str(uuidlib.uuid4())
    with store.writing():
        files = {"weights.h5": store.put_bytes(f"{uuid} weights".encode())}
        db.add_checkpoint(build_manifest(uuid=uuid, experiment_id=experiment_id,
                                         trial_id=trial_id, batches_trained=batches,
                                         files=files, metadata={}))
    return uuid


def test_labels_description_and_notes_are_stored_shown_and_filtered(layout, db):
    first, second, third = (make_experiment(db, name) for name in ("a", "b", "c"))
    ops.add_label(db, first, "baseline")
    ops.add_label(db, first, "digits v2")   # any non-empty text, spaces included
    assert ops.add_label(db, second, "baseline")["labels"] == ["baseline"]
    ops.add_label(db, second, "baseline")  # twice: still once
    ops.set_labels(db, third, ["other", "digits v2"])
    ops.set_description(db, first, "the first try")
    ops.set_notes(db, first, "lr too high?\nnext: 1e-4")
    ops.set_name(db, first, "renamed")

    def ids(**filters):
        return [e["id"] for e in ops.list_experiments(db, **filters)]

    assert ids() == [first, second, third]
    assert ids(labels=["baseline"]) == [first, second]
    assert ids(labels=["baseline", "digits v2"]) == [first]  # every label must match
    assert ids(labels=["nowhere"]) == []
    listed = ops.list_experiments(db)[0]
    assert (listed["name"], listed["description"], listed["labels"]) == (
        "renamed", "the first try", ["baseline", "digits v2"])
    described = ops.describe(layout, db, first)
    assert described["notes"] == "lr too high?\nnext: 1e-4"
    assert described["labels"] == ["baseline", "digits v2"]
    assert (described["name"], described["description"]) == ("renamed", "the first try")

    assert ops.remove_label(db, first, "baseline")["labels"] == ["digits v2"]
    assert ops.remove_label(db, first, "baseline")["labels"] == ["digits v2"]  # no-op
    assert ids(labels=["baseline"]) == [second]
    kinds = [e["kind"] for e in db.events(first)]
    assert "experiment_label_removed" in kinds and "experiment_changed" in kinds

    with pytest.raises(OperationError, match="^the label must not be empty$"):
        ops.add_label(db, first, "  ")
    with pytest.raises(OperationError, match="^the name must not be empty$"):
        ops.set_name(db, first, "")
    with pytest.raises(NotFound, match="there is no experiment 99"):
        ops.add_label(db, 99, "x")


def test_archive_hides_from_the_default_listing_and_keeps_everything(layout, db):
    store = Store(layout.store)
    experiment_id = make_experiment(db)
    trial_id = make_trial(db, experiment_id, {100: 0.5})
    uuid = save(db, store, experiment_id, trial_id, 100)
    other = make_experiment(db, "other")

    with pytest.raises(OperationError) as refused:
        ops.archive(db, experiment_id)
    assert str(refused.value) == (f"experiment {experiment_id} is ACTIVE; only an ended one "
                                  "can be archived (pause does not end it: kill it first)")
    end(db, experiment_id)
    assert ops.archive(db, experiment_id) == {"id": experiment_id, "archived": True}

    assert [e["id"] for e in ops.list_experiments(db)] == [other]
    assert [e["id"] for e in ops.list_experiments(db, archived=True)] == [experiment_id]
    assert [e["id"] for e in ops.list_experiments(db, archived=None)] == [experiment_id, other]
    described = ops.describe(layout, db, experiment_id)  # everything is still there
    assert described["archived"] is True
    assert [t["id"] for t in described["trials"]] == [trial_id]
    assert [c.uuid for c in db.checkpoints(experiment_id)] == [uuid]
    assert db.metrics(trial_id)[0].metrics == {"val_loss": 0.5}

    ops.unarchive(db, experiment_id)
    assert [e["id"] for e in ops.list_experiments(db)] == [experiment_id, other]


def test_the_light_listing_counts_trials_progress_and_the_best_metric(db):
    experiment_id = make_experiment(db)
    make_trial(db, experiment_id, {100: 0.5, 200: 0.3})
    nan_trial = make_trial(db, experiment_id, {100: float("nan")}, request_id=2)
    # A row SQLite cannot read as JSON (a NaN) beside a finite value of the metric.
    db.record_metrics(nan_trial, "validation", 200, {"val_loss": 0.25, "acc": float("nan")})
    db.record_metrics(nan_trial, "validation", 300, {"val_loss": "0.1"})  # text: no metric
    idle = make_experiment(db, "idle")
    job = make_experiment(db, "job")
    db.db.execute("UPDATE experiments SET kind = 'job' WHERE id = ?", [job])
    assert "best_metric" not in ops.list_experiments(db)[0]  # read only when asked

    listed = {e["id"]: e for e in ops.list_experiments(db, with_best_metric=True)}
    assert set(listed) == {experiment_id, idle}  # jobs are listed with kind="job"
    summary = listed[experiment_id]
    assert (summary["num_trials"], summary["best_metric"]) == (2, 0.25)
    assert summary["progress"] == pytest.approx((200 + 300) / 800)
    assert (listed[idle]["num_trials"], listed[idle]["best_metric"],
            listed[idle]["progress"]) == (0, None, 0.0)
    assert [e["id"] for e in ops.list_experiments(db, kind="job")] == [job]
    assert [e["id"] for e in ops.list_experiments(db, kind=None)] == [experiment_id, idle, job]
    assert ops.list_experiments(db, states=["COMPLETED"]) == []


def test_actions_are_requested_under_determineds_names(layout, db):
    experiment_id = make_experiment(db)
    trial_id = make_trial(db, experiment_id)
    assert ops.act(layout, db, "pause", experiment_id=experiment_id).startswith(
        f"pause requested for experiment {experiment_id}")
    db.set_experiment_state(experiment_id, "PAUSED")
    db.update_trial(trial_id, state="PAUSED")
    assert ops.act(layout, db, "activate", experiment_id=experiment_id).startswith(
        f"activate requested for experiment {experiment_id}")
    assert ops.act(layout, db, "cancel", trial_id=trial_id).startswith(
        f"cancel requested for trial {trial_id}")
    recorded = [r["action"] for r in db.db.table("requests").rows_where(order_by="id")]
    assert recorded == ["pause", "resume", "kill"]
    with pytest.raises(OperationError, match="^unknown action 'stop'; it is one of activate, "):
        ops.act(layout, db, "stop", experiment_id=experiment_id)
    end(db, experiment_id, "CANCELED")
    with pytest.raises(OperationError, match=f"experiment {experiment_id} is CANCELED; there "
                                             "is nothing to kill"):
        ops.act(layout, db, "kill", experiment_id=experiment_id)
    with pytest.raises(OperationError, match="there is nothing to cancel$"):
        ops.act(layout, db, "cancel", experiment_id=experiment_id)


def test_a_changed_gc_policy_is_what_retention_keeps(layout, db):
    store = Store(layout.store)
    experiment_id = make_experiment(db)
    trial_id = make_trial(db, experiment_id, {100: 0.5, 200: 0.2, 300: 0.4})
    uuids = [save(db, store, experiment_id, trial_id, b) for b in (100, 200, 300)]
    end(db, experiment_id)

    ops.set_gc_policy(db, experiment_id, save_trial_latest=3)  # the default would drop 100
    assert collect(layout, db, experiment_id).deleted == []
    changed = ops.set_gc_policy(db, experiment_id, save_trial_latest=1, save_trial_best=0)
    assert changed["checkpoint_storage"]["save_trial_best"] == 0
    assert [d.uuid for d in collect(layout, db, experiment_id).deleted] == uuids[:2]
    assert [c.uuid for c in db.checkpoints(experiment_id)] == [uuids[2]]
    assert db.events(experiment_id, kinds=["experiment_config_changed"])[-1]["payload"] == {
        "changes": {"checkpoint_storage.save_trial_latest": 1,
                    "checkpoint_storage.save_trial_best": 0}}

    with pytest.raises(OperationError, match=r"^checkpoint_storage.save_trial_best: expected "
                                             r"at least 0, got -1$"):
        ops.set_gc_policy(db, experiment_id, save_trial_best=-1)
    with pytest.raises(OperationError, match="^checkpoint_storage.save_trial_latest: expected "
                                             "an integer, got 'two'$"):
        ops.set_gc_policy(db, experiment_id, save_trial_latest="two")
    with pytest.raises(OperationError, match="^name at least one of"):
        ops.set_gc_policy(db, experiment_id)


def test_priority_and_max_slots_reach_the_schedulers_next_pass(layout, db):
    from localdet.daemon.daemon import Daemon

    experiment_id = make_experiment(db)
    daemon = Daemon(layout, log=lambda message: None).open(db)
    resources = daemon.scheduler.resources_of(db.experiment(experiment_id))
    assert (resources.priority, resources.max_slots) == (None, None)
    ops.set_priority(db, experiment_id, 10)
    ops.set_max_slots(db, experiment_id, 2)
    resources = daemon.scheduler.resources_of(db.experiment(experiment_id))
    assert (resources.priority, resources.max_slots) == (10, 2)
    ops.set_max_slots(db, experiment_id, None)
    assert daemon.scheduler.resources_of(db.experiment(experiment_id)).max_slots is None
    with pytest.raises(OperationError, match="^resources.max_slots: expected an integer or "
                                             "null, got 1.5$"):
        ops.set_max_slots(db, experiment_id, 1.5)
    with pytest.raises(OperationError, match="^resources.priority: expected an integer, got "
                                             "True$"):
        ops.set_priority(db, experiment_id, True)


def test_describe_lists_forks_and_continuations(layout, db):
    parent = make_experiment(db, "parent")
    child = make_experiment(db, "child")
    db.db.execute("UPDATE experiments SET parent_id = ? WHERE id = ?", [parent, child])
    db.log_event("experiment_continued", experiment_id=parent, checkpoint="abc",
                 batches=400, changes={"searcher.max_length": {"batches": 800}})
    described = ops.describe(layout, db, parent)
    assert (described["forks"], described["parent_id"]) == ([child], None)
    assert ops.describe(layout, db, child)["parent_id"] == parent
    [continued] = described["continued"]
    assert continued["checkpoint"] == "abc" and continued["batches"] == 400


def test_the_localdet_catalog_commands(layout, db, monkeypatch):
    from click.testing import CliRunner

    from localdet.ui.cli import cli

    monkeypatch.setenv("LOCALDET_HOME", str(layout.home))
    kept, doomed, running = (make_experiment(db, name) for name in ("kept", "doomed", "run"))
    make_trial(db, kept, {100: 0.5})
    end(db, kept)
    end(db, doomed)
    runner = CliRunner()

    def run(*args, code=0, stdin=None):
        result = runner.invoke(cli, [str(a) for a in args], input=stdin)
        assert result.exit_code == code, result.output
        return result.output

    assert run("label", "add", kept, "baseline") == f"experiment {kept} labels: baseline\n"
    run("note", kept, "-", stdin="first line\nsecond line\n")
    run("note", kept, "--description", "the baseline")
    assert run("note", kept) == "first line\nsecond line\n\n"
    described = json.loads(run("describe", kept, "--json"))
    assert (described["labels"], described["description"]) == (["baseline"], "the baseline")
    assert "notes:\n  first line\n  second line" in run("describe", kept)
    assert [e["id"] for e in json.loads(run("status", "--json", "--label", "baseline"))] == [kept]

    assert run("archive", running, code=1) == (
        f"error: experiment {running} is ACTIVE; only an ended one can be archived (pause "
        "does not end it: kill it first)\n")
    run("archive", kept)
    assert [e["id"] for e in json.loads(run("status", "--json"))] == [doomed, running]
    assert [e["id"] for e in json.loads(run("status", "--json", "--all"))] == [
        kept, doomed, running]

    assert "nothing was deleted" in run("delete", doomed, stdin="n\n", code=1)
    assert run("delete", doomed, "--yes").startswith(f"experiment {doomed} deleted; freed 0 "
                                                      "blobs")
    assert run("describe", doomed, code=1) == (f"error: there is no experiment {doomed}; "
                                               "`localdet status` lists them\n")
    assert "is ACTIVE" in run("delete", running, "--yes", code=1)
    run("label", "remove", kept, "baseline")
    # What an interrupted deletion left is finished by `localdet gc`.
    (layout.experiment_dir(doomed) / "model").mkdir(parents=True)
    db.db.execute("INSERT INTO experiment_deletions VALUES (?, '', '{}', '[]')", [doomed])
    assert run("gc").startswith(f"finished deleting experiment {doomed}\ndeleted 0 checkpoints")
    assert not layout.experiment_dir(doomed).exists()
