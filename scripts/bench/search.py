"""A hyperparameter search three ways: Optuna, Keras Tuner, localdet's daemon.

One run does the same search of the digits model (examples/digits_trial: Dense(hidden_units,
relu), Dropout(0.1), Dense(10, softmax), Adam(learning_rate), on scikit-learn's digits) with:

  Optuna        one process: a study on SQLite storage (a temporary file), RandomSampler
                (seeded), optuna-integration's Keras pruning callback reporting val_accuracy
                every epoch (KerasPruningCallback under Keras 3, TFKerasPruningCallback under
                Keras 2), NopPruner for the random search, HyperbandPruner for --searcher asha
  Keras Tuner   one process: RandomSearch (max_trials, seeded), or Hyperband for asha
  localdet      `localdet daemon --slots 1` (temporary LOCALDET_HOME), already running and
                idle (--settle, 5, seconds after it says it is watching) when the clock starts;
                timed from `localdet submit` to the experiment COMPLETED; searcher `random`
                (max_trials, max_concurrent_trials 1) or `adaptive_asha`

Random (the default): --trials 8 of --epochs 2. ASHA (--searcher asha): 12 trials of at
most --epochs 16, max_rungs 3, divisor 4: localdet's adaptive_asha (mode standard), Optuna's
HyperbandPruner and Keras Tuner's Hyperband(max_epochs 16, factor 4). Determined's formulas
cap the rungs by the trials as well: 12 trials get two brackets, one with rungs after 4 and
16 epochs (8 trials) and one of 16 epochs (4 trials); `--trials 16` gets rungs after 1, 4
and 16. Optuna's HyperbandPruner is given the same brackets (min_resource the shortest rung,
max_resource 16, reduction_factor 4); Keras Tuner's Hyperband always starts at 1 epoch and
sets its own number of trials (32 for 16 epochs: brackets with rungs after 1, 4, 16 epochs,
4, 16 and 16). The three stop different trials early, so the table gives the trials and
epochs each trained, and the seconds per epoch trained beside the wall time. (A trial that
Keras Tuner's Hyperband promotes reloads its weights with a fresh optimizer; localdet's
resume their optimizer state too.)

How the three are made comparable:
  - the same model, data split (train_test_split(test_size=0.2, random_state=0): 1437
    training and 360 validation digits), batch size 32, shuffled training data, and one
    validation pass over the 360 digits after every epoch (localdet: min_validation_period 1
    epoch); an epoch is 45 batches (Keras's last batch of each epoch holds 29 digits;
    localdet's data never ends, so its batches all hold 32);
  - the same search space: hidden_units an int in [16, 128], learning_rate log-uniform in
    [10^-3.5, 10^-1.5], dropout 0.1; each tool draws its own seeded random samples from it;
  - one trial at a time everywhere (localdet: 1 slot, max_concurrent_trials 1), each in a
    fresh Python process started by this script, with the same environment (TensorFlow's
    default thread pools, TF_CPP_MIN_LOG_LEVEL=2), one tool after another; this script
    itself imports no TensorFlow. Run it on an otherwise idle machine: the load average
    before and after is printed, and with 2 CPUs anything else running shifts the figures;
  - each tool keeps what it normally keeps: Optuna its study in SQLite (a row per epoch
    through the pruning callback), Keras Tuner its trials and best weights in a temporary
    folder, localdet its records, metrics and checkpoints (one per trial, one per rung under
    ASHA) in its temporary LOCALDET_HOME.

Optuna's and Keras Tuner's times are given twice: `process` (spawn to exit: Python, importing
TensorFlow and the tool, the search) and `search` (the `study.optimize` / `tuner.search` call
alone). localdet's daemon starts before the clock, so the stricter comparison is against
`search`. (The daemon keeps a warm process ready from its start for trial classes that set
no environment variables, so every launch here is warm. Its trials run under Keras 2, as a
trial class does by Determined's rule, while Optuna and Keras Tuner run under this
interpreter's default, Keras 3; the figures below, from 4395d19, are Keras 3 throughout.)

For localdet the script also reads its SQLite file once the experiment is done:
  launch -> first batch       per launch (`trial_launched` event), the time to the trial's
                              `trial_first_batch` event if there is one, else to its first
                              `training` metrics row (which comes at the first workload
                              boundary: batch 45, the first epoch's end, here)
  checkpoint -> next batch    per launch after the first, from the latest `checkpoint` event
                              before it (the previous trial's final checkpoint: one slot) to
                              the new trial's first batch as above, and the part of it
                              before the new launch (the old process ending, the daemon
                              noticing, choosing and starting the next)
Medians are printed. Targets, printed beside the figures, never asserted: localdet's wall
time at most 1.2x Optuna's, first batch within 1 s of a warm process being assigned.

    pip install -e ".[bench]"                       # optuna, optuna-integration, keras-tuner
    python scripts/bench/search.py                  # random: 8 trials of 2 epochs
    python scripts/bench/search.py --searcher asha  # ASHA: 12 trials, up to 16 epochs
    python scripts/bench/search.py --trials 3 --epochs 1          # a quicker look
    python scripts/bench/search.py --warm 0         # passed to `localdet daemon --warm`
    python scripts/bench/search.py --both-warm      # localdet twice: warm default, --warm 0
    python scripts/bench/search.py --only localdet  # one tool (repeatable)
    python scripts/bench/search.py --smoke          # seconds: 2 trials of 1 epoch, no settling

Measured with --both-warm on the 2-vCPU test machine (TensorFlow 2.21, Keras 3.15, Optuna
5.0, Keras Tuner 1.4.8, localdet at 4395d19), load average under 1.2 through each run;
x: ratio to Optuna's process / search time:
                        random, 8 trials x 2 epochs    ASHA, 12 trials, <= 16 epochs
  Optuna                13.9 s process, 8.8 s search   35.4 s, 30.3 s (156 epochs, 0.19 s/epoch)
  Keras Tuner           14.0 s, 9.7 s: 1.00x / 1.59x   54.9 s, 50.2 s: 1.55x / 1.81x
                                                       (32 trials, 136 epochs, 0.37 s/epoch)
  localdet, warm        10.2 s: 0.73x / 1.16x          22.1 s: 0.63x / 0.73x
                        (8 of 8 launches warm)         (14 of 14 warm; 120 epochs, 0.18 s/epoch)
  localdet, --warm 0    34.2 s: 2.46x / 3.89x          62.9 s: 1.78x / 2.08x (0.53 s/epoch)
  launch -> first batch, medians: warm 0.79 s, --warm 0 3.63 s (ASHA: 0.75 s, 3.49 s)
  final checkpoint -> next first batch: warm 0.83 s, --warm 0 3.87 s (ASHA: 0.80 s, 3.73 s),
    of which checkpoint -> next launch 0.04 s warm, 0.25 s with --warm 0 (ASHA the same)
Before the warm process was kept from the daemon's start (a6fedfb), an experiment's first
launch was cold (3.6 s to its first batch) and the random search took 1.70x Optuna's search.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
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
TOOLS = ("optuna", "kerastuner", "localdet")
NAMES = {"optuna": "Optuna", "kerastuner": "Keras Tuner", "localdet": "localdet"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--searcher", choices=("random", "asha"), default="random")
    parser.add_argument("--trials", type=int, help="trials (random: 8, asha: 12)")
    parser.add_argument("--epochs", type=int,
                        help="epochs per trial (random: 2); asha: the longest rung (16)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--warm", type=int, metavar="N",
                        help="pass --warm N to `localdet daemon` (0: no warm processes)")
    parser.add_argument("--both-warm", action="store_true",
                        help="run localdet twice: the daemon's default, then --warm 0")
    parser.add_argument("--settle", type=float, default=5.0,
                        help="seconds to wait after the daemon says it is watching, before "
                             "the clock starts")
    parser.add_argument("--only", action="append", choices=TOOLS,
                        help="run only this tool (repeatable)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the temporary folders and print where they are")
    parser.add_argument("--smoke", action="store_true",
                        help="a check that it runs (tests/test_scripts.py): 2 trials of 1 epoch, "
                             "no settling")
    parser.add_argument("--worker", choices=("optuna", "kerastuner"), help=argparse.SUPPRESS)
    parser.add_argument("--min-resource", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.smoke:
        args.trials, args.epochs, args.settle = args.trials or 2, args.epochs or 1, 0.0
    args.trials = args.trials or (12 if args.searcher == "asha" else 8)
    args.epochs = args.epochs or (16 if args.searcher == "asha" else 2)
    if args.warm is not None and args.both_warm:
        parser.error("--warm and --both-warm do not go together")
    return args


# -- the Optuna and Keras Tuner sides, each run in its own process (--worker) ----------------

def load_data():
    """examples/digits_trial/model_def.py's load_data (that module imports determined)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32")
    return train_test_split(x, y.astype("int32"), test_size=0.2, random_state=0)


