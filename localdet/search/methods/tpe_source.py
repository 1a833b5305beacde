"""Which hyperparameters a `tpe` trial gets: proposed by Optuna's TPE sampler from the
results so far, where `sources.RandomDraws` draws them blind.

    source = TpeProposals(space, experiment_seed, count=30, smaller_is_better=True)
    source.create(1)                   # Proposal(1, ..., seed=derive_seed(seed, 1))
    source.finished(1, 0.31)           # request 1 trained to max_length: its metric
    source.stopped(2, 0.52, step=25)   # request 2 waits (or was closed) at a lower rung
    source.running(2)                  # promoted: it trains on
    source.failed(3)                   # exited early without a result: left out
    source.create(4)                   # proposed knowing 1's, 2's and 3's outcomes

A proposal is a pure function of (space, experiment seed, request id, the outcomes recorded
before its `create`), worked out when its hyperparameters are first read (a `Proposal`: a
search replayed for `localdet status` never runs the sampler). Each builds a fresh in-memory
Optuna study holding every earlier request as a trial (COMPLETE with its final metric,
PRUNED with its rung metrics, RUNNING while it trains) and asks a `TPESampler` seeded from
(experiment seed, request id). So a search replayed from its events after a pause, a
restart or a daemon killed with -9 proposes the same values. After a restart the driver
hands the search the recorded trials' hyperparameters (`recorded`): the created requests'
values are read from there, not proposed again, so an Optuna upgrade between a pause and a
resume cannot change what earlier trials were given (only what the next ones get).

Trials still training when a proposal is made are in the study as RUNNING, and the sampler
runs with `constant_liar`: it counts them among the worse results, so concurrent trials are
not all sent to the same promising spot. The sampler's options are passed explicitly
(SAMPLER_OPTIONS): Optuna 5 changed the defaults of `constant_liar` and `multivariate`, and
a default that moves under a search would change its proposals. Trials that exited early
without a metric are left out, as Optuna's TPE leaves out FAILed trials (a NaN metric is
already recorded as the worst number, so a diverged trial counts against its region).
The first 10 proposals are random (Optuna's `n_startup_trials`).

Optuna is imported when the first proposal is made: the CLI and the other searchers never
pay for it.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from localdet.search.methods.base import Create, derive_seed, ranked
from localdet.search.methods.sources import HparamSource

RUNNING, COMPLETE, PRUNED, FAILED = "running", "complete", "pruned", "failed"

# TPESampler's options, each given (Optuna 5.1's defaults, which Optuna 4 did not share:
# there constant_liar and multivariate were False). The seed is per proposal.
SAMPLER_OPTIONS = {"n_startup_trials": 10, "n_ei_candidates": 24, "multivariate": True,
                   "group": False, "constant_liar": True}


@dataclass
class _Outcome:
    state: str = RUNNING
    value: float | None = None             # ranked (smaller wins, NaN already the worst)
    steps: dict[int, float] = field(default_factory=dict)  # rung length -> ranked metric

    def apply(self, state: str, value: float | None, step: int | None) -> None:
        """A change: a metric at a rung (step), a final metric, or only a new state."""
        self.state = state
        if state == RUNNING:
            self.value = None  # trains on (continued): its final metric is to come
        elif step is not None and value is not None:
            self.steps[step] = value
        elif value is not None:
            self.value = value


def _leaves(space: Mapping[str, Any], path: tuple[str, ...] = ()
            ) -> Iterator[tuple[tuple[str, ...], dict]]:
    """(path, spec) per hyperparameter, depth first in sorted-name order (as hparams.py)."""
    for name in sorted(space):
        spec = space[name]
        if "type" in spec:
            yield (*path, name), spec
        else:
            yield from _leaves(spec, (*path, name))


def _sampler_seed(experiment_seed: int, request_id: int) -> int:
    # Not derive_seed's value: the trial's own seed and the sampler's stay unrelated.
    digest = hashlib.sha256(f"tpe:{experiment_seed}:{request_id}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % (2**31)


def _optuna():
    import optuna  # lazily: ~0.5 s, and only the tpe searcher needs it

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "new study created" per proposal
    return optuna


class Proposal(Create):
    """A Create whose hyperparameters TPE works out when they are first read, from the
    outcomes as they were when it was created: a search replayed only for its progress and
    rungs (`localdet status`) never runs the sampler."""

    _source: TpeProposals

    def __init__(self, request_id: int, seed: int, source: TpeProposals):
        object.__setattr__(self, "request_id", request_id)
        object.__setattr__(self, "seed", seed)
        object.__setattr__(self, "_source", source)

    @property  # type: ignore[misc]  # read-only here, a field in Create
    def hparams(self) -> dict[str, Any]:
        return self._source.hparams(self.request_id)


class TpeProposals(HparamSource):
    """`count` trials; request r's hyperparameters are those TPE proposes from the outcomes
    recorded before `create(r)`, worked out when first asked for and kept."""

    def __init__(self, space: Mapping[str, Any], experiment_seed: int, count: int,
                 smaller_is_better: bool):
        super().__init__(experiment_seed)
        self.space = space
        self.count = count
        self.smaller_is_better = smaller_is_better
        self.leaves = list(_leaves(space))
        self.outcomes: dict[int, _Outcome] = {}   # by request, as they are now
        # Every change to an outcome, in order, and how many there were when each request
        # was created: request r's study is the log up to its mark.
        self._log: list[tuple[int, str, float | None, int | None]] = []
        self._marks: dict[int, int] = {}
        self._proposals: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}
        self._distributions: dict[str, Any] | None = None
        # request id -> its recorded trial's hyperparameters, None while it has no trial: set
        # by the driver after a replay, so created requests are read, never proposed again.
        self.recorded: Callable[[int], Mapping[str, Any] | None] | None = None

    # -- HparamSource ------------------------------------------------------------------
    def created(self, request_id: int) -> bool:
        return request_id in self._marks

    def create(self, request_id: int) -> Create:
        if request_id not in self._marks:
            self._marks[request_id] = len(self._log)
            self.outcomes[request_id] = _Outcome()
        return Proposal(request_id, derive_seed(self.experiment_seed, request_id), self)

    def hparams(self, request_id: int) -> dict[str, Any]:
        """A created request's hyperparameters (each caller its own copy)."""
        if request_id not in self._marks:
            raise KeyError(f"request {request_id} has not been created")
        for earlier in sorted(self._marks):  # each proposal needs the earlier ones' params
            if earlier > request_id:
                break
            if earlier not in self._proposals:
                self._proposals[earlier] = self._recorded(earlier) or self._propose(earlier)
        return copy.deepcopy(self._proposals[request_id][1])

    # -- what happened to the trials ----------------------------------------------------
    def _change(self, request_id: int, state: str, value: float | None = None,
                step: int | None = None) -> None:
        self.outcomes[request_id].apply(state, value, step)
        self._log.append((request_id, state, value, step))

    def running(self, request_id: int) -> None:
        if request_id in self.outcomes and self.outcomes[request_id].state != RUNNING:
            self._change(request_id, RUNNING)

    def finished(self, request_id: int, metric: float) -> None:
        """Trained to the end (max_length): its final metric."""
        if request_id in self.outcomes:
            self._change(request_id, COMPLETE, ranked(metric, self.smaller_is_better))

    def stopped(self, request_id: int, metric: float, step: int) -> None:
        """Stopped early (for now, or for good) after a rung `step` long."""
        if request_id in self.outcomes:
            self._change(request_id, PRUNED, ranked(metric, self.smaller_is_better), step)

    def failed(self, request_id: int) -> None:
        """Exited early: left out if it has no result, else kept with the results it has."""
        outcome = self.outcomes.get(request_id)
        if outcome is not None and outcome.state == RUNNING:
            self._change(request_id, PRUNED if outcome.steps else FAILED)

    # -- Optuna -----------------------------------------------------------------------
    def distributions(self) -> dict[str, Any]:
        """One Optuna distribution per searched hyperparameter, named by its dotted path;
        a categorical by the index of its value (values may be lists or mappings)."""
        if self._distributions is None:
            dist = _optuna().distributions
            made: dict[str, Any] = {}
            for path, spec in self.leaves:
                kind, name = spec["type"], ".".join(path)
                if kind == "int":
                    made[name] = dist.IntDistribution(spec["minval"], spec["maxval"])
                elif kind == "double":
                    made[name] = dist.FloatDistribution(spec["minval"], spec["maxval"])
                elif kind == "log":  # log-uniform between base**minval and base**maxval
                    made[name] = dist.FloatDistribution(spec["base"] ** spec["minval"],
                                                        spec["base"] ** spec["maxval"], log=True)
                elif kind == "categorical":
                    made[name] = dist.CategoricalDistribution(list(range(len(spec["vals"]))))
                elif kind != "const":
                    raise ValueError(f"unknown hyperparameter type {kind!r} for {name!r}")
            self._distributions = made
        return self._distributions

    def _recorded(self, request_id: int) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """(Optuna's flat params, the hyperparameters) of the request's recorded trial; None
        without one, or if its values are not points of the space."""
        hparams = self.recorded(request_id) if self.recorded is not None else None
        if hparams is None:
            return None
        params: dict[str, Any] = {}
        for path, spec in self.leaves:
            value: Any = hparams
            for part in path:
                if not isinstance(value, Mapping) or part not in value:
                    return None
                value = value[part]
            kind, name = spec["type"], ".".join(path)
            if kind == "categorical":  # the first equal value's index (as proposed)
                index = next((i for i, v in enumerate(spec["vals"]) if v == value), None)
                if index is None:
                    return None
                params[name] = index
            elif kind == "int":
                params[name] = int(value)
            elif kind != "const":
                params[name] = float(value)
        return params, copy.deepcopy(dict(hparams))

    def _propose(self, request_id: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """(Optuna's flat params, the hyperparameters) TPE proposes for the request, from
        the outcomes as they were when it was created."""
        outcomes: dict[int, _Outcome] = {r: _Outcome() for r in self._marks if r < request_id}
        for changed, state, value, step in self._log[:self._marks[request_id]]:
            outcomes[changed].apply(state, value, step)
        optuna = _optuna()
        distributions = self.distributions()
        sampler = optuna.samplers.TPESampler(
            seed=_sampler_seed(self.experiment_seed, request_id), **SAMPLER_OPTIONS)
        study = optuna.create_study(direction="minimize", sampler=sampler)
        states = {RUNNING: optuna.trial.TrialState.RUNNING,
                  COMPLETE: optuna.trial.TrialState.COMPLETE,
                  PRUNED: optuna.trial.TrialState.PRUNED}
        for earlier in sorted(outcomes):
            outcome = outcomes[earlier]
            if outcome.state == FAILED:
                continue
            study.add_trial(optuna.trial.create_trial(
                state=states[outcome.state], params=self._proposals[earlier][0],
                distributions=distributions, value=outcome.value,
                intermediate_values=dict(outcome.steps)))
        params = study.ask(distributions).params
        return params, self._nest(params)

    def _nest(self, params: Mapping[str, Any], space: Mapping[str, Any] | None = None,
              path: tuple[str, ...] = ()) -> dict[str, Any]:
        """Optuna's flat params back into the space's shape, constants filled in."""
        space = self.space if space is None else space
        values: dict[str, Any] = {}
        for name in sorted(space):
            spec, here = space[name], (*path, name)
            if "type" not in spec:
                values[name] = self._nest(params, spec, here)
            elif spec["type"] == "const":
                values[name] = copy.deepcopy(spec["val"])  # each trial its own values
            elif spec["type"] == "categorical":
                values[name] = copy.deepcopy(spec["vals"][params[".".join(here)]])
            elif spec["type"] == "int":
                values[name] = int(params[".".join(here)])
            else:
                values[name] = float(params[".".join(here)])
        return values
