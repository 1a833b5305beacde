"""Experiments made from other experiments: `det e fork` and `det e continue`.

    child = fork(layout, db, 3)                                  # the same config and code
    child = fork(layout, db, 3, overrides={"hyperparameters.lr": 0.1})
    child = fork(layout, db, 3, config_text=Path("other.yaml").read_text())
    continue_experiment(layout, db, 4, {"searcher.max_length.batches": 400})

A fork is a new experiment, recorded through the intake (so its config is checked as any
submission's, and a bad one is refused with the intake's sentence, nothing recorded), from
the parent's config as it stands (as submitted, with its later changes; or the given config
text) with `overrides` (dotted keys,
Determined's `--config key=value`) applied, and from the parent's model folder snapshot; its
`parent_id` names the parent, as Determined's "forked from".

Continuing is Determined's `det e continue`: the same experiment, of a single trial, ended
(COMPLETED, CANCELED, ERROR) or PAUSED, becomes ACTIVE again and its trial trains on from
its latest checkpoint, to the config's max_length (which `overrides` may raise). It is
recorded as the event `experiment_continued` (from which checkpoint, at how many batches,
what changed), which `describe` lists; the daemon launches the trial as a resumed one.
"""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path
from typing import Any

from localdet.config.experiment import ConfigError, load_config_text
from localdet.daemon.submissions import EXPERIMENT, Intake, SubmissionError, copy_submission
from localdet.operations.creation import apply_overrides
from localdet.operations.errors import OperationError
from localdet.paths import Layout
from localdet.pids import DaemonLock
from localdet.records import continuation
from localdet.records.db import Experiment, StateDB
from localdet.records.states import (
    ExperimentKind,
    ExperimentState,
    IllegalTransition,
    Runner,
    TrialState,
)
from localdet.scheduling.slots import read_slot_file
from localdet.search.methods.single import SingleSearch

# What a continuation may not change: the trial keeps its hyperparameters and slots, its
# checkpoints stay where they are, and the search stays a single trial (Determined's rule).
_FIXED_ON_CONTINUE = ("hyperparameters", "resources", "checkpoint_storage")


# -- fork -----------------------------------------------------------------------------------

def fork(layout: Layout, db: StateDB, experiment_id: int, config_text: str | None = None,
         overrides: dict[str, Any] | None = None) -> int:
    """Record a new experiment from experiment `experiment_id`'s model folder and config
    (or `config_text`), with `overrides` applied; returns its id. The daemon runs it as any
    submitted experiment (started or not, it is recorded)."""
    parent = db.experiment(experiment_id)  # NotFound names what to do
    if parent.kind == ExperimentKind.JOB:
        raise OperationError(f"{experiment_id} is a job, not an experiment; run the job again "
                             "with `localdet job run`")
    model_dir = Path(parent.model_dir)
    if not model_dir.is_dir():
        raise OperationError(f"experiment {experiment_id}'s model folder {model_dir} is gone, "
                             "so there is no code to fork; create a new experiment instead")
    text = current_config_text(db, parent) if config_text is None else config_text
    text = apply_overrides(text, overrides)
    layout.ensure()
    # The daemon's slots when one runs, so that a fork it could never run is refused now.
    slots = (read_slot_file(layout.slot_file)
             if DaemonLock.holder(layout.daemon_lock) is not None else None)
    intake = Intake(layout, db, slots=slots)
    # Named after this process: a daemon's recovery leaves it alone while we live, and moves
    # it to the model folder if we die once it is recorded.
    staged = intake.incoming_foreground / f"{os.getpid()}-{secrets.token_hex(4)}"
    staged.parent.mkdir(parents=True, exist_ok=True)
    try:
        copy_submission(text, model_dir, staged)
        # Checked once before the write lock is taken (the first check imports the config
        # machinery); `record` checks again, quickly, in the transaction that sets the parent.
        intake.check(staged, f"fork of experiment {experiment_id}", EXPERIMENT)
        with db.atomic():
            child = intake.record(staged, f"fork of experiment {experiment_id}",
                                  kind=EXPERIMENT, runner=Runner.DAEMON)
            db.db.execute("UPDATE experiments SET parent_id = ? WHERE id = ?",
                          [experiment_id, child])
            db.log_event("experiment_forked", experiment_id=child, parent_id=experiment_id,
                         overrides=overrides or {}, config_file=config_text is not None)
    except (ConfigError, SubmissionError) as error:
        shutil.rmtree(staged, ignore_errors=True)
        raise OperationError(str(error)) from None
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    return child


