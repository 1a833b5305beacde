"""Tests of the tpe searcher (also named bayesian): its config, proposals replayed the same
from the same events, a search that concentrates near the optimum better than random, ASHA's
early stopping with TPE choosing the hyperparameters, and one search under a real daemon."""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import numpy as np
import pytest
import yaml
from conftest import TEST_TRIALS, Home
from test_asha import Simulation

from localdet.config.experiment import ConfigError, parse_config
from localdet.search.driver import _feed, replay
from localdet.search.methods import (
    AdaptiveASHASearch,
    Create,
    RandomSearch,
    make_search_method,
)
from localdet.search.methods.tpe import TpeASHASearch, TpeSearch

# Every hyperparameter type random draws, nested and constant ones included.
SPACE = {
    "global_batch_size": 32,
    "x": {"type": "double", "minval": -3.0, "maxval": 3.0},
    "n": {"type": "int", "minval": 1, "maxval": 9},
    "optimizer": {"lr": {"type": "log", "minval": -5, "maxval": -1, "base": 10},
                  "kind": {"type": "categorical", "vals": ["sgd", "adam", {"momentum": 0.9}]},
                  "name": {"type": "const", "val": "opt"}},
}


def tpe_config(name: str = "tpe", hyperparameters=SPACE, **searcher) -> dict:
    searcher = {"name": name, "metric": "val_loss", "max_trials": 24,
                "max_length": {"batches": 64}, **searcher}
    return parse_config({"entrypoint": "model_def:Trial",
                         "hyperparameters": copy.deepcopy(hyperparameters),
                         "searcher": searcher}).config


def objective(request_id, hparams, length):
    """Smallest (0 at the end) at x = 1.3, n = 4, lr = 10**-2.5, kind adam; a longer
    training lowers it (so early stopping has something to see)."""
    opt = hparams["optimizer"]
    return ((hparams["x"] - 1.3) ** 2 + 0.1 * (hparams["n"] - 4) ** 2
            + (math.log10(opt["lr"]) + 2.5) ** 2 + (opt["kind"] != "adam") + 1 / length
            - 1 / 64)


# -- the config --------------------------------------------------------------------------------

def test_tpe_and_bayesian_are_accepted_and_early_stopping_fills_ashas_defaults():
    assert type(make_search_method(tpe_config(), 1)) is TpeSearch
    config = tpe_config("bayesian", max_rungs=3)
    assert {k: config["searcher"][k] for k in ("max_rungs", "divisor", "mode")} \
        == {"max_rungs": 3, "divisor": 4, "mode": "standard"}
    assert type(make_search_method(config, 1)) is TpeASHASearch
    assert tpe_config(mode="aggressive")["searcher"]["max_rungs"] == 5
    # All trials at once would all be drawn before any result: said in one warning.
    (warning,) = parse_config({"entrypoint": "model_def:Trial", "hyperparameters": SPACE,
                               "searcher": {"name": "tpe", "metric": "val_loss",
                                            "max_trials": 8,
                                            "max_length": {"batches": 64}}}).warnings
    assert warning.startswith("searcher.max_concurrent_trials: the tpe searcher learns") \
        and "16 lets all 8 start at once" in warning


@pytest.mark.parametrize("searcher, says", [
    ({"max_trials": None}, "missing required key 'searcher.max_trials'"),
    ({"max_trials": 0}, "searcher.max_trials: expected a value >= 1"),
    ({"mode": "fast"}, "searcher.mode: expected one of"),
    ({"divisor": 1}, "searcher.divisor: expected a value > 1"),
    ({"max_rungs": 2, "max_length": None}, "missing required key 'searcher.max_length'"),
])
def test_bad_settings_are_refused_in_one_sentence(searcher, says):
    searcher = {k: v for k, v in {"name": "tpe", "metric": "val_loss", "max_trials": 8,
                                  "max_length": {"batches": 64}, **searcher}.items()
                if v is not None}
    with pytest.raises(ConfigError) as refused:
        parse_config({"entrypoint": "model_def:Trial", "hyperparameters": SPACE,
                      "searcher": searcher})
    message = str(refused.value)
    assert message.startswith(says) and "\n" not in message and message.count(". ") == 0


# -- replay ------------------------------------------------------------------------------------

def replayed_creates(config: dict, seed: int, events: list[tuple]) -> dict[int, Create]:
    """The Creates a fresh method answers to the recorded events, fed as the driver feeds
    them after a restart (localdet/search/driver.py's _feed)."""
    kinds = {"initial_operations": "initialized", "on_validation_completed":
             "validation_completed", "on_trial_closed": "trial_closed",
             "on_trial_exited_early": "trial_exited_early"}
    method = make_search_method(config, seed)
    creates: dict[int, Create] = {}
    for kind, *args in events:
        event = dict(zip(("request_id", "metric", "length"), args, strict=False),
                     kind=kinds[kind])
        creates.update({op.request_id: op for op in _feed(method, event)
                        if isinstance(op, Create)})
    return creates


