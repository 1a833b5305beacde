"""The dashboard's charts, from recorded metrics: one panel per metric with a line per
trial and the best trial drawn on top in bold; hyperparameters that vary against the
searcher metric; a clear empty chart before any metric exists."""

from __future__ import annotations

import math

from localdet.ui import views
from localdet.ui.web import figures


def search(db, hparams_of: list[dict], accuracies: list[list[float]]):
    """An experiment with one trial per hparams, its validation val_loss per 10 batches."""
    experiment_id = db.create_experiment(
        name="s", description="", config={}, original_config="", searcher="random",
        metric="val_loss", smaller_is_better=True, experiment_seed=1, model_dir="")
    for request, (hparams, values) in enumerate(zip(hparams_of, accuracies, strict=True),
                                                start=1):
        trial_id = db.create_trial(experiment_id=experiment_id, request_id=request,
                                   hparams=hparams, seed=request, target_batches=30)
        for step, value in enumerate(values, start=1):
            db.record_metrics(trial_id, "training", 10 * step, {"loss": value + 0.1})
            db.record_metrics(trial_id, "validation", 10 * step, {"val_loss": value})
    experiment = db.experiment(experiment_id)
    return experiment, views.experiment_facts(db, experiment)


def test_curves_have_a_panel_per_metric_and_the_best_trial_bold_on_top(db):
    experiment, facts = search(db, [{"lr": 0.1, "opt": "sgd"}, {"lr": 0.01, "opt": "adam"},
                                    {"lr": 0.001, "opt": "adam"}],
                               [[0.9, 0.5, 0.4], [0.8, 0.3, 0.2], [0.7, 0.6, math.nan]])
    assert facts["best_trial"] == facts["trials"][1]["id"]
    figure = figures.curves(db, [t["id"] for t in facts["trials"]], facts["best_trial"])
    titles = [a["text"] for a in figure["layout"]["annotations"]]
    assert titles == ["val_loss", "training loss"]  # validation first
    val_loss = [t for t in figure["data"] if t["xaxis"] == "x"]
    assert len(val_loss) == 3 and val_loss[-1]["name"].endswith("(best)")
    assert val_loss[-1]["line"]["width"] > val_loss[0]["line"]["width"]
    assert val_loss[-1]["y"] == [0.8, 0.3, 0.2] and val_loss[-1]["x"] == [10, 20, 30]
    nan_trial = next(t for t in val_loss if t["name"] == f"trial {facts['trials'][2]['id']}")
    assert nan_trial["y"] == [0.7, 0.6]  # a NaN is left out, not plotted as zero


def test_hyperparameters_against_the_metric_skip_constants_and_name_categories(db):
    experiment, facts = search(db, [{"lr": 0.1, "opt": "sgd", "bs": 32},
                                    {"lr": 0.01, "opt": "adam", "bs": 32}],
                               [[0.9, 0.5], [0.8, 0.3]])
    figure = figures.hyperparameters(experiment, facts["trials"])
    (coordinates,) = figure["data"]
    dimensions = {d["label"]: d for d in coordinates["dimensions"]}
    assert list(dimensions) == ["lr", "opt", "val_loss"]  # bs is the same everywhere
    assert dimensions["lr"]["values"] == [0.1, 0.01]
    assert dimensions["opt"]["ticktext"] == ["adam", "sgd"]
    assert dimensions["opt"]["values"] == [1, 0]
    assert dimensions["val_loss"]["values"] == [0.5, 0.3]  # each trial's best


def test_an_experiment_without_metrics_gets_a_chart_that_says_so(db):
    experiment, facts = search(db, [{"lr": 0.1}], [[]])
    assert figures.curves(db, [facts["trials"][0]["id"]])["layout"]["annotations"][0][
        "text"] == "no metrics recorded yet"
    assert figures.hyperparameters(experiment, facts["trials"])["layout"]["annotations"][0][
        "text"] == "no validation metrics yet"