def current_config_text(db: StateDB, experiment: Experiment) -> str:
    """The experiment's config as it stands: the text it was submitted with (comments and
    all), with what was changed since applied in order (`det e set priority/max-slots/
    gc-policy`, and each continuation's overrides)."""
    row = db.db.execute("SELECT original_config FROM experiments WHERE id = ?",
                        [experiment.id]).fetchone()
    if not row or not row[0]:
        raise OperationError(f"experiment {experiment.id} has no recorded config text (it was "
                             "recorded by a script); pass a config file")
    text = row[0]
    for event in db.events(experiment.id, kinds=(_CONFIG_CHANGED,
                                                 continuation.CONTINUED_EVENT)):
        changes = event["payload"].get("changes" if event["kind"] == _CONFIG_CHANGED
                                       else "overrides")
        text = apply_overrides(text, changes or None)
    return text


# records/catalog.set_config's event: dotted key -> new value.
_CONFIG_CHANGED = "experiment_config_changed"


# -- continue -------------------------------------------------------------------------------

def continue_experiment(layout: Layout, db: StateDB, experiment_id: int,
                        overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Make the ended (or paused) single-trial experiment ACTIVE again, its trial queued to
    train on from its latest checkpoint (to a new max_length, when `overrides` gives one).
    Returns what was done: {"experiment_id", "trial_id", "checkpoint", "batches",
    "target_batches", "overrides", "daemon_running"}."""
    experiment = db.experiment(experiment_id)
    what = f"experiment {experiment_id}"
    if experiment.kind == ExperimentKind.JOB:
        raise OperationError(f"{experiment_id} is a job, which keeps no checkpoint to continue "
                             "from; run the job again with `localdet job run`")
    if experiment.runner == Runner.SCRIPT:
        raise OperationError(f"{what} is a script that recorded itself; run the script again "
                             "to train further")
    if experiment.state == ExperimentState.ACTIVE:
        raise OperationError(f"{what} is ACTIVE; only an ended or paused experiment can be "
                             "continued")
    trials = db.trials(experiment_id)
    if experiment.searcher != "single" or len(trials) != 1:
        raise OperationError(f"{what} is a {experiment.searcher} search of {len(trials)} "
                             "trial(s), and only a single-trial experiment can be continued; "
                             f"fork it (`det e fork {experiment_id}`) to search again")
    if (experiment.runner == Runner.FOREGROUND
            and DaemonLock.holder(layout.run_lock(experiment_id)) is not None):
        raise OperationError(f"{what} is still driven by its `localdet run`; resume it there, "
                             "or stop that first")
    trial = trials[0]
    if trial.state == TrialState.RUNNING:
        raise OperationError(f"trial {trial.id} of {what} is still stopping; continue once it "
                             "is PAUSED")

    config, text_overrides = _continued_config(db, experiment, overrides)
    target = SingleSearch(config, experiment.experiment_seed).target(trial.request_id)
    resume_from = _resume_point(db, trial.id, trial.latest_checkpoint)
    batches = resume_from[1] if resume_from else 0
    if target and batches >= target:
        raise OperationError(
            f"trial {trial.id} of {what} has already trained {batches} batches, its "
            f"searcher.max_length; give a longer one to train further, e.g. --config "
            f"searcher.max_length.batches={max(2 * batches, batches + 1)}")
    try:
        continuation.reopen(
            db, experiment_id=experiment_id, trial_id=trial.id, config=config,
            target_batches=target, resume_from=resume_from[0] if resume_from else None,
            runner=Runner.DAEMON, checkpoint=resume_from[0] if resume_from else None,
            batches=batches, target=target, overrides=text_overrides,
            previous_state=experiment.state)
    except IllegalTransition as error:  # changed meanwhile (a pause finishing, say)
        raise OperationError(str(error)) from None
    return {
        "experiment_id": experiment_id,
        "trial_id": trial.id,
        "checkpoint": resume_from[0] if resume_from else None,
        "batches": batches,
        "target_batches": target,
        "overrides": text_overrides,
        "daemon_running": DaemonLock.holder(layout.daemon_lock) is not None,
    }


def config_file_overrides(text: str) -> dict[str, Any]:
    """A config file given to `det e continue --config-file` as dotted-key overrides: its
    settings merged into the experiment's, as Determined merged the file into the active
    config. A length (`{batches: N}`, `{epochs: N}`, ...) replaces the one there."""
    import yaml

    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise OperationError(f"the config file is not valid YAML "
                             f"({str(error).splitlines()[0]}); fix it") from None
    if not isinstance(loaded, dict):
        raise OperationError("the config file is not a mapping of settings; check it")
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        leaf = not isinstance(value, dict) or not value or set(value) <= _LENGTH_UNITS
        if leaf and prefix:
            flat[prefix] = value
            return
        for key, inner in value.items():
            walk(f"{prefix}.{key}" if prefix else str(key), inner)

    walk("", loaded)
    return flat


_LENGTH_UNITS = {"batches", "records", "epochs"}


def _continued_config(db: StateDB, experiment: Experiment,
                      overrides: dict[str, Any] | None) -> tuple[dict[str, Any], dict]:
    """The config the continued experiment runs with: its config as it stands
    (`current_config_text`) with these overrides applied, checked as a submission's;
    its seed, resolved warm-start source and recorded hyperparameters, resources and
    checkpoint_storage kept. Returns it and the overrides."""
    overrides = dict(overrides or {})
    text = current_config_text(db, experiment)
    try:
        before = load_config_text(text).config
        config = load_config_text(apply_overrides(text, overrides)).config
    except ConfigError as error:
        raise OperationError(str(error)) from None
    for key in _FIXED_ON_CONTINUE:
        if config[key] != before[key]:
            raise OperationError(f"a continued experiment keeps its {key}; fork experiment "
                                 f"{experiment.id} (`det e fork {experiment.id}`) to run it "
                                 f"with other {key}")
    if config["searcher"]["name"] != "single":
        raise OperationError("a continued experiment keeps its single searcher, as "
                             "Determined's did; fork it to search")
    # As recorded: `det e set priority/max-slots/gc-policy` change these in the stored
    # config (operations/experiments.py), and the continuation keeps what they set.
    for key in _FIXED_ON_CONTINUE:
        config[key] = experiment.config.get(key, config[key])
    config["reproducibility"]["experiment_seed"] = experiment.experiment_seed
    source = (experiment.config.get("searcher") or {}).get("source_checkpoint_uuid")
    if source is not None:
        config["searcher"]["source_checkpoint_uuid"] = source
    return config, overrides


def _resume_point(db: StateDB, trial_id: int, latest: str | None) -> tuple[str, int] | None:
    """The checkpoint the trial trains on from (uuid, batches): its latest while kept, else
    its newest kept one; None when it never checkpointed (it starts again from batch 0).
    Refused when it had checkpoints and retention kept none."""
    kept = db.checkpoints(trial_id=trial_id)
    if kept:
        chosen = next((c for c in kept if c.uuid == latest), None) or \
            max(kept, key=lambda c: (c.batches_trained, c.created_at))
        return chosen.uuid, chosen.batches_trained
    if latest is not None:
        raise OperationError(f"trial {trial_id} kept no checkpoint to continue from (its "
                             "checkpoint_storage settings deleted them); fork the experiment "
                             "to train anew")
    return None
