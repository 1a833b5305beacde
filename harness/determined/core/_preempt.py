"""`core_context.preempt`: whether the trial should checkpoint and exit now.

    for batch in ...:
        train(batch)
        if core_context.preempt.should_preempt():
            save_checkpoint()
            return      # exit 0: localdet resumes the trial from its latest checkpoint

True once `localdet pause` (or the dashboard's Pause, or the daemon holding trials for disk
space) reaches the trial, and once the trial has validated at its searcher length (an ASHA
rung, `max_length`, `max_time`), which is how Determined 0.38 stopped a trial there. It
stays True from then on. A trial asked to pause that exits 0 is PAUSED; `localdet resume`
launches it again with `det.get_cluster_info().latest_checkpoint` set.
"""

from __future__ import annotations

import enum
import logging
from typing import Any, Optional

from determined.core._distributed import DistributedContext
from determined.core._length import TrialLength
from determined.core._reporting import TrialReporter

logger = logging.getLogger("determined.core")


class PreemptMode(enum.Enum):
    """WorkersAskChief (the default): every rank calls should_preempt() in step and gets the
    chief's answer. ChiefOnly: only the chief calls it. WorkersAskMaster: each rank asks on
    its own (here: the chief's records, read by each)."""

    WorkersAskChief = "WORKERS_ASK_CHIEF"
    ChiefOnly = "CHIEF_ONLY"
    WorkersAskMaster = "WORKERS_ASK_MASTER"


class PreemptContext:
    """`core_context.preempt`; see the module docstring."""

    def __init__(self, reporter: Optional[TrialReporter], distributed: DistributedContext,
                 length: TrialLength,
                 preempt_mode: PreemptMode = PreemptMode.WorkersAskChief) -> None:
        self._reporter = reporter   # None: off-cluster, never preempted
        self._dist = distributed
        self._length = length
        self._mode = PreemptMode(preempt_mode)
        self._started = False
        self._preempted = False     # sticky, as Determined's watcher was
        self.paused = False         # asked to stop by a request (not by its length)

    def start(self) -> "PreemptContext":
        if self._started:
            raise RuntimeError("you cannot call PreemptContext.start() multiple times")
        self._started = True
        return self

    def close(self) -> None:
        pass

    def __enter__(self) -> "PreemptContext":
        return self.start()

    def __exit__(self, *_: Any) -> None:
        self.close()

    def should_preempt(self, auto_ack: bool = True) -> bool:
        """Whether to checkpoint and exit now; see the module docstring. (`auto_ack` is
        accepted: the daemon notes a pause as seen when it is first answered True.)"""
        if not self._started:
            raise RuntimeError("you cannot call PreemptContext.should_preempt() before "
                               "PreemptContext.start() (use `with det.core.init() as "
                               "core_context:`)")
        rank = self._dist.get_rank()
        if rank == 0 or self._mode == PreemptMode.WorkersAskMaster:
            out = self._ask()
            if rank == 0 and self._mode == PreemptMode.WorkersAskChief:
                self._dist.broadcast(out)
        elif self._mode == PreemptMode.ChiefOnly:
            raise RuntimeError(f"PreemptContext was configured with preempt_mode=ChiefOnly but "
                               f".should_preempt() was called from rank {rank}")
        else:
            out = bool(self._dist.broadcast(None))
        self._preempted = self._preempted or out
        return out

    def acknowledge_preemption_signal(self) -> None:
        """Accepted: the daemon notes a pause as seen when should_preempt() answers it."""

    def _ask(self) -> bool:
        if self._preempted:
            return True
        if self._reporter is None:
            return False
        if self._reporter.should_pause():
            self.paused = True
            logger.info("should_preempt(): the trial was asked to pause")
            return True
        if self._length.reached():
            logger.info("should_preempt(): the trial validated at its searcher length "
                        "(%d batches)", self._length.target)
            return True
        return False


class DummyPreemptContext(PreemptContext):
    """Off-cluster: never preempted (the ranks still agree in step, as Determined's did)."""

    def __init__(self, dist: DistributedContext,
                 preempt_mode: PreemptMode = PreemptMode.WorkersAskChief) -> None:
        super().__init__(None, dist, TrialLength(None, 0), preempt_mode)
