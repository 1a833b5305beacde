"""The `tpe` searcher (also named `bayesian`): `max_trials` trials whose hyperparameters
Optuna's TPE sampler proposes from the results so far (tpe_source.TpeProposals), over the
same hyperparameter types as `random`.

    searcher: {name: tpe, metric: val_loss, max_trials: 30, max_length: {batches: 1000}}
    # with early stopping, as adaptive_asha (any of mode, max_rungs, divisor turns it on):
    searcher: {name: tpe, metric: val_loss, max_trials: 30, max_length: {batches: 1000},
               mode: standard, max_rungs: 3, divisor: 4}

Without early stopping every trial trains to max_length, then closes (full_length.py, as
`random`): TPE learns from each trial's final metric. With it, asha.py's brackets and rungs
decide how long each trial trains, and TPE learns from the rungs too: a trial that reached
max_length counts with its final metric, one waiting or closed at a lower rung as an Optuna
PRUNED trial with its rung metrics (Optuna ranks those below every finished trial, deeper
rungs first). Which hyperparameters is TPE's; how long is ASHA's.

    make_tpe_search(config, experiment_seed)   # TpeSearch, or TpeASHASearch with rungs
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from localdet.config.experiment import ConfigError
from localdet.config.typed import ExperimentConfig
from localdet.search.methods.asha import AdaptiveASHASearch
from localdet.search.methods.base import Operation, SearchMethod, ValidateAfter
from localdet.search.methods.full_length import FullLengthSearch
from localdet.search.methods.sources import RandomDraws
from localdet.search.methods.tpe_source import TpeProposals


def _proposals(settings: ExperimentConfig, experiment_seed: int) -> TpeProposals:
    max_trials = settings.searcher.max_trials
    if max_trials is None:  # parse_config refuses this: only a hand-made dict gets here
        raise ConfigError("missing required key 'searcher.max_trials'; the tpe searcher needs "
                          "it to know how many trials to run", "searcher.max_trials")
    return TpeProposals(settings.hyperparameters, experiment_seed, max_trials,
                        settings.searcher.smaller_is_better)


class TpeSearch(FullLengthSearch):
    """Every trial to max_length; each new trial proposed from the finished ones."""

    source: TpeProposals

    def hparam_source(self) -> TpeProposals:
        return _proposals(self.settings, self.experiment_seed)

    def use_recorded_hparams(self, recorded: Callable[[int], Mapping[str, Any] | None]) -> None:
        """After a replay: created requests' hyperparameters are their recorded trials'."""
        self.source.recorded = recorded

    def target(self, request_id: int) -> int:
        if self.settings.batch_size_searched and not self.source.created(request_id):
            # Not created yet (progress asks for every trial): its batch size is not known
            # until TPE proposes it, so estimate with a random draw and keep nothing.
            length = self.settings.searcher.max_length
            if length is None:
                return 0
            guess = RandomDraws(self.settings.hyperparameters, self.experiment_seed,
                                self.source.count).hparams(request_id)
            return self.settings.batches(length, "searcher.max_length", guess)
        return super().target(request_id)

    def on_validation_completed(self, request_id: int, metric: float,
                                length: int) -> list[Operation]:
        if self._running(request_id) and length >= self.target(request_id):
            self.source.finished(request_id, metric)  # before the Close makes the next trial
        return super().on_validation_completed(request_id, metric, length)

    def on_trial_exited_early(self, request_id: int) -> list[Operation]:
        if self._running(request_id):
            self.source.failed(request_id)
        return super().on_trial_exited_early(request_id)

    def on_trial_continued(self, request_id: int) -> list[Operation]:
        self.source.running(request_id)
        return super().on_trial_continued(request_id)


class TpeASHASearch(AdaptiveASHASearch):
    """adaptive_asha's brackets and rungs, with TPE proposing each new trial."""

    def __init__(self, config: ExperimentConfig | Mapping[str, Any], experiment_seed: int):
        super().__init__(config, experiment_seed)
        self.source = self.proposals = _proposals(self.settings, experiment_seed)

    def use_recorded_hparams(self, recorded: Callable[[int], Mapping[str, Any] | None]) -> None:
        """After a replay: created requests' hyperparameters are their recorded trials'."""
        self.proposals.recorded = recorded

    def on_validation_completed(self, request_id: int, metric: float,
                                length: int) -> list[Operation]:
        bracket = self.bracket_of.get(request_id)
        if bracket is not None and request_id in bracket.training:
            index = bracket.rung_of[request_id]
            rung = bracket.rungs[index]
            if length >= bracket.batches(request_id, rung):
                # Recorded before ASHA answers: its answer may create the next trial.
                if index == bracket.top:
                    self.proposals.finished(request_id, metric)
                else:
                    self.proposals.stopped(request_id, metric, rung.units)
        ops = super().on_validation_completed(request_id, metric, length)
        self._promoted(ops)
        return ops

    def on_trial_exited_early(self, request_id: int) -> list[Operation]:
        bracket = self.bracket_of.get(request_id)
        if bracket is not None and request_id in bracket.training:
            self.proposals.failed(request_id)
        ops = super().on_trial_exited_early(request_id)
        self._promoted(ops)
        return ops

    def _promoted(self, ops: list[Operation]) -> None:
        """A ValidateAfter for a trial that stopped at a rung is a promotion: it trains on."""
        for op in ops:
            if isinstance(op, ValidateAfter):
                self.proposals.running(op.request_id)


def make_tpe_search(config: ExperimentConfig | Mapping[str, Any],
                    experiment_seed: int) -> SearchMethod:
    """`tpe` with early stopping when the config has rungs (max_rungs, filled by parse_config
    when any of mode, max_rungs or divisor is given), else every trial to max_length."""
    settings = ExperimentConfig.of(config)
    if settings.searcher.max_rungs is not None:
        return TpeASHASearch(settings, experiment_seed)
    return TpeSearch(settings, experiment_seed)
