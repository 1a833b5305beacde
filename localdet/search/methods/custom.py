"""`searcher.name: custom`: Determined's custom searcher, whose decisions are made by a
`determined.searcher.SearchMethod` in a runner script, not here. The runner reads the
recorded searcher events and posts its operations for each
(localdet/operations/custom_search.py), which carries them out itself; so this method only
takes the events in (it answers none of them) and the search stays replayable."""

from __future__ import annotations

from localdet.search.methods.base import Operation


class CustomSearch:
    """Answers nothing: the runner's operations are carried out as they are posted."""

    def __init__(self, config, experiment_seed: int):
        self.experiment_seed = experiment_seed

    def initial_operations(self) -> list[Operation]:
        return []

    def on_validation_completed(self, request_id: int, metric: float,
                                length: int) -> list[Operation]:
        return []

    def on_trial_closed(self, request_id: int) -> list[Operation]:
        return []

    def on_trial_exited_early(self, request_id: int) -> list[Operation]:
        return []

    def on_trial_created(self, request_id: int) -> list[Operation]:
        return []

    def on_shutdown(self) -> list[Operation]:
        return []

    def progress(self, batches_trained: dict[int, int]) -> float:
        return 0.0  # the runner posts its method's progress (custom_search_batches)

    def rungs(self) -> list[dict]:
        return []
