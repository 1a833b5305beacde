"""`det trial` (`det t`): describe a trial, print its log, kill it, download a checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import click

from localdet.ui.det import output
from localdet.ui.det.state import reading, records, run


@click.group("trial", context_settings={"help_option_names": ["-h", "--help"]})
def command() -> None:
    """manage trials"""


@command.command("describe")
@click.argument("trial_id", type=int)
@click.option("--metrics-summary", is_flag=True, help="display summary of metrics")
@click.option("--metrics", "show_metrics", is_flag=True,
              help="display full metrics, such as batch metrics")
@click.option("--csv", "as_csv", is_flag=True, help="print as CSV")
@click.option("--json", "as_json", is_flag=True, help="print as JSON")
def describe(trial_id: int, metrics_summary: bool, show_metrics: bool, as_csv: bool,
             as_json: bool) -> None:
    """describe trial"""
    from localdet.operations.trials import describe_trial
    from localdet.ui.det.workloads import workloads

    if as_csv and as_json:
        output.fail("--csv and --json do not go together; choose one")
    with reading() as (_, db):
        trial = run(describe_trial, db, trial_id)
        steps = workloads(db, trial_id)
    summary = trial["summary_metrics"]
    if as_json:
        output.print_json({
            "trial": {"id": trial["id"], "experimentId": trial["experiment_id"],
                      "state": f"STATE_{trial['state']}", "hparams": trial["hparams"],
                      "startTime": trial["started_at"], "endTime": trial["ended_at"],
                      "totalBatchesProcessed": trial["batches_trained"],
                      "restarts": trial["restarts"],
                      "latestCheckpoint": trial["latest_checkpoint"],
                      "summaryMetrics": summary},
            "workloads": [{"totalBatches": s["batches"], "training": s.get("training"),
                           "validation": s.get("validation"),
                           "checkpoint": s["checkpoint"].uuid if s.get("checkpoint") else None}
                          for s in steps]})
        return
    output.table(["Experiment ID", "State", "H-Params", "Summary Metrics", "Started", "Ended"],
                 [[trial["experiment_id"], trial["state"], json.dumps(trial["hparams"], indent=4),
                   json.dumps(summary, indent=4), output.format_time(trial["started_at"]),
                   output.format_time(trial["ended_at"])]], as_csv)
    headers = ["# of Batches", "Report Time", "Checkpoint", "Checkpoint UUID",
               "Checkpoint Metadata", "Validation Metrics"]
    headers += ["Workload Metrics"] if show_metrics else []
    rows = []
    for s in steps:
        checkpoint = s.get("checkpoint")
        times = [t for t in (s.get("training_time"), s.get("validation_time"),
                             checkpoint.created_at if checkpoint else None) if t]
        rows.append([s["batches"], output.format_time(max(times)),
                     checkpoint.state if checkpoint else None,
                     checkpoint.uuid if checkpoint else None,
                     json.dumps(checkpoint.metadata, indent=4) if checkpoint else None,
                     json.dumps(s["validation"], indent=4) if "validation" in s else None]
                    + ([json.dumps(s.get("training"), indent=4) if "training" in s else None]
                       if show_metrics else []))
    click.echo()
    click.echo("Workloads:")
    output.table(headers, rows, as_csv)
    if metrics_summary:
        output.print_json(summary)


@command.command("logs")
@click.argument("trial_id", type=int)
@click.option("-f", "--follow", is_flag=True,
              help="follow the logs of a running trial, similar to tail -f")
@click.option("--head", type=click.IntRange(min=0), help="number of lines from the start")
@click.option("--tail", type=click.IntRange(min=0), help="number of lines from the end")
def logs(trial_id: int, follow: bool, head: int | None, tail: int | None) -> None:
    """fetch trial logs"""
    from localdet.ui.det.logs import show_log

    show_log(trial_id, follow, head, tail)


@command.command("kill")
@click.argument("trial_id", type=int)
def kill(trial_id: int) -> None:
    """forcibly terminate a trial"""
    from localdet.operations.experiments import act
    from localdet.ui.det.state import start_daemon_if_needed

    with records() as (where, db):
        run(act, where, db, "kill", trial_id=trial_id)
        if db.experiment(db.trial(trial_id).experiment_id).managed:
            start_daemon_if_needed(where, "the kill")
    click.echo(f"Killed trial {trial_id}")


@command.command("download")
@click.argument("trial_id", type=int)
@click.option("--best", is_flag=True, help="the checkpoint with the best validation metric")
@click.option("--latest", is_flag=True, help="the most recent checkpoint")
@click.option("--uuid", help="the checkpoint with this UUID")
@click.option("-o", "--output-dir", help="where to write it (default checkpoints/<uuid>)")
@click.option("--sort-by", help="with --best: the validation metric to sort by (default: the "
                                "searcher metric); needs --smaller-is-better")
@click.option("--smaller-is-better", type=click.BOOL, default=None,
              help="with --sort-by: the sort order (true or false)")
@click.option("-q", "--quiet", is_flag=True, help="only print the path to the checkpoint")
def download(trial_id: int, best: bool, latest: bool, uuid: str | None, output_dir: str | None,
             sort_by: str | None, smaller_is_better: bool | None, quiet: bool) -> None:
    """download checkpoint for trial"""
    from localdet.operations.checkpoints import download_checkpoint, list_checkpoints
    from localdet.ui.det.checkpoint import render_checkpoint

    if [best, latest, uuid is not None].count(True) != 1:
        output.fail("exactly one of --latest, --best, or --uuid must be set")
    if sort_by is not None and not best:
        output.fail("--sort-by and --smaller-is-better flags can only be used with --best")
    if (sort_by is None) != (smaller_is_better is None):
        output.fail("--sort-by and --smaller-is-better must be set together")
    with reading() as (where, db):
        if uuid is not None:
            found = run(list_checkpoints, db, trial_id=trial_id)
            chosen = [c for c in found if c["uuid"].startswith(uuid)]
            if len(chosen) != 1:
                output.fail(f"{'no' if not chosen else 'more than one'} checkpoint of trial "
                            f"{trial_id} matches '{uuid}'; `det e lc EXPERIMENT` lists them")
        elif latest:
            chosen = run(list_checkpoints, db, trial_id=trial_id, sort_by="batch_number",
                         order="desc", max_results=1)
        else:
            order = None if smaller_is_better is None else (
                "asc" if smaller_is_better else "desc")
            chosen = run(list_checkpoints, db, trial_id=trial_id, metric=sort_by, order=order,
                         max_results=1)
        if not chosen:
            output.fail(f"No checkpoints found for trial {trial_id}")
        path = run(download_checkpoint, where, db, chosen[0]["uuid"],
                   Path(output_dir) if output_dir else None)
    if quiet:
        click.echo(str(path))
    else:
        render_checkpoint(chosen[0], path)
