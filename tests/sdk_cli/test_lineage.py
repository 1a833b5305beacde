"""Fork and continue (localdet/operations/lineage.py): a fork is a new experiment recorded
through the intake with its parent named; continuing reopens an ended single-trial
experiment, which a real daemon then trains further from its checkpoint."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
import yaml
from conftest import TEST_TRIALS, Home, wait_for

from localdet.daemon.submissions import Intake, copy_submission
from localdet.operations import experiments, lineage
from localdet.operations.errors import OperationError
from localdet.paths import Layout
from localdet.records.db import StateDB
from localdet.search.driver import Search, replay
from localdet.search.methods import Close, Shutdown

COUNTER = TEST_TRIALS / "counter"


def counter_config(batches: int = 20, **changes) -> str:
    """The counter trial (milliseconds a batch, exact resumes), trained `batches` batches."""
    config = {
        "name": "lineage", "entrypoint_script": "python3 train.py",
        "hyperparameters": {"variant": 0, "batch_seconds": 0, "checkpoint_seconds": 0,
                            "crash_at": 0, "print_lines": 1},
        "searcher": {"name": "single", "metric": "val_loss",
                     "max_length": {"batches": batches}},
        "scheduling_unit": 5, "min_checkpoint_period": {"batches": 10}, "max_restarts": 0,
        "reproducibility": {"experiment_seed": 3},
    }
    config.update(changes)
    return "# the counter trial\n" + yaml.safe_dump(config)


def record(layout: Layout, db: StateDB, text: str, model_dir: Path = COUNTER) -> int:
    """Record an experiment as the daemon's intake does."""
    staged = Intake(layout, db).incoming / f"test-{secrets.token_hex(4)}"
    staged.parent.mkdir(parents=True, exist_ok=True)
    copy_submission(text, model_dir, staged)
    return Intake(layout, db).record(staged, "test")


def finish(db: StateDB, experiment_id: int, batches: int, state: str = "COMPLETED") -> int:
    """Play a single-trial run to its end as the daemon records one: the searcher's trial,
    a checkpoint and a validation at `batches`, then the trial and experiment `state`."""
    search = Search(db, log=lambda _: None)
    search.start(db.experiment(experiment_id))
    trial = db.trials(experiment_id)[0]
    db.update_trial(trial.id, state="RUNNING")
    db.add_checkpoint({"uuid": f"ckpt-{experiment_id}-{batches}",
                       "experiment_id": experiment_id, "trial_id": trial.id,
                       "batches_trained": batches, "size_bytes": 0, "metadata": {},
                       "files": {}, "created_at": "2026-01-01T00:00:00+00:00"})
    db.record_metrics(trial.id, "validation", batches, {"val_loss": 0.5})
    if state == "COMPLETED":
        search.validation_completed(db.experiment(experiment_id), db.trial(trial.id), 0.5)
    else:
        db.update_trial(trial.id, state=state)
    db.set_experiment_state(experiment_id, state)
    return trial.id


# -- fork -----------------------------------------------------------------------------------

def test_fork_records_a_new_experiment_naming_its_parent_with_the_changes_asked(layout, db):
    parent = record(layout, db, counter_config())
    experiments.set_priority(db, parent, 7)  # a change made since: the fork has it too
    child = lineage.fork(layout, db, parent, overrides={"hyperparameters.variant": 2,
                                                        "searcher.max_length.batches": 30})
    forked = db.experiment(child)
    assert child != parent and forked.parent_id == parent
    assert forked.config["hyperparameters"]["variant"] == {"type": "const", "val": 2}
    assert forked.config["searcher"]["max_length"] == {"batches": 30}
    assert forked.config["scheduling_unit"] == 5  # the rest as the parent's
    assert forked.config["resources"]["priority"] == 7
    assert forked.state == "ACTIVE" and forked.runner == "daemon"
    assert (Path(forked.model_dir) / "train.py").read_text() == \
        (COUNTER / "train.py").read_text()  # the parent's model folder snapshot
    assert db.events(child, kinds=("experiment_forked",))[0]["payload"]["parent_id"] == parent
    assert experiments.describe(layout, db, parent)["forks"] == [child]

    # A config file instead of the parent's: its settings, the parent's code.
    other = lineage.fork(layout, db, parent, config_text=counter_config(7, name="other"))
    assert db.experiment(other).name == "other"
    assert db.experiment(other).config["searcher"]["max_length"] == {"batches": 7}
    assert db.experiment(other).parent_id == parent


