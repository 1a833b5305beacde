"""Turn "this trial, these slots" into a process: argv, environment, folder and log.

Everything a backend needs to start a trial is decided in `launch_spec`; another backend
(Ray, Slurm) would be another implementation of that one function.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from determined.core._reporting import (
    ENGINE_VAR,
    FAILURE_MARK,
    HOME_VAR,
    KERAS_LINE_REASON_VAR,
    MODEL_DIR_VAR,
    SLOTS_VAR,
    TRIAL_DIR_VAR,
    TRIAL_ID_VAR,
)
from localdet.checkpoints import disk_space
from localdet.config import engines, keras_choice, script_hparams
from localdet.paths import Layout
from localdet.processes import capped_log, startup_hook, unchanged_scripts
from localdet.records.db import Experiment, Trial
from localdet.records.states import ExperimentKind


@dataclass(frozen=True)
class LaunchSpec:
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    log_path: Path
    keras_line: str
    keras_line_reason: str
    engine: str = engines.SINGLE   # how it trains on its slots (localdet/config/engines.py)
    header: str = ""               # the first line this launch writes to the log
    max_log_bytes: int = capped_log.DEFAULT_MAX_BYTES  # the trial log's cap


# `python`, `python3`, `python3.11`: the interpreter the user means is localdet's own, so that
# `determined` and the Keras line localdet chose are importable in the trial.
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")


def argv_for(config: dict) -> list[str]:
    """The trial's command: the script's, or the runner of trial classes."""
    if config.get("entrypoint_kind") != "script":
        return [sys.executable, "-m", "determined.exec.run_trial"]
    argv = shlex.split(config["script_command"])
    if argv and _PYTHON.match(argv[0]):
        argv[0] = sys.executable
    return argv


def launch_spec(layout: Layout, experiment: Experiment, trial: Trial,
                slots: list[int], visible_devices: str | None = None,
                max_log_bytes: int = capped_log.DEFAULT_MAX_BYTES,
                reserve: disk_space.Reserve | None = None,
                report_url: str | None = None, report_local: bool = True,
                allow_system_hooks: bool = False) -> LaunchSpec:
    """`visible_devices`: the trial's CUDA_VISIBLE_DEVICES (its GPUs, or "" on CPU slots);
    `report_url`: the daemon's report server, for a trial that reports over HTTP
    (`localdet daemon --report http`) rather than into SQLite; `report_local`: the trial
    runs on this machine (not on a cluster's node); `allow_system_hooks`: a startup hook's
    lines that change the machine run (`localdet daemon --allow-system-hooks`)."""
    user_env = {str(k): str(v) for k, v in
                experiment.config["environment"]["environment_variables"].items()}
    line, reason, engine = _line_and_engine(layout, experiment, user_env)
    env = experiment_environment(layout, user_env, line, reserve)
    env[KERAS_LINE_REASON_VAR] = reason
    env.update({TRIAL_ID_VAR: str(trial.id), SLOTS_VAR: ",".join(map(str, slots))})
    if report_url is not None:
        from localdet.reporting.report_server import trial_environment

        env.update(trial_environment(layout, trial.id, trial.restarts + 1, report_url,
                                     local=report_local))
        # Where a remote trial's folders would be its node's: here, the daemon's own.
        env[MODEL_DIR_VAR] = experiment.model_dir
        env[TRIAL_DIR_VAR] = str(layout.trial_dir(experiment.id, trial.id))
    if visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible_devices
        if visible_devices:  # nvidia-smi counts GPUs in PCI order; CUDA may not by default
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env[ENGINE_VAR] = engine
    # A script that never imports `determined` gets its hyperparameters as its own options
    # or module-level constants (localdet/config/script_hparams.py); the log says which.
    try:
        given = script_hparams.for_launch(argv_for(experiment.config), experiment.config,
                                          Path(experiment.model_dir), trial.hparams)
    except script_hparams.ScriptHparamError as error:
        raise LaunchError(str(error)) from None
    # An entrypoint_script that never imports `determined`: localdet trains its fits
    # (localdet/processes/unchanged_scripts.py).
    argv = unchanged_scripts.injected(given.argv, experiment.config,
                                      Path(experiment.model_dir),
                                      job=experiment.kind == ExperimentKind.JOB)
    if argv != given.argv:  # the backend such a script sets itself, before the hook's imports
        unchanged_scripts.backend_environment(env, experiment.config, Path(experiment.model_dir))
    return LaunchSpec(
        # The folder's startup-hook.sh first, once for all ranks (once per container, as
        # Determined ran it): localdet/processes/startup_hook.py.
        argv=startup_hook.wrapped(supervised_argv(argv, engine,
                                                  len(slots), experiment.config.get("launcher")),
                                  Path(experiment.model_dir), allow_system=allow_system_hooks,
                                  strict=experiment.config["environment"].get(
                                      "startup_hook") == "strict"),
        env=env,
        cwd=Path(experiment.model_dir),
        log_path=layout.trial_log(experiment.id, trial.id),
        keras_line=line,
        keras_line_reason=reason,
        engine=engine,
        header="\n".join([f"[localdet] trial {trial.id} launch {trial.restarts + 1} on slots "
                           f"{slots}: {line} ({reason}); engine {engine}", *given.lines]),
        max_log_bytes=max_log_bytes,
    )


def experiment_environment(layout: Layout, user_env: dict[str, str], line: str,
                           reserve: disk_space.Reserve | None = None) -> dict[str, str]:
    """What every trial of an experiment with these environment variables and this Keras
    line gets: the daemon's environment, theirs, and localdet's. `launch_spec` adds what is
    the trial's own; with `{}` and the default line, it is what a warm process is started
    with before any trial has launched."""
    env = dict(os.environ)
    env.pop("TF_USE_LEGACY_KERAS", None)  # the daemon's own choice must not leak in
    env.update(user_env)
    version = keras_choice.tensorflow_version()
    if version and version < (2, 16):
        # Keras 2 is its only Keras; the variable would make it look for tf-keras.
        env.pop("TF_USE_LEGACY_KERAS", None)
    else:
        env["TF_USE_LEGACY_KERAS"] = "1" if line == "keras2" else "0"
    env.update({HOME_VAR: str(layout.home), "PYTHONUNBUFFERED": "1"})
    env.update((reserve or disk_space.Reserve()).env())  # checked before each checkpoint
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def supervised_argv(argv: list[str], engine: str, slots: int,
                    launcher: str | None = None) -> list[str]:
    """A multi-process engine's trial is the rank supervisor, which runs one rank per slot
    and stands for them all (one pid, one process group, one log). A script started by
    `determined.launch.tensorflow` gets a TF_CONFIG on each rank whatever the engine, as
    that launcher gave each of Determined's containers one."""
    if engines.processes(engine, slots) == 1:
        return argv
    flag = "--horovod" if engine == engines.HOROVOD and launcher != "tensorflow" \
        else "--tf-config"
    # -P: the trial's folder is the working directory; its modules must not shadow ours.
    return [sys.executable, "-P", "-m", "localdet.processes.ranks", "--size", str(slots), flag,
            "--", *argv]


def unsupervised_argv(argv: list[str]) -> list[str]:
    """The ranks' own command inside a `supervised_argv` (for launchers that start each rank
    themselves, on several machines); any other argv as it is."""
    hook, argv = startup_hook.unwrapped(argv)  # each node runs the hook before its ranks
    if argv[1:4] == ["-P", "-m", "localdet.processes.ranks"] and "--" in argv:
        return hook + argv[argv.index("--") + 1:]
    return hook + argv


# (home, experiment id) -> (its config and model folder, Keras line, why, engine): deciding
# reads the model folder and fills the config's defaults (5 ms), and a daemon launches
# thousands of trials of one experiment. Decided again when its config changes; a trial of
# several processes has its engine decided at each launch (it depends on what is installed).
_DECIDED: dict[tuple[str, int], tuple[tuple[dict, str], str, str, str | None]] = {}


def _line_and_engine(layout: Layout, experiment: Experiment,
                     user_env: dict[str, str]) -> tuple[str, str, str]:
    key, basis = (str(layout.home), experiment.id), (experiment.config, experiment.model_dir)
    decided = _DECIDED.get(key)
    if decided is None or decided[0] != basis:
        line, reason = keras_choice.choose(Path(experiment.model_dir), user_env,
                                           experiment.config)
        engine = _engine(experiment)  # a LaunchError is raised again at each launch
        decided = _DECIDED[key] = (basis, line, reason,
                                   engine if engine == engines.SINGLE else None)
    return decided[1], decided[2], decided[3] or _engine(experiment)


def _engine(experiment: Experiment) -> str:
    if experiment.kind == ExperimentKind.JOB:
        return engines.SINGLE  # a job's slots are only reserved for it
    try:
        return engines.choose(experiment.config, Path(experiment.model_dir))[0]
    except engines.EngineRefusal as error:  # submitted before engines were checked
        raise LaunchError(str(error)) from None


class LaunchError(RuntimeError):
    """The trial's program could not be started; the message says which and why."""


class LaunchDeferred(LaunchError):
    """The trial could not start for now, through no fault of its own (a cluster's slots not
    yet released by the trial before, a node gone meanwhile): it stays queued, its restarts
    untouched, and is tried again (localdet/daemon/launches.py's MAX_DEFERRALS)."""


def start(spec: LaunchSpec, warm=None) -> subprocess.Popen:
    """Start the trial's process, its output going to its log through the log's writer (a
    process of its own, which keeps the log under its cap): `wait_for_log(process)` once
    the process has ended waits until everything it printed is in the log. Raises
    LaunchError (also written to the log) when the program is missing or cannot be run.
    `warm`: a warm process (localdet/processes/warm_pool.py) to run the trial in, skipping start-up;
    `process.warm` tells which it was."""
    spec.log_path.parent.mkdir(parents=True, exist_ok=True)
    log: int | None
    log, writer = _log_writer(spec)
    try:
        if spec.header:  # which Keras and why, before anything the trial prints
            first, *rest = spec.header.split("\n")
            os.write(log, "\n".join([f"{first}{'; in a warm process' if warm else ''}", *rest,
                                     ""]).encode())
        process = warm.hand_over(spec, log) if warm is not None else None
        if process is not None:
            process.log_writer, process.warm = writer, True
            return process
        if warm is not None:
            os.write(log, b"[localdet] the warm process had ended; starting the trial cold\n")
        # A session of its own: the trial outlives a daemon restart, and can be signalled
        # as a group.
        try:
            program = spec.argv[spec.argv.index("--") + 1] if _supervised(spec) else None
            if program and shutil.which(program, path=spec.env.get("PATH")) is None \
                    and not (spec.cwd / program).is_file():
                raise FileNotFoundError(program)  # say so now, not as each rank's exit 127
            process = subprocess.Popen(spec.argv, cwd=spec.cwd, env=spec.env, stdout=log,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       start_new_session=True)
            # The daemon's notes, kept on the Popen itself.
            process.log_writer, process.warm = writer, False  # type: ignore[attr-defined]
            return process
        except OSError as error:
            if not spec.cwd.is_dir():
                message = f"the experiment's model folder {spec.cwd} is missing"
            else:
                reason = ("there is no such program; install it, or fix the entrypoint"
                          if isinstance(error, FileNotFoundError)
                          else error.strerror or str(error))
                program = spec.argv[spec.argv.index("--") + 1] if _supervised(spec) \
                    else spec.argv[0]
                message = f"cannot start '{program}' from the entrypoint: {reason}"
            os.write(log, f"error: {message}\n".encode())
            os.close(log)
            log = None
            _wait(writer)  # the log says it before we do
            raise LaunchError(message) from None
    finally:
        if log is not None:
            os.close(log)  # the trial holds its own copy; the writer ends when the trial does


def wait_for_log(process: subprocess.Popen | None, log_path: Path,
                 seconds: float = 5.0) -> None:
    """Once a trial's process has ended, wait (up to `seconds`) until its log's writer has
    written all it printed; `process` None: a process not ours, judged by the log's lock."""
    writer = getattr(process, "log_writer", None)
    if writer is not None:
        _wait(writer, seconds)
    else:
        capped_log.wait_for_writer(log_path, seconds)


def _wait(writer: subprocess.Popen | None, seconds: float = 5.0) -> None:
    try:
        if writer is not None:
            writer.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        pass  # a process the trial left behind still holds the pipe: read what is there


def _log_writer(spec: LaunchSpec) -> tuple[int, subprocess.Popen | None]:
    """The write end of a pipe into the trial's log writer (`python -m
    localdet.processes.capped_log`, in a session of its own, so it outlives the daemon as the
    trial does), and the writer.
    If the writer cannot start, the log file itself, uncapped."""
    read_end, write_end = os.pipe()
    try:
        writer = subprocess.Popen(
            [sys.executable, "-m", "localdet.processes.capped_log", str(spec.log_path),
             str(spec.max_log_bytes)],
            stdin=read_end, stdout=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        os.close(write_end)
        return os.open(spec.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644), None
    finally:
        os.close(read_end)
    # Reaped when it ends, so it leaves no zombie behind in a long-lived daemon.
    threading.Thread(target=writer.wait, name="log-writer", daemon=True).start()
    return write_end, writer


def _supervised(spec: LaunchSpec) -> bool:
    return spec.argv[1:4] == ["-P", "-m", "localdet.processes.ranks"]


def log_tail(path: Path, lines: int = 5) -> str:
    if not path.exists():
        return ""
    with open(path, "rb") as log:
        log.seek(0, os.SEEK_END)
        log.seek(max(0, log.tell() - 8192))
        text = log.read().decode("utf-8", "replace")
    return "\n".join(text.strip().splitlines()[-lines:])


@dataclass(frozen=True)
class Failure:
    """How one launch failed, read from its part of the log."""
    signature: str        # the exception's message line (type: message)
    stage: str | None     # import, setup or training (trial classes); None: a script
    trained: bool | None  # whether it trained a batch; None: it cannot tell
    message: str = ""     # what the user is told: the signature, and a hint where one helps
    phase: str | None = None   # after training began: checkpoint, validation or training
    batches: int | None = None  # ... and the batches trained when it failed

    @property
    def told(self) -> str:
        return self.message or self.signature


def log_size(path: Path) -> int:
    """Where the next launch's part of the log begins (a stream offset: it stays right when
    the log's middle is dropped, see localdet/processes/capped_log.py)."""
    return capped_log.stream_size(path)


def failure(path: Path, offset: int = 0) -> Failure | None:
    """The failure this launch reported, or the last exception of a traceback it printed
    (a script), or None when its part of the log (from `offset`) shows neither."""
    try:
        with open(path, "rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(capped_log.file_position(path, offset), log.tell() - 65536))
            lines = log.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if FAILURE_MARK in line:
            try:
                data = json.loads(line.split(FAILURE_MARK, 1)[1])
                phase, batches = data.get("phase"), data.get("batches")
                at = (phase, batches) if isinstance(phase, str) and isinstance(batches, int) \
                    else (None, None)
                return Failure(str(data["signature"]), data.get("stage"), data.get("trained"),
                               str(data.get("message") or ""), *at)
            except (ValueError, KeyError, TypeError):
                break
    starts = [i for i, line in enumerate(lines) if "Traceback (most recent call last):" in line]
    if not starts:
        return None
    for line in lines[starts[-1] + 1:]:
        # Frames are indented; the first line that is not is the exception's own.
        if line.strip() and not line.startswith((" ", "\t")):
            return Failure(line.strip(), None, None)
    return None
