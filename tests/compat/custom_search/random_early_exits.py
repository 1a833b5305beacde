"""A random search written as a Determined SearchMethod, whose every third trial is drawn
with `fail: true` and exits early: the method counts failures, replaces each lost trial,
and shuts the search down after `max_trials` trials (or with failure=True after
`max_failures`). `concurrency` trials run at once; the decisions do not depend on the order
events come in, so a simulation predicts the trials made and how each ended."""

import json
import random
import uuid
from typing import Any, List

from determined import searcher


class RandomWithEarlyExits(searcher.SearchMethod):
    def __init__(self, max_trials: int, length: int, concurrency: int = 2,
                 max_failures: int = 100, seed: int = 0) -> None:
        self.max_trials, self.length, self.concurrency = max_trials, length, concurrency
        self.max_failures = max_failures
        self.rng = random.Random(seed)
        self.created = 0

    def _create(self) -> List[searcher.Operation]:
        if self.created >= self.max_trials:
            return []
        self.created += 1
        hparams = {"x": round(self.rng.uniform(0, 1), 6), "fail": self.created % 3 == 0}
        return [searcher.Create(uuid.uuid4(), hparams, checkpoint=None)]

    def initial_operations(self, _: searcher.SearcherState) -> List[searcher.Operation]:
        return [op for _ in range(self.concurrency) for op in self._create()]

    def on_trial_created(self, _: searcher.SearcherState,
                         request_id: uuid.UUID) -> List[searcher.Operation]:
        return [searcher.ValidateAfter(request_id, self.length)]

    def on_validation_completed(self, _: searcher.SearcherState, request_id: uuid.UUID,
                                metric: Any, train_length: int) -> List[searcher.Operation]:
        return [searcher.Close(request_id)]

    def _next(self, state: searcher.SearcherState) -> List[searcher.Operation]:
        if len(state.failures) >= self.max_failures:
            return [searcher.Shutdown(failure=True)]
        ended = len(state.trials_closed | state.failures)
        if ended >= self.max_trials:
            return [searcher.Shutdown()]
        return self._create()

    def on_trial_closed(self, state: searcher.SearcherState,
                        request_id: uuid.UUID) -> List[searcher.Operation]:
        return self._next(state)

    def on_trial_exited_early(self, state: searcher.SearcherState, request_id: uuid.UUID,
                              exited_reason: searcher.ExitedReason) -> List[searcher.Operation]:
        return self._next(state)

    def progress(self, state: searcher.SearcherState) -> float:
        return len(state.trials_closed | state.failures) / self.max_trials

    def save_method_state(self, path) -> None:
        (path / "random.json").write_text(json.dumps({"created": self.created,
                                                      "rng": repr(self.rng.getstate())}))

    def load_method_state(self, path) -> None:
        import ast

        saved = json.loads((path / "random.json").read_text())
        self.created = saved["created"]
        self.rng.setstate(ast.literal_eval(saved["rng"]))
