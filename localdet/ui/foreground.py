"""`localdet run CONFIG MODEL_DIR`: one whole experiment in the foreground, no daemon needed.

The old `det experiment create --local` habit. The experiment is recorded exactly as an
ingested submission would be (same copy, same rows), with runner 'foreground', and driven by
the daemon's own machinery restricted to it (`Daemon(only=id)`), so it leaves the same
records a daemon would.

    experiment_id, warnings = record(layout, Path("const.yaml"), Path("model_dir"))
    code = drive(layout, experiment_id, slots=1, console=Console())

Ctrl-C once asks the trials to pause (they checkpoint at their next workload boundary) and
leaves the experiment PAUSED; `localdet resume ID` then hands it to a daemon. Ctrl-C twice
kills them.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.text import Text

from localdet.daemon.daemon import Daemon
from localdet.daemon.submissions import EXPERIMENT, Intake, copy_submission, read_submission
from localdet.paths import Layout
from localdet.pids import DaemonLock
from localdet.processes import capped_log
from localdet.records import lifecycle
from localdet.records.db import StateDB
from localdet.records.states import TERMINAL_STATES, ExperimentState, Runner, TrialState
from localdet.ui import views

POLL_SECONDS = 0.5


def record(layout: Layout, config_path: Path, model_dir: Path) -> tuple[int, list[str]]:
    """Copy the model folder and config into the state folder and record the experiment,
    as the daemon's intake does. Raises ConfigError or SubmissionError before anything is
    written when the config or folder is bad. Returns the experiment id and the warnings."""
    text, parsed = read_submission(config_path, model_dir, EXPERIMENT)
    layout.ensure()
    db = StateDB.open(layout.db)
    try:
        intake = Intake(layout, db)
        # Named after this process, so a daemon's recovery leaves it alone while we live.
        staged = intake.incoming_foreground / f"{os.getpid()}-{secrets.token_hex(4)}"
        staged.parent.mkdir(parents=True, exist_ok=True)
        copy_submission(text, model_dir, staged)
        try:
            experiment_id = intake.record(staged, f"localdet run {Path(config_path).name}",
                                          runner=Runner.FOREGROUND)
        except BaseException:
            shutil.rmtree(staged, ignore_errors=True)
            raise
    finally:
        db.close()
    return experiment_id, parsed.warnings


class _Interrupts:
    """Counts Ctrl-C (and SIGTERM) instead of raising in the middle of a transaction."""

    def __init__(self) -> None:
        self.count = 0
        self._previous: dict[int, Any] = {}  # signal -> the handler it had

    def __enter__(self) -> "_Interrupts":
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._count)
        return self

    def _count(self, *_) -> None:
        self.count += 1

    def __exit__(self, *_) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class _Logs:
    """Follows each trial's log from where it was last read; prints whole lines."""

    def __init__(self, layout: Layout, experiment_id: int):
        self.layout = layout
        self.experiment_id = experiment_id
        self.offsets: dict[int, int] = {}
        self.partial: dict[int, str] = {}

    def new_lines(self, trial_id: int, final: bool = False) -> list[str]:
        path = self.layout.trial_log(self.experiment_id, trial_id)
        if not path.exists():
            return []
        if final:  # its last lines may still be on their way through the log's writer
            capped_log.wait_for_writer(path)
        data, self.offsets[trial_id] = capped_log.read_from(path, self.offsets.get(trial_id, 0))
        text = self.partial.pop(trial_id, "") + data.decode("utf-8", "replace")
        lines = text.split("\n")
        if not final:
            self.partial[trial_id] = lines.pop()  # an unfinished line waits for its end
        # A progress bar redrawn with \r: only its last state is a line worth showing.
        return [line.rsplit("\r", 1)[-1] for line in lines if line.strip()]


