"""Which hyperparameters mattered: each hyperparameter's importance for an experiment's
searcher metric, over its recorded trials (what `localdet status EXP --json` carries as
`importances` and the dashboard's experiment page draws as bars).

    found = importances(layout, db, 7)
    # {"metric": "val_loss", "evaluator": "ped-anova", "trials": 12, "validations": 40,
    #  "importances": {"lr": 0.91, "dropout": 0.09}, "constant": ["global_batch_size"],
    #  "note": None, "cached": False}
    importances(layout, db, 7, compute=False)   # the cached answer, or None if stale

Each trial counts with its best validation of the searcher metric (as the trials table and
the parallel-coordinates plot show it); a trial with none (or only NaN) is left out.

The evaluator is Optuna's PED-ANOVA (`PedAnovaImportanceEvaluator`), used as a library: it
needs only NumPy, where fANOVA and mean decrease impurity need scikit-learn, which is not a
dependency of localdet. Its top group is sized to hold about five trials (Optuna's own advice
for stable results) and at most half of them, so a search of ten trials still ranks the
hyperparameter that drives the metric first. Importances are normalized to sum to 1.

Computed on demand, and cached outside the state folder (which readers never write: the
user's cache, `user_cache_dir()/importance/<state folder's digest>/<experiment>.json`) under a
digest of exactly what was used (each scored trial's hyperparameters and value, and the validation
rows counted): a new validation, or a better one, changes the digest and the next call
computes again. Optuna is imported only when computing.
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from localdet.operations.facts import flat_hparams, validation_summary
from localdet.paths import Layout, user_cache_dir, write_cache_file
from localdet.records.db import Experiment, StateDB

EVALUATOR = "ped-anova"
MIN_TRIALS = 3  # the top group and the rest need two and one trials at the least
_UNCACHED = "_uncached"  # marks an answer that says why it could not be computed
_FORMAT = 1  # bumped when the answer's computation changes: older caches are recomputed


def hparam_types(config: Mapping[str, Any]) -> dict[str, str]:
    """Dotted name -> the configured type (int, double, log, categorical, const) of each
    hyperparameter in a parsed config's `hyperparameters` section."""
    types: dict[str, str] = {}

    def walk(group: Mapping[str, Any], prefix: str) -> None:
        for name, spec in group.items():
            if isinstance(spec, Mapping) and "type" in spec:
                types[prefix + name] = str(spec["type"])
            elif isinstance(spec, Mapping):
                walk(spec, f"{prefix}{name}.")
            else:
                types[prefix + name] = "const"

    walk(config.get("hyperparameters") or {}, "")
    return types


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)


def scored_trials(db: StateDB, experiment: Experiment) -> tuple[list[dict[str, Any]], int]:
    """Each trial with a finite searcher metric: {"trial_id", "hparams" (dotted), "value"
    (its best)}; and how many validation rows carried that metric."""
    summary = validation_summary(db, experiment)  # SQLite reads the values: no row parsed
    scored, counted = [], 0
    for trial in db.trials(experiment.id):
        found = summary.get(trial.id)
        if found and found["best"] is not None:
            counted += found["counted"]
            scored.append({"trial_id": trial.id, "hparams": flat_hparams(trial.hparams),
                           "value": found["best"][experiment.metric]})
    return scored, counted


def _label(value: Any) -> str | int | float | bool | None:
    # Optuna's categorical choices are plain scalars; a list or mapping value is its JSON.
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return json.dumps(value, sort_keys=True)


def _varies(values: list[Any]) -> bool:
    return len({json.dumps(v, sort_keys=True, default=str) for v in values}) > 1


