"""`localdet daemon`: the daemon in the foreground (containers, supervisors, the tests), or
started, found and stopped as a service:

    localdet daemon --slots 2             # in the foreground, as always (Ctrl-C stops it)
    localdet daemon start --slots 2       # detached; returns once it watches its queue
    localdet daemon status                # pid, uptime, slots, version, dashboard; exit 1: none
    localdet daemon stop                  # trials checkpoint, are queued again; it exits
    localdet daemon install-service       # a systemd user unit running it (--print: show it)
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from localdet.paths import Layout


def _fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(1)


def _size_option(context: click.Context, parameter: click.Parameter, value: str) -> int:
    from localdet.config.sizes import parse_size

    try:
        size = parse_size(value)
    except ValueError as error:
        raise click.BadParameter(str(error)) from None
    if size < 1000 and parameter.name == "max_log_bytes":  # a head, the marker, a tail
        raise click.BadParameter(f"{value!r} is too small for a log; give at least 1KB")
    return size


# The foreground daemon's options; `start` and `install-service` take them too and pass
# them on to the daemon they run.
_OPTIONS: list[Callable[[Any], Any]] = [
    click.option("--slots", type=click.IntRange(min=1), default=1, show_default=True,
                 help="CPU slots (trials at once) when the machine has no GPU; with GPUs, "
                      "one slot per GPU."),
    click.option("--web", is_flag=True, help="Serve the dashboard too (see `localdet web`)."),
    click.option("--host", default="127.0.0.1", show_default=True,
                 help="The dashboard's address (with --web)."),
    click.option("--port", type=click.IntRange(1, 65535), default=8090, show_default=True,
                 help="The dashboard's port (with --web)."),
    click.option("--no-token", is_flag=True,
                 help="Let the dashboard in without its printed token (with --web; loopback "
                      "addresses only)."),
    click.option("--trial-memory-fraction", type=click.FloatRange(0, 1, min_open=True),
                 help="Stop a trial whose processes use more than this fraction of the "
                      "machine's memory (0 < F <= 1), unless its config sets "
                      "resources.max_memory."),
    click.option("--max-log-bytes", default="100MB", show_default=True, callback=_size_option,
                 help="Cap each trial's log (and the daemon's own daemon.log) at this size: "
                      "past it a log keeps its first and most recent lines."),
    click.option("--min-free-space", default="2GB", show_default=True, callback=_size_option,
                 help="Free space to keep where state and checkpoints are written (with "
                      "--min-free-percent, the smaller counts): below it the daemon launches "
                      "nothing and running trials stop at their next boundary until space "
                      "returns."),
    click.option("--min-free-percent", type=click.FloatRange(0, 100), default=5.0,
                 show_default=True, help="The same reserve, as a percentage of the disk."),
    click.option("--warm", type=click.IntRange(min=0),
                 help="Trial processes to keep started ahead of need, TensorFlow imported, so "
                      "short trials skip the start-up (0: none); with any, the next queued "
                      "trial is also started ahead of its busy CPU slot. Default: one per spare "
                      "CPU core (at most 2), or 1 with GPUs; with no spare core, 1, started "
                      "only while no trial runs, and nothing started ahead."),
    click.option("--ray", "ray_address", metavar="ADDRESS",
                 help="Run the trials on a Ray cluster (`auto`: the one running here, else "
                      "HOST:PORT of its head): its GPUs, or on CPU-only nodes the "
                      "`localdet_slot` resource, are the slots; trials report over HTTP."),
    click.option("--report", type=click.Choice(["sqlite", "http"]), default="sqlite",
                 show_default=True,
                 help="How trials report: straight into the state folder (sqlite), or over "
                      "HTTP to a report server on 127.0.0.1 (http), as trials on other "
                      "machines do."),
    click.option("--report-port", type=click.IntRange(1, 65535),
                 help="The report server's port (with --report http). Default: the one "
                      "chosen at its first start, kept in the state folder so running trials "
                      "find a restarted daemon."),
    click.option("--backup-minutes", type=click.FloatRange(min=0, min_open=True), default=30,
                 show_default=True,
                 help="Copy the records (localdet.db) into $LOCALDET_HOME/backups at start "
                      "and this often, keeping the newest 3; `localdet doctor --restore` "
                      "brings one back."),
    click.option("--allow-system-hooks", is_flag=True,
                 help="Run the lines of model folders' startup-hook.sh that change the "
                      "machine (apt-get, yum, conda install, sudo ...); without it they are "
                      "skipped with a warning."),
    click.option("--system-metrics-period", type=click.FloatRange(min=0), default=5.0,
                 show_default=True, envvar="LOCALDET_SYSTEM_METRICS_PERIOD", show_envvar=True,
                 help="Seconds between samples of each running trial's CPU, memory, disk and "
                      "GPU use (`localdet metrics EXPERIMENT --system`); 0: none. An "
                      "experiment's `profiling.enabled: false` turns it off for its trials."),
]


def _daemon_options(command: Any) -> Any:
    for option in reversed(_OPTIONS):
        command = option(command)
    return command


def _given_arguments(context: click.Context) -> list[str]:
    """The daemon options given on this command line, as `localdet daemon` reads them."""
    from click.core import ParameterSource

    arguments: list[str] = []
    for parameter in context.command.params:
        if not isinstance(parameter, click.Option) or parameter.name is None \
                or parameter.name not in _DAEMON_PARAMETERS \
                or context.get_parameter_source(parameter.name) != ParameterSource.COMMANDLINE:
            continue
        flag = max(parameter.opts, key=len)
        value = context.params[parameter.name]
        if parameter.is_flag:
            if value:
                arguments.append(flag)
        else:
            arguments += [flag, str(value)]
    return arguments


def _layout() -> Layout:
    return Layout.from_environment()


def _check_folder(layout: Layout) -> None:
    from localdet.daemon.service import ServiceError, check_state_folder

    try:
        check_state_folder(layout)
    except ServiceError as error:
        _fail(str(error))


@click.group(invoke_without_command=True)
@_daemon_options
@click.pass_context
def daemon(context: click.Context, slots: int, web: bool, host: str, port: int,
           no_token: bool, trial_memory_fraction: float | None, max_log_bytes: int,
           min_free_space: int, min_free_percent: float, warm: int | None,
           ray_address: str | None, report: str, report_port: int | None,
           backup_minutes: float, allow_system_hooks: bool,
           system_metrics_period: float) -> None:
    """Watch the queue folder and run the experiments dropped into it (in the foreground;
    `localdet daemon start` runs it detached)."""
    if context.invoked_subcommand is not None:
        if _given_arguments(context):
            _fail(f"put the daemon's options after `{context.invoked_subcommand}` "
                  f"(`localdet daemon {context.invoked_subcommand} --slots 2`)")
        return
    from localdet.checkpoints.disk_space import Reserve
    from localdet.daemon.daemon import Daemon
    from localdet.pids import DaemonAlreadyRunning
    from localdet.records.backups import DamagedDatabase
    from localdet.reporting.report_server import ReportServerError
    from localdet.scheduling.ray_cluster import RayError

    layout = _layout()
    _check_folder(layout)
    url = None
    if web:
        from localdet.ui.web.server import WebError, start_in_thread

        try:
            _, url = start_in_thread(layout, host, port, token=not no_token)
        except WebError as error:
            _fail(str(error))
        click.echo(f"dashboard at {url}", err=True)
    try:
        Daemon(layout, slots=slots, log=lambda message: click.echo(message, err=True),
               trial_memory_fraction=trial_memory_fraction, max_log_bytes=max_log_bytes,
               reserve=Reserve(min_free_space, min_free_percent), warm=warm,
               report=report, report_port=report_port, ray=ray_address,
               backup_minutes=backup_minutes, allow_system_hooks=allow_system_hooks,
               dashboard=url, system_metrics_period=system_metrics_period).run()
    except (DaemonAlreadyRunning, ReportServerError, RayError, DamagedDatabase) as error:
        _fail(str(error))


_DAEMON_PARAMETERS = {parameter.name for parameter in daemon.params}


@daemon.command()
@_daemon_options
@click.option("--wait", "wait_seconds", type=click.FloatRange(min=1), default=120,
              show_default=True, help="Seconds to wait for it to watch its queue.")
@click.pass_context
def start(context: click.Context, wait_seconds: float, **_: Any) -> None:
    """Start the daemon detached (its log: $LOCALDET_HOME/daemon.log), with the options of
    the foreground `localdet daemon`; returns once it watches its queue."""
    from localdet.daemon.service import ServiceError, output_file
    from localdet.daemon.service import start as start_daemon

    layout = _layout()
    try:
        pid = start_daemon(layout, _given_arguments(context), wait_seconds=wait_seconds)
    except ServiceError as error:
        _fail(str(error))
    click.echo(f"started the localdet daemon (pid {pid}) on {layout.home}; its log: "
               f"{layout.daemon_log} (start-up output: {output_file(layout)})")
    if context.params.get("web"):
        _show_dashboard(layout)


def _show_dashboard(layout: Layout) -> None:
    from localdet.daemon.service import running

    found = running(layout)
    if found is not None and found.dashboard:
        click.echo(f"dashboard at {found.dashboard}")


@daemon.command()
@click.option("--timeout", type=click.FloatRange(min=0), default=300, show_default=True,
              help="Seconds to wait for it to exit.")
@click.option("--now", is_flag=True,
              help="Stop at once (SIGTERM): running trials keep training, and the next "
                   "daemon adopts them.")
def stop(timeout: float, now: bool) -> None:
    """Stop the running daemon: its running trials checkpoint at their next boundary and
    are queued again for the next daemon (jobs keep running and are adopted); it exits
    once they have."""
    from localdet.daemon.service import NotRunning, ServiceError, running
    from localdet.daemon.service import stop as stop_daemon

    layout = _layout()
    if not now and running(layout) is not None:
        click.echo(f"stopping the localdet daemon on {layout.home}: its running trials "
                   "checkpoint at their next boundary...", err=True)
    try:
        said = stop_daemon(layout, timeout=timeout, now=now)
    except NotRunning as error:
        click.echo(str(error))
        sys.exit(0)  # what was asked holds: none runs
    except ServiceError as error:
        _fail(str(error))
    click.echo(said)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    days, seconds = divmod(seconds, 86400)
    hours, seconds = divmod(seconds, 3600)
    minutes, seconds = divmod(seconds, 60)
    parts = [f"{days}d"] if days else []
    if days or hours:
        parts.append(f"{hours}h")
    if days or hours or minutes:
        parts.append(f"{minutes}m")
    return " ".join([*parts, f"{seconds}s"])


@daemon.command()
@click.option("--json", "as_json", is_flag=True, help="Print the facts as JSON.")
def status(as_json: bool) -> None:
    """Whether a daemon runs on $LOCALDET_HOME: its pid, uptime, slots, version and the
    dashboard's address (exit status 1 when none runs)."""
    import json

    from localdet.daemon.service import START_COMMAND, running

    layout = _layout()
    found = running(layout)
    if found is None:
        if as_json:
            click.echo(json.dumps({"running": False, "home": str(layout.home)}))
        click.echo(f"no localdet daemon is running on {layout.home}; start one with "
                   f"`{START_COMMAND}`", err=True)
        sys.exit(1)
    uptime = found.uptime()
    facts = {"running": True, "home": str(layout.home), "pid": found.pid,
             "uptime_seconds": None if uptime is None else round(uptime, 1),
             "slots": found.slots, "slot_description": found.slot_description,
             "version": found.version, "dashboard": found.dashboard,
             "log": str(layout.daemon_log), "here": found.here}
    if as_json:
        click.echo(json.dumps(facts, indent=2))
        return
    click.echo(f"localdet daemon running on {layout.home}")
    click.echo(f"  pid:       {found.pid}" + ("" if found.here else
                                             " (in another pid namespace, e.g. a container)"))
    if found.started is None:
        click.echo("  starting:  it has not described itself yet (daemon.json)")
    else:
        click.echo(f"  uptime:    {_duration(uptime or 0)}")
        click.echo(f"  slots:     {found.slots} ({found.slot_description})")
        click.echo(f"  version:   {found.version}")
        click.echo("  dashboard: " + (found.dashboard
                                   or "not served (`localdet daemon start --web`)"))
    click.echo(f"  log:       {layout.daemon_log}")


@daemon.command("install-service")
@_daemon_options
@click.option("--print", "print_only", is_flag=True,
              help="Only print the unit; write nothing.")
@click.pass_context
def install_service(context: click.Context, print_only: bool, **_: Any) -> None:
    """Write a systemd user unit (~/.config/systemd/user/localdet.service) that runs this
    daemon, with the options given, on $LOCALDET_HOME, and print how to enable it."""
    from localdet.daemon.systemd_unit import enable_commands, unit_path, unit_text

    layout = Layout(_layout().home.expanduser().absolute())
    text = unit_text(layout, str(Path(sys.executable).absolute()), _given_arguments(context))
    if print_only:
        click.echo(text, nl=False)
        return
    path = unit_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        existed = path.exists()
        path.write_text(text, encoding="utf-8")
    except OSError as error:
        _fail(f"cannot write {path} ({error.strerror or error}); `localdet daemon "
              "install-service --print` prints the unit to place yourself")
    click.echo(f"{'rewrote' if existed else 'wrote'} {path}; enable it with:")
    for line in enable_commands(path):
        click.echo(f"  {line}")
