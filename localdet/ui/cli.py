"""The `localdet` command line.

    localdet daemon start --slots 2                # detached; `localdet daemon stop`
    localdet submit const.yaml ./model_dir
    localdet status 1
    localdet run const.yaml ./model_dir            # one experiment in the foreground
    localdet job run job.yaml ./code               # a batch job, followed to its end
    localdet metrics 1 --csv                       # recorded metrics (--plot curves.png)
    localdet logs 3 -f                             # a trial's log, followed to its end
    localdet tensorboard 1                         # TensorBoard over experiment 1's trials
    localdet compare 1 2                           # best trials side by side (--plot c.png)
"""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from localdet import __version__
from localdet.config.schema import ConfigError  # (config.experiment's: parsing, jsonschema)
from localdet.paths import Layout
from localdet.records.db import NotFound, StateDB
from localdet.records.states import ExperimentKind, ExperimentState
from localdet.ui import (
    catalog_commands,
    compare,
    daemon_commands,
    doctor_commands,
    migrate_command,
    script_commands,
    views,
)

# Piped output (scripts, CI logs) gets wide tables rather than rich's 80-column default.
console = Console(width=None if sys.stdout.isatty() else 160)


def _fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(1)


def _open_db(layout: Layout) -> StateDB:
    """The records for a command that changes them."""
    if not layout.db.exists():
        _fail(f"no localdet state at {layout.home}; run `localdet daemon start` or submit an "
              "experiment first")
    return StateDB.open(layout.db)


def _read_db(layout: Layout) -> StateDB:
    """The records for a command that only reads them: opened read-only (nothing recorded
    yet reads as no experiments)."""
    return StateDB.open_readonly(layout.db)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="localdet",
                      message="%(prog)s %(version)s")
def cli() -> None:
    """localdet: Determined-style Keras training on one machine."""


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to serve on.")
@click.option("--port", type=click.IntRange(1, 65535), default=8090, show_default=True)
@click.option("--no-token", is_flag=True,
              help="Let in requests without the printed token (loopback addresses only).")
def web(host: str, port: int, no_token: bool) -> None:
    """Serve the dashboard: experiments, trials, curves, checkpoints, logs, jobs."""
    from localdet.ui.web.server import WebError, serve

    try:
        serve(Layout.from_environment().ensure(), host, port,
              announce=lambda text: click.echo(text, err=True), token=not no_token)
    except WebError as error:
        _fail(str(error))


@cli.command()
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("model_dir", required=False, type=click.Path(file_okay=False, path_type=Path))
def submit(config: Path, model_dir: Path | None) -> None:
    """Queue an experiment: CONFIG (YAML) and the MODEL_DIR holding its code."""
    from localdet.daemon.service import START_COMMAND, ServiceError, check_state_folder
    from localdet.daemon.submissions import SubmissionError
    from localdet.daemon.submissions import submit as submit_experiment
    from localdet.pids import DaemonLock

    layout = Layout.from_environment()
    try:
        check_state_folder(layout)
        queued, warnings = submit_experiment(layout, config, model_dir)
    except ServiceError as error:
        _fail(str(error))
    except (ConfigError, SubmissionError) as error:
        _fail(f"{config}: {error}")
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)
    click.echo(f"queued {queued.name}")
    if DaemonLock.holder(layout.daemon_lock) is None:
        click.echo(f"note: no localdet daemon is running on {layout.home}, so nothing will run "
                   f"it until `{START_COMMAND}`", err=True)


@cli.command()
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("model_dir", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--hp", "hps", multiple=True, metavar="NAME=VALUE",
              help="With a SCRIPT.py instead of a config: a hyperparameter (repeat for more); "
                   "a range (lr=log(1e-4,1e-1)) is drawn once. See `localdet search --help`.")
@click.option("--slots", type=click.IntRange(min=1), default=1, show_default=True,
              help="CPU slots (trials at once) when the machine has no GPU; with GPUs, "
                   "one slot per GPU.")
@click.option("--quiet", is_flag=True, help="Show progress bars, not the trials' logs.")
@click.option("--allow-system-hooks", is_flag=True,
              help="Run the lines of model folders' startup-hook.sh that change the machine "
                   "(apt-get, yum, conda install, sudo ...); without it they are skipped with "
                   "a warning.")
