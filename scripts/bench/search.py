"""A hyperparameter search four ways: Optuna, Keras Tuner, localdet's daemon, and bare fits.

One run does the same search of the digits model (examples/digits_trial: Dense(hidden_units,
relu), Dropout(0.1), Dense(10, softmax), Adam(learning_rate), on scikit-learn's digits) with:

  Optuna        one process: a study on SQLite storage (a temporary file), RandomSampler
                (seeded), optuna-integration's Keras pruning callback reporting val_accuracy
                every epoch (KerasPruningCallback under Keras 3, TFKerasPruningCallback under
                Keras 2), NopPruner for the random search, HyperbandPruner for --searcher asha
  Keras Tuner   one process: RandomSearch (max_trials, seeded), or Hyperband for asha
  localdet      `localdet daemon --slots 1` (temporary LOCALDET_HOME), already running and
                idle (its processes, its warm one among them, under a tenth of a CPU over a second,
                then --settle, 1, second more) when the clock starts, and having run one
                trial of the same model for 1 epoch before it (a warm-up, as a daemon in use
                has run trials before: its warm process then holds what they import, as the
                bare fits' process holds it before their clock; its launch -> first batch is
                printed; --first-search leaves it out and times a new daemon's first search);
                timed from `localdet submit` to the experiment COMPLETED; searcher `random`
                (max_trials; the default max_concurrent_trials, so that the next trial
                is queued while one trains and can start ahead of its slot) or
                `adaptive_asha` (max_concurrent_trials 1); a fresh daemon for
                each Keras line (--line) and each --warm setting
  bare fits     one process that has imported TensorFlow: localdet's trials again, the same
                hyperparameters (read from its records after its search) and epochs, one
                `model.fit` after another (build, compile, fit with validation each epoch),
                under the same Keras line as those trials; timed: the fits summed (TensorFlow's
                import and the data's loading left out) and the process, spawn to exit

Keras lines (--line keras2|keras3|both, default both): localdet's digits trial is a
TFKerasTrial, which the daemon runs under Keras 2 (tf_keras) by Determined's rule; for Keras 3
the experiment's config sets TF_USE_LEGACY_KERAS=0 in environment.environment_variables.
Each line's search gets bare fits under the same line (a process started with
TF_USE_LEGACY_KERAS=1 or 0). Optuna and Keras Tuner run once, under Keras 3 (0).

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
resume their optimizer state too. The bare fits train each of localdet's trials for the
epochs it trained in all, in one fit.)

How they are made comparable:
  - the same model, data split (train_test_split(test_size=0.2, random_state=0): 1437
    training and 360 validation digits), batch size 32, shuffled training data, and one
    validation pass over the 360 digits after every epoch (localdet: min_validation_period 1
    epoch); an epoch is 45 batches (Keras's last batch of each epoch holds 29 digits;
    localdet's data never ends, so its batches all hold 32);
  - the same search space: hidden_units an int in [16, 128], learning_rate log-uniform in
    [10^-3.5, 10^-1.5], dropout 0.1; Optuna, Keras Tuner and localdet each draw their own
    seeded random samples from it, the bare fits take localdet's (with --only bare and no
    localdet: a list drawn with Python's random, seeded);
  - one trial at a time everywhere (localdet: 1 slot), each tool in
    a fresh Python process started by this script, with the same environment (TensorFlow's
    default thread pools, TF_CPP_MIN_LOG_LEVEL=2), one tool after another; this script
    itself imports no TensorFlow. Run it on an otherwise idle machine: the load average
    before and after is printed, and with 2 CPUs anything else running shifts the figures;
  - each tool keeps what it normally keeps: Optuna its study in SQLite (a row per epoch
    through the pruning callback), Keras Tuner its trials and best weights in a temporary
    folder, localdet its records, metrics and checkpoints (one per trial, one per rung under
    ASHA) in its temporary LOCALDET_HOME; the bare fits keep nothing.

Optuna's and Keras Tuner's times are given twice: `process` (spawn to exit: Python, importing
TensorFlow and the tool, the search) and `search` (the `study.optimize` / `tuner.search` call
alone). localdet's daemon starts before the clock, so the stricter comparison is against
`search`, and the strictest against the bare fits summed.

After each localdet search the script reads where its time went, from its timeline
(localdet/operations/timeline.py, what `localdet status ID --timeline --json` prints):
  shares        of the slot-seconds from the first launch's decision to the last exit:
                training, start-up (launch to first batch), validation, checkpoints,
                shut-down, the daemon (deciding, launching, recording exits), untracked
                (in a trial between phases), idle
  phase means   each recorded phase's mean seconds: launch (the daemon's decision to the
                process started), process_ready (forked from a warm process, or a cold
                start), import (the trial's module), model_built, data_ready,
                steps_traced (a trial started ahead of its slot), first_batch (the train
                function made, the first batch trained), training (a workload),
                validation, checkpoint, checkpoint_store, end, exit
and from its launches' phases (table launch_phases), medians of
  launch -> first batch       the daemon's decision to launch to the first batch's end (the
                              timeline's launch_to_first_batch, of which it gives the mean);
                              warm and cold launches apart where both occur
  last batch -> next first batch
                              between two launches on the slot: the last training batch of
                              one to the first batch of the next, of which the slot free
                              (the exit recorded) -> the next launch
Targets, printed beside the figures, never asserted: localdet's wall time at most 1.15x the
bare fits summed in the same line, launch -> first batch at most 1 s in both lines.

    pip install -e ".[bench]"                       # optuna, optuna-integration, keras-tuner
    python scripts/bench/search.py                  # random: 8 trials of 2 epochs, both lines
    python scripts/bench/search.py --line keras2    # one Keras line (keras2, keras3, both)
    python scripts/bench/search.py --searcher asha  # ASHA: 12 trials, up to 16 epochs
    python scripts/bench/search.py --trials 3 --epochs 1          # a quicker look
    python scripts/bench/search.py --warm 0         # passed to `localdet daemon --warm`
    python scripts/bench/search.py --both-warm      # localdet twice: warm default, --warm 0
    python scripts/bench/search.py --only localdet --only bare    # some tools (repeatable)
    python scripts/bench/search.py --smoke          # seconds: 2 trials, 1 epoch, Keras 2

Measured on the 2-vCPU test machine (TensorFlow 2.21, Keras 3.15.1, tf_keras 2.21.0, Optuna
5.0, Keras Tuner 1.4.8), localdet at 926c045, the default run (random, 8 trials x 2 epochs,
both lines). Other engineers' tests and benchmarks were running on and off all along; this
run fell in a lull: load average 1.1 before, 1.7 after (1-minute), not an idle machine.
Optuna 24.0 s process, 15.0 s search; Keras Tuner 23.1 s, 15.7 s (both Keras 3). x: localdet's
wall time over the bare fits summed in the same line (target <= 1.15x, not met in either):

                          Keras 2 (the default)          Keras 3 (TF_USE_LEGACY_KERAS=0)
  bare fits summed        7.4 s (0.93 s a trial;         11.3 s (1.41 s a trial;
                          process 14.9 s)                process 20.2 s)
  localdet                16.1 s: 2.18x (+1.09 s a       20.5 s: 1.82x (+1.15 s a trial);
                          trial); 1.07x Optuna's search  1.36x Optuna's search
  launches                8 of 8 warm                    7 of 8 warm (the first cold)
  launch -> first batch   median 1.13 s (0.95 to 2.37)   1.26 s; warm 1.20 s, cold 6.91 s
  last batch -> next      1.26 s, of which slot free     1.32 s, of which slot free
    first batch           -> next launch 0.00 s          -> next launch 0.00 s
  shares: training        7.0%                           6.3%
    start-up              74.0%                          80.8%
    validation            12.4%                          7.5%
    checkpoints           3.7%                           2.6%
    daemon, shut-down,    2.4%, 0.1%, 0.2%, 0.1%         2.5%, 0.0%, 0.1%, 0.1%
    untracked, idle
  phase means, s:         process_ready 0.19, import     process_ready 0.11, import 0.69
                          0.15, model_built 0.21,        (the cold launch's in it),
                          data_ready 0.09, first_batch   model_built 0.17, data_ready
                          0.73, training 0.07,           0.08, first_batch 0.88, training
                          validation 0.12, checkpoint    0.07, validation 0.09, checkpoint
                          0.04, checkpoint_store 0.03,   0.04, checkpoint_store 0.02, end
                          end 0.03, exit 0.04            0.02, exit 0.06
Two runs of 926c045 under more load, one after the other: load 1.3 -> 4.7: Keras 2 14.6 s,
1.73x its bare fits (8.4 s), 1.16x Optuna's search (12.5 s); Keras 3 19.1 s, 1.39x (13.7 s);
launch -> first batch 1.11 s and 1.17 s (cold 6.50 s). Load 3.1 -> 8.2: Keras 2 17.8 s,
1.80x (9.9 s), 0.87x Optuna's search (20.4 s); Keras 3 36.8 s, 2.33x (15.8 s), its cold
first launch 17.1 s to the first batch. The ratios move by 0.4x from run to run here.

Reading them: start-up (the daemon's decision to the first batch) is most of every trial.
Its first_batch phase (the train function traced, one batch) is paid by a bare fit too; what
a bare fit does not pay is process_ready, import and data_ready (about 0.4 s a trial in Keras
2), the checkpoint and the exit. A new daemon's first search pays once what the bare fits'
process did before their clock: under Keras 2 the model's imports (scikit-learn: its warm
process learns them from that first trial), under Keras 3 TensorFlow's import too (the daemon
keeps a warm process for the default line, Keras 2, once it has been idle 5 s after its
start, and one for Keras 3 only from a Keras 3 launch). Hence the warm-up trial. The training
share is small because a 45-batch epoch of this model trains in about 0.05 s: the fits are
mostly tracing and validation.

At 926c045 the table above had no warm-up. With it (the default since), on an idle machine
(load 0.6 before, 1.3 after), the same search: Keras 2 7.6 s, 0.86x its bare fits (8.8 s);
Keras 3 8.2 s, 0.77x (10.6 s); launch -> first batch median 0.29 s in both; the warm-up
trial's 1.97 s (Keras 2) and 6.89 s (Keras 3). localdet comes in under the fits done in a row
because it makes the next trial (its process, model and traced steps) on the other core
while a trial trains, which one process's fits one after another cannot. A new daemon's first
search (`--first-search`, load 0.7 -> 1.1): Keras 2 9.5 s, 1.43x (6.6 s), its first launch
2.91 s to the first batch; Keras 3 11.8 s, 1.25x (9.5 s), 5.24 s; the other launches'
median 0.26 and 0.20 s.

Earlier figures (4395d19, load average under 1.2; Keras 3 throughout, with --both-warm;
localdet measured against Optuna only): Optuna 13.9 s process, 8.8 s search; Keras Tuner 14.0
s, 9.7 s; localdet warm 10.2 s (0.73x / 1.16x), --warm 0 34.2 s. Their launch -> first batch
(warm 0.79 s, --warm 0 3.63 s) ran from the `trial_launched` event, which is written once the
trial's process has started, so it left out the wait for the process (process_ready); the
figures above run from the daemon's decision, as the timeline does.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _search_localdet import (  # noqa: E402  (imports no TensorFlow)
    ASHA_DIVISOR,
    ASHA_RUNGS,
    BATCH_SIZE,
    BATCHES_PER_EPOCH,
    DROPOUT,
    HIDDEN_UNITS,
    KERAS,
    LEGACY,
    LOG10_LEARNING_RATE,
    asha_brackets,
    daemon_has_warm,
    median,
    run_localdet,
)

TOOLS = ("optuna", "kerastuner", "localdet", "bare")
NAMES = {"optuna": "Optuna", "kerastuner": "Keras Tuner", "localdet": "localdet",
         "bare": "bare fits"}
LINES = ("keras2", "keras3")
TARGET_RATIO, TARGET_FIRST_BATCH = 1.15, 1.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--searcher", choices=("random", "asha"), default="random")
    parser.add_argument("--trials", type=int, help="trials (random: 8, asha: 12)")
    parser.add_argument("--epochs", type=int,
                        help="epochs per trial (random: 2); asha: the longest rung (16)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--line", choices=(*LINES, "both"),
                        help="the Keras line of localdet's trials and their bare fits: keras2 "
                             "(the daemon's default for a trial class), keras3 "
                             "(TF_USE_LEGACY_KERAS=0 in the config), or both, one after the other "
                             "(the default; --smoke: keras2)")
    parser.add_argument("--warm", type=int, metavar="N",
                        help="pass --warm N to `localdet daemon` (0: no warm processes)")
    parser.add_argument("--both-warm", action="store_true",
                        help="run localdet twice: the daemon's default, then --warm 0")
    parser.add_argument("--first-search", dest="warm_up", action="store_false",
                        help="time a new daemon's first search: no warm-up trial before it")
    parser.add_argument("--settle", type=float, default=1.0,
                        help="seconds to wait once the daemon is idle (its warm process "
                             "ready), before the clock starts")
    parser.add_argument("--only", action="append", choices=TOOLS,
                        help="run only this tool (repeatable)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the temporary folders and print where they are")
    parser.add_argument("--smoke", action="store_true",
                        help="a check that it runs (tests/test_scripts.py): 2 trials of 1 epoch, "
                             "no settling")
    parser.add_argument("--worker", choices=("optuna", "kerastuner", "bare"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--min-resource", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--draws", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.smoke:  # one line: the other differs only by an environment variable
        args.trials, args.epochs, args.settle = args.trials or 2, args.epochs or 1, 0.0
        args.line = args.line or "keras2"
    args.line = args.line or "both"
    args.trials = args.trials or (12 if args.searcher == "asha" else 8)
    args.epochs = args.epochs or (16 if args.searcher == "asha" else 2)
    args.lines = list(LINES) if args.line == "both" else [args.line]
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
    if keras_version().startswith("Keras 3"):
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




def run_bare(args: argparse.Namespace) -> dict:
    """localdet's trials again as plain fits, one after another in this process."""
    import tensorflow as tf
    draws = json.loads(args.draws.read_text())
    x_train, x_val, y_train, y_val = load_data()
    fits, best = [], 0.0
    for number, draw in enumerate(draws):
        tf.keras.backend.clear_session()
        tf.keras.utils.set_random_seed(args.seed * 1000 + number)
        start = time.monotonic()
        model = build_model(draw["hidden_units"], draw["learning_rate"])
        history = model.fit(x_train, y_train, batch_size=BATCH_SIZE, epochs=draw["epochs"],
                            validation_data=(x_val, y_val), shuffle=True, verbose=0)
        fits.append(time.monotonic() - start)
        best = max([best, *history.history["val_accuracy"]])
    return {"search": sum(fits), "fits": fits, "trials": len(draws),
            "epochs": sum(draw["epochs"] for draw in draws), "best": best}


