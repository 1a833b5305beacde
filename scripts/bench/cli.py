"""How long do localdet's read-only commands take with many experiments recorded?

Builds a state folder (a temporary LOCALDET_HOME) through localdet's records API, as the
daemon would have left it: `--experiments` experiments (200) with `--trials` trials in all
(5,000), each trial with its launch events, training metrics every 100 batches, a validation
and a checkpoint every 250 (retention keeps the latest), searched by the real search
driver (random, a few ASHA and single), most experiments COMPLETED, a few ACTIVE or PAUSED,
and a few batch jobs. Then runs each read-only command as a subprocess, `--repeats` times,
against `python -c pass` run the same way, and prints the fastest run of each, its ratio to
the baseline and whether it is within the target (0.25 s).

    python scripts/bench/cli.py                       # builds (about a minute), times, removes
    python scripts/bench/cli.py --keep                # keeps the folder and says where
    python scripts/bench/cli.py --home FOLDER         # times a folder built before (--keep)
    python scripts/bench/cli.py --experiments 20 --trials 500 --repeats 3   # a quicker look
    python scripts/bench/cli.py --smoke               # seconds: 10 experiments, 60 trials

Commands that do not exist in this checkout yet (`det`, `det m list`) are skipped with a
note. Timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import uuid as uuidlib
from pathlib import Path

TARGET_SECONDS = 0.25
VALIDATE_EVERY, TRAIN_EVERY = 250, 100
BIN = Path(sys.executable).parent

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--experiments", type=int, default=200)
parser.add_argument("--trials", type=int, default=5000, help="trials in all")
parser.add_argument("--repeats", type=int, default=7,
                    help="runs of each command (the fastest counts)")
parser.add_argument("--home", type=Path, help="time this state folder (built by --keep) instead")
parser.add_argument("--keep", action="store_true", help="keep the state folder it builds")
parser.add_argument("--experiment", type=int, default=7,
                    help="the experiment `status ID` and friends show (default 7)")
parser.add_argument("--smoke", action="store_true",
                    help="a check that it runs (tests/test_scripts.py): 10 experiments, "
                    "60 trials, 1 repeat")


def _config(searcher: str, trials: int, name: str) -> dict:
    from localdet.config.experiment import parse_config

    search: dict = {"name": searcher, "metric": "val_loss", "smaller_is_better": True,
                    "max_length": {"batches": 1000}}
    if searcher == "random":
        search.update(max_trials=trials, max_concurrent_trials=8)
    elif searcher == "adaptive_asha":
        search.update(max_trials=trials, max_rungs=3, divisor=4, max_concurrent_trials=8)
    return parse_config({
        "name": name, "entrypoint": "model_def:DigitsTrial",
        "hyperparameters": {"global_batch_size": 32,
                            "learning_rate": {"type": "log", "base": 10, "minval": -4,
                                              "maxval": -1},
                            "hidden_units": {"type": "int", "minval": 16, "maxval": 256},
                            "dropout": {"type": "double", "minval": 0.0, "maxval": 0.5}},
        "searcher": search,
        "checkpoint_storage": {"save_trial_latest": 1, "save_trial_best": 0,
                               "save_experiment_best": 0},
    }).config


def _train(db, search, experiment, trial, rng, stop_after: int | None = None) -> None:
    """One launch of `trial`, as the daemon and the trial process record it: launched,
    first batch, metrics, checkpoints (retention keeps the latest), validated at its target."""
    from localdet.checkpoints.manifest import build_manifest
    from localdet.checkpoints.store import FileEntry
    from localdet.records.db import now
    from localdet.records.states import TrialState

    db.update_trial(trial.id, state=TrialState.RUNNING, pid=rng.randrange(1000, 99999),
                    started_at=now(), slots=json.dumps([0]))
    db.log_event("trial_launched", experiment_id=experiment.id, trial_id=trial.id, pid=1,
                 slots=[0], keras_line="keras3",
                 keras_line_reason="rule default, decided by TensorFlow 2.21 (Keras 3)",
                 engine="single", log_offset=0, warm=True)
    db.log_event("trial_first_batch", experiment_id=experiment.id, trial_id=trial.id,
                 seconds=round(rng.uniform(0.8, 3.5), 2))
    end = trial.target_batches if stop_after is None else min(stop_after, trial.target_batches)
    loss = rng.uniform(0.5, 2.5)
    for batches in range(trial.batches_trained + TRAIN_EVERY, end + 1, TRAIN_EVERY):
        loss *= rng.uniform(0.85, 1.0)
        db.record_metrics(trial.id, "training", batches, {"loss": loss, "accuracy": 1 - loss / 3})
        if batches % VALIDATE_EVERY == 0 or batches == trial.target_batches:
            db.record_metrics(trial.id, "validation", batches,
                              {"val_loss": loss * 1.1, "val_accuracy": 1 - loss / 3,
                               "val_top5": 1 - loss / 9})
            previous = db.trial(trial.id).latest_checkpoint
            files = {"determined-keras-model.h5": FileEntry(os.urandom(32).hex(), 2_400_000),
                     "code/model_def.py": FileEntry("d" * 64, 4_200),
                     "code/const.yaml": FileEntry("e" * 64, 600),
                     "load_data.py": FileEntry("f" * 64, 1_900),
                     "trial_state.json": FileEntry(os.urandom(32).hex(), 300),
                     "metadata.json": FileEntry(os.urandom(32).hex(), 250)}
            db.add_checkpoint(build_manifest(
                uuid=str(uuidlib.UUID(int=rng.getrandbits(128))), experiment_id=experiment.id,
                trial_id=trial.id, batches_trained=batches, files=files,
                metadata={"framework": "tensorflow", "steps_completed": batches}))
            if previous:
                db.delete_checkpoint(previous, "save_trial_latest: 1")
    if stop_after is None:
        search.validation_completed(experiment, db.trial(trial.id), metric=loss * 1.1)


def build(home: Path, experiments: int, trials: int) -> None:
    import random

    from localdet.config.experiment import parse_job_config
    from localdet.paths import Layout
    from localdet.records.db import StateDB
    from localdet.records.states import ExperimentKind, ExperimentState, TrialState
    from localdet.search.driver import Search

    rng = random.Random(0)
    layout = Layout(home).ensure()
    db = StateDB.open(layout.db)
    search = Search(db, log=lambda message: None)
    jobs = max(1, experiments // 40)
    searched = experiments - jobs
    searchers = ["single" if index % 10 == 9 else "adaptive_asha" if index % 10 == 5
                 else "random" for index in range(searched)]
    # Every tenth search is twice the others' size; the trials are shared out as they are
    # made (ASHA makes fewer than its max_trials), so that the last, a random search, makes
    # the total `trials` (a single search and a job have one each).
    weights = [0 if s == "single" else 2 if index % 10 == 0 else 1
               for index, s in enumerate(searchers)]
    for index, searcher in enumerate(searchers):
        made = db.db.execute("SELECT COUNT(*) FROM trials").fetchone()[0]
        left = trials - made - jobs - searchers[index:].count("single")
        count = 1 if searcher == "single" else \
            max(1, round(left * weights[index] / sum(weights[index:])))
        # the last few stay ACTIVE (one PAUSED) with trials part-way
        live = index >= searched - 4
        name = f"digits-{searcher}-{index}"
        config = _config(searcher, count, name)
        with db.atomic():
            experiment_id = db.create_experiment(
                name=name, description=f"{searcher} search {index}", config=config,
                original_config=json.dumps(config), searcher=searcher, metric="val_loss",
                smaller_is_better=True, experiment_seed=index, model_dir=str(home / "model"))
            db.log_event("config_warning", experiment_id=experiment_id,
                         message="resources.slots_per_trial: 1 slot on this machine")
            experiment = db.experiment(experiment_id)
            search.start(experiment)
            while True:  # a live one trains until all its trials exist
                queued = db.trials(experiment_id, states=(TrialState.QUEUED,))
                if not queued or (live and len(db.trials(experiment_id)) == count):
                    break
                for trial in queued:
                    _train(db, search, experiment, trial, rng)
            if live:
                for trial in db.trials(experiment_id, states=(TrialState.QUEUED,))[:2]:
                    _train(db, search, experiment, trial, rng, stop_after=500)
                if index == searched - 1:
                    db.set_experiment_state(experiment_id, ExperimentState.PAUSED)
            else:
                db.set_experiment_state(experiment_id, ExperimentState.COMPLETED)
        if index % 20 == 0:
            print(f"  built {index + 1} of {experiments} experiments", file=sys.stderr)
    for index in range(jobs):
        config = parse_job_config({"name": f"infer-{index}",
                                   "entrypoint_script": "python3 infer.py",
                                   "resources": {"slots": 1}}).config
        with db.atomic():
            job_id = db.create_experiment(
                name=f"infer-{index}", description="", config=config, original_config="",
                searcher="none", metric="", smaller_is_better=True, experiment_seed=1,
                model_dir=str(home / "model"), kind=ExperimentKind.JOB)
            trial_id = db.create_trial(experiment_id=job_id, request_id=0, hparams={},
                                       seed=1, target_batches=0)
            db.update_trial(trial_id, state=TrialState.RUNNING, started_at=db.experiment(
                job_id).submitted_at)
            db.update_trial(trial_id, state=TrialState.COMPLETED)
            db.set_experiment_state(job_id, ExperimentState.COMPLETED)
    counts = {table: db.db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
              for table in ("experiments", "trials", "metrics", "checkpoints", "events",
                            "searcher_events")}
    db.close()
    print("recorded: " + ", ".join(f"{n} {table}" for table, n in counts.items()),
          file=sys.stderr)


def _det() -> list[str] | None:
    """How to run `det` here: its script beside this Python, else its `main` (the package
    is not reinstalled yet); None if this checkout has no `det` yet."""
    if (BIN / "det").exists():
        return [str(BIN / "det")]
    try:
        import localdet.ui.det as det
    except ImportError:
        return None
    if not hasattr(det, "main"):
        return None
    return [sys.executable, "-c", "import sys; sys.argv[0] = 'det'; "
            "from localdet.ui.det import main; main()"]


def commands(experiment: int) -> list[tuple[str, list[str] | None, str]]:
    """(what a user types, the argv, why it is skipped)."""
    localdet = [str(BIN / "localdet")] if (BIN / "localdet").exists() \
        else [sys.executable, "-m", "localdet"]
    det = _det()
    rows = [("localdet --help", localdet + ["--help"], ""),
            ("localdet status", localdet + ["status"], ""),
            (f"localdet status {experiment}", localdet + ["status", str(experiment)], ""),
            (f"localdet checkpoints {experiment}",
             localdet + ["checkpoints", str(experiment)], ""),
            (f"localdet metrics {experiment}", localdet + ["metrics", str(experiment)], "")]
    for typed, args in (("det e list", ["e", "list"]),
                        (f"det e describe {experiment}", ["e", "describe", str(experiment)]),
                        ("det m list", ["m", "list"])):
        rows.append((typed, det + args if det else None, "" if det else "no `det` here yet"))
    return rows


def best_of(argv: list[str], env: dict, repeats: int) -> tuple[float, float, str]:
    """The fastest of `repeats` runs (wall seconds), the least CPU seconds (user + system)
    a run took, and the last run's failure (stderr) if it failed."""
    times, cpu = [], []
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
        times.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if done.returncode != 0:
            return min(times), min(cpu), (done.stderr.strip().splitlines()
                                           or ["(no output)"])[-1]
    return min(times), min(cpu), ""