def run(config: Path, model_dir: Path | None, hps: tuple[str, ...], slots: int, quiet: bool,
        allow_system_hooks: bool) -> None:
    """Run one experiment in the foreground, without a daemon (Ctrl-C pauses it): CONFIG
    and its MODEL_DIR, or a SCRIPT.py alone (`localdet run train.py --hp lr=0.01`), run
    from its folder with the config written for it."""
    from localdet.daemon.submissions import SubmissionError
    from localdet.ui import foreground

    if config.suffix == ".py":
        from localdet.ui.script_commands import run_script

        if model_dir is not None:
            _fail(f"{config} is a script, run from its own folder; leave out {model_dir}")
        return run_script(config, hps, slots, quiet, allow_system_hooks, console)
    if hps:
        _fail("--hp goes with a script (localdet run train.py --hp lr=0.01); with a config, "
              "set its hyperparameters section")
    if model_dir is None:
        return _fail(f"give the model folder after {config} (localdet run CONFIG MODEL_DIR)")
    layout = Layout.from_environment()
    try:
        experiment_id, warnings = foreground.record(layout, config, model_dir)
    except (ConfigError, SubmissionError) as error:
        click.echo(f"error: {config}: {error}", err=True)
        sys.exit(2)  # nothing was recorded
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)
    sys.exit(foreground.drive(layout, experiment_id, slots, console, show_logs=not quiet,
                              allow_system_hooks=allow_system_hooks))


@cli.group()
def job() -> None:
    """Batch jobs: a script run once (e.g. batch inference), scheduled like a trial."""