def _digest(scored: list[dict[str, Any]], counted: int, experiment: Experiment) -> str:
    text = json.dumps([_FORMAT, experiment.metric, bool(experiment.smaller_is_better), counted,
                       [[s["trial_id"], s["hparams"], s["value"]] for s in scored]],
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def cache_path(layout: Layout, experiment_id: int) -> Path:
    """The experiment's cached importances: per state folder, which may hold the same ids."""
    home = hashlib.sha256(str(layout.home.resolve()).encode()).hexdigest()[:16]
    return user_cache_dir() / "importance" / home / f"{experiment_id}.json"


def _read_cache(layout: Layout, experiment_id: int, digest: str) -> dict[str, Any] | None:
    try:
        cached = json.loads(cache_path(layout, experiment_id).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(cached, dict) or cached.get("digest") != digest:
        return None
    return cached.get("answer")


def _write_cache(layout: Layout, experiment_id: int, digest: str,
                 answer: dict[str, Any]) -> None:
    write_cache_file(cache_path(layout, experiment_id), {"digest": digest, "answer": answer})


def importances(layout: Layout, db: StateDB, experiment_id: int, *,
                compute: bool = True) -> dict[str, Any] | None:
    """The experiment's importances (see the module's docstring): from the cache when it
    matches the recorded trials, else computed (with `compute=False`: None instead)."""
    experiment = db.experiment(experiment_id)
    scored, counted = scored_trials(db, experiment)
    digest = _digest(scored, counted, experiment)
    cached = _read_cache(layout, experiment_id, digest)
    if cached is not None:
        return {**cached, "cached": True}
    if not compute:
        return None
    answer = evaluate(experiment, scored, counted)
    if not answer.pop(_UNCACHED, False):  # a failure is tried again next time
        _write_cache(layout, experiment_id, digest, answer)
    return {**answer, "cached": False}


def evaluate(experiment: Experiment, scored: list[dict[str, Any]],
             counted: int) -> dict[str, Any]:
    """The answer for these scored trials (no cache)."""
    answer: dict[str, Any] = {
        "metric": experiment.metric, "smaller_is_better": bool(experiment.smaller_is_better),
        "evaluator": EVALUATOR, "trials": len(scored), "validations": counted,
        "importances": {}, "constant": [], "note": None}
    names = sorted({name for s in scored for name in s["hparams"]})
    varied = [n for n in names if _varies([s["hparams"].get(n) for s in scored])]
    answer["constant"] = [n for n in names if n not in varied]
    if len(scored) < MIN_TRIALS:
        answer["note"] = (f"too few trials for importances: {len(scored)} with a "
                          f"{experiment.metric}, at least {MIN_TRIALS} needed")
        return answer
    if not varied:
        answer["note"] = "no hyperparameter took more than one value in these trials"
        return answer
    if not _varies([s["value"] for s in scored]):
        answer["importances"] = {name: 0.0 for name in varied}
        answer["note"] = f"{experiment.metric} was the same in every trial"
        return answer
    try:  # the answer says why, rather than the status or page it is part of failing
        found = _pedanova(experiment, scored, varied)
    except ImportError:
        answer["note"] = "importances need Optuna, which is not installed: pip install optuna"
        return {**answer, _UNCACHED: True}
    except ValueError as error:  # Optuna refused these values
        answer["note"] = f"importances could not be computed: {error}"
        return {**answer, _UNCACHED: True}
    total = sum(found.values())
    answer["importances"] = dict(sorted(
        ((name, found.get(name, 0.0) / total if total > 0 else 0.0) for name in varied),
        key=lambda item: (-item[1], item[0])))
    if answer["constant"]:
        answer["note"] = (f"left out, never varied: {', '.join(answer['constant'])}")
    return answer


def _pedanova(experiment: Experiment, scored: list[dict[str, Any]],
              varied: list[str]) -> dict[str, float]:
    import optuna
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    types = hparam_types(experiment.config)
    distributions: dict[str, Any] = {}
    encode: dict[str, Any] = {}
    for name in varied:
        values = [s["hparams"].get(name) for s in scored]
        numeric = all(_finite(v) for v in values)
        if numeric and all(isinstance(v, int) for v in values) and types.get(name) != "log":
            distributions[name] = IntDistribution(min(values), max(values))
            encode[name] = int
        elif numeric:
            log = types.get(name) == "log" and min(values) > 0
            distributions[name] = FloatDistribution(float(min(values)), float(max(values)),
                                                    log=log)
            encode[name] = float
        else:  # categories (a trial lacking the name counts as its own category, None)
            choices = sorted({_label(v) for v in values}, key=lambda c: (str(type(c)), str(c)))
            distributions[name] = CategoricalDistribution(choices)
            encode[name] = _label
    study_trials = [
        optuna.trial.create_trial(
            params={name: encode[name](s["hparams"].get(name)) for name in varied},
            distributions=distributions, value=float(s["value"]))
        for s in scored]
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # experimental-API and small-sample warnings
            study = optuna.create_study(
                direction="minimize" if experiment.smaller_is_better else "maximize")
            study.add_trials(study_trials)
            quantile = min(0.5, max(0.1, 5 / len(scored)))
            evaluator = optuna.importance.PedAnovaImportanceEvaluator(target_quantile=quantile)
            found = optuna.importance.get_param_importances(study, evaluator=evaluator,
                                                            normalize=False)
    finally:
        optuna.logging.set_verbosity(verbosity)
    return {name: float(value) for name, value in found.items()}
