"""`det e label add/remove` and `det e set ...`: an experiment's labels and attributes."""

from __future__ import annotations

import click

from localdet.ui.det import output
from localdet.ui.det.state import records, run


@click.group("label")
def label() -> None:
    """manage experiment labels"""


@label.command("add")
@click.argument("experiment_id", type=int)
@click.argument("label")
def add_label(experiment_id: int, label: str) -> None:
    """add label"""
    from localdet.operations.experiments import add_label as added

    with records() as (_, db):
        run(added, db, experiment_id, label)
    click.echo(f"Added label '{label}' to experiment {experiment_id}")


@label.command("remove")
@click.argument("experiment_id", type=int)
@click.argument("label")
def remove_label(experiment_id: int, label: str) -> None:
    """remove label"""
    from localdet.operations.experiments import remove_label as removed

    with records() as (_, db):
        run(removed, db, experiment_id, label)
    click.echo(f"Removed label '{label}' from experiment {experiment_id}")


@click.group("set")
def set_() -> None:
    """set experiment attributes"""


@set_.command("description")
@click.argument("experiment_id", type=int)
@click.argument("description")
def set_description(experiment_id: int, description: str) -> None:
    """set experiment description"""
    from localdet.operations.experiments import set_description as change

    with records() as (_, db):
        run(change, db, experiment_id, description)
    click.echo(f"Set description of experiment {experiment_id} to '{description}'")


@set_.command("name")
@click.argument("experiment_id", type=int)
@click.argument("name")
def set_name(experiment_id: int, name: str) -> None:
    """set experiment name"""
    from localdet.operations.experiments import set_name as change

    with records() as (_, db):
        run(change, db, experiment_id, name)
    click.echo(f"Set name of experiment {experiment_id} to '{name}'")


@set_.command("notes")
@click.argument("experiment_id", type=int)
@click.argument("notes")
def set_notes(experiment_id: int, notes: str) -> None:
    """set experiment notes (free text; '-' reads them from stdin)"""
    import sys

    from localdet.operations.experiments import set_notes as change

    text = sys.stdin.read() if notes == "-" else notes
    with records() as (_, db):
        run(change, db, experiment_id, text)
    click.echo(f"Set notes of experiment {experiment_id}")


@set_.command("priority")
@click.argument("experiment_id", type=int)
@click.argument("priority", type=int)
def set_priority(experiment_id: int, priority: int) -> None:
    """set `priority` of experiment"""
    from localdet.operations.experiments import set_priority as change

    with records() as (_, db):
        run(change, db, experiment_id, priority)
    click.echo(f"Set `priority` of experiment {experiment_id} to {priority}")


def _none_or_int(text: str) -> int | None:
    if text.strip().lower() in ("null", "none"):
        return None
    try:
        return int(text)
    except ValueError:
        output.fail(f"max slots {text!r} is not a whole number or 'none'")


@set_.command("max-slots")
@click.argument("experiment_id", type=int)
@click.argument("max_slots")
def set_max_slots(experiment_id: int, max_slots: str) -> None:
    """set `max_slots` of experiment (a number, or none)"""
    from localdet.operations.experiments import set_max_slots as change

    value = _none_or_int(max_slots)
    with records() as (_, db):
        run(change, db, experiment_id, value)
    click.echo(f"Set `max_slots` of experiment {experiment_id} to {value}")


@set_.command("gc-policy")
@click.argument("experiment_id", type=int)
@click.option("--save-experiment-best", type=click.IntRange(min=0), required=True,
              help="number of best checkpoints per experiment to save")
@click.option("--save-trial-best", type=click.IntRange(min=0), required=True,
              help="number of best checkpoints per trial to save")
@click.option("--save-trial-latest", type=click.IntRange(min=0), required=True,
              help="number of latest checkpoints per trial to save")
@click.option("--yes", is_flag=True, help="automatically answer yes to prompts")
def set_gc_policy(experiment_id: int, save_experiment_best: int, save_trial_best: int,
                  save_trial_latest: int, yes: bool) -> None:
    """set experiment GC policy and run GC"""
    import pprint

    from localdet.operations.experiments import set_gc_policy as change

    policy = {"save_experiment_best": save_experiment_best,
              "save_trial_best": save_trial_best, "save_trial_latest": save_trial_latest}
    if not yes and not output.yes_or_no(
            "A new checkpoint policy may delete checkpoints it does not keep, and that "
            "cannot be undone. Change it?"):
        click.echo("Aborting operations.")
        return
    with records() as (_, db):
        run(change, db, experiment_id, **policy)
    click.echo(f"Set GC policy of experiment {experiment_id} to\n{pprint.pformat(policy)}")


@set_.command("weight")
@click.argument("experiment_id", type=int)
@click.argument("weight", type=float)
def set_weight(experiment_id: int, weight: float) -> None:
    """(refused: no fair-share scheduler; use `set priority`)"""
    output.fail("`det e set weight` is for a cluster's fair-share scheduler, which localdet "
                f"does not have; `det e set priority {experiment_id} N` orders experiments")


@set_.command("log-retention")
@click.argument("experiment_id", type=int)
@click.option("--days", type=int)
@click.option("--forever", is_flag=True)
def set_log_retention(experiment_id: int, days: int | None, forever: bool) -> None:
    """(refused: logs are kept until the experiment is deleted)"""
    output.fail("`det e set log-retention` does not apply: localdet keeps an experiment's "
                f"logs until it is deleted (`det e delete {experiment_id}`)")


COMMANDS = (label, set_)
