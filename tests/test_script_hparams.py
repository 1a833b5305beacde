"""Hyperparameters for unchanged scripts, in process: what `ast` finds in argparse, click and
absl definitions and module-level constants, the refusals before launch, the trial's argv
and environment, and the runner that replaces constants in memory (real subprocesses of a
few milliseconds run the scripts to show what they received)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from localdet.config.experiment import ConfigError, parse_config
from localdet.config.script_hparams import (
    ScriptHparamError,
    check,
    for_launch,
    interface,
    script_index,
)
from localdet.config.script_options import ScriptError, discover

ARGPARSE = '''\
import argparse
import json

LEARNING_RATE = 1e-3
EPOCHS: int = 10
NAME = "base"
SCALE = -2.5
DROPOUT = None          # not a literal the runner can replace: not a constant
A, B = 1, 2             # nor is a tuple


def parse():
    parser = argparse.ArgumentParser()
    parser.add_argument("--learning-rate", type=float, default=0.01)
    parser.add_argument("-b", "--batch_size", dest="bs", type=int, default=32)
    parser.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--augment", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--version", action="version", version="1")
    return parser.parse_args()


if __name__ == "__main__":
    args = parse()
    with open("got.json", "w") as out:
        json.dump({"args": vars(args), "LEARNING_RATE": LEARNING_RATE, "EPOCHS": EPOCHS,
                   "NAME": NAME, "SCALE": SCALE}, out)
'''

CLICK = '''\
import json
import click
from click import option


@click.command()
@click.option("--units", type=int, default=32)
@option("--lr", "learning_rate", type=float, default=0.1)
@click.option("--shout/--no-shout", default=True)
@click.option("--opt", type=click.Choice(["adam", "sgd"]), default="adam")
@click.option("-d", "--dropout-rate", type=float, default=0.1)
@click.option("--debug", is_flag=True)
@click.argument("out")
def main(units, learning_rate, shout, opt, dropout_rate, debug, out):
    with open(out, "w") as f:
        json.dump(dict(units=units, learning_rate=learning_rate, shout=shout, opt=opt,
                       dropout_rate=dropout_rate, debug=debug), f)


if __name__ == "__main__":
    main()
'''

ABSL = '''\
from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_float("learning_rate", 0.01, "step size")
flags.DEFINE_integer("epochs", 3, "passes")
flags.DEFINE_bool("augment", False, "flip images")
flags.DEFINE_enum("optimizer", "adam", ["adam", "sgd"], "which")
flags.DEFINE_string(name="tag", default="t", help="a label")
'''


def script(folder: Path, text: str, name: str = "train.py") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def config(hyperparameters: dict, command: str = "python3 train.py") -> dict:
    return parse_config({"entrypoint_script": command,
                         "hyperparameters": hyperparameters}).config


def test_argparse_options_and_module_constants(tmp_path):
    found = discover(script(tmp_path, ARGPARSE))
    options = found.options
    assert options["learning_rate"].flag == "--learning-rate"
    assert (options["learning_rate"].type, options["learning_rate"].default) == ("float", 0.01)
    assert options["bs"].flag == "--batch_size" and found.option("batch_size") is options["bs"]
    assert options["optimizer"].choices == ("adam", "sgd")
    assert options["verbose"].kind == "true"
    assert (options["augment"].kind, options["augment"].negative) == ("boolean", "--no-augment")
    assert "version" not in options  # version and help take no value
    assert {name: c.value for name, c in found.constants.items()} == {
        "LEARNING_RATE": 1e-3, "EPOCHS": 10, "NAME": "base", "SCALE": -2.5}
    assert found.constants["EPOCHS"].line == 5
    assert not found.imports_determined


def test_click_options_arguments_and_flags(tmp_path):
    found = discover(script(tmp_path, CLICK))
    options = found.options
    assert options["units"].type == "int"
    assert options["learning_rate"].flag == "--lr"  # the explicit name wins
    assert (options["shout"].kind, options["shout"].negative) == ("boolean", "--no-shout")
    assert options["opt"].choices == ("adam", "sgd")
    assert options["dropout_rate"].flag == "--dropout-rate"
    assert options["debug"].kind == "true"
    assert [p.name for p in found.positionals] == ["out"]


def test_absl_flags(tmp_path):
    found = discover(script(tmp_path, ABSL))
    options = found.options
    assert [(o.name, o.type) for o in options.values()] == [
        ("learning_rate", "float"), ("epochs", "int"), ("augment", "bool"),
        ("optimizer", "str"), ("tag", "str")]
    assert options["augment"].negative == "--noaugment"
    assert options["optimizer"].choices == ("adam", "sgd")
    assert options["tag"].default == "t"


def test_a_script_importing_determined_itself_or_through_its_folder(tmp_path):
    script(tmp_path, "import determined as det\nLR = 0.1\n")
    assert discover(tmp_path / "train.py").imports_determined
    (tmp_path / "helpers").mkdir()
    script(tmp_path / "helpers", "from determined import keras\n", "__init__.py")
    script(tmp_path, "from helpers import thing\nLR = 0.1\n", "other.py")
    assert discover(tmp_path / "other.py").imports_determined
    # A script using Determined's API reads its hyperparameters itself: nothing to check.
    check(config({"anything": 1}), tmp_path)
    assert interface(config({"anything": 1}), tmp_path) is None


def test_an_unparseable_script_is_one_sentence(tmp_path):
    script(tmp_path, "LR = 0.1\ndef broken(:\n")
    with pytest.raises(ScriptError) as caught:
        discover(tmp_path / "train.py")
    assert str(caught.value).startswith("train.py does not parse as Python")
    assert "line 2" in str(caught.value)
    with pytest.raises(ConfigError) as refused:
        check(config({"LR": 0.2}), tmp_path)
    assert "\n" not in str(refused.value) and "LR" in str(refused.value)


def test_undefined_hyperparameters_are_refused_in_one_sentence(tmp_path):
    script(tmp_path, ARGPARSE)
    check(config({"learning_rate": {"type": "log", "minval": -4, "maxval": -1},
                  "EPOCHS": 3, "batch_size": 16, "verbose": True,
                  "optimizer": {"type": "categorical", "vals": ["adam", "sgd"]}}), tmp_path)
    with pytest.raises(ScriptHparamError) as caught:
        check(config({"learning_rate": 0.1, "momentum": 0.9}), tmp_path)
    message = str(caught.value)
    assert message.startswith("hyperparameter 'momentum' is defined by train.py neither as a "
                              "command-line option nor as a module-level constant")
    assert "--learning-rate" in message and "EPOCHS" in message and "\n" not in message
    for space, words in [
            ({"optimizer": {"type": "categorical", "vals": ["adam", "rmsprop"]}}, "'rmsprop'"),
            ({"verbose": 1}, "on or off"),
            ({"group": {"lr": 0.1}}, "nested group")]:
        with pytest.raises(ScriptHparamError, match=words):
            check(config(space), tmp_path)


def test_other_commands_get_hyperparameters_as_before(tmp_path):
    script(tmp_path, "print('hi')\n", "run.sh")
    assert interface(config({"x": 1}, "bash run.sh"), tmp_path) is None
    assert interface(config({"x": 1}, "python3 -m train"), tmp_path) is None
    assert script_index(["python3", "-u", "-X", "dev", "train.py", "--a"]) == 4
    assert script_index(["python3", "-c", "pass"]) is None


def run_launch(tmp_path: Path, hparams: dict, command: str = "python3 train.py") -> tuple:
    """The launch for_launch makes, run for real in `tmp_path`; returns it and what the
    script wrote."""
    cfg = config({name: value for name, value in hparams.items()}, command)
    launch = for_launch([sys.executable, *command.split()[1:]], cfg, tmp_path, hparams)
    subprocess.run(launch.argv, cwd=tmp_path, check=True, capture_output=True)
    return launch, json.loads((tmp_path / "got.json").read_text())


def test_options_and_constants_reach_an_argparse_script(tmp_path):
    script(tmp_path, ARGPARSE)
    launch, got = run_launch(tmp_path, {
        "learning_rate": 0.02, "batch_size": 8, "verbose": True, "augment": False,
        "optimizer": "sgd", "EPOCHS": 3, "NAME": "tuned", "SCALE": -0.5})
    assert got["args"] == {"learning_rate": 0.02, "bs": 8, "optimizer": "sgd",
                           "verbose": True, "augment": False}
    assert (got["EPOCHS"], got["NAME"], got["SCALE"], got["LEARNING_RATE"]) == \
        (3, "tuned", -0.5, 1e-3)
    assert launch.argv[1:4] == ["-m", "determined.exec.run_script", "--constants"]
    assert json.loads(launch.argv[4]) == {"EPOCHS": 3, "NAME": "tuned", "SCALE": -0.5}
    assert launch.argv[5] == "train.py"
    said = "\n".join(launch.lines)
    assert "hyperparameter learning_rate=0.02: train.py's argparse option --learning-rate " \
           "(line 14), given as --learning-rate=0.02" in said
    assert "hyperparameter EPOCHS=3: train.py's module-level constant EPOCHS (line 5, 10 in " \
           "the file), replaced in memory" in said
    assert (tmp_path / "train.py").read_text() == ARGPARSE  # the file itself is untouched


def test_options_only_run_the_script_itself(tmp_path):
    script(tmp_path, CLICK)
    launch, got = run_launch(tmp_path, {"units": 7, "learning_rate": 0.5, "shout": False,
                                        "opt": "sgd", "dropout_rate": 0.25, "debug": True,
                                        "out": "got.json"})
    assert got == {"units": 7, "learning_rate": 0.5, "shout": False, "opt": "sgd",
                   "dropout_rate": 0.25, "debug": True}
    assert launch.argv[1] == "train.py"  # no runner: the script itself
    assert launch.argv[-1] == "got.json"  # the positional after the options


def test_absl_flags_reach_the_script(tmp_path):
    pytest.importorskip("absl")
    script(tmp_path, ABSL + textwrap.dedent('''
        import json

        def main(argv):
            with open("got.json", "w") as out:
                json.dump({k: FLAGS[k].value for k in ("learning_rate", "epochs", "augment",
                                                      "optimizer", "tag")}, out)

        if __name__ == "__main__":
            app.run(main)
    '''))
    _, got = run_launch(tmp_path, {"learning_rate": 1e-4, "epochs": 2, "augment": True,
                                   "optimizer": "sgd", "tag": "-x"})
    assert got == {"learning_rate": 1e-4, "epochs": 2, "augment": True, "optimizer": "sgd",
                   "tag": "-x"}


def test_a_hyperparameter_overrides_the_entrypoints_own_option(tmp_path):
    script(tmp_path, ARGPARSE)
    _, got = run_launch(tmp_path, {"learning_rate": 0.3},
                        command="python3 train.py --learning-rate 0.9")
    assert got["args"]["learning_rate"] == 0.3


def test_a_traceback_names_the_users_file_and_line(tmp_path):
    script(tmp_path, "import sys\nSTEPS = 5\n\n\ndef go():\n    raise ValueError(STEPS)\n\n"
                     "go()\n")
    cfg = config({"STEPS": 7})
    launch = for_launch([sys.executable, "train.py"], cfg, tmp_path, {"STEPS": 7})
    result = subprocess.run(launch.argv, cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 1
    assert f'File "{tmp_path / "train.py"}", line 6, in go' in result.stderr
    assert result.stderr.strip().endswith("ValueError: 7")
    assert not list(tmp_path.glob("*.py"))[1:]  # no rewritten copy beside it


def test_the_runner_refuses_a_constant_the_file_no_longer_assigns(tmp_path):
    script(tmp_path, "X = 1\n")
    result = subprocess.run([sys.executable, "-m", "determined.exec.run_script", "--constants",
                             '{"Y": 2}', "train.py"], cwd=tmp_path, capture_output=True,
                            text=True)
    assert result.returncode == 1
    assert result.stderr.strip() == ("error: train.py no longer assigns Y a literal at module "
                                     "level, so localdet cannot give it the hyperparameter; "
                                     "submit the experiment again")