@job.command("run")
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("model_dir", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--detach", is_flag=True, help="Queue the job and return at once.")
def job_run(config: Path, model_dir: Path | None, detach: bool) -> None:
    """Queue a job (CONFIG and the MODEL_DIR holding its code) and follow its log."""
    from localdet.daemon.submissions import JOB, SubmissionError
    from localdet.daemon.submissions import submit as submit_job
    from localdet.pids import DaemonLock
    from localdet.ui.jobs import JobNotTaken, follow

    layout = Layout.from_environment()
    if not detach and DaemonLock.holder(layout.daemon_lock) is None:
        _fail(f"no localdet daemon is running on {layout.home} to run the job; start one "
              "with `localdet daemon start`, or queue the job with `--detach` for when one starts")
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
    if experiment.kind == ExperimentKind.JOB:
        return views.job_facts(db, layout, experiment, tail_lines)
    return views.experiment_facts(db, experiment)


def _rows(layout: Layout, db: StateDB, listed: list) -> list[dict]:
    """The status table's rows: an experiment's light summary (a few queries for them all,
    as `det e list`), a job's facts."""
    from localdet.operations.experiments import list_experiments

    summaries = {s["id"]: s for s in list_experiments(db, archived=None, kind=None,
                                                       with_best_metric=True)}
    return [_facts(layout, db, e) if e.kind == ExperimentKind.JOB
            else {**summaries[e.id], "runner": e.runner} for e in listed]


@cli.command()
@click.argument("experiment_id", required=False, type=int)
@click.option("--json", "as_json", is_flag=True, help="Print the facts as JSON.")
@click.option("--all", "show_all", is_flag=True,
              help="Archived experiments too; with EXPERIMENT_ID, every trial's row (past 20 "
                   "trials, the best, the running and the latest few are shown).")
@click.option("--label", "labels", multiple=True, help="Only those with this label (repeat: all).")
@click.option("--timeline", is_flag=True,
              help="Where the experiment's time went: its slots' seconds in training, start-up, "
                   "validation, checkpoints, the daemon and idle, and each phase's length.")
def status(experiment_id: int | None, as_json: bool, show_all: bool,
           labels: tuple[str, ...], timeline: bool = False) -> None:
    """Experiments and jobs, or one experiment's trials (one job's log)."""
    layout = Layout.from_environment()
    with _read_db(layout) as db:
        if timeline:
            from localdet.ui.timeline_view import show_timeline
            return show_timeline(console, db, experiment_id, as_json)
        _status(layout, db, experiment_id, as_json, show_all, labels)


def status_facts(layout: Layout, db: StateDB, experiment_id: int | None = None, *,
                 show_all: bool = False, labels: tuple[str, ...] = ()) -> Any:
    """What `localdet status [EXPERIMENT_ID] --json` prints, as Python values before JSON:
    every experiment's and job's facts, or the one's. NotFound for an unknown id."""
    if experiment_id is None:
        return [_facts(layout, db, e) for e in _listed(db, show_all, labels)]
    return _one_experiment(layout, db, experiment_id, compute_importances=True)


def _listed(db: StateDB, show_all: bool, labels: tuple[str, ...]) -> list:
    """The experiments `status` lists: not archived (unless `show_all`), with every label."""
    from localdet.records.catalog import with_labels

    chosen = with_labels(db, labels) if labels else None
    return [e for e in db.experiments()
            if (show_all or not e.archived) and (chosen is None or e.id in chosen)]


def _one_experiment(layout: Layout, db: StateDB, experiment_id: int,
                    compute_importances: bool) -> dict:
    """An experiment's facts with its labels, notes and lineage (forks, continuations) and
    its importances (cached ones only, unless `compute_importances`); a job's with its log's
    last lines."""
    from localdet.operations.experiments import describe

    experiment = db.experiment(experiment_id)
    if experiment.kind == ExperimentKind.JOB:
        return _facts(layout, db, experiment, tail_lines=20)
    from localdet.operations.importance import importances

    facts = describe(layout, db, experiment_id)
    found = importances(layout, db, experiment_id, compute=compute_importances)
    # The same facts whether or not they were cached: scripts compare them.
    facts["importances"] = found and {k: v for k, v in found.items() if k != "cached"}
    return facts


def _status(layout: Layout, db: StateDB, experiment_id: int | None, as_json: bool,
            show_all: bool = False, labels: tuple[str, ...] = ()) -> None:
    """`localdet status` over the open database."""
    from localdet.pids import DaemonLock

    facts: Any  # every experiment's rows, or the one's facts
    try:
        if as_json:
            click.echo(json.dumps(status_facts(layout, db, experiment_id, show_all=show_all,
                                               labels=labels), indent=2))
            return
        facts = _rows(layout, db, _listed(db, show_all, labels)) if experiment_id is None \
            else _one_experiment(layout, db, experiment_id, compute_importances=False)
    except NotFound as error:
        _fail(str(error))
    pid = DaemonLock.holder(layout.daemon_lock)
    console.print(f"daemon running (pid {pid})" if pid else
                  "[yellow]the daemon is not running[/] (start it with `localdet daemon start`)")
    if not pid:
        from localdet.daemon.service import waiting_submissions

        waiting = waiting_submissions(layout)
        if waiting:
            console.print(f"[yellow]{waiting} submission(s) wait in "
                          f"{escape(str(layout.queue))}; nothing runs them until "
                          "`localdet daemon start`[/]")
    notice = views.daemon_notice(db) if pid else None
    if notice:
        console.print(f"[yellow]{escape(notice)}[/]")
    if experiment_id is None and db.nothing_recorded:
        console.print(f"no experiments yet in {escape(str(layout.home))}; start with "
                      "`localdet daemon start`, then `localdet submit CONFIG MODEL_DIR`")
        return
    if experiment_id is None:
        jobs = [f for f in facts if f["kind"] == ExperimentKind.JOB]
        experiments = [f for f in facts if f["kind"] != ExperimentKind.JOB]
        if experiments or not jobs:
            console.print(views.experiments_table(experiments))
        if jobs:
            console.print(views.jobs_table(jobs))
    elif facts["kind"] == ExperimentKind.JOB:
        console.print(views.job_table(facts))
        if facts["error"] and facts["error"] not in facts["log_tail"]:  # else shown below
            console.print(f"[red]error:[/] {escape(facts['error'])}")
        if facts["log_tail"]:
            console.print("[bold]log tail[/]")
            console.print(Text(facts["log_tail"]))
    else:
        if facts["state"] == ExperimentState.ERROR and facts["error"]:
            console.print(f"[red]error:[/] {escape(facts['error'].splitlines()[0])}")
        console.print(views.search_summary(facts))
        if facts["rungs"]:
            console.print(views.rungs_table(facts))
        shown = views.shown_trials(facts, every=show_all)
        console.print(views.trials_table(facts, shown))
        found = facts["importances"]  # cached (`status ID --json` computes them)
        if found and found["importances"]:
            console.print(f"importance for {escape(found['metric'])} over {found['trials']} "
                          "trials: " + ", ".join(f"{escape(name)} {value:.2f}"
                                                 for name, value in found["importances"].items()))
        for trial in shown:  # (the rest's errors: --all)
            if trial["error"]:
                console.print(f"[red]trial {trial['id']}:[/] {escape(trial['error'])}")
        for warning in facts["warnings"]:
            console.print(f"[yellow]warning:[/] {warning}")


def _request(action: str, experiment_id: int | None, trial_id: int | None) -> None:
    from localdet.records.actions import ActionError, request

    layout = Layout.from_environment()
    db = _open_db(layout)
    try:
        message = request(layout, db, action, experiment_id=experiment_id, trial_id=trial_id)
    except ActionError as error:
        _fail(str(error))
    finally:
        db.close()
    done, _, note = message.partition("; ")
    click.echo(done)
    if note:
        click.echo(note, err=True)


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
    with _read_db(Layout.from_environment()) as db:
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
    from localdet.operations.checkpoints import download_checkpoint
    from localdet.operations.errors import OperationError

    layout = Layout.from_environment()
    with _read_db(layout) as db:
        try:
            found = db.checkpoint(uuid)
            download_checkpoint(layout, db, found.uuid, destination, reuse=False)
        except (NotFound, OperationError) as error:  # NotFound: also one gc deleted
            _fail(str(error))
    click.echo(f"checkpoint {found.uuid} (trial {found.trial_id}, {found.batches_trained} "
               f"batches) written to {destination}")


@checkpoint.command("import")
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path))
def import_(folder: Path) -> None:
    """Store the checkpoint FOLDER (exported from localdet, or written by Determined) as a
    checkpoint of its own experiment, and print its uuid, for searcher.source_checkpoint_uuid."""
    from localdet.checkpoints.importing import import_checkpoint
    from localdet.checkpoints.store import StoreError

    try:
        imported = import_checkpoint(Layout.from_environment().ensure(), folder)
    except StoreError as error:
        _fail(str(error))
    click.echo(f"checkpoint {imported.uuid} imported from {folder} ({imported.files} files, "
               f"experiment {imported.experiment_id}, trial {imported.trial_id})", err=True)
    click.echo(imported.uuid)


