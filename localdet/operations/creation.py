"""Creating experiments from the commands and the SDK: the config changed where asked and
checked with its model folder, the daemon started when none runs (as `localdet daemon
start` starts it), the submission queued and waited for until the daemon's intake records
it (or says why not).

    pid = ensure_daemon(layout)                       # `localdet daemon start`, if none runs
    experiment_id = create_experiment(layout, text, Path("."),
                                      overrides={"searcher.max_length.batches": 50})
    state = wait(db, experiment_id, interval=5)       # COMPLETED, CANCELED or ERROR
    checks = test_mode(layout, text, Path("."))       # Determined's `det e create --test-mode`

Overrides follow Determined's `--config key=value`: dotted keys, YAML values, a comma-separated
value a list (`parse_overrides`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from localdet.operations.errors import OperationError
from localdet.paths import Layout
from localdet.pids import DaemonLock
from localdet.records.db import StateDB

POLL_SECONDS = 0.2
TEST_MODE_BATCHES = 2


def _overridable(config: Any, path: str) -> dict:
    if not isinstance(config, dict):
        raise OperationError(f"the config is not a mapping of settings, so --config {path}=... "
                             "cannot be applied; check the config file")
    return config


def parse_overrides(pairs: Iterable[str]) -> dict[str, Any]:
    """`["resources.slots_per_trial=2", "hyperparameters.lr=0.1"]` as a dict of dotted keys
    and YAML values; a comma-separated value (not in [] or {}) is a list, as Determined read
    `--config`."""
    import yaml

    overrides: dict[str, Any] = {}
    for pair in pairs:
        key, equals, text = pair.partition("=")
        if not equals or not key.strip():
            raise OperationError(f"--config {pair!r} is not key=value; write it as e.g. "
                                 "resources.slots_per_trial=2")
        try:
            if "," in text and not text.startswith(("[", "{")):
                value: Any = [yaml.safe_load(part) for part in text.split(",")]
            else:
                value = yaml.safe_load(text)
        except yaml.YAMLError as error:
            raise OperationError(f"--config {key}: the value {text!r} is not YAML "
                                 f"({str(error).splitlines()[0]}); quote it") from None
        overrides[key.strip()] = value
    return overrides


def apply_overrides(config_text: str, overrides: dict[str, Any] | None) -> str:
    """The config text with `overrides` (dotted keys) set; unchanged (comments kept) when
    there are none."""
    if not overrides:
        return config_text
    import yaml

    try:
        config = yaml.safe_load(config_text) or {}
    except yaml.YAMLError as error:
        raise OperationError(f"the config is not valid YAML ({str(error).splitlines()[0]}); "
                             "fix the file") from None
    for key, value in overrides.items():
        parts = key.split(".")
        here = _overridable(config, key)
        for part in parts[:-1]:
            if not isinstance(here.get(part), dict):
                here[part] = {}
            here = here[part]
        here[parts[-1]] = value
    return yaml.safe_dump(config, sort_keys=False)


def ensure_daemon(layout: Layout) -> int:
    """The pid of the daemon running on `layout`; when none runs, starts one as `localdet
    daemon start` does (detached, its output in daemon.out in the state folder) and waits
    until it watches its queue. Raises OperationError when it cannot start."""
    from localdet.daemon.service import ServiceError, start

    try:
        return start(layout, refuse_running=False)
    except ServiceError as error:
        raise OperationError(str(error)) from None


def _stage(folder: Path, config_text: str, model_dir: Path | None,
           includes: Iterable[Path]) -> tuple[Path, Path | None]:
    """Write the config and, when needed, a model folder holding `model_dir` (a folder, or
    a single file as Determined accepted) and the `includes` into `folder`; returns the
    config's path and the model folder to submit."""
    config_path = folder / "config.yaml"
    config_path.write_text(config_text, encoding="utf-8")
    includes = [Path(p) for p in includes]
    if model_dir is not None and not Path(model_dir).exists():
        raise OperationError(f"model folder '{model_dir}' does not exist")
    if not includes and (model_dir is None or Path(model_dir).is_dir()):
        return config_path, model_dir
    staged = folder / "model"
    if model_dir is not None and Path(model_dir).is_dir():
        shutil.copytree(model_dir, staged, ignore=shutil.ignore_patterns(
            "__pycache__", ".git", "*.pyc"))
    else:
        staged.mkdir()
        if model_dir is not None:
            shutil.copy2(model_dir, staged / Path(model_dir).name)
    for path in includes:
        if not path.exists():
            raise OperationError(f"--include '{path}' does not exist")
        target = staged / path.resolve().name
        if path.is_dir():
            shutil.copytree(path, target, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__", ".git", "*.pyc"))
        else:
            shutil.copy2(path, target)
    return config_path, staged


def _wait_for_intake(layout: Layout, queued_name: str) -> int:
    """The id the intake gave the queued submission; OperationError with its reason when
    it refused it, or when the daemon stopped first."""
    from localdet.daemon.submissions import ingested_as

    db: StateDB | None = None
    try:
        while True:
            if db is None and layout.db.exists():
                db = StateDB.open(layout.db)
            outcome = ingested_as(db, queued_name) if db is not None else None
            if outcome is not None:
                status, value = outcome
                if status == "rejected":
                    raise OperationError(str(value))
                return int(value)
            if DaemonLock.holder(layout.daemon_lock) is None:
                raise OperationError(
                    f"the daemon stopped before taking the experiment; it waits in "
                    f"{layout.queue / queued_name} for the next daemon (`localdet daemon start`)")
            time.sleep(POLL_SECONDS)
    finally:
        if db is not None:
            db.close()


def create_experiment(layout: Layout, config_text: str, model_dir: Path | None, *,
                      overrides: dict | None = None, includes: Iterable[Path] = (),
                      parent_id: int | None = None, start_daemon: bool = True,
                      warn: Callable[[str], None] | None = None) -> int:
    """Queue an experiment (config text, with `overrides` applied, and its model folder
    plus `includes`) and wait until the daemon's intake records it; returns its id.
    `parent_id` records it as forked from that experiment. Without `start_daemon`, a
    missing daemon is an error rather than started. The config's warnings go to `warn`.
    Raises OperationError with the intake's (or the config check's) one sentence."""
    from localdet.config.experiment import ConfigError
    from localdet.daemon.submissions import SubmissionError, read_submission, submit

    text = apply_overrides(config_text, overrides)
    try:
        with tempfile.TemporaryDirectory(prefix="localdet-create-") as folder:
            config_path, folder_to_submit = _stage(Path(folder), text, model_dir, includes)
            # The config and the model folder are checked before anything is started.
            read_submission(config_path, folder_to_submit)
            if start_daemon:
                ensure_daemon(layout)
            elif DaemonLock.holder(layout.daemon_lock) is None:
                raise OperationError(f"no localdet daemon is running on {layout.home}; start "
                                     "one with `localdet daemon start`")
            layout.ensure()
            queued, warnings = submit(layout, config_path, folder_to_submit)
    except (ConfigError, SubmissionError) as error:
        raise OperationError(str(error)) from None
    except (OSError, shutil.Error) as error:  # a file it cannot read, a disk that is full
        raise OperationError(f"cannot copy the model definition into the queue: "
                             f"{str(error).splitlines()[0][:300]}") from None
    for warning in warnings:
        if warn is not None:
            warn(warning)
    experiment_id = _wait_for_intake(layout, queued.name)
    if parent_id is not None:
        _record_parent(layout, experiment_id, parent_id)
    return experiment_id


def _record_parent(layout: Layout, experiment_id: int, parent_id: int) -> None:
    with StateDB.open(layout.db) as db:
        db.experiment(parent_id)  # NotFound for no such parent
        with db.atomic():
            db.db.execute("UPDATE experiments SET parent_id = ? WHERE id = ?",
                          [parent_id, experiment_id])
            db.log_event("experiment_forked", experiment_id=experiment_id, parent_id=parent_id)


NO_DAEMON_SECONDS = 30  # a daemon restarted meanwhile (stop, start) is not an absence


def wait(db: StateDB, experiment_id: int, interval: float = 5.0,
         layout: Layout | None = None) -> str:
    """Poll until the experiment is COMPLETED, CANCELED or ERROR; returns that state.
    Raises NotFound for no such experiment (or one deleted meanwhile), and OperationError
    once it is PAUSED, as Determined's wait did (nothing would end it), or, given the
    `layout`, while no daemon runs the daemon's experiment (at once, or for
    NO_DAEMON_SECONDS once waiting)."""
    from localdet.records.states import TERMINAL_STATES, ExperimentState

    absent_since: float | None = None
    first = True
    while True:
        experiment = db.experiment(experiment_id)
        state = experiment.state
        if state in TERMINAL_STATES:
            return str(state)
        if state == ExperimentState.PAUSED:
            raise OperationError(f"experiment {experiment_id} is paused, so it will not end "
                                 f"while waited for; activate it first (`det e activate "
                                 f"{experiment_id}`)")
        if layout is not None and experiment.managed \
                and DaemonLock.holder(layout.daemon_lock) is None:
            absent_since = absent_since if absent_since is not None else time.monotonic()
            if first or time.monotonic() - absent_since >= NO_DAEMON_SECONDS:
                raise OperationError(
                    f"no localdet daemon is running on {layout.home}, so experiment "
                    f"{experiment_id} ({state}) will not end while waited for; start one "
                    "with `localdet daemon start`")
        else:
            absent_since = None
        first = False
        time.sleep(interval)


def test_config_text(config_text: str, batches: int = TEST_MODE_BATCHES) -> str:
    """Determined's test-mode config: a single trial (the single searcher picks its
    hyperparameters) of `batches` batches, validated after each one, a checkpoint kept, no
    restarts; checkpoints go to the test's own state folder."""
    import yaml

    try:
        config = yaml.safe_load(config_text) or {}
    except yaml.YAMLError as error:
        raise OperationError(f"the config is not valid YAML ({str(error).splitlines()[0]}); "
                             "fix the file") from None
    _overridable(config, "searcher")
    searcher = config.get("searcher") or {}
    config.update({
        "description": f"[test-mode] {config.get('description') or config.get('name') or ''}",
        "min_validation_period": {"batches": 1},
        "checkpoint_storage": {"save_experiment_best": 0, "save_trial_best": 0,
                               "save_trial_latest": 1},
        "searcher": {"name": "single", "metric": searcher.get("metric", "val_loss"),
                     "smaller_is_better": searcher.get("smaller_is_better", True),
                     "max_length": {"batches": batches}},
        "max_restarts": 0,
    })
    return yaml.safe_dump(config, sort_keys=False)


def test_mode(layout: Layout, config_text: str, model_dir: Path | None, *,
              overrides: dict | None = None, includes: Iterable[Path] = (),
              report: Callable[[str], None] = print,
              batches: int = TEST_MODE_BATCHES) -> dict[str, Any]:
    """Determined's `--test-mode`: the experiment shrunk to one trial of a few batches,
    run in the foreground in a temporary state folder (nothing is recorded in `layout`),
    then checked: it trained, validated, checkpointed, and its checkpoint reads back (a
    Keras trial's model loads from it). `report` is told each check as it passes; returns
    {"passed": bool, "checks": [...], "failed": sentence or None}."""
    from localdet.records.states import ExperimentState

    del layout  # the test records nothing in the user's state folder
    text = test_config_text(apply_overrides(config_text, overrides), batches)
    checks: list[str] = []

    def passed(what: str) -> None:
        checks.append(what)
        report(f"{what} [ok]")

    with tempfile.TemporaryDirectory(prefix="localdet-test-mode-") as folder:
        config_path, model = _stage(Path(folder), text, model_dir, includes)
        if model is None:
            raise OperationError("test mode needs the model folder (MODEL_DIR)")
        home = Path(folder) / "home"
        output = Path(folder) / "run.log"
        env = {**os.environ, "LOCALDET_HOME": str(home)}
        with open(output, "wb") as out:
            code = subprocess.run(
                [sys.executable, "-m", "localdet", "run", str(config_path), str(model),
                 "--quiet"], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=env).returncode
        log = output.read_text(errors="replace")
        if not (home / "localdet.db").exists():
            return _failed(checks, f"the config or model folder was refused: {_tail(log)}")
        with StateDB.open(home / "localdet.db") as db:
            experiments = db.experiments()
            if not experiments:
                return _failed(checks, f"nothing was run: {_tail(log)}")
            experiment = experiments[0]
            trials = db.trials(experiment.id)
            trial_log = ""
            if trials:
                path = Path(home, "experiments", str(experiment.id), "trials",
                            str(trials[0].id), "trial.log")
                trial_log = path.read_text(errors="replace") if path.exists() else ""
            passed("scheduling task")
            training = db.metrics(trials[0].id, "training") if trials else []
            if not training and not (trials and trials[0].batches_trained):
                return _failed(checks, f"training failed: {_tail(trial_log or log)}")
            passed(f"training ({trials[0].batches_trained} batches)")
            if not (trials and db.metrics(trials[0].id, "validation")):
                return _failed(checks, f"validation failed: {_tail(trial_log or log)}")
            passed("validation")
            checkpoints = db.checkpoints(experiment.id)
            if experiment.state != ExperimentState.COMPLETED or code != 0 or not checkpoints:
                why = experiment.error or _tail(trial_log or log)
                return _failed(checks, f"checkpointing failed ({experiment.state}): {why}")
            passed(f"checkpointing ({checkpoints[-1].uuid})")
            restored = _read_back(Layout(home), db, checkpoints[-1].uuid,
                                  Path(folder) / "restored", experiment.config)
            if restored is not None:
                return _failed(checks, f"restoring the checkpoint failed: {restored}")
            passed("restoring the checkpoint")
    return {"passed": True, "checks": checks, "failed": None}


def _read_back(layout: Layout, db: StateDB, uuid: str, destination: Path,
               config: dict) -> str | None:
    """Write the checkpoint out as a folder (every stored file read back and checked against
    its hash) and, for a Keras trial, load its model from there; None when that worked,
    else what failed."""
    from localdet.checkpoints.manifest import files_of
    from localdet.checkpoints.storage import checkpoint_store
    from localdet.checkpoints.store import StoreError

    try:
        found = db.checkpoint(uuid)
        checkpoint_store(layout, found).materialize(files_of(found.manifest), destination)
    except (StoreError, LookupError) as error:
        return str(error)
    keras_files = ("determined-keras-model.h5", "localdet-keras-weights.h5")
    if not any((destination / name).exists() for name in keras_files):
        return None  # a script's own files: read back is all there is to check
    code = subprocess.run(
        [sys.executable, "-c", "import sys; from determined import keras; "
         "keras.load_model_from_checkpoint_path(sys.argv[1])", str(destination)],
        stdin=subprocess.DEVNULL, capture_output=True, text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    if code.returncode != 0:
        return _tail(code.stderr)
    return None


def _tail(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def _failed(checks: list[str], sentence: str) -> dict[str, Any]:
    return {"passed": False, "checks": checks, "failed": sentence}
