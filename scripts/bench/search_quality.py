"""How good a search is, not how fast: the best value found after N trials, over 10 seeds,
for localdet's `random`, localdet's `tpe` and Optuna's own `study.optimize` with its
TPESampler, on two cheap objectives whose optimum is known.

  synthetic   Branin over (x1, x2) doubles, shifted so its minimum is 0, plus an int, a log
              and a categorical term, nested groups and a constant: 0 at the optimum
  digits      an RBF or sigmoid SVC (scikit-learn) on 400 of scikit-learn's digits, scored by
              its error on 899 others, over C (log), gamma (log) and the kernel
              (categorical); its best is known from a dense grid (--grid points per axis)

localdet's searchers run in this process: the same search method objects the daemon's driver
makes (`make_search_method` on the parsed config), fed the objective's results as the
driver's searcher events (`driver._feed`), one trial at a time like Optuna's sequential
`optimize`, without a daemon or a trial process per trial (those are the same code path and
only cost time; tests/test_tpe.py runs a tpe search under a real daemon). Optuna's loop uses
`TPESampler(seed=seed)` with the same ranges (`suggest_float(log=True)` for a log range).

    python scripts/bench/search_quality.py                  # 40 trials, 10 seeds, both
    python scripts/bench/search_quality.py --trials 25 --only synthetic
    python scripts/bench/search_quality.py --concurrent 4   # localdet with 4 trials in flight
    python scripts/bench/search_quality.py --smoke          # seconds; the verdicts mean nothing

Per objective and searcher: the mean and standard deviation over the seeds of the best value
after N trials (smaller is better), then whether localdet's tpe matches Optuna's (their means
differ by less than two standard errors of the difference) and beats random (a smaller mean
and a better best on most seeds).
"""

from __future__ import annotations

import argparse
import copy
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from localdet.config.experiment import parse_config
from localdet.search.driver import _feed
from localdet.search.methods import Close, Create, Shutdown, ValidateAfter, make_search_method

LENGTH = 10  # batches: any length; the objectives ignore it

# -- the objectives ------------------------------------------------------------------------

SYNTHETIC_SPACE = {
    "branin": {"x1": {"type": "double", "minval": -5.0, "maxval": 10.0},
               "x2": {"type": "double", "minval": 0.0, "maxval": 15.0}},
    "layers": {"type": "int", "minval": 1, "maxval": 12},
    "lr": {"type": "log", "minval": -5, "maxval": -1, "base": 10},
    "activation": {"type": "categorical", "vals": ["relu", "tanh", "sigmoid", "elu"]},
    "global_batch_size": {"type": "const", "val": 32},
}
BRANIN_MIN = 0.397887
ACTIVATION_COST = {"relu": 0.0, "tanh": 0.5, "sigmoid": 1.0, "elu": 0.25}


def synthetic(hparams: dict[str, Any]) -> float:
    """Branin (minimum 0.397887 at three points) shifted to 0, plus 0.05 (layers - 5)**2,
    (log10 lr + 3)**2 and the activation's cost: 0 at its optimum."""
    x1, x2 = hparams["branin"]["x1"], hparams["branin"]["x2"]
    branin = ((x2 - 5.1 / (4 * math.pi ** 2) * x1 ** 2 + 5 / math.pi * x1 - 6) ** 2
              + 10 * (1 - 1 / (8 * math.pi)) * math.cos(x1) + 10)
    return (branin - BRANIN_MIN + 0.05 * (hparams["layers"] - 5) ** 2
            + (math.log10(hparams["lr"]) + 3) ** 2 + ACTIVATION_COST[hparams["activation"]])


DIGITS_SPACE = {
    "svc": {"C": {"type": "log", "minval": -2, "maxval": 4, "base": 10},
            "gamma": {"type": "log", "minval": -4, "maxval": 1, "base": 10},
            "kernel": {"type": "categorical", "vals": ["rbf", "sigmoid"]}},
    "global_batch_size": {"type": "const", "val": 32},
}


class Digits:
    """An SVC's validation error on scikit-learn's digits (pixels scaled to [0, 1])."""

    def __init__(self) -> None:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        x, y = load_digits(return_X_y=True)
        x_train, self.x_val, y_train, self.y_val = train_test_split(
            x / 16, y, test_size=0.5, random_state=0)
        self.x_train, self.y_train = x_train[:400], y_train[:400]

    def __call__(self, hparams: dict[str, Any]) -> float:
        from sklearn.svm import SVC

        svc = hparams["svc"]
        model = SVC(C=svc["C"], gamma=svc["gamma"], kernel=svc["kernel"])
        return 1.0 - float(model.fit(self.x_train, self.y_train).score(self.x_val, self.y_val))

    def grid_best(self, points: int) -> tuple[float, dict]:
        """The best error on a dense grid: `points` values per log axis, both kernels."""
        best = (math.inf, {})
        for kernel in ("rbf", "sigmoid"):
            for c in np.linspace(-2, 4, points):
                for gamma in np.linspace(-4, 1, points):
                    hparams = {"svc": {"C": float(10 ** c), "gamma": float(10 ** gamma),
                                       "kernel": kernel}}
                    best = min(best, (self(hparams), hparams), key=lambda b: b[0])
        return best


# -- localdet's searchers, in process --------------------------------------------------------

