"""Which hyperparameters mattered (issue 24, item 3): importances over an experiment's
recorded trials (localdet/operations/importance.py), on searches recorded straight through
the records API; `localdet status EXP --json` carries them."""

from __future__ import annotations

import json
import math

from click.testing import CliRunner
from recorded_searches import add_trial, lr_driven, record_experiment

from localdet.operations.importance import cache_path, importances
from localdet.ui.cli import cli


def test_the_hyperparameter_that_drives_the_metric_ranks_first(layout, db):
    trials = lr_driven(12)
    trials.append(({**trials[0][0], "lr": 1e-3}, [math.nan]))  # diverged: left out
    experiment_id = record_experiment(db, "bowl", trials)

    found = importances(layout, db, experiment_id)

    assert found["metric"] == "val_loss" and found["evaluator"] == "ped-anova"
    assert found["trials"] == 12 and found["validations"] == 36
    ranked = list(found["importances"])
    assert ranked[0] == "lr", found
    assert set(ranked) == {"lr", "dropout", "optimizer"}
    assert found["importances"]["lr"] > 0.5
    assert math.isclose(sum(found["importances"].values()), 1.0)
    assert found["constant"] == ["global_batch_size"]  # never varied: left out, and said
    assert "global_batch_size" in found["note"]


def test_too_few_trials_is_an_answer_not_an_error(layout, db):
    experiment_id = record_experiment(db, "two", lr_driven(2))

    found = importances(layout, db, experiment_id)

    assert found["importances"] == {} and found["trials"] == 2
    assert found["note"] == "too few trials for importances: 2 with a val_loss, at least 3 needed"


def test_the_cache_is_used_and_refreshed_when_new_validations_arrive(layout, db):
    experiment_id = record_experiment(db, "cached", lr_driven(6, seed=3))
    first = importances(layout, db, experiment_id)
    assert first["cached"] is False
    assert cache_path(layout, experiment_id).exists()
    assert not list(layout.home.rglob("*importance*"))  # the state folder is the daemon's

    again = importances(layout, db, experiment_id, compute=False)
    assert again == {**first, "cached": True}

    # One more trial validates: the cached answer no longer matches what is recorded.
    add_trial(db, experiment_id, 7, {**lr_driven(1, seed=9)[0][0]}, [0.2, 0.1])
    assert importances(layout, db, experiment_id, compute=False) is None
    fresh = importances(layout, db, experiment_id)
    assert fresh["cached"] is False and fresh["trials"] == 7 and fresh["validations"] == 20
    assert importances(layout, db, experiment_id)["cached"] is True


def test_status_json_carries_the_importances_and_status_shows_them_cached(layout, db):
    experiment_id = record_experiment(db, "status", lr_driven(10, seed=1))

    done = CliRunner().invoke(cli, ["status", str(experiment_id), "--json"],
                              env={"LOCALDET_HOME": str(layout.home)})

    assert done.exit_code == 0, done.output
    facts = json.loads(done.output)
    assert list(facts["importances"]["importances"])[0] == "lr"
    assert facts["importances"]["trials"] == 10
    again = CliRunner().invoke(cli, ["status", str(experiment_id), "--json"],
                               env={"LOCALDET_HOME": str(layout.home)})
    assert json.loads(again.output) == facts  # computed, then cached: the same facts
    # The plain status shows them once cached (it never computes them: it stays fast).
    plain = CliRunner().invoke(cli, ["status", str(experiment_id)],
                               env={"LOCALDET_HOME": str(layout.home)})
    assert "importance for val_loss over 10 trials: lr " in plain.output
