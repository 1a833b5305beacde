"""`det experiment` (`det e`): Determined's experiment commands over localdet's records.

The commands that create experiments (create, continue, fork) are in experiment_create.py,
those that change attributes (label, set) in experiment_set.py.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from localdet.ui.det import output
from localdet.ui.det.groups import AliasedGroup
from localdet.ui.det.state import reading, records, run

# Determined's experiment states in its API's JSON.
API_STATE = "STATE_{}"


@click.group("experiment", cls=AliasedGroup, invoke_without_command=True,
             aliases={"ls": "list", "lt": "list-trials", "lc": "list-checkpoints",
                      "unpause": "activate"},
             context_settings={"help_option_names": ["-h", "--help"]})
@click.pass_context
def command(ctx: click.Context) -> None:
    """manage experiments (`det e` alone lists them)"""
    if ctx.invoked_subcommand is None:
        ctx.invoke(list_experiments)


def experiment_id_argument(function: Any) -> Any:
    return click.argument("experiment_id", type=int)(function)


def _owner() -> str:
    import getpass

    return getpass.getuser()


# -- inspection ---------------------------------------------------------------------------

@command.command("list")
@click.option("-a", "--all", "show_all", is_flag=True,
              help="show all experiments (including archived ones)")
@click.option("--label", "labels", multiple=True, metavar="LABEL",
              help="only experiments with this label (repeat for several: all of them)")
@click.option("--limit", type=click.IntRange(min=1), help="at most this many")
@click.option("--offset", type=click.IntRange(min=0), default=0, help="skip this many first")
@click.option("--csv", "as_csv", is_flag=True, help="print as CSV")
@click.option("--json", "as_json", is_flag=True, help="print as JSON")
def list_experiments(show_all: bool = False, labels: tuple[str, ...] = (),
                     limit: int | None = None, offset: int = 0, as_csv: bool = False,
                     as_json: bool = False) -> None:
    """list experiments"""
    from localdet.ui.det import state

    found: list[dict] = []
    if state.exists():
        from localdet.operations.experiments import list_experiments as listed

        with reading(empty_ok=True) as (_, db):
            found = run(listed, db, archived=None if show_all else False, labels=labels,
                        kind="experiment")
    found = found[offset:offset + limit if limit else None]
    if as_json:
        output.print_json(found)
        return
    owner = _owner()
    headers = ["ID", "Owner", "Name", "Parent ID", "State", "Progress", "Started", "Ended",
               "Resource Pool"] + (["Archived"] if show_all else [])
    rows = [[e["id"], owner, e["name"], e.get("parent_id"), e["state"],
             output.format_percent(e.get("progress")), output.format_time(e.get("submitted_at")),
             output.format_time(e.get("ended_at")), "default"]
            + ([bool(e.get("archived"))] if show_all else []) for e in found]
    output.table(headers, rows, as_csv)


@command.command("config")
@experiment_id_argument
def config(experiment_id: int) -> None:
    """display experiment config"""
    import yaml

    from localdet.operations.experiments import describe

    with reading() as (layout, db):
        facts = run(describe, layout, db, experiment_id)
    click.echo(yaml.safe_dump(facts["config"], default_flow_style=False, sort_keys=False),
               nl=False)


def _api_json(facts: dict) -> dict:
    """One experiment as Determined's GetExperiment response named things, with what
    localdet adds (notes, forks, continuations, trials) beside."""
    return {
        "experiment": {
            "id": facts["id"], "name": facts["name"],
            "description": facts.get("description", ""),
            "labels": facts.get("labels", []), "notes": facts.get("notes", ""),
            "state": API_STATE.format(facts["state"]), "archived": facts.get("archived"),
            "progress": facts.get("progress"), "startTime": facts.get("submitted_at"),
            "endTime": facts.get("ended_at"), "forkedFrom": facts.get("parent_id"),
            "searcherType": facts.get("searcher"), "numTrials": len(facts.get("trials", [])),
            "resourcePool": "default", "username": _owner(),
        },
        "config": facts.get("config"),
        "forks": facts.get("forks", []),
        "continued": facts.get("continued", []),
        "trials": facts.get("trials", []),
    }


def _scalars(steps: list[dict], kind: str) -> list[str]:
    names: set[str] = set()
    for step in steps:
        names |= {k for k, v in (step.get(kind) or {}).items()
                  if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return sorted(names)


@command.command("describe")
@click.argument("experiment_ids")
@click.option("--metrics", "show_metrics", is_flag=True, help="display full metrics")
@click.option("--csv", "as_csv", is_flag=True, help="print as CSV")
@click.option("--json", "as_json", is_flag=True, help="print as JSON")
@click.option("--outdir", type=click.Path(file_okay=False, path_type=Path),
              help="directory to save output")
def describe(experiment_ids: str, show_metrics: bool, as_csv: bool, as_json: bool,
             outdir: Path | None) -> None:
    """describe experiment (EXPERIMENT_IDS: comma-separated)"""
    import json

    from localdet.operations.experiments import describe as described

    try:
        ids = [int(part) for part in experiment_ids.split(",") if part.strip()]
    except ValueError:
        output.fail(f"{experiment_ids!r} is not a comma-separated list of experiment IDs")
    if sum([as_csv, as_json, outdir is not None]) > 1:
        output.fail("--csv, --json and --outdir do not go together; choose one")
    from localdet.operations.trials import experiment_trials
    from localdet.ui.det.workloads import workloads

    with reading() as (layout, db):
        facts = [run(described, layout, db, i) for i in ids]
        if as_json:
            output.print_json([_api_json(f) for f in facts])
            return
        trials = {f["id"]: run(experiment_trials, db, f["id"]) for f in facts}
        steps_by_trial = {t["id"]: workloads(db, t["id"])
                          for f in facts for t in trials[f["id"]]}
    if outdir is not None:
        outdir.mkdir(parents=True, exist_ok=True)

    def section(title: str, filename: str, headers: list[str], rows: list[list]) -> None:
        if outdir is None:
            click.echo(title)
            output.table(headers, rows, as_csv)
            return
        with open(outdir / filename, "w") as out:
            import csv

            writer = csv.writer(out)
            writer.writerow(headers)
            writer.writerows(rows)

    section("Experiment:", "experiments.csv",
            ["Experiment ID", "State", "Progress", "Started", "Ended", "Name", "Description",
             "Archived", "Resource Pool", "Labels"],
            [[f["id"], f["state"], output.format_percent(f.get("progress")),
              output.format_time(f.get("submitted_at")), output.format_time(f.get("ended_at")),
              f["name"], f.get("description", ""), bool(f.get("archived")), "default",
              ", ".join(sorted(f.get("labels", [])))] for f in facts])
    if outdir is None and not as_csv:  # (CSV stays tables only)
        for f in facts:
            _lineage(f)
    section("\nTrials:", "trials.csv",
            ["Trial ID", "Experiment ID", "State", "Started", "Ended", "H-Params"],
            [[t["id"], f["id"], t["state"], output.format_time(t.get("started_at")),
              output.format_time(t.get("ended_at")), json.dumps(t["hparams"], indent=4)]
             for f in facts for t in trials[f["id"]]])
    steps = [s for trial_steps in steps_by_trial.values() for s in trial_steps]
    training = _scalars(steps, "training") if show_metrics else []
    validation = _scalars(steps, "validation") if show_metrics else []
    rows = []
    for trial_id, trial_steps in steps_by_trial.items():
        for s in trial_steps:
            checkpoint = s.get("checkpoint")
            checkpoint_state = checkpoint.state if checkpoint else ""
            validation_state = "COMPLETED" if "validation" in s else ""
            times = [s.get("training_time"), s.get("validation_time"),
                     checkpoint.created_at if checkpoint else None]
            rows.append([trial_id, s["batches"], checkpoint_state or validation_state,
                         output.format_time(max(t for t in times if t))]
                        + [(s.get("training") or {}).get(n) for n in training]
                        + [checkpoint_state,
                           output.format_time(checkpoint.created_at) if checkpoint else None,
                           validation_state, output.format_time(s.get("validation_time"))]
                        + [(s.get("validation") or {}).get(n) for n in validation])
    section("\nWorkloads:", "workloads.csv",
            ["Trial ID", "# of Batches", "State", "Report Time"]
            + [f"Training Metric: {n}" for n in training]
            + ["Checkpoint State", "Checkpoint Report Time", "Validation State",
               "Validation Report Time"]
            + [f"Validation Metric: {n}" for n in validation], rows)


def _lineage(facts: dict) -> None:
    """What localdet adds below the experiment table: notes, forks, continuations."""
    lines = []
    if facts.get("parent_id") is not None:
        lines.append(f"Forked from experiment {facts['parent_id']}")
    if facts.get("forks"):
        lines.append(f"Forked into experiment(s) {', '.join(map(str, facts['forks']))}")
    for step in facts.get("continued", []):
        lines.append("Continued " + ", ".join(f"{k} {v}" for k, v in step.items()
                                              if v not in (None, "", {}, [])))
    if facts.get("notes"):
        lines.append("Notes: " + facts["notes"].replace("\n", "\n       "))
    if lines:
        click.echo(f"Experiment {facts['id']}: " + "\n".join(lines) if len(lines) == 1
                   else f"Experiment {facts['id']}:\n  " + "\n  ".join(lines))


@command.command("logs")
@experiment_id_argument
@click.option("-f", "--follow", is_flag=True,
              help="follow the logs of a running trial, similar to tail -f")
@click.option("--head", type=click.IntRange(min=0), help="number of lines from the start")
@click.option("--tail", type=click.IntRange(min=0), help="number of lines from the end")
def logs(experiment_id: int, follow: bool, head: int | None, tail: int | None) -> None:
    """fetch logs of the first trial of an experiment"""
    with reading() as (_, db):
        trials = run(db.trials, experiment_id)
        if not trials:
            run(db.experiment, experiment_id)  # NotFound when there is no such experiment
            output.fail(f"experiment {experiment_id} has no trial yet")
    from localdet.ui.det.logs import show_log

    show_log(min(t.id for t in trials), follow, head, tail)


@command.command("list-trials")
@experiment_id_argument
@click.option("--limit", type=click.IntRange(min=1), help="at most this many")
@click.option("--offset", type=click.IntRange(min=0), default=0, help="skip this many first")
@click.option("--csv", "as_csv", is_flag=True, help="print as CSV")
@click.option("--json", "as_json", is_flag=True, help="print as JSON")
def list_trials(experiment_id: int, limit: int | None, offset: int, as_csv: bool,
                as_json: bool) -> None:
    """list trials of experiment"""
    import json

    from localdet.operations.trials import experiment_trials

    with reading() as (_, db):
        trials = run(experiment_trials, db, experiment_id)
    trials = trials[offset:offset + limit if limit else None]
    if as_json:
        output.print_json(trials)
        return
    output.table(["Trial ID", "State", "H-Params", "Started", "Ended", "# of Batches"],
                 [[t["id"], t["state"], json.dumps(t["hparams"], indent=4),
                   output.format_time(t.get("started_at")), output.format_time(t.get("ended_at")),
                   t["batches_trained"]] for t in trials], as_csv)


@command.command("list-checkpoints")
@experiment_id_argument
@click.option("--best", type=click.IntRange(min=1), metavar="N",
              help="the best N checkpoints (those with a validation metric only)")
@click.option("--csv", "as_csv", is_flag=True, help="print as CSV")
@click.option("--json", "as_json", is_flag=True, help="print as JSON")
def list_checkpoints(experiment_id: int, best: int | None, as_csv: bool, as_json: bool) -> None:
    """list checkpoints of experiment"""
    from localdet.ui.det.checkpoint import print_checkpoints

    print_checkpoints(experiment_id, best, as_csv, as_json)


@command.command("download-model-def")
@experiment_id_argument
@click.option("--output-dir", type=click.Path(file_okay=False, path_type=Path), default=".",
              show_default=True, help="output directory")
def download_model_def(experiment_id: int, output_dir: Path) -> None:
    """download model definition (as experiment_ID_model_def.tgz)"""
    from localdet.operations.model_def import download_model_def as download

    with reading() as (layout, db):
        written = run(download, layout, db, experiment_id, output_dir)
    # The name Determined's CLI gave it (the SDK's download_code names it otherwise).
    path = written.replace(output_dir / f"experiment_{experiment_id}_model_def.tgz")
    click.echo(f"Model definition of experiment {experiment_id} written to {path}", err=True)


@command.command("download")
@experiment_id_argument
@click.option("-o", "--output-dir", default="checkpoints", show_default=True,
              help="top folder: each checkpoint goes to OUTPUT_DIR/<uuid>")
@click.option("--top-n", type=click.IntRange(min=1), default=1, show_default=True,
              help="how many of the best checkpoints to download")
@click.option("--sort-by", help="validation metric to sort by (default: the searcher metric); "
                                "needs --smaller-is-better")
@click.option("--smaller-is-better", type=click.BOOL, default=None,
              help="sort order for --sort-by (true or false)")
@click.option("-q", "--quiet", is_flag=True, help="only print the checkpoints' paths")
def download(experiment_id: int, output_dir: str, top_n: int, sort_by: str | None,
             smaller_is_better: bool | None, quiet: bool) -> None:
    """download checkpoints for an experiment"""
    from localdet.operations.checkpoints import download_checkpoint, list_checkpoints
    from localdet.ui.det.checkpoint import render_checkpoint

    if (sort_by is None) != (smaller_is_better is None):
        output.fail("--sort-by and --smaller-is-better go together; give both or neither")
    order = None if smaller_is_better is None else ("asc" if smaller_is_better else "desc")
    top = Path(output_dir)
    with reading() as (layout, db):
        chosen = run(list_checkpoints, db, experiment_id, metric=sort_by, order=order,
                     max_results=top_n)
        top.mkdir(parents=True, exist_ok=True)
        for found in chosen:
            path = run(download_checkpoint, layout, db, found["uuid"], top / found["uuid"])
            if quiet:
                click.echo(str(path))
            else:
                render_checkpoint(found, path)
                click.echo()


@command.command("wait")
@experiment_id_argument
@click.option("--polling-interval", type=click.IntRange(min=0), default=5, show_default=True,
              help="the interval (in seconds) to poll for updated state")
def wait(experiment_id: int, polling_interval: int) -> None:
    """wait for experiment to reach terminal state (exit status 1 unless COMPLETED)"""
    from localdet.operations.creation import wait as wait_for

    with reading() as (where, db):
        state = run(wait_for, db, experiment_id, max(polling_interval, 0.2), layout=where)
    if state != "COMPLETED":
        sys.exit(1)


# -- lifecycle ----------------------------------------------------------------------------

def _act(action: str, experiment_id: int, done: str) -> None:
    from localdet.operations.experiments import act
    from localdet.ui.det.state import start_daemon_if_needed

    with records() as (layout, db):
        run(act, layout, db, action, experiment_id=experiment_id)
        if db.experiment(experiment_id).managed:  # not a foreground run or a script
            start_daemon_if_needed(layout, f"the {action}")
    click.echo(f"{done} experiment {experiment_id}")


@command.command("activate")
@experiment_id_argument
def activate(experiment_id: int) -> None:
    """activate experiment, i.e., unpause a paused experiment (also: unpause)"""
    _act("activate", experiment_id, "Activated")


@command.command("pause")
@experiment_id_argument
def pause(experiment_id: int) -> None:
    """pause experiment"""
    _act("pause", experiment_id, "Paused")


@command.command("cancel")
@experiment_id_argument
def cancel(experiment_id: int) -> None:
    """cancel experiment"""
    _act("cancel", experiment_id, "Canceled")


@command.command("kill")
@experiment_id_argument
def kill(experiment_id: int) -> None:
    """kill experiment"""
    _act("kill", experiment_id, "Killed")


@command.command("archive")
@experiment_id_argument
def archive(experiment_id: int) -> None:
    """archive experiment (left out of `det e list`; everything is kept)"""
    from localdet.operations.experiments import archive as archived

    with records() as (_, db):
        run(archived, db, experiment_id)
    click.echo(f"Archived experiment {experiment_id}")


@command.command("unarchive")
@experiment_id_argument
def unarchive(experiment_id: int) -> None:
    """unarchive experiment"""
    from localdet.operations.experiments import unarchive as unarchived

    with records() as (_, db):
        run(unarchived, db, experiment_id)
    click.echo(f"Unarchived experiment {experiment_id}")


@command.command("delete")
@experiment_id_argument
@click.option("--yes", is_flag=True, help="automatically answer yes to prompts")
def delete(experiment_id: int, yes: bool) -> None:
    """delete experiment, with its logs, checkpoints and records"""
    from localdet.operations.deletion import delete_experiment

    if not yes and not output.yes_or_no(
            f"Delete experiment {experiment_id} with its records, logs, TensorBoard files and "
            "the checkpoints no other experiment shares? This cannot be undone; "
            "`det e archive` hides an experiment and keeps it. Delete it?"):
        click.echo("Aborting experiment deletion.")
        return
    with records() as (layout, db):
        run(delete_experiment, layout, db, experiment_id)
    click.echo(f"Deleted experiment {experiment_id}")


def _refuse(what: str, instead: str) -> None:
    output.fail(f"{what} is a Determined cluster feature localdet does not have; {instead}")


@command.command("move", context_settings={"ignore_unknown_options": True},
                 add_help_option=False)
@click.argument("ignored", nargs=-1, type=click.UNPROCESSED)
def move(ignored: tuple[str, ...]) -> None:
    """(no projects here: refused)"""
    _refuse("`det e move` (workspaces and projects)",
            "group experiments with labels instead (`det e label add ID LABEL`)")


@command.command("delete-tb-files")
@experiment_id_argument
def delete_tb_files(experiment_id: int) -> None:
    """(refused: `det e delete` removes TensorBoard files with the experiment)"""
    _refuse("`det e delete-tb-files`", f"`det e delete {experiment_id}` removes them with the "
            "experiment, and `localdet tensorboard` rewrites them when asked")


def _register_more() -> None:
    """The create and attribute commands, from their own modules."""
    from localdet.ui.det import experiment_create, experiment_set

    for sub in (*experiment_create.COMMANDS, *experiment_set.COMMANDS):
        command.add_command(sub)


_register_more()
