"""An ASHA written as a Determined SearchMethod (as Determined's custom_search_method example
did, here our own): rungs of lengths `min_length * divisor**k`; a trial validated at a rung
is promoted to the next when it ranks in the top 1/divisor of that rung so far, else
closed; a new trial starts whenever one is closed, until `max_trials`; Shutdown when all
are closed. One trial in flight at a time (`max_concurrent_trials` 1), so the decisions
depend on the metrics alone, not on timing, and a simulation predicts them exactly. Its
state (rungs, draws) is saved with save_method_state, so a restarted runner resumes it."""

import json
import random
import uuid
from typing import Any, Dict, List

from determined import searcher


class ASHASearchMethod(searcher.SearchMethod):
    def __init__(self, max_trials: int, num_rungs: int, min_length: int, divisor: int = 2,
                 seed: int = 0) -> None:
        self.max_trials, self.num_rungs = max_trials, num_rungs
        self.min_length, self.divisor = min_length, divisor
        self.rng = random.Random(seed)
        self.rungs: List[Dict[str, float]] = [{} for _ in range(num_rungs)]  # request -> metric
        self.rung_of: Dict[str, int] = {}
        self.created = 0

    def _length(self, rung: int) -> int:
        return self.min_length * self.divisor ** rung

    def _create(self) -> List[searcher.Operation]:
        self.created += 1
        request_id = uuid.uuid4()
        self.rung_of[str(request_id)] = 0
        hparams = {"x": round(self.rng.uniform(0, 1), 6)}
        return [searcher.Create(request_id, hparams, checkpoint=None)]

    def initial_operations(self, _: searcher.SearcherState) -> List[searcher.Operation]:
        return self._create()

    def on_trial_created(self, _: searcher.SearcherState,
                         request_id: uuid.UUID) -> List[searcher.Operation]:
        return [searcher.ValidateAfter(request_id, self._length(0))]

    def on_validation_completed(self, _: searcher.SearcherState, request_id: uuid.UUID,
                                metric: Any, train_length: int) -> List[searcher.Operation]:
        rung = self.rung_of[str(request_id)]
        self.rungs[rung][str(request_id)] = float(metric)
        ranked = sorted(self.rungs[rung].values())
        keep = max(1, len(ranked) // self.divisor)
        if rung + 1 < self.num_rungs and float(metric) <= ranked[keep - 1]:
            self.rung_of[str(request_id)] = rung + 1
            return [searcher.ValidateAfter(request_id, self._length(rung + 1))]
        return [searcher.Close(request_id)]

    def on_trial_closed(self, state: searcher.SearcherState,
                        request_id: uuid.UUID) -> List[searcher.Operation]:
        if self.created < self.max_trials:
            return self._create()
        if len(state.trials_closed | state.failures) >= self.max_trials:
            return [searcher.Shutdown()]
        return []

    def on_trial_exited_early(self, state: searcher.SearcherState, request_id: uuid.UUID,
                              exited_reason: searcher.ExitedReason) -> List[searcher.Operation]:
        return self.on_trial_closed(state, request_id)

    def progress(self, state: searcher.SearcherState) -> float:
        return len(state.trials_closed) / self.max_trials

    def save_method_state(self, path) -> None:
        (path / "asha.json").write_text(json.dumps({
            "rungs": self.rungs, "rung_of": self.rung_of, "created": self.created,
            "rng": repr(self.rng.getstate())}))

    def load_method_state(self, path) -> None:
        import ast

        saved = json.loads((path / "asha.json").read_text())
        self.rungs, self.rung_of, self.created = saved["rungs"], saved["rung_of"], saved["created"]
        self.rng.setstate(ast.literal_eval(saved["rng"]))