def test_a_bad_fork_is_refused_in_one_sentence_and_records_nothing(layout, db):
    parent = record(layout, db, counter_config())
    before = [e.id for e in db.experiments()]
    with pytest.raises(OperationError) as refused:
        lineage.fork(layout, db, parent, overrides={"searcher.name": "bogus"})
    assert "searcher.name" in str(refused.value) and "\n" not in str(refused.value)
    assert [e.id for e in db.experiments()] == before
    assert not any(Intake(layout, db).incoming_foreground.iterdir())  # nothing left staged
    with pytest.raises(OperationError, match="expected a mapping"):
        lineage.fork(layout, db, parent, config_text="- a list, not a config\n")
    assert [e.id for e in db.experiments()] == before


# -- continue: the records ------------------------------------------------------------------

def test_continue_reopens_a_finished_trial_to_a_longer_target(layout, db):
    experiment_id = record(layout, db, counter_config(20))
    trial_id = finish(db, experiment_id, 20)
    assert db.trial(trial_id).state == "COMPLETED"
    experiments.set_gc_policy(db, experiment_id, save_trial_latest=3)

    done = lineage.continue_experiment(layout, db, experiment_id,
                                       {"searcher.max_length.batches": 40})
    assert done["checkpoint"] == f"ckpt-{experiment_id}-20" and done["batches"] == 20
    assert done["target_batches"] == 40
    experiment, trial = db.experiment(experiment_id), db.trial(trial_id)
    assert (experiment.state, experiment.ended_at) == ("ACTIVE", None)
    assert experiment.config["searcher"]["max_length"] == {"batches": 40}
    assert experiment.config["reproducibility"]["experiment_seed"] == 3
    assert experiment.config["checkpoint_storage"]["save_trial_latest"] == 3  # kept
    assert (trial.state, trial.target_batches, trial.restarts, trial.ended_at) == \
        ("QUEUED", 40, 0, None)
    assert trial.latest_checkpoint == f"ckpt-{experiment_id}-20"
    # The search, replayed from its events, now closes the trial at 40 batches, not 20.
    method = replay(experiment, db.searcher_events(experiment_id))
    assert method.on_validation_completed(1, 0.4, 20) == []
    assert method.on_validation_completed(1, 0.4, 40) == [Close(1), Shutdown()]
    continued = experiments.describe(layout, db, experiment_id)["continued"]
    assert len(continued) == 1 and continued[0]["checkpoint"] == f"ckpt-{experiment_id}-20"
    assert continued[0]["overrides"] == {"searcher.max_length.batches": 40}

    # Once more after a kill: the earlier change is kept, without a new length.
    db.update_trial(trial_id, state="CANCELED")
    db.set_experiment_state(experiment_id, "CANCELED")
    again = lineage.continue_experiment(layout, db, experiment_id)
    assert again["target_batches"] == 40 and db.experiment(experiment_id).state == "ACTIVE"


