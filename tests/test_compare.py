"""Experiments side by side (issue 24, item 4): `localdet compare` over searches recorded
straight through the records API (localdet/operations/compare.py, localdet/ui/compare.py)."""

from __future__ import annotations

import json

from click.testing import CliRunner
from recorded_searches import record_experiment

from localdet.ui.cli import cli


def _compare(layout, *args: str):
    return CliRunner().invoke(cli, ["compare", *args], env={"LOCALDET_HOME": str(layout.home)})


def _two(db) -> tuple[int, int]:
    first = record_experiment(db, "adam-search", [
        ({"global_batch_size": 16, "lr": 0.01, "optimizer": "adam"}, [0.9, 0.4, 0.5]),
        ({"global_batch_size": 16, "lr": 0.001, "optimizer": "adam"}, [0.8, 0.7]),
    ])
    second = record_experiment(db, "sgd-search", [
        ({"global_batch_size": 32, "lr": 0.1, "momentum": 0.9}, [0.95, 0.6, 0.3, 0.25]),
    ], space={"global_batch_size": 32, "lr": {"type": "double", "minval": 0.01, "maxval": 1},
              "momentum": {"type": "double", "minval": 0, "maxval": 1}})
    return first, second


def test_compare_json_gives_each_best_trial_its_point_and_curve(layout, db):
    first, second = _two(db)

    done = _compare(layout, str(second), str(first), "--json")

    assert done.exit_code == 0, done.output
    found = json.loads(done.output)
    left, right = found["experiments"]
    assert (left["id"], right["id"]) == (second, first)  # in the order asked
    # Experiment 1's best is its first trial, at its second validation (0.4 < 0.5).
    assert right["best_metric"] == 0.4 and right["best_batches"] == 20
    assert right["batches"] == 30 and right["num_trials"] == 2
    assert right["validation"] == {"val_loss": 0.4, "val_accuracy": 0.96}
    assert right["curve"] == [[10, 0.9], [20, 0.4], [30, 0.5]]
    assert right["hparams"] == {"global_batch_size": 16, "lr": 0.01, "optimizer": "adam"}
    assert left["best_metric"] == 0.25 and left["curve"][-1] == [40, 0.25]
    assert found["hyperparameters"] == ["global_batch_size", "lr", "momentum", "optimizer"]
    assert found["metrics"] == ["val_loss", "val_accuracy"]


def test_compare_table_has_a_column_per_experiment_and_a_row_per_name(layout, db, tmp_path):
    first, second = _two(db)
    png = tmp_path / "compare.png"

    done = _compare(layout, str(first), str(second), "--plot", str(png))

    assert done.exit_code == 0, done.output
    assert f"{first}: adam-search" in done.output and f"{second}: sgd-search" in done.output
    lines = {line.split("│")[1].strip(): line for line in done.output.splitlines()
             if line.count("│") >= 3}
    assert "0.4" in lines["best"] and "0.25" in lines["best"]
    assert "adam" in lines["optimizer"] and "0.9" in lines["momentum"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_refuses_an_unknown_id_and_a_single_one(layout, db):
    first, _ = _two(db)

    unknown = _compare(layout, str(first), "99")
    single = _compare(layout, str(first), str(first))

    assert unknown.exit_code == 1
    assert "there is no experiment 99" in unknown.output
    assert single.exit_code == 1
    assert f"comparing needs two or more experiments (only {first} given)" in single.output
