"""Searches whose trials each train once, straight to `max_length`, then close: the common
part of `single`, `random` and `grid`. A subclass says how many trials and their
hyperparameters; this class paces their creation and says when the search is over.

    class RandomSearch(FullLengthSearch):
        def trial_count(self):
            return self.config["searcher"]["max_trials"]

        def hparams(self, request_id):
            rng = np.random.default_rng([self.experiment_seed, request_id])
            return sample(self.config["hyperparameters"], rng)

`searcher.max_concurrent_trials` (0: no limit) caps the trials created and not yet closed or
exited: that many are created at first, one more each time one closes or exits early.
A script's run may leave max_length out: its target is then 0 batches, meaning the script's
own epochs decide, and its first completed validation closes it.
"""

from __future__ import annotations

from localdet.config.experiment import length_to_batches
from localdet.search.methods.base import (
    Close,
    Create,
    Operation,
    Shutdown,
    ValidateAfter,
    derive_seed,
)


class FullLengthSearch:
    def __init__(self, config: dict, experiment_seed: int):
        self.config = config
        self.experiment_seed = experiment_seed
        length = config["searcher"]["max_length"]
        self.max_length = (0 if length is None  # 0: the script decides
                           else length_to_batches(length, config, "searcher.max_length"))
        self.max_concurrent_trials = config["searcher"].get("max_concurrent_trials") or 0
        self.total_trials = self.trial_count()
        self.created = 0
        self.finished: set[int] = set()  # closed by us or exited early
        self.closed: set[int] = set()    # the daemon confirmed the Close
        self.exited: set[int] = set()
        self.shut_down = False

    # -- what a subclass says ---------------------------------------------------------
    def trial_count(self) -> int:
        raise NotImplementedError

    def hparams(self, request_id: int) -> dict:
        raise NotImplementedError

    # -- the SearchMethod protocol ----------------------------------------------------
    def initial_operations(self) -> list[Operation]:
        first = self.total_trials
        if self.max_concurrent_trials:
            first = min(first, self.max_concurrent_trials)
        ops: list[Operation] = []
        for _ in range(first):
            ops += self._create()
        return ops + self._shutdown_if_done()

    def on_validation_completed(self, request_id: int, metric: float,
                                length: int) -> list[Operation]:
        if not self._running(request_id) or length < self.max_length:
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

    def progress(self, batches_trained: dict[int, int]) -> float:
        """Batches trained, each trial's capped at max_length, over max_length per trial;
        a trial that exited early counts as done, since it will train no further."""
        if not self.max_length or not self.total_trials:
            return 0.0  # unknown until the script records its length
        done = sum(self.max_length if r in self.exited
                   else min(batches_trained.get(r, 0), self.max_length)
                   for r in range(1, self.total_trials + 1))
        return min(1.0, done / (self.max_length * self.total_trials))

    def rungs(self) -> list[dict]:
        return []

    # -- pacing ---------------------------------------------------------------------
    def _running(self, request_id: int) -> bool:
        return 1 <= request_id <= self.created and request_id not in self.finished

    def _create(self) -> list[Operation]:
        self.created += 1
        request_id = self.created
        return [Create(request_id, self.hparams(request_id),
                       derive_seed(self.experiment_seed, request_id)),
                ValidateAfter(request_id, self.max_length)]

    def _create_next(self) -> list[Operation]:
        """A trial left: one more may start (all were started at first without a limit)."""
        if self.max_concurrent_trials and self.created < self.total_trials:
            return self._create()
        return []

    def _shutdown_if_done(self) -> list[Operation]:
        if self.shut_down or self.created < self.total_trials:
            return []
        if len(self.finished) < self.created:
            return []
        self.shut_down = True
        return [Shutdown()]
