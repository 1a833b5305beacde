"""`det checkpoint` (`det c`): describe, download, list and delete checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import click

from localdet.ui.det import output
from localdet.ui.det.groups import AliasedGroup
from localdet.ui.det.state import reading, records, run


@click.group("checkpoint", cls=AliasedGroup, aliases={"ls": "list"},
             context_settings={"help_option_names": ["-h", "--help"]})
def command() -> None:
    """manage checkpoints"""


def render_checkpoint(facts: dict, path: Path | None = None) -> None:
    """One checkpoint as Determined's CLI showed it (its local path first, when downloaded)."""
    if path is not None:
        click.echo("Local checkpoint path:")
        click.echo(f"{path} \n")
    metadata = facts.get("metadata") or {}
    output.table(["Experiment ID", "Trial ID", "Steps Completed", "Report Time",
                  "Checkpoint UUID", "Validation Metrics", "Metadata"],
                 [[facts["experiment_id"], facts["trial_id"],
                   metadata.get("steps_completed", facts.get("batches_trained")),
                   output.format_time(facts.get("created_at")), facts["uuid"],
                   json.dumps({"avgMetrics": facts.get("validation_metrics") or {}}, indent=4),
                   json.dumps(metadata, indent=4)]])


def print_checkpoints(experiment_id: int, best: int | None, as_csv: bool,
                      as_json: bool) -> None:
    """`det e lc` / `det c list`: an experiment's checkpoints, by end time; with `best`,
    the best N of those validated where they were taken."""
    from localdet.operations.checkpoints import list_checkpoints

    with reading() as (_, db):
        if best:
            found = [c for c in run(list_checkpoints, db, experiment_id)
                     if c.get("searcher_metric_value") is not None][:best]
        else:
            found = run(list_checkpoints, db, experiment_id, sort_by="end_time", order="asc")
        # The Resources and Size columns: each file's size, from the manifests in one read.
        files = {c.uuid: {name: entry["size"] for name, entry
                          in c.manifest.get("files", {}).items()}
                 for c in db.checkpoints(experiment_id)}
    if as_json:
        output.print_json(found)
        return
    output.table(["Trial ID", "# of Batches", "State", "Validation Metric", "UUID", "Resources",
                  "Size"],
                 [[c["trial_id"], c["batches_trained"], c["state"],
                   "" if c.get("searcher_metric_value") is None else c["searcher_metric_value"],
                   c["uuid"], "\n".join(sorted(files.get(c["uuid"], {}))),
                   output.size(sum(files.get(c["uuid"], {}).values()))] for c in found], as_csv)


@command.command("list")
@click.argument("experiment_id", type=int)
@click.option("--best", type=click.IntRange(min=1), metavar="N",
              help="the best N checkpoints (those with a validation metric only)")
@click.option("--csv", "as_csv", is_flag=True, help="print as CSV")
@click.option("--json", "as_json", is_flag=True, help="print as JSON")
def list_(experiment_id: int, best: int | None, as_csv: bool, as_json: bool) -> None:
    """list checkpoints of experiment (as `det e list-checkpoints`)"""
    print_checkpoints(experiment_id, best, as_csv, as_json)



@command.command("describe")
@click.argument("uuid")
@click.option("--json", "as_json", is_flag=True, help="print as JSON")
def describe(uuid: str, as_json: bool) -> None:
    """describe checkpoint"""
    from localdet.operations.checkpoints import describe_checkpoint

    with reading() as (layout, db):
        facts = run(describe_checkpoint, layout, db, uuid)
    if as_json:
        output.print_json(facts)
    else:
        render_checkpoint(facts)


@command.command("download")
@click.argument("uuid")
@click.option("-o", "--output-dir", help="where to write it (default checkpoints/<uuid>)")
@click.option("-q", "--quiet", is_flag=True, help="only print the path to the checkpoint")
@click.option("--mode", type=click.Choice(["auto", "direct", "master"]), default="auto",
              help="accepted for Determined's scripts: checkpoints are always read directly")
def download(uuid: str, output_dir: str | None, quiet: bool, mode: str) -> None:
    """download checkpoint from its storage"""
    from localdet.operations.checkpoints import describe_checkpoint, download_checkpoint

    with reading() as (layout, db):
        facts = run(describe_checkpoint, layout, db, uuid)
        path = run(download_checkpoint, layout, db, facts["uuid"],
                   Path(output_dir) if output_dir else None)
    if quiet:
        click.echo(str(path))
    else:
        render_checkpoint(facts, path)


@command.command("delete")
@click.argument("checkpoints_uuids")
@click.option("--yes", is_flag=True, help="automatically answer yes to prompts")
def delete(checkpoints_uuids: str, yes: bool) -> None:
    """delete checkpoints (CHECKPOINTS_UUIDS: comma-separated)"""
    from localdet.operations.checkpoints import delete_checkpoint

    uuids = [u.strip() for u in checkpoints_uuids.split(",") if u.strip()]
    if not yes and not output.yes_or_no(
            f"Delete {len(uuids)} checkpoint(s) and their stored files (those no other "
            "checkpoint shares)? This cannot be undone. Delete?"):
        click.echo("Stopping deletion of checkpoints.")
        return
    with records() as (layout, db):
        for uuid in uuids:
            run(delete_checkpoint, layout, db, uuid)
    click.echo(f"Deleted checkpoints {', '.join(uuids)}")
