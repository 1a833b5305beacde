"""Laptop mode: a training script run on its own records itself as an unmanaged experiment.

`python3 train.py` with `det.keras.init()` and no daemon still leaves its metrics and
checkpoints in localdet's database, visible in `localdet status`, as Determined's
unmanaged trials were:

    reporter = record_script_run(Path("train.py"), hparams={"dropout": 0.5}, config_path=None)

The experiment's runner is 'script': the daemon never schedules it. When the process ends
the run is marked COMPLETED, or ERROR (CANCELED on Ctrl-C) when an exception ended it.
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, Optional

from localdet.config.experiment import ConfigError, load_config_file, parse_config
from localdet.paths import Layout
from localdet.records.db import StateDB, now
from localdet.records.states import ExperimentState, Runner, TrialState
from localdet.reporting.sqlite_reporter import SQLiteReporter
from localdet.search.methods import Create, make_search_method

# What of the script's folder is kept as the run's code: source and small settings files,
# never data sets or virtual environments that happen to sit beside the script.
CODE_SUFFIXES = (".py", ".yaml", ".yml", ".json", ".toml", ".cfg", ".txt")
CODE_MAX_BYTES = 1 << 20
SKIPPED_FOLDERS = ("__pycache__", "node_modules", "venv", "site-packages")


class ScriptRunError(RuntimeError):
    """The script's run cannot be recorded; the message says what to fix."""


def _config_for(script: Path, hparams: Optional[Dict[str, Any]],
                config_path: Optional[str]) -> tuple[dict, str]:
    if config_path:
        try:
            parsed = load_config_file(config_path)
        except ConfigError as error:
            raise ScriptRunError(f"LOCALDET_CONFIG={config_path}: {error}") from None
        text = Path(config_path).read_text(encoding="utf-8")
    else:
        raw = {"name": script.stem, "entrypoint_script": f"python3 {script.name}",
               "hyperparameters": hparams or {}}
        try:
            parsed = parse_config(raw)
        except ConfigError as error:
            raise ScriptRunError(f"det.keras.init(hparams=...): {error}") from None
        text = f"# recorded from a run of {script}\n"
    return parsed.config, text


def _copy_code(source: Path, destination: Path) -> None:
    def leave_out(directory: str, names: list[str]) -> set[str]:
        skipped = set()
        for name in names:
            path = Path(directory, name)
            if path.is_dir():
                if name.startswith(".") or name in SKIPPED_FOLDERS:
                    skipped.add(name)
            elif not name.endswith(CODE_SUFFIXES) or path.stat().st_size > CODE_MAX_BYTES:
                skipped.add(name)
        return skipped

    shutil.copytree(source, destination, ignore=leave_out, symlinks=False,
                    ignore_dangling_symlinks=True)


def _plan(script: Path, hparams: Optional[Dict[str, Any]],
          config_path: Optional[str]) -> tuple[dict, str, int, Create, dict]:
    """The run's config (and its text), experiment seed, the single searcher's trial, and
    the hyperparameters: `hparams` when given, else drawn from the config's
    hyperparameters as the single searcher would, else none."""
    config, text = _config_for(script, hparams, config_path)
    seed = config["reproducibility"].get("experiment_seed")
    if seed is None:
        seed = secrets.randbelow(2**31)
        config["reproducibility"]["experiment_seed"] = seed
    create = next((op for op in make_search_method(config, seed).initial_operations()
                   if isinstance(op, Create)), None)
    if create is None:  # a custom search: its trials come from a runner's SearchMethod
        raise ScriptRunError(
            f"LOCALDET_CONFIG={config_path}: searcher '{config['searcher']['name']}' creates "
            "trials only from a search runner (determined.searcher.LocalSearchRunner); run "
            "that script, or give this run a config with searcher.name: single")
    chosen = dict(hparams) if hparams is not None else create.hparams
    return config, text, seed, create, chosen


