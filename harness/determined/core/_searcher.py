"""`core_context.searcher`: the searcher's length for a trial, in the shape each release had.

    for op in core_context.searcher.operations():
        while steps < op.length:            # in the config's unit (batches, epochs, records)
            train(); steps += 1
            op.report_progress(steps)
        op.report_completed(validate()["loss"])

One operation per launch: its length is where the searcher wants this trial trained to
before it decides (the whole `max_length` for single, grid and random; the current rung for
ASHA, whose promotions launch the trial again from its checkpoint with a longer one).
`report_completed(metric)` records the metric as a validation at the batches reached, so
the searcher reads it even if the script reported no validation metrics itself.

Determined 0.38 deprecated this API and made it only where the config has
`searcher.max_length`; a run without a length gets `SearcherContextMissing`, whose methods
say so.
"""

from __future__ import annotations

import enum
import logging
from typing import Any, Dict, Iterator, Optional

from determined.core._distributed import DistributedContext
from determined.core._train import TrainContext

logger = logging.getLogger("determined.core")


class Unit(enum.Enum):
    EPOCHS = "EPOCHS"
    RECORDS = "RECORDS"
    BATCHES = "BATCHES"


class SearcherMode(enum.Enum):
    """WorkersAskChief (the default): every rank iterates operations() in step. ChiefOnly:
    only the chief does."""

    WorkersAskChief = "WORKERS_ASK_CHIEF"
    ChiefOnly = "CHEIF_ONLY"  # sic: Determined's value


def _parse_searcher_max_length(experiment_config: Dict[str, Any]) -> Optional[int]:
    length = (experiment_config.get("searcher") or {}).get("max_length")
    if isinstance(length, dict):
        return next(iter(length.values()), None)
    return length


def _parse_searcher_units(experiment_config: Dict[str, Any]) -> Optional[Unit]:
    searcher = experiment_config.get("searcher") or {}
    units = {"records": Unit.RECORDS, "epochs": Unit.EPOCHS, "batches": Unit.BATCHES}
    if "unit" in searcher:
        return units.get(searcher["unit"])
    length = searcher.get("max_length")
    if isinstance(length, dict) and len(length) == 1:
        return units.get(next(iter(length)))
    return None


def length_in_units(target_batches: int, config: Dict[str, Any]) -> int:
    """The searcher's target in the unit its config counts in (localdet's searchers count
    batches): epochs through `records_per_epoch` and the global batch size."""
    unit = _parse_searcher_units(config)
    if unit in (None, Unit.BATCHES):
        return target_batches
    hparams = config.get("hyperparameters") or {}
    batch = hparams.get("global_batch_size")
    batch = batch.get("val") if isinstance(batch, dict) else batch
    if not isinstance(batch, int) or batch < 1:
        return target_batches
    if unit == Unit.RECORDS:
        return target_batches * batch
    per_epoch = int(config.get("records_per_epoch") or 0)
    if per_epoch < batch:
        return target_batches
    return max(1, round(target_batches * batch / per_epoch))


class SearcherOperation:
    """One train-then-validate request: train to `length` (absolute, in the config's unit),
    then `report_completed(metric)`."""

    def __init__(self, length: int, is_chief: bool, train: Optional[TrainContext] = None,
                 metric: Optional[str] = None, batches: int = 0) -> None:
        self._length = length
        self._is_chief = is_chief
        self._train = train
        self._metric = metric
        self._batches = batches   # the length in batches, where no steps were reported
        self._completed = False

    @property
    def length(self) -> int:
        return self._length

    def report_progress(self, length: float) -> None:
        if not self._is_chief:
            raise RuntimeError("you must only call op.report_progress() from the chief worker")
        if self._completed and length != self._length:
            raise RuntimeError("you must not call op.report_progress() after "
                               "op.report_completed()")
        if self._train is not None and self._length:
            self._train.report_progress(min(1.0, max(0.0, length / self._length)))

    def report_completed(self, searcher_metric: Any) -> None:
        if not self._is_chief:
            raise RuntimeError("you must only call op.report_completed() from the chief worker")
        if self._completed:
            raise RuntimeError("you may only call op.report_completed() once")
        self._completed = True
        logger.info("op.report_completed(%r) at length %d", searcher_metric, self._length)
        if self._train is not None and self._metric is not None:
            steps = max(self._train._length.last_steps, self._batches)
            self._train.report_validation_metrics(steps, {self._metric: searcher_metric})


class SearcherContext:
    """`core_context.searcher`; see the module docstring."""

    def __init__(self, dist: DistributedContext, length: int, units: Optional[Unit] = None,
                 train: Optional[TrainContext] = None, metric: Optional[str] = None,
                 batches: int = 0) -> None:
        self._dist = dist
        self._length = length
        self._units = units
        self._train = train
        self._metric = metric
        self._batches = batches

    def operations(self, searcher_mode: SearcherMode = SearcherMode.WorkersAskChief,
                   auto_ack: bool = True) -> Iterator[SearcherOperation]:
        """This launch's operation (one); see the module docstring."""
        mode = SearcherMode(searcher_mode)
        if self._dist.rank == 0:
            op = SearcherOperation(self._length, True, self._train, self._metric, self._batches)
            if mode == SearcherMode.WorkersAskChief:
                self._dist.broadcast(op.length)
            yield op
            if not op._completed:
                raise RuntimeError("you must call op.report_completed() on each operation")
            if mode == SearcherMode.WorkersAskChief:
                self._dist.broadcast(None)
            return
        if mode != SearcherMode.WorkersAskChief:
            raise RuntimeError("you cannot call searcher.operations(searcher_mode=ChiefOnly) "
                               "from a non-chief worker")
        while True:
            length = self._dist.broadcast(None)
            if length is None:
                return
            yield SearcherOperation(length, False)

    def acknowledge_out_of_ops(self) -> None:
        """Accepted: nothing to acknowledge."""

    def get_configured_units(self) -> Optional[Unit]:
        return self._units


class DummySearcherContext(SearcherContext):
    """Off-cluster: one operation of `length` (default 1), as Determined's was."""

    def __init__(self, dist: DistributedContext, length: int = 1) -> None:
        super().__init__(dist, length, Unit.EPOCHS)


_MISSING = ("core_context.searcher has no length to give: the experiment config sets no "
            "searcher.max_length (Determined 0.38 made this API only with one); train for "
            "the length your script chooses, or set searcher.max_length")


class SearcherContextMissing(SearcherContext):
    """A run whose config sets no searcher length."""

    def __init__(self) -> None:
        super().__init__(DistributedContext(), 0)

    def operations(self, searcher_mode: SearcherMode = SearcherMode.WorkersAskChief,
                   auto_ack: bool = True) -> Iterator[SearcherOperation]:
        raise ValueError(_MISSING)

    def acknowledge_out_of_ops(self) -> None:
        raise ValueError(_MISSING)

    def get_configured_units(self) -> Optional[Unit]:
        raise ValueError(_MISSING)


DummySearcherOperation = SearcherOperation