def drive(layout: Layout, experiment_id: int, slots: int, console: Console,
          show_logs: bool = True, allow_system_hooks: bool = False) -> int:
    """Run the experiment to its end (or to PAUSED); returns the exit status: 0 when it
    COMPLETED, else 1. `allow_system_hooks`: as `localdet daemon --allow-system-hooks`."""
    lock = DaemonLock(layout.run_lock(experiment_id))
    lock.acquire()  # tells a daemon this experiment has a live runner
    db = StateDB.open(layout.db)
    progress = Progress(TextColumn("{task.description}"), BarColumn(),
                        TextColumn("{task.fields[batches]}"), TimeElapsedColumn(),
                        console=console, transient=False)

    def log(message: str) -> None:
        progress.console.print(Text(message, style="dim"))

    daemon = Daemon(layout, slots=slots, poll_seconds=POLL_SECONDS, log=log,
                    only=experiment_id, allow_system_hooks=allow_system_hooks).open(db)
    logs = _Logs(layout, experiment_id)
    tasks: dict[int, TaskID] = {}  # trial id -> its progress bar
    asked = 0
    try:
        with _Interrupts() as interrupts, progress:
            console.print(f"experiment {experiment_id} ({db.experiment(experiment_id).name}) "
                          f"running in the foreground on {slots} slot(s); Ctrl-C pauses it")
            while True:
                if interrupts.count > asked:
                    asked = interrupts.count
                    _interrupt(db, experiment_id, asked, log)
                daemon.step()
                _show(db, experiment_id, progress, tasks, logs if show_logs else None)
                if _done(db, experiment_id, daemon):
                    break
                time.sleep(POLL_SECONDS)
            _show(db, experiment_id, progress, tasks, logs if show_logs else None, final=True)
    except BaseException:
        _kill_what_we_started(daemon)  # a bug here must not leave trials training unwatched
        raise
    finally:
        db.close()
        lock.release()
    return _summary(layout, experiment_id, console)


def _interrupt(db: StateDB, experiment_id: int, count: int, log) -> None:
    if count == 1:
        db.add_request("pause", experiment_id=experiment_id)
        log("pausing: running trials checkpoint at their next workload boundary "
            "(Ctrl-C again kills them)")
    elif count == 2:
        db.add_request("kill", experiment_id=experiment_id)
        log("killing the trials")


def _done(db: StateDB, experiment_id: int, daemon: Daemon) -> bool:
    if daemon.running():
        return False
    experiment = db.experiment(experiment_id)
    if experiment.state in TERMINAL_STATES or experiment.state == ExperimentState.PAUSED:
        return True
    # Every trial paused one by one (`localdet pause --trial`), the rest waiting on the
    # searcher or ended: nothing left to drive.
    return lifecycle.all_paused(t.state for t in db.trials(experiment_id))


def _show(db: StateDB, experiment_id: int, progress: Progress, tasks: dict,
          logs: _Logs | None, final: bool = False) -> None:
    for trial in db.trials(experiment_id):
        if logs is not None:
            for line in logs.new_lines(trial.id, final=final):
                # The harness names the trial itself; other output gets its name added.
                named = line.startswith(f"[trial {trial.id}]")
                prefix = Text("" if named else f"trial {trial.id} | ", style="dim")
                progress.console.print(prefix + Text(line))
        if trial.state == TrialState.QUEUED and trial.id not in tasks:
            continue  # a bar appears once the trial starts
        # 0 batches to go is a script that has not said its length yet: an indeterminate bar.
        total = trial.target_batches or None
        batches = (f"{trial.batches_trained}/{trial.target_batches} batches" if total
                   else f"{trial.batches_trained} batches")
        description = f"trial {trial.id} {trial.state.lower()}"
        if trial.id not in tasks:
            tasks[trial.id] = progress.add_task(description, total=total,
                                                completed=trial.batches_trained,
                                                batches=batches)
        progress.update(tasks[trial.id], description=description, total=total,
                        completed=min(trial.batches_trained, total or trial.batches_trained),
                        batches=batches)
        if trial.state in TERMINAL_STATES or trial.state == TrialState.PAUSED:
            progress.stop_task(tasks[trial.id])


def _kill_what_we_started(daemon: Daemon) -> None:
    for process in list(daemon._processes.values()):
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _summary(layout: Layout, experiment_id: int, console: Console) -> int:
    db = StateDB.open(layout.db)
    try:
        experiment = db.experiment(experiment_id)
        facts = views.experiment_facts(db, experiment)
        best = views.best_checkpoint(db, experiment)
    finally:
        db.close()
    style = views.STATE_STYLES.get(experiment.state, "white")
    console.print(Text(f"experiment {experiment_id}: ") + Text(experiment.state, style=style))
    if facts["best_metric"] is not None:
        console.print(f"best validation {experiment.metric}: {facts['best_metric']:.6g}")
    if best is not None:
        console.print(f"best checkpoint: {best.uuid} (trial {best.trial_id}, "
                      f"{best.batches_trained} batches)")
    if experiment.state == ExperimentState.PAUSED:
        console.print(f"`localdet resume {experiment_id}` continues it under the daemon "
                      "(start one with `localdet daemon`)")
    elif experiment.state != ExperimentState.COMPLETED:
        error = experiment.error or f"experiment {experiment_id} was {experiment.state}"
        print(f"error: {error}", file=sys.stderr, flush=True)
    return 0 if experiment.state == ExperimentState.COMPLETED else 1