def done_with(home: Path, built: bool, keep: bool) -> None:
    """A state folder this run built is removed, or kept (`--keep`) to be timed again."""
    if built and not keep:
        shutil.rmtree(home, ignore_errors=True)
    elif built:
        print(f"kept {home} (time it again with --home {home})", file=sys.stderr)


def main() -> None:
    args = parser.parse_args()
    if args.smoke:
        args.experiments, args.trials, args.repeats = 10, 60, 1
    home = args.home
    built = home is None
    if built:
        home = Path(tempfile.mkdtemp(prefix="localdet-cli-bench-"))
        start = time.perf_counter()
        print(f"building {args.experiments} experiments, {args.trials} trials in {home}",
              file=sys.stderr)
        build(home, args.experiments, args.trials)
        print(f"built in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    env = {**os.environ, "LOCALDET_HOME": str(home), "COLUMNS": "160"}
    env.pop("DET_MASTER", None)
    # As installed: modules load from their bytecode (the first run writes it), not compiled
    # from source at every start as under PYTHONDONTWRITEBYTECODE.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    try:
        base, base_cpu, _ = best_of([sys.executable, "-c", "pass"], env, args.repeats)
        print(f"{'command':<28} {'seconds':>8} {'ratio':>7} {'CPU s':>7}  "
              f"within {TARGET_SECONDS} s")
        print(f"{'python -c pass':<28} {base:8.3f} {1:7.1f} {base_cpu:7.3f}")
        for typed, argv, skipped in commands(args.experiment):
            if argv is None:
                print(f"{typed:<28} {'':>8} {'':>7} {'':>7}  skipped: {skipped}")
                continue
            seconds, cpu, failure = best_of(argv, env, args.repeats)
            verdict = f"FAILED: {failure}" if failure else \
                "yes" if seconds <= TARGET_SECONDS else "NO"
            print(f"{typed:<28} {seconds:8.3f} {seconds / base:7.1f} {cpu:7.3f}  {verdict}")
        load = os.getloadavg()[0]
        print(f"(fastest of {args.repeats} runs each; load average {load:.2f}; "
              f"{os.cpu_count()} CPUs)")
    finally:
        done_with(home, built, args.keep)


if __name__ == "__main__":
    main()
