"""`det job` (`det j`): run a script once as a job (the seed's batch inference: `det job run
batch_inference.yaml .`), and list the queue of what is waiting or running."""

from __future__ import annotations

from pathlib import Path

import click

from localdet.ui.det import output
from localdet.ui.det.groups import AliasedGroup
from localdet.ui.det.state import reading, run


@click.group("job", cls=AliasedGroup, aliases={"ls": "list"}, invoke_without_command=True,
             context_settings={"help_option_names": ["-h", "--help"]})
@click.pass_context
def command(ctx: click.Context) -> None:
    """run and list jobs (`det job` alone lists the queue)"""
    if ctx.invoked_subcommand is None:
        ctx.invoke(list_jobs)


@command.command("run")
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("model_dir", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--detach", is_flag=True, help="queue the job and return at once")
@click.pass_context
def run_job(ctx: click.Context, config: Path, model_dir: Path | None, detach: bool) -> None:
    """run CONFIG's script once as a job (with the MODEL_DIR holding its code) and follow
    its log; the daemon is started if none runs"""
    from localdet.operations.creation import ensure_daemon
    from localdet.ui import cli
    from localdet.ui.det.state import layout

    run(ensure_daemon, layout())
    ctx.invoke(cli.job_run, config=config, model_dir=model_dir, detach=detach)


@command.command("list")
@click.option("--csv", "as_csv", is_flag=True, help="print as CSV")
@click.option("--json", "as_json", is_flag=True, help="print as JSON")
def list_jobs(as_csv: bool = False, as_json: bool = False) -> None:
    """list the queue: experiments and jobs that are not ended, oldest first"""
    import getpass

    from localdet.ui.det import state

    queued: list[dict] = []
    if state.exists():
        from localdet.operations.experiments import list_experiments

        with reading(empty_ok=True) as (_, db):
            queued = run(list_experiments, db, archived=None, states=("ACTIVE", "PAUSED"),
                         kind=None)
            for e in queued:
                e.update(_slots(db, e["id"]))
    if as_json:
        output.print_json({"jobs": queued})
        return
    owner = getpass.getuser()
    output.table(["#", "ID", "Type", "Job Name", "Priority", "Submitted",
                  "Slots (acquired/needed)", "State", "User"],
                 [[place, e["id"], "EXPERIMENT" if e.get("kind") != "job" else "JOB",
                   f"{e['name']} ({e['id']})", e["priority"],
                   output.format_time(e.get("submitted_at")),
                   f"{e['slots_acquired']}/{e['slots_needed']}", e["state"], owner]
                  for place, e in enumerate(queued)], as_csv)


def _slots(db, experiment_id: int) -> dict:
    """Its priority, and the slots its running trials hold / its unfinished trials need."""
    from localdet.records.states import TERMINAL_STATES, TrialState
    from localdet.scheduling.placement import DEFAULT_PRIORITY

    experiment = db.experiment(experiment_id)
    resources = experiment.config.get("resources") or {}
    per_trial = resources.get("slots_per_trial") or resources.get("slots") or 1
    trials = [t for t in db.trials(experiment_id) if t.state not in TERMINAL_STATES]
    priority = resources.get("priority")
    return {"priority": DEFAULT_PRIORITY if priority is None else priority,
            "slots_acquired": sum(len(t.slots or []) for t in trials
                                  if t.state == TrialState.RUNNING),
            "slots_needed": per_trial * len(trials)}