def seeded_draws(args: argparse.Namespace) -> list[dict]:
    """Draws of the search space for bare fits without a localdet search to copy."""
    rng = random.Random(args.seed)
    return [{"hidden_units": rng.randint(*HIDDEN_UNITS),
             "learning_rate": 10 ** rng.uniform(*LOG10_LEARNING_RATE), "epochs": args.epochs}
            for _ in range(args.trials)]


def worker(args: argparse.Namespace) -> None:
    if args.worker == "bare":
        result = run_bare(args)
    else:
        with tempfile.TemporaryDirectory(prefix=f"search-bench-{args.worker}-") as folder:
            run = run_optuna if args.worker == "optuna" else run_kerastuner
            result = run(args, Path(folder))
    print("RESULT " + json.dumps({**result, "keras": keras_version()}), flush=True)


def keras_version() -> str:
    """What tf.keras is: "Keras 3.15.1", or "tf_keras 2.21.0" (Keras 2, which has no version
    of its own under tf.keras)."""
    import tensorflow as tf
    version = getattr(tf.keras, "__version__", None)
    if version is None:
        import tf_keras
        return f"tf_keras {tf_keras.__version__}"
    return f"Keras {version}"


def in_process(tool: str, args: argparse.Namespace, env: dict, logs: Path, line: str,
               draws: list[dict] | None = None) -> dict:
    """Run one tool's search in a fresh process under a Keras line; its wall time from spawn
    to exit."""
    argv = [sys.executable, __file__, "--worker", tool, "--searcher", args.searcher,
            "--trials", str(args.trials), "--epochs", str(args.epochs), "--seed", str(args.seed),
            "--min-resource", str(args.min_resource)]
    if draws is not None:
        (logs / f"{tool}-{line}-draws.json").write_text(json.dumps(draws))
        argv += ["--draws", str(logs / f"{tool}-{line}-draws.json")]
    log = logs / f"{tool}-{line}.log"
    start = time.monotonic()
    with open(log, "w") as err:
        done = subprocess.run(argv, env={**env, "TF_USE_LEGACY_KERAS": LEGACY[line]},
                              stdout=subprocess.PIPE, stderr=err, text=True)
    wall = time.monotonic() - start
    results = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not results:
        sys.exit(f"{NAMES[tool]} failed (exit {done.returncode}); its log:\n"
                 + log.read_text()[-3000:])
    return {"process": wall, **json.loads(results[-1].removeprefix("RESULT "))}


