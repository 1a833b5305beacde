"""localdet's side of scripts/bench/search.py: a daemon on a temporary LOCALDET_HOME, the search
submitted and timed to COMPLETED, then what its records say: the hyperparameters its trials
drew (the bare fits repeat them), where its time went (`localdet status ID --timeline --json`,
localdet/operations/timeline.py) and each launch's phases (table launch_phases).

    result = run_localdet(args, env, "keras2", warm=None, keep=False)
    result["wall"], result["draws"], result["timeline"]["shares"], result["first"]
    result["warm_up_first"]  # the warm-up trial's launch -> first batch ([], or None: none ran)

Imports no TensorFlow.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "digits_trial"
RECORDS_PER_EPOCH = 1437  # 80 % of the 1797 digits
BATCH_SIZE = 32
BATCHES_PER_EPOCH = -(-RECORDS_PER_EPOCH // BATCH_SIZE)  # 45
HIDDEN_UNITS = (16, 128)
LOG10_LEARNING_RATE = (-3.5, -1.5)
DROPOUT = 0.1
ASHA_RUNGS, ASHA_DIVISOR = 3, 4
# TF_USE_LEGACY_KERAS for each Keras line (bare fits, Optuna, Keras Tuner: the process's own).
LEGACY = {"keras2": "1", "keras3": "0"}
KERAS = {"keras2": "Keras 2", "keras3": "Keras 3"}


def localdet_config(args: argparse.Namespace, line: str) -> dict:
    """The search as an experiment config. Keras 2 is the daemon's own choice for a trial class
    (Determined's rule); Keras 3 is asked for in the config's environment, as a user would."""
    searcher = {"metric": "val_accuracy", "smaller_is_better": False,
                "max_length": {"epochs": args.epochs}, "max_trials": args.trials}
    if args.searcher == "asha":
        # One at a time: ASHA decides promotions from the results so far.
        searcher.update(name="adaptive_asha", max_rungs=ASHA_RUNGS, divisor=ASHA_DIVISOR,
                        mode="standard", max_concurrent_trials=1)
    else:
        # The default max_concurrent_trials: the one slot runs them one at a time, and the
        # next trial is queued while one trains (random draws do not depend on results), so
        # the daemon can start it ahead of its slot.
        searcher.update(name="random")
    config = {
        "name": f"search-bench-{args.searcher}-{line}",
        "entrypoint": "model_def:DigitsTrial",
        "hyperparameters": {
            "global_batch_size": BATCH_SIZE, "dropout": DROPOUT,
            "hidden_units": {"type": "int", "minval": HIDDEN_UNITS[0],
                             "maxval": HIDDEN_UNITS[1]},
            "learning_rate": {"type": "log", "minval": LOG10_LEARNING_RATE[0],
                              "maxval": LOG10_LEARNING_RATE[1]},
        },
        "records_per_epoch": RECORDS_PER_EPOCH,
        "searcher": searcher,
        "min_validation_period": {"epochs": 1},
        "max_restarts": 0,
        "reproducibility": {"experiment_seed": args.seed},
    }
    if line == "keras3":
        config["environment"] = {"environment_variables": ["TF_USE_LEGACY_KERAS=0"]}
    return config


def asha_brackets(args: argparse.Namespace) -> list[list[int]]:
    """localdet's adaptive_asha brackets for this search, as rung lengths in epochs (Determined's
    formulas: 12 trials of at most 16 epochs give [[4, 16], [16]], 16 trials [[1, 4, 16],
    [4, 16]])."""
    from localdet.search.methods.asha import bracket_rung_counts, rung_units
    counts = bracket_rung_counts(ASHA_RUNGS, args.epochs, args.trials, ASHA_DIVISOR, "standard")
    return [rung_units(args.epochs, rungs, ASHA_DIVISOR) for rungs in counts]


def seconds(text: str) -> float:
    return datetime.datetime.fromisoformat(text).timestamp()


def wait_until_idle(pid: int, timeout: float = 180.0) -> None:
    """Until the daemon and its children (its warm process importing TensorFlow) have used
    under a tenth of a CPU over a second: the search starts on a daemon already idle."""
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
            before = sum(sum(p.cpu_times()[:2]) for p in tree)
            time.sleep(1.0)
            after = sum(sum(p.cpu_times()[:2]) for p in tree)
        except psutil.Error:
            continue  # a process came or went: look again
        if after - before < 0.1:
            return


def wait_for_warm_process(pid: int, timeout: float = 60.0) -> None:
    """Until the daemon has started its first warm process (a few seconds after its start,
    where nothing is submitted: localdet/processes/warm_pool.py, AT_START_AFTER_SECONDS)."""
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if any("localdet.processes.warm_process" in " ".join(child.cmdline())
                   for child in psutil.Process(pid).children()):
                return
        except psutil.Error:
            pass  # a process came or went: look again
        time.sleep(0.1)


def daemon_has_warm(env: dict) -> bool:
    text = subprocess.run([sys.executable, "-m", "localdet", "daemon", "--help"], env=env,
                          capture_output=True, text=True).stdout
    return "--warm" in text


def run_localdet(args: argparse.Namespace, env: dict, line: str, warm: int | None,
                 keep: bool) -> dict:
    home = tempfile.mkdtemp(prefix=f"search-bench-localdet-{line}-")
    env = {**env, "LOCALDET_HOME": home}
    env.pop("TF_USE_LEGACY_KERAS", None)  # the daemon chooses each trial's line itself
    argv = [sys.executable, "-m", "localdet", "daemon", "--slots", "1"]
    if warm is not None:
        argv += ["--warm", str(warm)]
    daemon_log = Path(home) / "bench-daemon.out"
    with open(daemon_log, "w") as out:
        daemon = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while "watching" not in daemon_log.read_text():
            if daemon.poll() is not None or time.monotonic() > deadline:
                sys.exit("the daemon did not start:\n" + daemon_log.read_text()[-3000:])
            time.sleep(0.1)
        if warm != 0:
            wait_for_warm_process(daemon.pid)
        wait_until_idle(daemon.pid)
        time.sleep(args.settle)
        warm_up = None
        if args.warm_up:
            # One trial of the same model first, as a daemon in use has run before: its warm
            # process then holds what the trials import (scikit-learn, here), as the bare
            # fits' process holds it before their clock starts.
            config = localdet_config(args, line)
            config["name"] += "-warm-up"
            config["searcher"] = {"name": "random", "metric": "val_accuracy", "max_trials": 1,
                                  "smaller_is_better": False, "max_length": {"epochs": 1}}
            warm_up_id, _, db = submit_and_wait(Path(home), env, config, daemon, daemon_log)
            warm_up = launch_spans(db, warm_up_id)["first"]
            db.close()
            wait_until_idle(daemon.pid)
            time.sleep(args.settle)
        experiment, wall, db = submit_and_wait(Path(home), env, localdet_config(args, line),
                                               daemon, daemon_log)
        result = {"wall": wall, **records(db, experiment), **launch_spans(db, experiment),
                  "timeline": timeline(env, experiment), "warm_up_first": warm_up}
        db.close()
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        if keep:
            print(f"  (localdet home kept: {home})")
        else:
            shutil.rmtree(home, ignore_errors=True)
    return result


def submit_and_wait(home: Path, env: dict, config: dict, daemon: subprocess.Popen,
                    daemon_log: Path) -> tuple[int, float, sqlite3.Connection]:
    """Submits the experiment and waits for it to end COMPLETED (else exits, with the
    daemon's log): its id, the seconds from the submission to its end, the database open."""
    config_path = home / f"{config['name']}.yaml"
    config_path.write_text(json.dumps(config))  # JSON is YAML
    submitted = time.time()
    subprocess.run([sys.executable, "-m", "localdet", "submit", str(config_path),
                    str(EXAMPLE)], env=env, check=True, stdout=subprocess.DEVNULL)
    db = sqlite3.connect(home / "localdet.db", timeout=30)
    while True:
        rows = db.execute("SELECT id, state, ended_at, error FROM experiments WHERE name = ?",
                          (config["name"],)).fetchall()
        if rows and rows[0][1] not in ("ACTIVE", "PAUSED"):
            break
        if daemon.poll() is not None:
            sys.exit(f"the daemon exited (status {daemon.returncode}):\n"
                     + daemon_log.read_text()[-3000:])
        time.sleep(0.1)
    seen = time.time()
    experiment, state, ended_at, error = rows[0]
    if state != "COMPLETED":
        sys.exit(f"{config['name']} ended {state}: {error}; the daemon's log:\n"
                 + daemon_log.read_text()[-3000:])
    return experiment, (seconds(ended_at) if ended_at else seen) - submitted, db


def records(db: sqlite3.Connection, experiment: int) -> dict:
    """The trials: what they drew and trained (in the order they were made), the best
    validation, the launches and the Keras line each launch ran under."""
    trials = db.execute("SELECT hparams, batches_trained FROM trials WHERE experiment_id = ? "
                        "ORDER BY id", (experiment,)).fetchall()
    draws = [{"hidden_units": json.loads(hparams)["hidden_units"],
              "learning_rate": json.loads(hparams)["learning_rate"],
              "epochs": round((batches or 0) / BATCHES_PER_EPOCH)}
             for hparams, batches in trials]
    best = db.execute(
        "SELECT MAX(json_extract(m.metrics, '$.val_accuracy')) FROM metrics m JOIN trials t "
        "ON t.id = m.trial_id WHERE t.experiment_id = ? AND m.kind = 'validation'",
        (experiment,)).fetchone()[0]
    launched = [json.loads(payload) for (payload,) in db.execute(
        "SELECT payload FROM events WHERE experiment_id = ? AND kind = 'trial_launched'",
        (experiment,))]
    return {"trials": len(trials), "draws": draws, "best": best or 0.0,
            "epochs": sum((batches or 0) for _, batches in trials) / BATCHES_PER_EPOCH,
            "launches": len(launched), "warm_launches": sum(bool(p.get("warm")) for p in launched),
            "keras_lines": sorted({p.get("keras_line", "?") for p in launched})}


def launch_spans(db: sqlite3.Connection, experiment: int) -> dict:
    """Per launch, from its phases: launch -> first batch (the daemon's decision to launch to
    the first batch's end: what the timeline's launch_to_first_batch averages), and between
    two launches on the one slot, the last batch of one -> the first batch of the next, of
    which the slot free (the exit recorded) -> the next launch."""
    try:
        rows = db.execute("SELECT trial_id, launch, phase, started, ended, details FROM "
                          "launch_phases WHERE experiment_id = ? ORDER BY started, id",
                          (experiment,)).fetchall()
    except sqlite3.OperationalError:  # a localdet from before the timeline
        rows = []
    grouped: dict[tuple, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for trial, launch, phase, started, ended, details in rows:
        grouped[(trial, launch)][phase].append((started, ended, json.loads(details or "{}")))
    launches = sorted((its for its in grouped.values() if its.get("launch")),
                      key=lambda its: its["launch"][0][0])
    first, warm, handover, gap = [], [], [], []
    previous = None
    for its in launches:
        started = its["launch"][0][0]
        batch = its["first_batch"][0][1] if its.get("first_batch") else None
        if batch is not None:
            first.append(batch - started)
            warm.append(bool(its["launch"][0][2].get("warm")))
        if previous is not None and previous.get("training") and previous.get("exit"):
            gap.append(started - previous["exit"][0][1])
            if batch is not None:
                handover.append(batch - max(end for _, end, _ in previous["training"]))
        previous = its
    return {"first": first, "warm": warm, "handover": handover, "gap": gap}


def timeline(env: dict, experiment: int) -> dict:
    """What `localdet status ID --timeline --json` says ({} from a localdet without it)."""
    done = subprocess.run([sys.executable, "-m", "localdet", "status", str(experiment),
                           "--timeline", "--json"], env=env, capture_output=True, text=True)
    if done.returncode:
        print(f"  (localdet status --timeline failed: {done.stderr.strip()[-300:]})",
              file=sys.stderr)
        return {}
    return json.loads(done.stdout or "{}")


def median(values: list[float]) -> str:
    if not values:
        return "n/a"
    return (f"median {statistics.median(values):.2f} s (min {min(values):.2f}, "
            f"max {max(values):.2f}, n={len(values)})")
