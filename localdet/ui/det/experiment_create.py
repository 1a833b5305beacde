"""`det e create`, `det e continue` and `det e fork`: experiments made from a config, with
Determined's `--config key=value`, `-f/--follow-first-trial` and `-t/--test-mode`."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import click

from localdet.ui.det import output
from localdet.ui.det.state import layout, records, run, start_daemon_if_needed

CONFIG_HELP = ("set a config value, key=value: dotted keys for nested ones "
               "(resources.slots_per_trial=2), YAML values, commas for a list (repeatable)")


def _overrides(pairs: tuple[str, ...]) -> dict:
    from localdet.operations.creation import parse_overrides

    return run(parse_overrides, pairs)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        output.fail(f"cannot read the config file {path}: {error}")


def follow_first_trial(experiment_id: int) -> None:
    """Print the experiment's first trial's log until that trial stops running, as
    Determined's `-f` did."""
    from localdet.records.states import TERMINAL_STATES
    from localdet.ui import trial_logs

    where = layout()
    click.echo("Waiting for first trial to begin...")
    with records() as (_, db):
        while True:
            trials = db.trials(experiment_id)
            if trials:
                break
            experiment = db.experiment(experiment_id)
            if experiment.state in TERMINAL_STATES:
                output.fail(f"experiment {experiment_id} ended ({experiment.state}) before "
                            f"its first trial began: {experiment.error or 'no reason recorded'}")
            time.sleep(0.2)
        first = min(t.id for t in trials)
        click.echo(f"Following first trial with ID {first}")
        sys.stdout.flush()
        try:
            trial_logs.follow(where, db, first, sys.stdout.buffer)
        except trial_logs.LogError as error:
            output.fail(str(error))
        finally:
            click.echo("Trial log stream ended. To reopen log stream, run: "
                       f"det trial logs -f {first}")


def _test_mode(config_text: str, model_dir: Path | None, overrides: dict,
               includes: tuple[Path, ...]) -> None:
    from localdet.operations.creation import test_mode

    click.echo("Testing the experiment: one trial of a few batches, validated and "
               "checkpointed, in a temporary state folder (nothing is recorded here)...")
    result = run(test_mode, layout(), config_text, model_dir, overrides=overrides,
                 includes=includes, report=lambda check: click.echo(f"  {check}"))
    if not result["passed"]:
        output.fail(f"Model definition test failed: {result['failed']}")
    click.echo("Model definition test succeeded! 🎉")


