"""A script without a config file: `localdet run train.py --hp k=v` (one trial in the
foreground) and `localdet search train.py k=log(a,b) --searcher tpe --max-trials 16`
(a search the daemon runs).

Both write the config they made into the experiment (its model folder's
`experiment.yaml`, as `localdet submit` does) and print where: edit it and resubmit it with
`localdet submit`. The hyperparameters reach the script as its own options or module-level
constants when it never imports `determined` (localdet/config/script_hparams.py), and
through Determined's API when it does; either way they are checked before anything runs.

    text = config_text(Path("train.py"), {"lr": 0.01}, {"name": "single"}, command)
"""

from __future__ import annotations

import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

import click

from localdet.config.schema import ConfigError
from localdet.paths import Layout

SEARCHERS = ("single", "grid", "random", "adaptive_asha", "tpe", "bayesian")


def _fail(message: str, code: int = 1) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def config_text(script: Path, space: dict[str, Any], searcher: dict[str, Any],
                command: str, name: str | None = None) -> str:
    """The experiment config for `script` (run from its own folder) as YAML, with a header
    saying which command wrote it and how to resubmit it."""
    import yaml  # (here: `localdet` starts without it)

    config = {"name": name or script.stem, "entrypoint_script": f"python3 {script.name}",
              "hyperparameters": space, "searcher": searcher}
    header = (f"# written by `{command}`\n"
              f"# edit it and resubmit: localdet submit THIS_FILE {shlex.quote(str(script.parent))}"
              "\n")
    return header + yaml.safe_dump(config, sort_keys=False)


def _script(path: Path) -> Path:
    if not path.is_file():
        _fail(f"script '{path}' does not exist")
    return path.resolve()


def _space(pairs: tuple[str, ...]) -> dict[str, Any]:
    from localdet.config.hparam_syntax import parse_hparams

    try:
        return parse_hparams(pairs)
    except ConfigError as error:
        _fail(str(error))
    return {}


def _command_line() -> str:
    return shlex.join(["localdet", *sys.argv[1:]])


def _written(layout: Layout, experiment_id: int, script: Path) -> None:
    path = layout.model_dir(experiment_id) / "experiment.yaml"
    click.echo(f"config written to {path}; edit it and resubmit it with `localdet submit "
               f"{shlex.quote(str(path))} {shlex.quote(str(script.parent))}`")


def run_script(path: Path, pairs: tuple[str, ...], slots: int, quiet: bool,
               allow_system_hooks: bool, console) -> None:
    """`localdet run SCRIPT.py --hp k=v ...`: one trial (searcher single) in the foreground."""
    from localdet.daemon.submissions import SubmissionError
    from localdet.ui import foreground

    script = _script(path)
    text = config_text(script, _space(pairs), {"name": "single", "metric": "val_loss"},
                       _command_line())
    layout = Layout.from_environment()
    with tempfile.TemporaryDirectory(prefix="localdet-run-") as folder:
        config_path = Path(folder) / "experiment.yaml"
        config_path.write_text(text, encoding="utf-8")
        try:
            experiment_id, warnings = foreground.record(layout, config_path, script.parent)
        except (ConfigError, SubmissionError) as error:
            _fail(str(error), code=2)  # nothing was recorded
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)
    _written(layout, experiment_id, script)
    sys.exit(foreground.drive(layout, experiment_id, slots, console, show_logs=not quiet,
                              allow_system_hooks=allow_system_hooks))


def _max_length(text: str | None) -> dict[str, int] | None:
    """`--max-length 500` (batches) or `--max-length epochs=3` as Determined's max_length."""
    if text is None:
        return None
    unit, equals, count = text.partition("=")
    if not equals:
        unit, count = "batches", text
    if unit.strip() not in ("batches", "epochs", "records") or not count.strip().isdigit() \
            or int(count) < 1:
        _fail(f"--max-length {text!r}: give a number of batches (500) or a unit and a number "
              "(epochs=3, batches=500, records=10000)")
    return {unit.strip(): int(count)}


@click.command()
@click.argument("script", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("hyperparameters", nargs=-1)
@click.option("--searcher", "searcher_name", type=click.Choice(SEARCHERS),
              help="The search method (Determined's searcher.name). Default: random when a "
                   "hyperparameter is a range, single otherwise.")
@click.option("--max-trials", type=click.IntRange(min=1), help="searcher.max_trials.")
@click.option("--metric", default="val_loss", show_default=True,
              help="The validation metric the searcher compares (searcher.metric).")
@click.option("--smaller-is-better/--larger-is-better", default=True, show_default=True,
              help="Whether a smaller metric is better (searcher.smaller_is_better).")
@click.option("--max-length", help="searcher.max_length: batches (500) or unit=N "
                                   "(epochs=3); required by adaptive_asha.")
@click.option("--max-concurrent-trials", type=click.IntRange(min=0),
              help="searcher.max_concurrent_trials (default 16).")
@click.option("--max-rungs", type=click.IntRange(min=1), help="adaptive_asha's max_rungs.")
@click.option("--divisor", type=float, help="adaptive_asha's divisor.")
@click.option("--name", help="The experiment's name (default: the script's name).")
@click.option("--seed", type=int, help="reproducibility.experiment_seed.")
def search(script: Path, hyperparameters: tuple[str, ...], searcher_name: str | None,
           max_trials: int | None, metric: str, smaller_is_better: bool,
           max_length: str | None, max_concurrent_trials: int | None, max_rungs: int | None,
           divisor: float | None, name: str | None, seed: int | None) -> None:
    """Search a script's hyperparameters without a config file; the daemon runs it.

    SCRIPT is run from its folder (copied as the model folder). Each HYPERPARAMETER is
    name=value (a constant) or a range: name=int(16,128), name=double(0,0.5),
    name=log(1e-4,1e-1) (the ends are values; base 10, or base=B), name=choice(adam,sgd);
    a grid's count goes last: int(16,128,count=4). They reach a script that never imports
    determined as its own command-line options (argparse, click, absl) or module-level
    constants, and are refused before anything runs when it defines neither.
    """
    from localdet.operations.creation import create_experiment
    from localdet.operations.errors import OperationError

    path = _script(script)
    space = _space(hyperparameters)
    ranged = any(isinstance(v, dict) and v.get("type") != "const" for v in space.values())
    chosen: dict[str, Any] = {"name": searcher_name or ("random" if ranged else "single"),
                              "metric": metric, "smaller_is_better": smaller_is_better}
    for key, value in (("max_trials", max_trials), ("max_length", _max_length(max_length)),
                       ("max_concurrent_trials", max_concurrent_trials),
                       ("max_rungs", max_rungs), ("divisor", divisor)):
        if value is not None:
            chosen[key] = value
    text = config_text(path, space, chosen, _command_line(), name)
    if seed is not None:
        import yaml

        text += yaml.safe_dump({"reproducibility": {"experiment_seed": seed}})
    layout = Layout.from_environment()
    try:
        experiment_id = create_experiment(
            layout, text, path.parent,
            warn=lambda warning: click.echo(f"warning: {warning}", err=True))
    except OperationError as error:
        _fail(str(error))
    click.echo(f"experiment {experiment_id} created; `localdet status {experiment_id}` "
               "shows its trials")
    _written(layout, experiment_id, path)