def localdet_best(name: str, space: dict, objective: Callable[[dict], float], trials: int,
                  seed: int, concurrent: int) -> float:
    """Run localdet's `name` search to its end, results fed back as the driver feeds them;
    with several trials in flight, the oldest pending one reports first."""
    config = parse_config({
        "entrypoint": "model_def:Trial", "hyperparameters": copy.deepcopy(space),
        "searcher": {"name": name, "metric": "objective", "max_trials": trials,
                     "max_length": {"batches": LENGTH}, "max_concurrent_trials": concurrent},
        "reproducibility": {"experiment_seed": seed}}).config
    method = make_search_method(config, seed)
    hparams: dict[int, dict] = {}
    pending: list[ValidateAfter] = []
    best = math.inf
    events: list[dict] = [{"kind": "initialized"}]
    while events or pending:
        if not events:
            op = pending.pop(0)
            value = objective(hparams[op.request_id])
            best = min(best, value)
            events.append({"kind": "validation_completed", "request_id": op.request_id,
                           "metric": value, "length": op.length})
        for operation in _feed(method, events.pop(0)):
            if isinstance(operation, Create):
                hparams[operation.request_id] = operation.hparams
            elif isinstance(operation, ValidateAfter):
                pending.append(operation)
            elif isinstance(operation, Close):
                events.append({"kind": "trial_closed", "request_id": operation.request_id})
            elif isinstance(operation, Shutdown):
                pass
    if len(hparams) != trials:
        raise RuntimeError(f"{name} made {len(hparams)} trials, not {trials}")
    return best


# -- Optuna's own loop -------------------------------------------------------------------------

def _suggest(trial, space: dict, path: str = "") -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name in sorted(space):
        spec, here = space[name], f"{path}{name}"
        kind = spec.get("type")
        if kind is None:
            values[name] = _suggest(trial, spec, here + ".")
        elif kind == "const":
            values[name] = spec["val"]
        elif kind == "int":
            values[name] = trial.suggest_int(here, spec["minval"], spec["maxval"])
        elif kind == "double":
            values[name] = trial.suggest_float(here, spec["minval"], spec["maxval"])
        elif kind == "log":
            values[name] = trial.suggest_float(here, spec["base"] ** spec["minval"],
                                               spec["base"] ** spec["maxval"], log=True)
        else:
            values[name] = trial.suggest_categorical(here, spec["vals"])
    return values


def optuna_best(space: dict, objective: Callable[[dict], float], trials: int, seed: int) -> float:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed))
    study.optimize(lambda trial: objective(_suggest(trial, space)), n_trials=trials)
    return float(study.best_value)


# -- the table ---------------------------------------------------------------------------------

def compare(title: str, space: dict, objective: Callable[[dict], float], optimum: float,
            trials: int, seeds: list[int], concurrent: int) -> list[str]:
    runs: dict[str, list[float]] = {}
    seconds: dict[str, float] = {}
    for label, run in (
            ("localdet random", lambda s: localdet_best("random", space, objective, trials, s,
                                                        concurrent)),
            ("localdet tpe", lambda s: localdet_best("tpe", space, objective, trials, s,
                                                     concurrent)),
            ("optuna TPESampler", lambda s: optuna_best(space, objective, trials, s))):
        start = time.perf_counter()
        runs[label] = [run(seed) for seed in seeds]
        seconds[label] = time.perf_counter() - start
    lines = [f"{title}: best after {trials} trials over {len(seeds)} seeds "
             f"(smaller is better; known optimum {optimum:.4g})"]
    for label, values in runs.items():
        lines.append(f"  {label:<18} {np.mean(values):8.4f} +- {np.std(values, ddof=1):.4f}"
                     f"   median {np.median(values):.4f}   ({seconds[label]:.1f} s)")
    ours, theirs, blind = (np.array(runs[k]) for k in
                           ("localdet tpe", "optuna TPESampler", "localdet random"))
    noise = 2 * math.sqrt(ours.var(ddof=1) / len(ours) + theirs.var(ddof=1) / len(theirs))
    difference = ours.mean() - theirs.mean()
    verdict = "matches within noise" if abs(difference) <= noise else "differs"
    lines.append(f"  tpe vs Optuna: difference {difference:+.4f}, two standard errors "
                 f"{noise:.4f}: {verdict}")
    wins = int((ours < blind).sum())
    beats = ours.mean() < blind.mean() and wins > len(seeds) / 2
    lines.append(f"  tpe vs random: better on {wins} of {len(seeds)} seeds, mean "
                 f"{ours.mean():.4f} vs {blind.mean():.4f}: "
                 f"{'beats random' if beats else 'does not beat random'}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--concurrent", type=int, default=1,
                        help="localdet's max_concurrent_trials (Optuna's loop is sequential)")
    parser.add_argument("--grid", type=int, default=30, help="digits: grid points per axis")
    parser.add_argument("--only", choices=("synthetic", "digits"), action="append")
    parser.add_argument("--smoke", action="store_true",
                        help="a check that it runs (tests/test_scripts.py): 12 trials, 2 seeds, "
                             "a 4 x 4 grid")
    args = parser.parse_args()
    if args.smoke:  # two seeds: the fewest a standard deviation takes
        args.trials, args.seeds, args.grid = 12, 2, 4
    seeds = list(range(1, args.seeds + 1))
    only = args.only or ["synthetic", "digits"]
    output: list[str] = []
    if "synthetic" in only:
        output += compare("synthetic (Branin + int + log + categorical)", SYNTHETIC_SPACE,
                          synthetic, 0.0, args.trials, seeds, args.concurrent)
    if "digits" in only:
        digits = Digits()
        start = time.perf_counter()
        best, where = digits.grid_best(args.grid)
        print(f"digits: grid of {2 * args.grid ** 2} points: best error {best:.4f} at "
              f"{where} ({time.perf_counter() - start:.0f} s)", flush=True)
        output += compare("digits SVC validation error", DIGITS_SPACE, digits, best,
                          args.trials, seeds, args.concurrent)
    print("\n".join(output))


if __name__ == "__main__":
    main()