@click.command("create")
@click.argument("config_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("model_def", required=False, type=click.Path(exists=True, path_type=Path))
@click.option("-i", "--include", "includes", multiple=True,
              type=click.Path(exists=True, path_type=Path),
              help="additional files or folders to copy beside the model definition")
@click.option("--config", "config_pairs", multiple=True, metavar="KEY=VALUE", help=CONFIG_HELP)
@click.option("-f", "--follow-first-trial", is_flag=True,
              help="follow the logs of the first trial that is created")
@click.option("--paused", is_flag=True, help="create it paused (`det e activate` starts it)")
@click.option("-t", "--test-mode", "--test", is_flag=True,
              help="only test the config and model definition: a few batches, a validation "
                   "and a checkpoint round-trip, in a temporary state folder")
@click.option("--local", is_flag=True, help="with --test: the same test (it always runs here)")
@click.option("--template", help="(refused: there are no templates)")
@click.option("--project_id", "--project-id", "project_id", type=int,
              help="(refused: there are no projects)")
@click.option("-p", "--publish", multiple=True, help="(refused: trials run on this machine)")
def create(config_file: Path, model_def: Path | None, includes: tuple[Path, ...],
           config_pairs: tuple[str, ...], follow_first_trial: bool, paused: bool,
           test_mode: bool, local: bool, template: str | None, project_id: int | None,
           publish: tuple[str, ...]) -> None:
    """create experiment from CONFIG_FILE and the MODEL_DEF folder (or file)"""
    from localdet.operations.creation import create_experiment

    if template is not None:
        output.fail("--template is refused: localdet has no templates (a cluster's shared "
                    "config pieces); put those settings in the config file, or pass them "
                    "with --config key=value")
    if project_id is not None:
        output.fail("--project_id is refused: localdet has no workspaces or projects; group "
                    "experiments with labels (`det e label add ID LABEL`)")
    if publish:
        output.fail("--publish is refused: trials run on this machine, so their ports are "
                    "already reachable here")
    if local and not test_mode:
        output.fail("--local needs --test, as in Determined; `localdet run CONFIG DIR` runs "
                    "a whole experiment in the foreground")
    if test_mode and (follow_first_trial or paused):
        output.fail("--test-mode does not go with --follow-first-trial or --paused; "
                    "choose one")
    config_text = _read(config_file)
    overrides = _overrides(config_pairs)
    if test_mode:
        _test_mode(config_text, model_def, overrides, includes)
        return
    from localdet.pids import DaemonLock

    where = layout()
    had_daemon = DaemonLock.holder(where.daemon_lock) is not None
    # The config and model folder are checked first: a refused one starts no daemon.
    experiment_id = run(create_experiment, where, config_text, model_def,
                        overrides=overrides, includes=includes,
                        warn=lambda text: click.echo(f"warning: {text}", err=True))
    if not had_daemon:
        pid = DaemonLock.holder(where.daemon_lock)
        click.echo(f"det: started a localdet daemon (pid {pid}) on {where.home} to run it "
                   "(`localdet daemon stop` stops it)", err=True)
    click.echo(f"Created experiment {experiment_id}")
    if paused:
        from localdet.operations.experiments import act

        with records() as (where, db):
            run(act, where, db, "pause", experiment_id=experiment_id)
        click.echo(f"Paused experiment {experiment_id}")
        return
    if follow_first_trial:
        follow_first_trial_of(experiment_id)


def follow_first_trial_of(experiment_id: int) -> None:
    try:
        follow_first_trial(experiment_id)
    except KeyboardInterrupt:
        click.echo(f"stopped following; experiment {experiment_id} keeps running "
                   f"(`det e describe {experiment_id}`, `det e kill {experiment_id}`)", err=True)
        sys.exit(130)


@click.command("continue")
@click.argument("experiment_id", type=int)
@click.option("--config-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="a config file whose settings change the experiment's")
@click.option("--config", "config_pairs", multiple=True, metavar="KEY=VALUE", help=CONFIG_HELP)
@click.option("-f", "--follow-first-trial", is_flag=True,
              help="follow logs of the trial that is being continued")
def continue_(experiment_id: int, config_file: Path | None, config_pairs: tuple[str, ...],
              follow_first_trial: bool) -> None:
    """resume or recover training for a single-searcher experiment"""
    from localdet.operations.lineage import config_file_overrides, continue_experiment

    overrides: dict[str, Any] = {}
    if config_file is not None:
        overrides.update(run(config_file_overrides, _read(config_file)))
    overrides.update(_overrides(config_pairs))
    with records() as (where, db):
        run(continue_experiment, where, db, experiment_id, overrides or None)
        start_daemon_if_needed(where, "the continued training")
    click.echo(f"Continued experiment {experiment_id}")
    if follow_first_trial:
        follow_first_trial_of(experiment_id)


@click.command("fork")
@click.argument("experiment_id", type=int)
@click.option("--config-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="the new experiment's config (default: the parent's)")
@click.option("--config", "config_pairs", multiple=True, metavar="KEY=VALUE", help=CONFIG_HELP)
@click.option("-f", "--follow-first-trial", is_flag=True,
              help="follow the logs of the new experiment's first trial")
def fork(experiment_id: int, config_file: Path | None, config_pairs: tuple[str, ...],
         follow_first_trial: bool) -> None:
    """create an experiment from another's config and model definition (changed as asked)"""
    from localdet.operations.lineage import fork as forked

    config_text = _read(config_file) if config_file is not None else None
    overrides = _overrides(config_pairs)
    with records() as (where, db):
        new_id = run(forked, where, db, experiment_id, config_text, overrides or None)
        start_daemon_if_needed(where, "the new experiment")
    click.echo(f"Created experiment {new_id} (forked from experiment {experiment_id})")
    if follow_first_trial:
        follow_first_trial_of(new_id)


COMMANDS = (create, continue_, fork)