def script_run_reporter(script: Path, hparams: Optional[Dict[str, Any]],
                        config_path: Optional[str], record: bool = True):
    """The reporter of a script run on its own: recorded (`record_script_run`), or one
    that discards everything but still knows the hyperparameters and seed."""
    if record:
        return record_script_run(script, hparams, config_path)
    from determined.core import DiscardingReporter, TrialInfo

    config, _, _, create, chosen = _plan(Path(script).resolve(), hparams, config_path)
    scratch = Path(tempfile.mkdtemp(prefix="localdet-unrecorded-"))
    atexit.register(shutil.rmtree, scratch, True)
    (scratch / "code").mkdir()
    return DiscardingReporter(TrialInfo(
        experiment_id=0, trial_id=0, hparams=chosen, seed=create.seed, target_batches=0,
        scheduling_unit=config["scheduling_unit"], validation_period=0, checkpoint_period=0,
        latest_checkpoint=None, config=config, model_dir=scratch / "code",
        trial_dir=scratch / "trial"))


def record_script_run(script: Path, hparams: Optional[Dict[str, Any]],
                      config_path: Optional[str]) -> SQLiteReporter:
    """Create the unmanaged experiment and its one RUNNING trial; returns its reporter."""
    script = Path(script).resolve()
    config, text, seed, create, chosen = _plan(script, hparams, config_path)
    layout = Layout.from_environment().ensure()
    db = StateDB.open(layout.db)
    try:
        with db.atomic():
            experiment_id = db.create_experiment(
                name=config["name"], description=config["description"], config=config,
                original_config=text, searcher=config["searcher"]["name"],
                metric=config["searcher"]["metric"],
                smaller_is_better=config["searcher"]["smaller_is_better"],
                experiment_seed=seed, model_dir="", runner=Runner.SCRIPT)
            model_dir = layout.model_dir(experiment_id)
            db.db.table("experiments").update(experiment_id, {"model_dir": str(model_dir)})
            trial_id = db.create_trial(experiment_id=experiment_id, request_id=create.request_id,
                                       hparams=chosen, seed=create.seed, target_batches=0)
            db.update_trial(trial_id, state=TrialState.RUNNING, pid=os.getpid(), started_at=now())
            db.log_event("script_run_started", experiment_id=experiment_id, trial_id=trial_id,
                         script=str(script), argv=sys.argv)
    finally:
        db.close()
    _copy_code(script.parent, model_dir)
    reporter = SQLiteReporter(layout, trial_id)
    _end_with_the_process(reporter, experiment_id)
    print(f"localdet: recording this run as experiment {experiment_id} (trial {trial_id}) "
          f"in {layout.home}", flush=True)
    return reporter


def _end_with_the_process(reporter: SQLiteReporter, experiment_id: int) -> None:
    """Mark the run ended when the interpreter exits: ERROR (or CANCELED on Ctrl-C) if an
    uncaught exception ended it, COMPLETED otherwise."""
    failure: Dict[str, Any] = {}
    previous_hook = sys.excepthook

    def remember(kind, value, traceback):
        failure["kind"], failure["value"] = kind, value
        previous_hook(kind, value, traceback)

    def finish() -> None:
        try:
            reporter.wait_for_checkpoints()
        except Exception as error:  # the run's outcome must still be recorded
            failure.setdefault("kind", type(error))
            failure.setdefault("value", error)
        if "kind" not in failure:
            state, message = ExperimentState.COMPLETED, None
        elif issubclass(failure["kind"], KeyboardInterrupt):
            state, message = ExperimentState.CANCELED, "interrupted (Ctrl-C)"
        else:
            state, message = (ExperimentState.ERROR,
                              f"{failure['kind'].__name__}: {failure['value']}")
        reporter.db.update_trial(reporter.trial_id, state=state, error=message,
                                 stop_requested=None)
        reporter.db.set_experiment_state(experiment_id, state, error=message)

    sys.excepthook = remember
    atexit.register(finish)