@cli.command()
@click.argument("experiment_id", required=False, type=int)
@click.option("--dry-run", is_flag=True, help="Show what would be deleted; delete nothing.")
@click.option("--rechunk", is_flag=True,
              help="Also cut files stored whole (by an older localdet or older remote trials) "
                   "into content-defined chunks, and say how much space that saved.")
def gc(experiment_id: int | None, dry_run: bool, rechunk: bool) -> None:
    """Delete the checkpoints that checkpoint_storage does not keep (of EXPERIMENT_ID, or of
    all experiments), and the stored files no kept checkpoint needs."""
    from localdet.checkpoints.gc import collect
    from localdet.checkpoints.store import StoreError
    from localdet.operations.deletion import finish_pending

    if rechunk and (dry_run or experiment_id is not None):
        _fail("--rechunk converts every store at once; leave out EXPERIMENT_ID and --dry-run")
    layout = Layout.from_environment()
    with _open_db(layout) as db:
        try:
            if not dry_run:  # what interrupted `localdet delete`s left: folders, blobs
                for deleted in finish_pending(layout, db):
                    click.echo(f"finished deleting experiment {deleted}")
            report = collect(layout, db, experiment_id, dry_run=dry_run,
                             writer_wait_seconds=10)
        except (NotFound, StoreError) as error:  # StoreError: an S3 store it cannot reach
            _fail(str(error))
    if dry_run:
        for c in report.deleted:
            click.echo(f"would delete checkpoint {c.uuid} (experiment {c.experiment_id}, "
                       f"trial {c.trial_id}, {c.batches_trained} batches)")
        for sha in report.blobs:
            click.echo(f"would delete blob {sha}")
    click.echo(report.summary())
    if rechunk:
        from localdet.checkpoints.rechunk import rechunk as rechunk_stores

        with _open_db(layout) as db:
            try:
                click.echo(rechunk_stores(layout, db).summary())
            except StoreError as error:
                _fail(str(error))