# -- the report -------------------------------------------------------------------------------

def report(args: argparse.Namespace, results: dict[str, dict],
           lines: dict[str, dict[str, dict]]) -> None:
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
        return (f"; {wall / base['process']:.2f}x Optuna's process, "
                f"{wall / base['search']:.2f}x its search")

    def work(r: dict) -> str:
        per_epoch = r.get("wall", r.get("search")) / r["epochs"] if r["epochs"] else 0
        return (f"      {r['trials']} trials, {r['epochs']:.0f} epochs trained "
                f"({per_epoch:.2f} s per epoch), best val_accuracy {r['best']:.4f}")

    for tool in ("optuna", "kerastuner"):
        if tool in results:
            r = results[tool]
            print(f"  {NAMES[tool]:<26} process {r['process']:6.1f} s, "
                  f"search {r['search']:6.1f} s ({r['keras']})"
                  + (ratios(r["process"]) if tool != "optuna" else ""))
            print(work(r) + (f", {r['pruned']} pruned" if "pruned" in r else ""))
    for line, runs in lines.items():
        name = KERAS[line]
        bare = runs.get("bare")
        how = ("the daemon's default for a trial class" if line == "keras2"
               else "TF_USE_LEGACY_KERAS=0 in the config's environment")
        print(f"  {name}: localdet's trials by {how}"
              + (f"; the bare fits under {bare['keras']}" if bare else ""))
        if bare:
            print(f"    {'bare fits, ' + name:<24} fits summed {bare['search']:6.1f} s "
                  f"({bare['search'] / max(bare['trials'], 1):.2f} s a trial), "
                  f"process {bare['process']:6.1f} s"
                  + ("; localdet's draws" if bare["copied"] else "; seeded draws"))
        for label, r in runs.items():
            if label == "bare":
                continue
            against = (f": {r['wall'] / bare['search']:.2f}x the bare fits summed (target <= "
                       f"{TARGET_RATIO}x)" if bare else "")
            print(f"    {label + ', ' + name:<24} submit -> COMPLETED {r['wall']:6.1f} s"
                  + against + ratios(r["wall"]))
            extra = (f", {(r['wall'] - bare['search']) / max(r['trials'], 1):.2f} s a trial "
                     "over the bare fits" if bare else "")
            print(work(r) + f", {r['launches']} launches ({r['warm_launches']} warm)" + extra)
            if r["keras_lines"] != [line]:
                print(f"      (its launches ran under {', '.join(r['keras_lines'])}, "
                      f"not {line})")
            timeline_lines(r, name)