def test_continue_is_refused_in_one_sentence(layout, db):
    active = record(layout, db, counter_config())
    with pytest.raises(OperationError, match="is ACTIVE"):
        lineage.continue_experiment(layout, db, active)

    done = record(layout, db, counter_config(20))
    finish(db, done, 20)
    with pytest.raises(OperationError, match="already trained 20 batches"):
        lineage.continue_experiment(layout, db, done)
    for key in ("hyperparameters.variant", "resources.slots_per_trial"):
        with pytest.raises(OperationError, match="keeps its"):
            lineage.continue_experiment(layout, db, done, {key: 2,
                                                           "searcher.max_length.batches": 40})
    with pytest.raises(OperationError, match="searcher.max_length"):
        lineage.continue_experiment(layout, db, done, {"searcher.max_length": "long"})
    assert db.experiment(done).state == "COMPLETED"  # nothing changed by a refusal

    pausing = record(layout, db, counter_config(20))
    Search(db, log=lambda _: None).start(db.experiment(pausing))
    db.update_trial(db.trials(pausing)[0].id, state="RUNNING", stop_requested="PAUSING")
    db.set_experiment_state(pausing, "PAUSED")
    with pytest.raises(OperationError, match="still stopping"):
        lineage.continue_experiment(layout, db, pausing)
    db.update_trial(db.trials(pausing)[0].id, state="PAUSED", stop_requested=None)
    assert lineage.continue_experiment(layout, db, pausing)["target_batches"] == 20
    assert db.experiment(pausing).state == "ACTIVE"  # a paused one continues as resumed
    assert db.trials(pausing)[0].state == "QUEUED"

    search = record(layout, db, counter_config(20, searcher={
        "name": "random", "metric": "val_loss", "max_trials": 2,
        "max_length": {"batches": 20}}))
    Search(db, log=lambda _: None).start(db.experiment(search))
    db.set_experiment_state(search, "CANCELED")
    with pytest.raises(OperationError, match="only a single-trial experiment") as refused:
        lineage.continue_experiment(layout, db, search)
    assert "\n" not in str(refused.value)


# -- continue: a real run -----------------------------------------------------------------

@pytest.mark.slow
def test_continue_trains_further_from_its_checkpoint_under_a_daemon(tmp_path, daemons):
    home = Home(tmp_path / "home")
    layout = Layout(home.path).ensure()
    db = StateDB.open(layout.db)
    try:
        experiment_id = record(layout, db, counter_config(20))
        daemons(home, "--warm", "0")

        def ended(eid: int) -> str:
            def state():
                found = db.experiment(eid).state
                return found if found in ("COMPLETED", "CANCELED", "ERROR") else None
            return wait_for(state, 180, f"experiment {eid} to end", interval=0.1)

        assert ended(experiment_id) == "COMPLETED"
        first = db.trials(experiment_id)[0]
        assert first.batches_trained == 20

        done = lineage.continue_experiment(layout, db, experiment_id,
                                           {"searcher.max_length.batches": 40})
        assert done["batches"] == 20 and done["daemon_running"] is True
        # A fork trained straight to 40 batches: the continued run must end the same.
        straight = lineage.fork(layout, db, experiment_id,
                                overrides={"searcher.max_length.batches": 40})
        assert ended(experiment_id) == "COMPLETED"
        assert ended(straight) == "COMPLETED"

        trial = db.trial(first.id)
        assert trial.batches_trained == 40 and trial.state == "COMPLETED"
        assert db.checkpoint(trial.latest_checkpoint).batches_trained == 40
        launches = db.events(experiment_id, kinds=("trial_launched",))
        assert len(launches) == 2
        # The second launch started from the checkpoint at 20: its part of the log begins
        # with batch 21, and it trained no batch the first one had.
        log = layout.trial_log(experiment_id, first.id).read_bytes()
        resumed = log[launches[1]["payload"]["log_offset"]:].decode()
        assert "batch 21 line 0" in resumed and "batch 20 line 0" not in resumed
        assert "batch 40 line 0" in resumed

        def validation(eid: int) -> dict:
            rows = db.metrics(db.trials(eid)[0].id, "validation")
            return {row.batches_trained: row.metrics["val_loss"] for row in rows}

        assert validation(experiment_id)[40] == validation(straight)[40]  # resumed exactly
        assert set(validation(experiment_id)) == {20, 40}
        events = db.events(experiment_id, kinds=("experiment_continued",))
        assert events[0]["payload"]["checkpoint"] == first.latest_checkpoint
        assert db.experiment(straight).parent_id == experiment_id
    finally:
        db.close()


def test_a_continue_config_file_merges_into_the_experiments_config():
    text = "searcher:\n  max_length:\n    epochs: 2\n  metric: loss\nmax_restarts: 3\n"
    assert lineage.config_file_overrides(text) == {
        "searcher.max_length": {"epochs": 2}, "searcher.metric": "loss", "max_restarts": 3}
    with pytest.raises(OperationError, match="not a mapping"):
        lineage.config_file_overrides("- 1\n")
