"""`localdet describe / note / label / archive / unarchive / delete`: the catalog commands,
spellings over localdet/operations/experiments.py and deletion.py (as `det e ...` is).

    localdet label add 3 baseline
    localdet note 3 "lr too high; try 1e-4"
    localdet archive 3                 # out of `localdet status`; `status --all` shows it
    localdet delete 3 --yes            # rows, logs, TensorBoard files, model folder, blobs
    localdet describe 3 --json
"""

from __future__ import annotations

import json
import sys
from typing import Any, Callable

import click

from localdet.paths import Layout


def _fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(1)


def _run(operation: Callable[..., Any], *args: Any, read_only: bool = False,
         **kwargs: Any) -> Any:
    """Run an operation over the open state (opened read-only for one that only reads),
    its one-sentence refusal printed as an error."""
    from localdet.operations.errors import NotFound, OperationError
    from localdet.records.db import StateDB

    layout = Layout.from_environment()
    if not layout.db.exists():
        _fail(f"no localdet state at {layout.home}; start `localdet daemon` or submit an "
              "experiment first")
    with (StateDB.open_readonly(layout.db) if read_only else StateDB.open(layout.db)) as db:
        try:
            return operation(layout, db, *args, **kwargs)
        except (OperationError, NotFound) as error:
            _fail(str(error))


@click.command()
@click.argument("experiment_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print the facts as JSON.")
def describe(experiment_id: int, as_json: bool) -> None:
    """An experiment's facts with its description, labels, notes and lineage."""
    from localdet.operations import experiments

    facts = _run(experiments.describe, experiment_id, read_only=True)
    if as_json:
        click.echo(json.dumps(facts, indent=2))
        return
    lines = [f"{facts['kind'].capitalize()} {facts['id']}: {facts['name']} ({facts['state']}"
             f"{', archived' if facts['archived'] else ''})"]
    if facts["description"]:
        lines.append(f"description: {facts['description']}")
    if facts["labels"]:
        lines.append(f"labels: {', '.join(facts['labels'])}")
    if facts["parent_id"] is not None:
        lines.append(f"forked from experiment {facts['parent_id']}")
    if facts["forks"]:
        lines.append(f"forks: {', '.join(map(str, facts['forks']))}")
    for continued in facts["continued"]:
        lines.append(f"continued at {continued['at'][:19]}")
    lines.append(f"trials: {len(facts['trials'])}")
    if facts.get("best_metric") is not None:
        lines.append(f"best {facts['metric']}: {facts['best_metric']:.6g} "
                     f"(trial {facts['best_trial']})")
    if facts["notes"]:
        lines += ["notes:", *(f"  {line}" for line in facts["notes"].splitlines())]
    click.echo("\n".join(lines))


@click.command()
@click.argument("experiment_id", type=int)
@click.argument("text", required=False)
@click.option("--description", "is_description", is_flag=True,
              help="Set the one-line description instead of the notes.")
def note(experiment_id: int, text: str | None, is_description: bool) -> None:
    """Set an experiment's free-text notes to TEXT ('-' reads them from stdin), or print
    them when TEXT is left out."""
    from localdet.operations import experiments

    field = "description" if is_description else "notes"
    if text is None:
        click.echo(_run(lambda layout, db: experiments.describe(layout, db, experiment_id),
                        read_only=True)[field])
        return
    if text == "-":
        text = sys.stdin.read()
    setter = experiments.set_description if is_description else experiments.set_notes
    _run(lambda layout, db: setter(db, experiment_id, text))
    click.echo(f"{field} of experiment {experiment_id} set")


@click.group()
def label() -> None:
    """Add or remove an experiment's labels (`localdet status --label L` filters by them)."""


@label.command("add")
@click.argument("experiment_id", type=int)
@click.argument("label_text", metavar="LABEL")
def label_add(experiment_id: int, label_text: str) -> None:
    """Add LABEL to the experiment."""
    from localdet.operations import experiments

    result = _run(lambda layout, db: experiments.add_label(db, experiment_id, label_text))
    click.echo(f"experiment {experiment_id} labels: {', '.join(result['labels'])}")


@label.command("remove")
@click.argument("experiment_id", type=int)
@click.argument("label_text", metavar="LABEL")
def label_remove(experiment_id: int, label_text: str) -> None:
    """Remove LABEL from the experiment."""
    from localdet.operations import experiments

    result = _run(lambda layout, db: experiments.remove_label(db, experiment_id, label_text))
    click.echo(f"experiment {experiment_id} labels: {', '.join(result['labels']) or 'none'}")


@click.command()
@click.argument("experiment_id", type=int)
def archive(experiment_id: int) -> None:
    """Hide an ended experiment from the default listings; everything it recorded stays."""
    from localdet.operations import experiments

    _run(lambda layout, db: experiments.archive(db, experiment_id))
    click.echo(f"experiment {experiment_id} archived")


@click.command()
@click.argument("experiment_id", type=int)
def unarchive(experiment_id: int) -> None:
    """Show an archived experiment in the default listings again."""
    from localdet.operations import experiments

    _run(lambda layout, db: experiments.unarchive(db, experiment_id))
    click.echo(f"experiment {experiment_id} unarchived")


@click.command()
@click.argument("experiment_id", type=int)
@click.option("--yes", is_flag=True, help="Delete without asking.")
def delete(experiment_id: int, yes: bool) -> None:
    """Delete an ended experiment for good: its records, logs, TensorBoard files, model
    folder and the checkpoint files no other checkpoint shares (`localdet archive` only
    hides one)."""
    from localdet.operations import deletion

    if not yes and not click.confirm(
            f"Delete experiment {experiment_id} with its logs and checkpoints? This cannot be "
            "undone (`localdet archive` hides it instead)", default=False):
        _fail("nothing was deleted")
    result = _run(deletion.delete_experiment, experiment_id)
    freed = f"{result['bytes_freed'] / 1e6:.1f} MB"
    line = f"experiment {experiment_id} deleted; freed {result['blobs_deleted']} blobs ({freed})"
    if result["blobs_deferred"]:
        line += ("; its remaining checkpoint files are freed by the next `localdet gc` (a "
                 "checkpoint was being written)")
    click.echo(line)


COMMANDS = (describe, note, label, archive, unarchive, delete)
