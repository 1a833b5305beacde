"""Searches whose trials each train once, straight to `max_length`, then close: the
scheduler of `single`, `random` and `grid`. A subclass names the source of its trials'
hyperparameters (sources.py, which also says how many); this class paces their creation and
says when the search is over.

    class RandomSearch(FullLengthSearch):
        def hparam_source(self):
            return RandomDraws(self.settings.hyperparameters, self.experiment_seed,
                               self.settings.searcher.max_trials)

`searcher.max_concurrent_trials` (0: no limit) caps the trials created and not yet closed or
exited (base.Pacing): that many are created at first, one more each time one closes or
exits early.
A script's run may leave max_length out: its target is then 0 batches, meaning the script's
own epochs decide, and its first completed validation closes it. A max_length in records or
epochs with a searched global_batch_size comes to each trial's own number of batches.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from localdet.config.typed import ExperimentConfig
from localdet.search.methods.base import (
    Close,
    Operation,
    Pacing,
    Shutdown,
    ValidateAfter,
)
from localdet.search.methods.sources import HparamSource


class FullLengthSearch:
    def __init__(self, config: ExperimentConfig | Mapping[str, Any], experiment_seed: int):
        self.settings = ExperimentConfig.of(config)
        self.experiment_seed = experiment_seed
        searcher = self.settings.searcher
        self.source = self.hparam_source()
        self._targets: dict[int, int] = {}
        # The same for every trial unless the batch size is searched (then trial 1's).
        self.max_length = self.target(1)
        self.total_trials = self.source.count
        self.pacing = Pacing(self.total_trials, searcher.max_concurrent_trials)
        self.finished: set[int] = set()  # closed by us or exited early
        self.closed: set[int] = set()    # the daemon confirmed the Close
        self.exited: set[int] = set()
        self.shut_down = False

    # -- what a subclass says ---------------------------------------------------------
    def hparam_source(self) -> HparamSource:
        """Which hyperparameters each trial gets, and how many trials."""
        raise NotImplementedError

    def target(self, request_id: int) -> int:
        """Request r's length in batches; 0: the script decides."""
        if not self.settings.batch_size_searched:
            request_id = 1  # the same for all
        if request_id not in self._targets:
            length = self.settings.searcher.max_length
            hparams = self.source.hparams(request_id) if length is not None \
                and self.settings.batch_size_searched else None
            self._targets[request_id] = 0 if length is None else self.settings.batches(
                length, "searcher.max_length", hparams)
        return self._targets[request_id]

    # -- the SearchMethod protocol ----------------------------------------------------
    def initial_operations(self) -> list[Operation]:
        ops: list[Operation] = []
        for _ in range(self.pacing.first()):
            ops += self._create()
        return ops + self._shutdown_if_done()

    def on_validation_completed(self, request_id: int, metric: float,
                                length: int) -> list[Operation]:
        if not self._running(request_id) or length < self.target(request_id):
            return []  # not the validation at max_length (or a duplicate): nothing to decide
        self.finished.add(request_id)
        return [Close(request_id), *self._shutdown_if_done()]

    def on_trial_closed(self, request_id: int) -> list[Operation]:
        if request_id in self.closed or request_id not in self.finished:
            return []
        self.closed.add(request_id)
        return self._create_next()

    def on_trial_exited_early(self, request_id: int) -> list[Operation]:
        if not self._running(request_id):
            return []
        self.finished.add(request_id)
        self.exited.add(request_id)
        return self._create_next() + self._shutdown_if_done()

    def on_trial_continued(self, request_id: int) -> list[Operation]:
        """`det e continue`: the trial trains on, to the target of the config the search is
        replayed with (which the continuation may have raised), so it runs again, and the
        search is over once it has validated there."""
        if 1 <= request_id <= self.pacing.created:
            self.finished.discard(request_id)
            self.closed.discard(request_id)
            self.exited.discard(request_id)
            self.shut_down = False
        return []

    def progress(self, batches_trained: dict[int, int]) -> float:
        """Batches trained, each trial's capped at max_length, over max_length per trial;
        a trial that exited early counts as done, since it will train no further."""
        if not self.max_length or not self.total_trials:
            return 0.0  # unknown until the script records its length
        requests = range(1, self.total_trials + 1)
        done = sum(self.target(r) if r in self.exited
                   else min(batches_trained.get(r, 0), self.target(r)) for r in requests)
        return min(1.0, done / sum(self.target(r) for r in requests))

    def rungs(self) -> list[dict]:
        return []

    # -- pacing ---------------------------------------------------------------------
    def _running(self, request_id: int) -> bool:
        return 1 <= request_id <= self.pacing.created and request_id not in self.finished

    def _create(self) -> list[Operation]:
        self.pacing.count()
        request_id = self.pacing.created  # request ids are 1, 2, 3... in creation order
        return [self.source.create(request_id), ValidateAfter(request_id, self.target(request_id))]

    def _create_next(self) -> list[Operation]:
        """A trial left: one more may start."""
        return self._create() if self.pacing.more() else []

    def _shutdown_if_done(self) -> list[Operation]:
        if self.shut_down or self.pacing.more():
            return []
        if len(self.finished) < self.pacing.created:
            return []
        self.shut_down = True
        return [Shutdown()]
