"""The `single` searcher: one trial, trained to `max_length`.

Hyperparameters given as ranges are drawn once, from the experiment seed, as Determined's
single searcher does. A script's run may leave max_length out: its target is then 0
batches, meaning the script's own epochs decide (the harness records the real target).
"""

from __future__ import annotations

import numpy as np

from localdet.config import length_to_batches
from localdet.searcher.base import Create, Operation, Shutdown, ValidateAfter, derive_seed
from localdet.searcher.hparams import sample

REQUEST_ID = 1


class SingleSearch:
    def __init__(self, config: dict, experiment_seed: int):
        self.config = config
        self.experiment_seed = experiment_seed
        length = config["searcher"]["max_length"]
        self.max_length = (0 if length is None  # 0: the script decides
                           else length_to_batches(length, config, "searcher.max_length"))

    def initial_operations(self) -> list[Operation]:
        rng = np.random.default_rng([self.experiment_seed, REQUEST_ID])
        hparams = sample(self.config["hyperparameters"], rng)
        return [Create(REQUEST_ID, hparams, derive_seed(self.experiment_seed, REQUEST_ID)),
                ValidateAfter(REQUEST_ID, self.max_length)]

    def on_validation_completed(self, request_id: int, metric: float,
                                length: int) -> list[Operation]:
        return [Shutdown()] if length >= self.max_length else []

    def on_trial_exited_early(self, request_id: int) -> list[Operation]:
        return [Shutdown()]

    def progress(self, batches_trained: dict[int, int]) -> float:
        if not self.max_length:
            return 0.0  # unknown until the script records its length
        return min(1.0, batches_trained.get(REQUEST_ID, 0) / self.max_length)
