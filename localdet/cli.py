"""The `localdet` command line.

    localdet daemon --slots 2 &
    localdet submit const.yaml ./model_dir
    localdet status 1
    localdet run const.yaml ./model_dir            # one experiment in the foreground
    localdet job run job.yaml ./code               # a batch job, followed to its end
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from localdet import views
from localdet.config import ConfigError
from localdet.db import NotFound, StateDB
from localdet.paths import Layout
from localdet.store import StoreError

# Piped output (scripts, CI logs) gets wide tables rather than rich's 80-column default.
console = Console(width=None if sys.stdout.isatty() else 160)


def _fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(1)


def _open_db(layout: Layout) -> StateDB:
    if not layout.db.exists():
        _fail(f"no localdet state at {layout.home}; start `localdet daemon` or submit an "
              "experiment first")
    return StateDB.open(layout.db)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """localdet: Determined-style Keras training on one machine."""


@cli.command()
@click.option("--slots", type=click.IntRange(min=1), default=1, show_default=True,
              help="CPU slots (trials at once) when the machine has no GPU; with GPUs, "
                   "one slot per GPU.")
def daemon(slots: int) -> None:
    """Watch the queue folder and run the experiments dropped into it."""
    from localdet.daemon import Daemon
    from localdet.processes import DaemonAlreadyRunning

    try:
        Daemon(Layout.from_environment(), slots=slots,
               log=lambda message: click.echo(message, err=True)).run()
    except DaemonAlreadyRunning as error:
        _fail(str(error))


@cli.command()
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("model_dir", required=False, type=click.Path(file_okay=False, path_type=Path))
def submit(config: Path, model_dir: Path | None) -> None:
    """Queue an experiment: CONFIG (YAML) and the MODEL_DIR holding its code."""
    from localdet.submissions import SubmissionError, submit as submit_experiment

    layout = Layout.from_environment().ensure()
    try:
        queued, warnings = submit_experiment(layout, config, model_dir)
    except (ConfigError, SubmissionError) as error:
        _fail(f"{config}: {error}")
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)
    click.echo(f"queued {queued.name}")


@cli.command()
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("model_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--slots", type=click.IntRange(min=1), default=1, show_default=True,
              help="CPU slots (trials at once) when the machine has no GPU; with GPUs, "
                   "one slot per GPU.")
@click.option("--quiet", is_flag=True, help="Show progress bars, not the trials' logs.")
def run(config: Path, model_dir: Path, slots: int, quiet: bool) -> None:
    """Run one experiment in the foreground, without a daemon (Ctrl-C pauses it)."""
    from localdet import foreground
    from localdet.submissions import SubmissionError

    layout = Layout.from_environment()
    try:
        experiment_id, warnings = foreground.record(layout, config, model_dir)
    except (ConfigError, SubmissionError) as error:
        click.echo(f"error: {config}: {error}", err=True)
        sys.exit(2)  # nothing was recorded
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)
    sys.exit(foreground.drive(layout, experiment_id, slots, console, show_logs=not quiet))


@cli.group()
def job() -> None:
    """Batch jobs: a script run once (e.g. batch inference), scheduled like a trial."""


@job.command("run")
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("model_dir", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--detach", is_flag=True, help="Queue the job and return at once.")
def job_run(config: Path, model_dir: Path | None, detach: bool) -> None:
    """Queue a job (CONFIG and the MODEL_DIR holding its code) and follow its log."""
    from localdet.processes import DaemonLock
    from localdet.jobs import JobNotTaken, follow
    from localdet.submissions import JOB, SubmissionError, submit as submit_job

    layout = Layout.from_environment()
    if not detach and DaemonLock.holder(layout.daemon_lock) is None:
        _fail(f"no localdet daemon is running on {layout.home} to run the job; start one "
              "with `localdet daemon`, or queue the job with `--detach` for when one starts")
    layout.ensure()
    try:
        queued, warnings = submit_job(layout, config, model_dir, kind=JOB)
    except (ConfigError, SubmissionError) as error:
        _fail(f"{config}: {error}")
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)
    if detach:
        click.echo(f"queued job {queued.name}")
        return
    try:
        sys.exit(follow(layout, queued.name))
    except JobNotTaken as error:
        _fail(str(error))
    except KeyboardInterrupt:
        _fail("stopped following the job; it keeps running (`localdet status` shows it, "
              "`localdet kill ID` stops it)")


def _facts(layout: Layout, db: StateDB, experiment, tail_lines: int = 0) -> dict:
    if experiment.kind == "job":
        return views.job_facts(db, layout, experiment, tail_lines)
    return views.experiment_facts(db, experiment)


@cli.command()
@click.argument("experiment_id", required=False, type=int)
@click.option("--json", "as_json", is_flag=True, help="Print the facts as JSON.")
def status(experiment_id: int | None, as_json: bool) -> None:
    """Experiments and jobs, or one experiment's trials (one job's log)."""
    from localdet.processes import DaemonLock

    layout = Layout.from_environment()
    db = _open_db(layout)
    try:
        if experiment_id is None:
            facts = [_facts(layout, db, e) for e in db.experiments()]
        else:
            facts = _facts(layout, db, db.experiment(experiment_id), tail_lines=20)
    except NotFound as error:
        _fail(str(error))
    if as_json:
        click.echo(json.dumps(facts, indent=2))
        return
    pid = DaemonLock.holder(layout.daemon_lock)
    console.print(f"daemon running (pid {pid})" if pid else
                  "[yellow]the daemon is not running[/] (start it with `localdet daemon`)")
    if experiment_id is None:
        jobs = [f for f in facts if f["kind"] == "job"]
        experiments = [f for f in facts if f["kind"] != "job"]
        if experiments or not jobs:
            console.print(views.experiments_table(experiments))
        if jobs:
            console.print(views.jobs_table(jobs))
    elif facts["kind"] == "job":
        console.print(views.job_table(facts))
        if facts["error"] and facts["error"] not in facts["log_tail"]:  # else shown below
            console.print(f"[red]error:[/] {escape(facts['error'])}")
        if facts["log_tail"]:
            console.print("[bold]log tail[/]")
            console.print(Text(facts["log_tail"]))
    else:
        console.print(views.search_summary(facts))
        if facts["rungs"]:
            console.print(views.rungs_table(facts))
        console.print(views.trials_table(facts))
        for trial in facts["trials"]:
            if trial["error"]:
                console.print(f"[red]trial {trial['id']}:[/] {trial['error']}")
        for warning in facts["warnings"]:
            console.print(f"[yellow]warning:[/] {warning}")


ACTION_STATES = {  # what each action applies to, and what it can never apply to
    "pause": ("ACTIVE", "QUEUED", "RUNNING"),
    "resume": ("PAUSED",),
    "kill": ("ACTIVE", "PAUSED", "QUEUED", "RUNNING", "WAITING"),
}


def _request(action: str, experiment_id: int | None, trial_id: int | None) -> None:
    from localdet.processes import DaemonLock

    if (experiment_id is None) == (trial_id is None):
        _fail(f"name an experiment (`localdet {action} EXP`) or a trial "
              f"(`localdet {action} --trial ID`), not both or neither")
    layout = Layout.from_environment()
    db = _open_db(layout)
    try:
        if trial_id is not None:
            target, what = db.trial(trial_id), f"trial {trial_id}"
            experiment = db.experiment(target.experiment_id)
            states = [target.state]
        else:
            target = experiment = db.experiment(experiment_id)
            what = f"{experiment.kind} {experiment_id}"
            states = [target.state] + [t.state for t in db.trials(experiment_id)]
    except NotFound as error:
        _fail(str(error))
    if experiment.runner == "script":
        _fail(f"experiment {experiment.id} is a script running outside the daemon; stop it "
              "with Ctrl-C in its terminal")
    if experiment.kind == "job" and action != "kill":
        _fail(f"job {experiment.id} cannot be {action}d, since jobs keep no checkpoints to "
              f"resume from; `localdet kill {experiment.id}` stops it")
    if not any(state in ACTION_STATES[action] for state in states):
        _fail(f"{what} is {target.state}; there is nothing to {action}")
    db.add_request(action, experiment_id=experiment_id, trial_id=trial_id)
    click.echo(f"{action} requested for {what}")
    if (experiment.runner == "foreground"
            and DaemonLock.holder(layout.run_lock(experiment.id)) is not None):
        return  # its `localdet run` carries it out
    if DaemonLock.holder(layout.daemon_lock) is None:
        click.echo("the daemon is not running; it will carry this out when it starts", err=True)


def _target_options(command):
    command = click.argument("experiment_id", required=False, type=int)(command)
    return click.option("--trial", "trial_id", type=int, help="Act on one trial.")(command)


@cli.command()
@_target_options
def pause(experiment_id: int | None, trial_id: int | None) -> None:
    """Checkpoint running trials at their next workload boundary and stop them."""
    _request("pause", experiment_id, trial_id)


@cli.command()
@_target_options
def resume(experiment_id: int | None, trial_id: int | None) -> None:
    """Continue paused trials from their latest checkpoint."""
    _request("resume", experiment_id, trial_id)


@cli.command()
@_target_options
def kill(experiment_id: int | None, trial_id: int | None) -> None:
    """Stop trials at once, without a checkpoint."""
    _request("kill", experiment_id, trial_id)


@cli.command()
@click.argument("experiment_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print the facts as JSON.")
@click.option("--best", is_flag=True,
              help="Only the checkpoint where the searcher metric was best.")
@click.option("--all", "show_all", is_flag=True,
              help="Also the checkpoints deleted by retention, with their state.")
def checkpoints(experiment_id: int, as_json: bool, best: bool, show_all: bool) -> None:
    """The checkpoints of an experiment (those kept by checkpoint_storage; --all for all)."""
    db = _open_db(Layout.from_environment())
    try:
        experiment = db.experiment(experiment_id)
    except NotFound as error:
        _fail(str(error))
    if best:
        found = views.best_checkpoint(db, experiment)
        chosen = [found] if found else []
    else:
        chosen = db.checkpoints(experiment_id, include_deleted=show_all)
    facts = [views.checkpoint_facts(c) for c in chosen]
    if as_json:
        click.echo(json.dumps(facts, indent=2))
    else:
        console.print(views.checkpoints_table(facts, experiment_id, show_state=show_all))


@cli.group()
def checkpoint() -> None:
    """Work with one checkpoint."""


@checkpoint.command("export")
@click.argument("uuid")
@click.argument("destination", type=click.Path(path_type=Path))
def export(uuid: str, destination: Path) -> None:
    """Write checkpoint UUID (or a unique prefix) to DESTINATION as a plain folder."""
    from localdet.manifest import files_of
    from localdet.reporting import CheckpointReader
    from localdet.store import Store

    layout = Layout.from_environment()
    _open_db(layout).close()
    try:
        # Held while its files are copied: `localdet gc` skips it meanwhile.
        with CheckpointReader(layout).holding(uuid) as found:
            Store(layout.store).materialize(files_of(found.manifest), destination)
    except (NotFound, StoreError) as error:  # NotFound includes a checkpoint gc deleted
        _fail(str(error))
    click.echo(f"checkpoint {found.uuid} (trial {found.trial_id}, {found.batches_trained} "
               f"batches) written to {destination}")


@cli.command()
@click.argument("experiment_id", required=False, type=int)
@click.option("--dry-run", is_flag=True, help="Show what would be deleted; delete nothing.")
def gc(experiment_id: int | None, dry_run: bool) -> None:
    """Delete the checkpoints that checkpoint_storage does not keep (of EXPERIMENT_ID, or of
    all experiments), and the stored files no kept checkpoint needs."""
    from localdet.gc import collect

    layout = Layout.from_environment()
    db = _open_db(layout)
    try:
        report = collect(layout, db, experiment_id, dry_run=dry_run, writer_wait_seconds=10)
    except NotFound as error:
        _fail(str(error))
    if dry_run:
        for c in report.deleted:
            click.echo(f"would delete checkpoint {c.uuid} (experiment {c.experiment_id}, "
                       f"trial {c.trial_id}, {c.batches_trained} batches)")
        for sha in report.blobs:
            click.echo(f"would delete blob {sha}")
    click.echo(report.summary())


def main() -> None:
    cli()
