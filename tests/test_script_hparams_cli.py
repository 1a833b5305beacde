"""`localdet run train.py --hp ...` and `localdet search train.py k=log(a,b) ...` without a
config file, on a script that never imports `determined` (no TensorFlow: the point is the
hyperparameters): each writes what it received to a file named after its trial, the trial
log says which form each hyperparameter took, a hyperparameter the script does not define
is refused before anything runs, and the config written beside the experiment resubmits.
One daemon (no warm processes) serves the search tests."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from conftest import Home, one_error_line, wait_for

from localdet.config.experiment import load_config_file
from localdet.config.hparam_syntax import parse_hparams

SCRIPT = '''\
import argparse
import json
import os

EPOCHS = 10
OPTIMIZER = "adam"

parser = argparse.ArgumentParser()
parser.add_argument("--learning-rate", type=float, default=0.1)
parser.add_argument("--units", type=int, default=8)
args = parser.parse_args()
trial = os.environ.get("LOCALDET_TRIAL_ID", "none")
with open(f"got-{trial}.json", "w") as out:
    json.dump({"learning_rate": args.learning_rate, "units": args.units, "EPOCHS": EPOCHS,
               "OPTIMIZER": OPTIMIZER}, out)
'''


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("project")
    (folder / "train.py").write_text(SCRIPT)
    return folder


@pytest.fixture(scope="module")
def shared_home(tmp_path_factory, module_daemons) -> Home:
    home = Home(tmp_path_factory.mktemp("state") / "home")
    module_daemons(home, "--slots", "2", "--warm", "0")
    return home


def got(home: Home, experiment_id: int, trial_id: int) -> dict:
    model_dir = home.path / "experiments" / str(experiment_id) / "model"
    return json.loads((model_dir / f"got-{trial_id}.json").read_text())


def test_the_range_syntax():
    assert parse_hparams(["lr=log(1e-4,1e-1)", "units=int(16,128,count=4)",
                          "opt=choice(adam,sgd)", "dropout=double(0,0.5)", "x=1e-3",
                          "flag=true", "name=resnet"]) == {
        "lr": {"type": "log", "base": 10, "minval": -4.0, "maxval": -1.0},
        "units": {"type": "int", "minval": 16, "maxval": 128, "count": 4},
        "opt": {"type": "categorical", "vals": ["adam", "sgd"]},
        "dropout": {"type": "double", "minval": 0.0, "maxval": 0.5},
        "x": 0.001, "flag": True, "name": "resnet"}
    for bad, words in [("lr", "not name=value"), ("lr=log(0,1)", "two values above 0"),
                       ("u=int(1.5,3)", "whole numbers"), ("u=int(3,1)", "swap them"),
                       ("u=int(1)", r"int\(low,high\)"), ("o=choice()", "at least one")]:
        with pytest.raises(ValueError, match=words):
            parse_hparams([bad])


@pytest.mark.slow
def test_run_a_script_with_hp_in_the_foreground(tmp_path, project):
    home = Home(tmp_path / "home")
    result = home.cli("run", project / "train.py", "--hp", "learning_rate=0.02",
                      "--hp", "EPOCHS=3", "--hp", "OPTIMIZER=sgd", "--slots", "2",
                      check=False)
    assert "Traceback" not in result.stderr
    (experiment,) = home.json("status")
    trial_id = home.first_trial(experiment["id"])["id"]
    assert got(home, experiment["id"], trial_id) == {
        "learning_rate": 0.02, "units": 8, "EPOCHS": 3, "OPTIMIZER": "sgd"}
    log = home.cli("logs", trial_id).stdout
    assert "hyperparameter learning_rate=0.02: train.py's argparse option --learning-rate" in log
    assert "hyperparameter EPOCHS=3: train.py's module-level constant EPOCHS" in log
    written = home.path / "experiments" / str(experiment["id"]) / "model" / "experiment.yaml"
    assert f"config written to {written}" in result.stdout
    config = load_config_file(written).config
    assert config["entrypoint_script"] == "python3 train.py"
    assert config["hyperparameters"]["EPOCHS"] == {"type": "const", "val": 3}
    assert (project / "train.py").read_text() == SCRIPT


def test_run_refuses_an_undefined_hyperparameter_before_anything_runs(tmp_path, project):
    home = Home(tmp_path / "home")
    result = home.cli("run", project / "train.py", "--hp", "momentum=0.9", check=False)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: hyperparameter 'momentum' is defined by train.py neither as a command-line "
        "option nor as a module-level constant (it defines options --learning-rate, --units "
        "and module-level constants EPOCHS, OPTIMIZER); rename the hyperparameter or define "
        "it in the script")
    assert home.rows("SELECT id FROM experiments") == []


@pytest.mark.slow
def test_search_a_script_without_a_config(shared_home, project):
    result = shared_home.cli(
        "search", project / "train.py", "learning_rate=log(1e-4,1e-1)", "units=int(4,64)",
        "EPOCHS=int(1,5)", "OPTIMIZER=choice(adam,sgd)", "--searcher", "random",
        "--max-trials", "3", "--max-concurrent-trials", "2", "--seed", "7", "--name", "hp")
    experiment_id = int(result.stdout.split()[1])
    facts = shared_home.wait_until_ended(experiment_id, timeout=180)
    trials = facts["trials"]
    assert len(trials) == 3
    for trial in trials:
        hparams = trial["hparams"]
        assert got(shared_home, experiment_id, trial["id"]) == {
            name: hparams[name] for name in ("learning_rate", "units", "EPOCHS", "OPTIMIZER")}
        assert 1e-4 <= hparams["learning_rate"] <= 1e-1
    written = shared_home.path / "experiments" / str(experiment_id) / "model" / \
        "experiment.yaml"
    assert f"config written to {written}" in result.stdout
    text = written.read_text()
    assert text.startswith("# written by `localdet search ")
    # Edited and resubmitted as it is, with the script's folder.
    resubmitted = shared_home.cli("submit", written, project)
    assert resubmitted.stdout.startswith("queued ")
    wait_for(lambda: len(shared_home.rows("SELECT id FROM experiments WHERE name = 'hp'")) == 2,
             60, "the resubmitted config to be taken")


def test_search_refuses_before_submitting(shared_home, project, tmp_path):
    before = len(shared_home.rows("SELECT id FROM experiments"))
    line = one_error_line(shared_home.cli("search", project / "train.py", "momentum=0.9",
                                          "learning_rate=0.1", check=False))
    assert line.startswith("error: hyperparameter 'momentum' is defined by train.py neither")
    other = tmp_path / "other.py"
    other.write_text(textwrap.dedent('''\
        import click

        @click.command()
        @click.option("--opt", type=click.Choice(["adam", "sgd"]))
        def main(opt):
            pass
    '''))
    line = one_error_line(shared_home.cli("search", other, "opt=choice(adam,rmsprop)",
                                          "--searcher", "grid", check=False))
    assert line == ("error: hyperparameter 'opt' can be 'rmsprop', which other.py's --opt does "
                    "not accept (its choices: adam, sgd)")
    assert len(shared_home.rows("SELECT id FROM experiments")) == before