def build_model(hidden_units: int, learning_rate: float):
    """DigitsTrial.build_model, without the context's wrapping."""
    import tensorflow as tf
    model = tf.keras.Sequential([
        tf.keras.Input(shape=(64,)),
        tf.keras.layers.Dense(hidden_units, activation="relu"),
        tf.keras.layers.Dropout(DROPOUT),
        tf.keras.layers.Dense(10, activation="softmax"),
    ])
    model.compile(optimizer=tf.keras.optimizers.Adam(learning_rate=learning_rate),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def epoch_counter():
    """A callback class counting every epoch trained, in a global (Keras Tuner copies the
    callbacks it is given for each trial)."""
    import tensorflow as tf

    class CountEpochs(tf.keras.callbacks.Callback):
        total = 0

        def on_epoch_end(self, epoch, logs=None):
            CountEpochs.total += 1

    return CountEpochs


def run_optuna(args: argparse.Namespace, folder: Path) -> dict:
    import optuna
    import tensorflow as tf
    if tf.keras.__version__.startswith("3"):
        from optuna_integration import KerasPruningCallback as PruningCallback
    else:
        from optuna_integration import TFKerasPruningCallback as PruningCallback

    class EpochsPruningCallback(PruningCallback):
        """Reports with step = epochs trained (1, 2, ...) rather than the epoch's index, so
        the pruner's rungs fall after as many epochs as localdet's do."""

        def on_epoch_end(self, epoch, logs=None):
            super().on_epoch_end(epoch + 1, logs)

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    x_train, x_val, y_train, y_val = load_data()
    counter = epoch_counter()
    if args.searcher == "asha":
        pruner = optuna.pruners.HyperbandPruner(min_resource=args.min_resource,
                                                max_resource=args.epochs,
                                                reduction_factor=ASHA_DIVISOR)
    else:
        pruner = optuna.pruners.NopPruner()

    def objective(trial: optuna.Trial) -> float:
        tf.keras.backend.clear_session()
        tf.keras.utils.set_random_seed(args.seed * 1000 + trial.number)
        model = build_model(
            trial.suggest_int("hidden_units", *HIDDEN_UNITS),
            trial.suggest_float("learning_rate", 10 ** LOG10_LEARNING_RATE[0],
                                10 ** LOG10_LEARNING_RATE[1], log=True))
        history = model.fit(x_train, y_train, batch_size=BATCH_SIZE, epochs=args.epochs,
                            validation_data=(x_val, y_val), shuffle=True, verbose=0,
                            callbacks=[counter(), EpochsPruningCallback(trial, "val_accuracy")])
        return history.history["val_accuracy"][-1]

    study = optuna.create_study(
        storage=f"sqlite:///{folder / 'optuna.db'}", study_name="search-bench",
        direction="maximize", sampler=optuna.samplers.RandomSampler(seed=args.seed),
        pruner=pruner)
    start = time.monotonic()
    study.optimize(objective, n_trials=args.trials)
    search = time.monotonic() - start
    return {"search": search, "trials": len(study.trials), "epochs": counter.total,
            "best": study.best_value,
            "pruned": sum(t.state == optuna.trial.TrialState.PRUNED for t in study.trials)}


def run_kerastuner(args: argparse.Namespace, folder: Path) -> dict:
    import keras_tuner
    import tensorflow as tf
    x_train, x_val, y_train, y_val = load_data()
    counter = epoch_counter()
    built = [0]

    def build(hp: keras_tuner.HyperParameters):
        tf.keras.utils.set_random_seed(args.seed * 1000 + built[0])
        built[0] += 1
        return build_model(
            hp.Int("hidden_units", *HIDDEN_UNITS),
            hp.Float("learning_rate", 10 ** LOG10_LEARNING_RATE[0],
                     10 ** LOG10_LEARNING_RATE[1], sampling="log"))

    common = {"objective": keras_tuner.Objective("val_accuracy", "max"), "seed": args.seed,
              "directory": str(folder), "project_name": "search-bench", "overwrite": True}
    if args.searcher == "asha":
        tuner = keras_tuner.Hyperband(build, max_epochs=args.epochs, factor=ASHA_DIVISOR,
                                      hyperband_iterations=1, **common)
    else:
        tuner = keras_tuner.RandomSearch(build, max_trials=args.trials, **common)
    start = time.monotonic()
    tuner.search(x_train, y_train, batch_size=BATCH_SIZE, epochs=args.epochs,
                 validation_data=(x_val, y_val), shuffle=True, verbose=0,
                 callbacks=[counter()])
    search = time.monotonic() - start
    best = tuner.oracle.get_best_trials(1)[0].score
    return {"search": search, "trials": len(tuner.oracle.trials), "epochs": counter.total,
            "best": best}


def worker(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix=f"search-bench-{args.worker}-") as folder:
        run = run_optuna if args.worker == "optuna" else run_kerastuner
        result = run(args, Path(folder))
    print("RESULT " + json.dumps(result), flush=True)


def in_process(tool: str, args: argparse.Namespace, env: dict, logs: Path) -> dict:
    """Run one tool's search in a fresh process; its wall time from spawn to exit."""
    argv = [sys.executable, __file__, "--worker", tool, "--searcher", args.searcher,
            "--trials", str(args.trials), "--epochs", str(args.epochs), "--seed", str(args.seed),
            "--min-resource", str(args.min_resource)]
    log = logs / f"{tool}.log"
    start = time.monotonic()
    with open(log, "w") as err:
        done = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
    wall = time.monotonic() - start
    results = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not results:
        sys.exit(f"{NAMES[tool]} failed (exit {done.returncode}); its log:\n"
                 + log.read_text()[-3000:])
    return {"process": wall, **json.loads(results[-1].removeprefix("RESULT "))}


# -- the localdet side ------------------------------------------------------------------------

def localdet_config(args: argparse.Namespace) -> dict:
    searcher = {"metric": "val_accuracy", "smaller_is_better": False,
                "max_length": {"epochs": args.epochs}, "max_trials": args.trials,
                "max_concurrent_trials": 1}
    if args.searcher == "asha":
        searcher.update(name="adaptive_asha", max_rungs=ASHA_RUNGS, divisor=ASHA_DIVISOR,
                        mode="standard")
    else:
        searcher.update(name="random")
    return {
        "name": f"search-bench-{args.searcher}",
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


def asha_brackets(args: argparse.Namespace) -> list[list[int]]:
    """localdet's adaptive_asha brackets for this search, as rung lengths in epochs (Determined's
    formulas: 12 trials of at most 16 epochs give [[4, 16], [16]], 16 trials [[1, 4, 16],
    [4, 16]])."""
    from localdet.search.methods.asha import bracket_rung_counts, rung_units
    counts = bracket_rung_counts(ASHA_RUNGS, args.epochs, args.trials, ASHA_DIVISOR, "standard")
    return [rung_units(args.epochs, rungs, ASHA_DIVISOR) for rungs in counts]


def seconds(text: str) -> float:
    return datetime.datetime.fromisoformat(text).timestamp()


def daemon_has_warm(env: dict) -> bool:
    text = subprocess.run([sys.executable, "-m", "localdet", "daemon", "--help"], env=env,
                          capture_output=True, text=True).stdout
    return "--warm" in text


def run_localdet(args: argparse.Namespace, env: dict, warm: int | None, keep: bool) -> dict:
    home = tempfile.mkdtemp(prefix="search-bench-localdet-")
    env = {**env, "LOCALDET_HOME": home}
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
        time.sleep(args.settle)
        config_path = Path(home) / "search-bench.yaml"
        config_path.write_text(json.dumps(localdet_config(args)))  # JSON is YAML
        submitted = time.time()
        subprocess.run([sys.executable, "-m", "localdet", "submit", str(config_path),
                        str(EXAMPLE)], env=env, check=True, stdout=subprocess.DEVNULL)
        db = sqlite3.connect(Path(home) / "localdet.db", timeout=30)
        while True:
            rows = db.execute("SELECT id, state, ended_at FROM experiments").fetchall()
            if rows and rows[0][1] not in ("ACTIVE", "PAUSED"):
                break
            if daemon.poll() is not None:
                sys.exit(f"the daemon exited (status {daemon.returncode}):\n"
                         + daemon_log.read_text()[-3000:])
            time.sleep(0.1)
        seen = time.time()
        experiment, state, ended_at = rows[0]
        if state != "COMPLETED":
            error = db.execute("SELECT error FROM experiments").fetchone()[0]
            sys.exit(f"the search ended {state}: {error}; the daemon's log:\n"
                     + daemon_log.read_text()[-3000:])
        wall = (seconds(ended_at) if ended_at else seen) - submitted
        result = {"wall": wall, **latencies(db, experiment)}
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


def latencies(db: sqlite3.Connection, experiment: int) -> dict:
    events = db.execute("SELECT at, trial_id, kind, payload FROM events "
                        "WHERE experiment_id = ? ORDER BY id", (experiment,)).fetchall()
    reports = db.execute(
        "SELECT m.trial_id, m.recorded_at, m.batches_trained FROM metrics m "
        "JOIN trials t ON t.id = m.trial_id WHERE t.experiment_id = ? AND m.kind = 'training' "
        "ORDER BY m.id", (experiment,)).fetchall()
    first_batches = [(trial, seconds(at)) for at, trial, kind, _ in events
                     if kind == "trial_first_batch"]
    checkpoints = sorted(seconds(at) for at, _, kind, _ in events if kind == "checkpoint")
    launches = [(trial, seconds(at), json.loads(payload)) for at, trial, kind, payload in events
                if kind == "trial_launched"]
    first, handover, gap, report_batches, warm, handover_warm = [], [], [], [], [], []
    for trial, launched, payload in launches:
        marks = [at for t, at in first_batches if t == trial and at >= launched]
        if not marks:
            later = [(seconds(at), b) for t, at, b in reports if t == trial
                     and seconds(at) >= launched]
            if not later:
                continue
            marks = [later[0][0]]
            report_batches.append(later[0][1])
        first.append(marks[0] - launched)
        warm.append(bool(payload.get("warm")))
        before = [at for at in checkpoints if at < launched]
        if before and launched != launches[0][1]:
            handover.append(marks[0] - before[-1])
            gap.append(launched - before[-1])
            handover_warm.append(bool(payload.get("warm")))
    trials = db.execute("SELECT COUNT(*), SUM(batches_trained) FROM trials "
                        "WHERE experiment_id = ?", (experiment,)).fetchone()
    best = db.execute(
        "SELECT MAX(json_extract(m.metrics, '$.val_accuracy')) FROM metrics m JOIN trials t "
        "ON t.id = m.trial_id WHERE t.experiment_id = ? AND m.kind = 'validation'",
        (experiment,)).fetchone()[0]
    return {"trials": trials[0], "epochs": (trials[1] or 0) / BATCHES_PER_EPOCH, "best": best,
            "launches": len(launches),
            "warm_launches": sum(bool(p.get("warm")) for _, _, p in launches),
            "first": first, "handover": handover, "gap": gap, "warm": warm,
            "handover_warm": handover_warm,
            "by_event": bool(first_batches), "report_batches": report_batches}


# -- the report -------------------------------------------------------------------------------

def median(values: list[float]) -> str:
    if not values:
        return "n/a"
    return (f"median {statistics.median(values):.2f} s (min {min(values):.2f}, "
            f"max {max(values):.2f}, n={len(values)})")


def report(args: argparse.Namespace, results: dict[str, dict]) -> None:
    if args.searcher == "asha":
        what = (f"ASHA: {args.trials} trials (Keras Tuner's Hyperband: its own count), "
                f"max_rungs {ASHA_RUNGS}, divisor {ASHA_DIVISOR}, at most {args.epochs} epochs; "
                f"localdet's and Optuna's brackets' rungs after {args.brackets} epochs")
    else:
        what = f"random: {args.trials} trials of {args.epochs} epochs"
    print(f"\n{what}; {BATCHES_PER_EPOCH} batches of {BATCH_SIZE} an epoch, one trial at a "
          f"time, seed {args.seed}; load average {args.load[0]:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after ({os.cpu_count()} CPUs)")
    base = results.get("optuna")

    def ratios(wall: float) -> str:
        if not base:
            return ""
        return (f"  {wall / base['process']:.2f}x Optuna's process, "
                f"{wall / base['search']:.2f}x its search")

    def work(r: dict) -> str:
        per_epoch = r.get("wall", r.get("search")) / r["epochs"] if r["epochs"] else 0
        return (f"      {r['trials']} trials, {r['epochs']:.0f} epochs trained "
                f"({per_epoch:.2f} s per epoch), best val_accuracy {r['best']:.4f}")

    for tool in ("optuna", "kerastuner"):
        if tool in results:
            r = results[tool]
            print(f"  {NAMES[tool]:<26} process {r['process']:6.1f} s, "
                  f"search {r['search']:6.1f} s"
                  + (ratios(r["process"]) if tool != "optuna" else ""))
            print(work(r) + (f", {r['pruned']} pruned" if "pruned" in r else ""))
    for label, r in results.items():
        if not label.startswith("localdet"):
            continue
        print(f"  {label:<26} submit -> COMPLETED {r['wall']:6.1f} s" + ratios(r["wall"])
              + ("   (target <= 1.2x)" if base else ""))
        print(work(r) + f", {r['launches']} launches ({r['warm_launches']} warm)")
        if r["by_event"]:
            to = "first batch (trial_first_batch)"
        else:
            batch = (f"batch {statistics.median(r['report_batches']):.0f}"
                     if r["report_batches"] else "")
            to = f"first training report ({batch})"
        print(f"      launch -> {to}: {median(r['first'])}")
        for name, kind in (("warm", True), ("cold", False)):
            if any(r["warm"]) and kind in r["warm"]:
                print(f"        {name} launches: "
                      + median([f for f, w in zip(r["first"], r["warm"], strict=True)
                                if w == kind]))
        print("        (target: first batch within 1 s of a warm process being assigned)")
        print(f"      previous trial's final checkpoint -> next {to.split(' (')[0]}: "
              f"{median(r['handover'])}")
        for name, kind in (("warm", True), ("cold", False)):
            if any(r["handover_warm"]) and kind in r["handover_warm"]:
                print(f"        to {name} launches: "
                      + median([h for h, w in zip(r["handover"], r["handover_warm"],
                                                  strict=True) if w == kind]))
        print(f"        of which final checkpoint -> next launch: {median(r['gap'])}")


def main() -> None:
    args = parse_args()
    if args.worker:
        worker(args)
        return
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    tools = args.only or list(TOOLS)
    if "localdet" in tools and (args.warm is not None or args.both_warm) \
            and not daemon_has_warm(env):
        sys.exit("this localdet's daemon has no --warm option yet")
    args.load = os.getloadavg()
    if args.searcher == "asha":
        args.brackets = asha_brackets(args)
        args.min_resource = args.brackets[0][0]
    logs = Path(tempfile.mkdtemp(prefix="search-bench-logs-"))
    results: dict[str, dict] = {}
    for tool in ("optuna", "kerastuner"):
        if tool in tools:
            print(f"{NAMES[tool]}...", file=sys.stderr, flush=True)
            results[tool] = in_process(tool, args, env, logs)
    if "localdet" in tools:
        runs = [("localdet (warm default)", None), ("localdet (--warm 0)", 0)] \
            if args.both_warm else [("localdet" if args.warm is None
                                     else f"localdet (--warm {args.warm})", args.warm)]
        for label, warm in runs:
            print(f"{label}...", file=sys.stderr, flush=True)
            results[label] = run_localdet(args, env, warm, args.keep)
    report(args, results)
    if args.keep:
        print(f"  (logs kept: {logs})")
    else:
        shutil.rmtree(logs, ignore_errors=True)


if __name__ == "__main__":
    main()