@pytest.mark.parametrize("searcher", [{"max_concurrent_trials": 3},
                                      {"max_concurrent_trials": 4, "max_rungs": 2,
                                       "divisor": 2}])
def test_the_same_events_replay_to_the_same_proposals(searcher):
    config = tpe_config(**searcher)
    # Trials finish out of order (lifo), one diverges (NaN) and one exits early.
    run = Simulation(make_search_method(config, 5),
                     lambda r, h, n: math.nan if r == 7 else objective(r, h, n),
                     exits={9: 0}, lifo=True).run()
    assert len(run.creates) == 24 and run.shutdowns == 1
    # After a restart (all events) and after a pause (half of them, then the rest).
    assert replayed_creates(config, 5, run.events) == run.creates
    paused = replayed_creates(config, 5, run.events[:len(run.events) // 2])
    assert 3 < len(paused) < 24 and all(run.creates[r] == c for r, c in paused.items())
    # The driver's own replay reaches the same state: what it proposes next is the same.
    experiment = SimpleNamespace(config=config, experiment_seed=5)
    kinds = {"initial_operations": "initialized", "on_validation_completed":
             "validation_completed", "on_trial_closed": "trial_closed",
             "on_trial_exited_early": "trial_exited_early"}
    events = [dict(zip(("request_id", "metric", "length"), args, strict=False),
                   kind=kinds[kind]) for kind, *args in run.events]
    replayed = replay(experiment, events)
    assert not replayed.source._proposals  # replayed for status: the sampler never ran
    assert {r: replayed.source.hparams(r) for r in replayed.source.outcomes} \
        == {r: c.hparams for r, c in run.creates.items()}
    # Another experiment seed proposes other values.
    other = Simulation(make_search_method(config, 6), objective, lifo=True).run()
    assert other.creates[12].hparams != run.creates[12].hparams


DRIVER_KINDS = {"initial_operations": "initialized", "on_validation_completed":
                "validation_completed", "on_trial_closed": "trial_closed",
                "on_trial_exited_early": "trial_exited_early"}


@pytest.mark.parametrize("searcher", [{"max_concurrent_trials": 3},
                                      {"max_concurrent_trials": 4, "max_rungs": 2,
                                       "divisor": 2}])
def test_a_restart_reads_the_recorded_hyperparameters_and_proposes_as_if_uninterrupted(
        searcher):
    """After a restart the driver hands the replayed search its trials' recorded
    hyperparameters: the sampler runs only for trials created after it, and the search goes
    on exactly as the uninterrupted one (an Optuna upgraded meanwhile cannot rewrite what
    the earlier trials were given)."""
    config = tpe_config(**searcher)
    run = Simulation(make_search_method(config, 5), objective, exits={9: 0}, lifo=True).run()
    events = [dict(zip(("request_id", "metric", "length"), args, strict=False),
                   kind=DRIVER_KINDS[kind]) for kind, *args in run.events]
    half = len(events) // 2
    experiment = SimpleNamespace(config=config, experiment_seed=5)
    method = replay(experiment, events[:half])
    before = set(method.source.outcomes)  # the trials created before the restart
    assert 3 < len(before) < 24
    method.use_recorded_hparams(lambda r: run.creates[r].hparams if r in before else None)
    proposed = []
    propose = method.source._propose
    method.source._propose = lambda r: proposed.append(r) or propose(r)
    creates = {}
    for event in events[half:]:
        creates.update({op.request_id: op for op in _feed(method, event)
                        if isinstance(op, Create)})
    assert set(creates) == set(run.creates) - before
    assert {r: c.hparams for r, c in creates.items()} \
        == {r: run.creates[r].hparams for r in creates}
    assert sorted(proposed) == sorted(creates)  # never for a recorded trial
    # What is recorded is what the replayed search holds, whatever its sampler would say.
    other = Simulation(make_search_method(config, 6), objective, lifo=True).run()
    method = replay(experiment, events[:half])
    method.use_recorded_hparams(lambda r: other.creates[r].hparams if r in before else None)
    assert all(method.source.hparams(r) == other.creates[r].hparams for r in before)


def test_the_sampler_is_given_each_option_whose_default_optuna_changed(monkeypatch):
    import optuna

    built = []

    class Recording(optuna.samplers.TPESampler):
        def __init__(self, **options):
            built.append(options)
            super().__init__(**options)

    monkeypatch.setattr(optuna.samplers, "TPESampler", Recording)
    method = make_search_method(tpe_config(max_concurrent_trials=2), 3)
    for op in method.initial_operations():
        if isinstance(op, Create):
            op.hparams  # noqa: B018  (read: the sampler proposes them)
    assert len(built) == 2 and built[0]["seed"] != built[1]["seed"]
    for options in built:
        assert {k: v for k, v in options.items() if k != "seed"} == {
            "constant_liar": True, "multivariate": True, "group": False,
            "n_startup_trials": 10, "n_ei_candidates": 24}


# -- search quality ----------------------------------------------------------------------------

def test_tpe_concentrates_near_the_optimum_better_than_random():
    tpe_best, random_best, tpe_late, random_late = [], [], [], []
    for seed in (1, 2, 3):
        config = tpe_config(max_trials=30, max_concurrent_trials=1)
        runs = {"tpe": Simulation(make_search_method(config, seed), objective).run(),
                "random": Simulation(RandomSearch({**config, "searcher": {
                    **config["searcher"], "name": "random"}}, seed), objective).run()}
        for name, best, late in (("tpe", tpe_best, tpe_late),
                                 ("random", random_best, random_late)):
            values = [objective(r, c.hparams, 64) for r, c in sorted(runs[name].creates.items())]
            best.append(min(values))
            late.append(float(np.median(values[-10:])))  # TPE's proposals after 20 results
    assert np.mean(tpe_best) < np.mean(random_best)
    assert max(tpe_late) < min(random_late)  # each seed's late TPE trials are closer


# -- early stopping ----------------------------------------------------------------------------

def test_early_stopping_promotes_and_closes_trials_as_adaptive_asha_does():
    """With the same metric per request, tpe with rungs answers every event with
    adaptive_asha's operations: only the hyperparameters differ."""
    searcher = {"max_trials": 20, "max_rungs": 3, "divisor": 2, "mode": "standard",
                "max_concurrent_trials": 4}

    def by_request(request_id, hparams, length):
        return (request_id * 7919 % 13) / length

    tpe = Simulation(make_search_method(tpe_config(**searcher), 3), by_request,
                     exits={6: 1}).run()
    asha_config = tpe_config(**searcher)
    asha_config["searcher"]["name"] = "adaptive_asha"
    asha = Simulation(AdaptiveASHASearch(asha_config, 3), by_request, exits={6: 1}).run()

    def shape(run):
        return [[("Create" if isinstance(op, Create) else type(op).__name__,
                  getattr(op, "request_id", None), getattr(op, "length", None))
                 for op in ops] for ops in run.answers]
    assert shape(tpe) == shape(asha)
    assert tpe.closed == asha.closed and any(len(t) == 1 for t in tpe.targets.values())
    assert tpe.method.rungs() == asha.method.rungs()
    # TPE saw the stopped trials as pruned, with their rung metrics.
    states = {o.state for o in tpe.method.source.outcomes.values()}
    assert states == {"complete", "pruned"}


# -- under a real daemon -----------------------------------------------------------------------

@pytest.mark.slow
def test_a_tpe_search_runs_under_the_daemon(tmp_path, daemons):
    """The counter trial (tests/trials/counter, milliseconds a batch) searched by tpe with
    early stopping; the recorded trials are what the recorded events replay to."""
    from localdet.records.db import StateDB

    home = Home(tmp_path / "home")
    config = tmp_path / "tpe.yaml"
    config.write_text(yaml.safe_dump({
        "name": "tpe", "entrypoint_script": "python3 train.py",
        "hyperparameters": {"variant": {"type": "int", "minval": 0, "maxval": 3},
                            "batch_seconds": {"type": "double", "minval": 0.0,
                                              "maxval": 0.002},
                            "checkpoint_seconds": 0, "crash_at": 0},
        "searcher": {"name": "bayesian", "metric": "val_loss", "max_trials": 4,
                     "max_length": {"batches": 8}, "max_rungs": 2, "divisor": 2,
                     "mode": "aggressive", "max_concurrent_trials": 2},
        "scheduling_unit": 4, "min_checkpoint_period": {"batches": 4}, "max_restarts": 0,
        "reproducibility": {"experiment_seed": 4}}))
    daemon = daemons(home)
    home.cli("submit", config, TEST_TRIALS / "counter")
    facts = home.wait_until_ended(home.experiment_named("tpe")["id"], timeout=120)
    assert facts["state"] == "COMPLETED"
    db = StateDB.open(home.path / "localdet.db")
    try:
        (experiment,) = db.experiments()
        trials = db.trials(experiment.id)
        method = replay(experiment, db.searcher_events(experiment.id))
    finally:
        db.close()
    assert len(trials) == 4 and all(t.state == "COMPLETED" for t in trials)
    assert sorted(t.target_batches for t in trials) == [4, 4, 8, 8]  # two stopped at 4
    assert {t.request_id: t.hparams for t in trials} \
        == {r: method.source.hparams(r) for r in method.source.outcomes}
    daemon.stop()