def timeline_lines(r: dict, name: str) -> None:
    summary = r["timeline"]
    if summary:
        print(f"      timeline ({name}), shares of {summary['slot_seconds']:.1f} slot-seconds: "
              + ", ".join(f"{category} {share:.1f}%"
                          for category, share in summary["shares"].items()))
        print(f"      phase means ({name}), s: "
              + ", ".join(f"{phase} {stats['mean']:.2f}"
                          for phase, stats in summary["phases"].items()))
    else:
        print(f"      timeline ({name}): none recorded")
    print(f"      launch -> first batch ({name}): {median(r['first'])} "
          f"(target <= {TARGET_FIRST_BATCH:.0f} s)")
    for label, kind in (("warm", True), ("cold", False)):
        if any(r["warm"]) and not all(r["warm"]) and kind in r["warm"]:
            print(f"        {label} launches: "
                  + median([f for f, w in zip(r["first"], r["warm"], strict=True) if w == kind]))
    if r.get("warm_up_first"):
        print(f"      the warm-up trial before the clock, launch -> first batch ({name}): "
              f"{r['warm_up_first'][0]:.2f} s")
    print(f"      last batch -> next first batch: {median(r['handover'])}")
    print(f"        of which slot free -> next launch: {median(r['gap'])}")


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
            results[tool] = in_process(tool, args, env, logs, "keras3")
    lines: dict[str, dict[str, dict]] = {}
    for line in args.lines:
        runs: dict[str, dict] = {}
        if "localdet" in tools:
            warms = [("localdet", None), ("localdet --warm 0", 0)] if args.both_warm else \
                [("localdet" if args.warm is None else f"localdet --warm {args.warm}", args.warm)]
            for label, warm in warms:
                print(f"{label}, {KERAS[line]}...", file=sys.stderr, flush=True)
                runs[label] = run_localdet(args, env, line, warm, args.keep)
        if "bare" in tools:
            copied = next((r["draws"] for r in runs.values()), None)
            print(f"bare fits, {KERAS[line]}...", file=sys.stderr, flush=True)
            runs["bare"] = {**in_process("bare", args, env, logs, line,
                                         copied or seeded_draws(args)),
                            "copied": bool(copied)}
        lines[line] = runs
    report(args, results, lines)
    if args.keep:
        print(f"  (logs kept: {logs})")
    else:
        shutil.rmtree(logs, ignore_errors=True)


if __name__ == "__main__":
    main()