@cli.command()
@click.argument("experiment_id", type=int)
@click.option("--trial", "trial_id", type=int, help="Only this trial.")
@click.option("--metric", help="Only this metric.")
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV (header row) instead of a table.")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the learning curves to this PNG instead.")
@click.option("--system", is_flag=True,
              help="The trials' system metrics instead (CPU, memory, disk, GPU): a summary "
                   "a trial, or with --trial its samples.")
def metrics(experiment_id: int, trial_id: int | None, metric: str | None, as_csv: bool,
            plot: Path | None, system: bool) -> None:
    """The training and validation metrics an experiment recorded: a table, CSV or a PNG."""
    from localdet.ui import metrics_report
    if as_csv and plot:
        _fail("--csv and --plot do not go together; choose one")
    if system and (plot or metric):
        _fail("--system shows every system metric as a table or CSV: leave out "
              f"{'--plot' if plot else '--metric'} (the dashboard draws them)")
    db = _read_db(Layout.from_environment())
    try:
        experiment = db.experiment(experiment_id)
        if system:
            from localdet.ui import system_metrics_report as system_report
            try:
                if as_csv:
                    system_report.write_csv(db, experiment, trial_id, sys.stdout)
                else:
                    console.print(system_report.table(db, experiment, trial_id))
            except system_report.SystemMetricsError as error:
                _fail(str(error))
            return
        report = metrics_report.collect(db, experiment, trial_id, metric)
        if plot:
            best = views.experiment_facts(db, experiment)["best_trial"]
            click.echo(f"learning curves written to {metrics_report.plot(report, plot, best)}")
        elif as_csv:
            metrics_report.write_csv(report, sys.stdout)
        else:
            console.print(metrics_report.table(report))
    except (NotFound, metrics_report.MetricsError) as error:
        _fail(str(error))
    finally:
        db.close()


@cli.command()
@click.argument("trial_id", type=int)
@click.option("-f", "--follow", is_flag=True,
              help="Keep printing new lines until the trial stops running.")
def logs(trial_id: int, follow: bool) -> None:
    """Print a trial's log (with -f, follow it)."""
    from localdet.ui import trial_logs
    layout = Layout.from_environment()
    db = _read_db(layout)
    out = sys.stdout.buffer  # (click.get_binary_stream is deprecated since click 8.5)
    try:
        if follow:
            trial_logs.follow(layout, db, trial_id, out)
        else:
            trial_logs.show(layout, db, trial_id, out)
    except trial_logs.LogError as error:
        _fail(str(error))
    except KeyboardInterrupt:
        sys.exit(130)
    finally:
        db.close()


@cli.command()
@click.argument("experiment_id", type=int)
@click.option("--port", type=click.IntRange(1, 65535), default=6006, show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--logdir-only", is_flag=True,
              help="Write the event files, print their folder and exit.")
def tensorboard(experiment_id: int, port: int, host: str, logdir_only: bool) -> None:
    """TensorBoard over an experiment's trials: their recorded metrics, and what the
    TensorBoard callback wrote."""
    import os

    from localdet.ui import tensorboard_export
    layout = Layout.from_environment()
    db = _read_db(layout)
    try:
        folder = tensorboard_export.export(layout, db, db.experiment(experiment_id))
    except NotFound as error:
        _fail(str(error))
    finally:
        db.close()
    if logdir_only:
        click.echo(str(folder))
        return
    click.echo(f"TensorBoard over {folder}: http://{host}:{port}/ (Ctrl-C stops it)")
    sys.stdout.flush()
    command = tensorboard_export.server_command(folder, port, host)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorBoard imports TensorFlow
    os.execv(command[0], command)  # TensorBoard takes this process over: Ctrl-C and all


for _command in catalog_commands.COMMANDS:
    cli.add_command(_command)
cli.add_command(compare.compare)
cli.add_command(doctor_commands.doctor)
cli.add_command(daemon_commands.daemon)
cli.add_command(migrate_command.migrate)
cli.add_command(script_commands.search)


def main() -> None:
    from localdet.records.opening import RecordsUnavailable, unavailable

    try:
        cli()
    except RecordsUnavailable as error:  # damaged, a newer schema, a directory, ...
        _fail(str(error))
    except sqlite3.Error as error:  # met past the open: locked, read-only, a damaged page
        _fail(str(unavailable(Layout.from_environment().db, error)))
