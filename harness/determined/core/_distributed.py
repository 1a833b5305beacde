"""DistributedContext: who this process is among the trial's processes."""

from __future__ import annotations

import os
from typing import Any, List, Optional


class DistributedContext:
    """Rank information for the processes of one trial.

    A one-slot trial is rank 0 of size 1, which is what `DistributedContext()` gives:

        distributed = DistributedContext()
        distributed.get_rank()     # 0
        distributed.allgather(x)   # [x]

    Collective operations across several processes arrive with multi-slot trials; until
    then a context of size > 1 refuses them rather than return wrong answers.
    """

    def __init__(self, *, rank: int = 0, size: int = 1, local_rank: int = 0,
                 local_size: int = 1, cross_rank: int = 0, cross_size: int = 1,
                 chief_ip: Optional[str] = None, pub_port: int = 12360,
                 pull_port: int = 12376, port_offset: int = 0, force_tcp: bool = False):
        if not 0 <= rank < size:
            raise ValueError(f"rank must be in [0, {size}), got {rank}")
        self.rank, self.size = rank, size
        self.local_rank, self.local_size = local_rank, local_size
        self.cross_rank, self.cross_size = cross_rank, cross_size
        self._chief_ip = chief_ip or os.environ.get("DET_CHIEF_IP")

    @classmethod
    def from_horovod(cls, hvd: Any, chief_ip: Optional[str] = None) -> "DistributedContext":
        return cls(rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(),
                   local_size=hvd.local_size(), cross_rank=hvd.cross_rank(),
                   cross_size=hvd.cross_size(), chief_ip=chief_ip)

    def get_rank(self) -> int:
        return self.rank

    def get_local_rank(self) -> int:
        return self.local_rank

    def get_size(self) -> int:
        return self.size

    def shard_batch_size(self, global_batch_size: int) -> int:
        """This process's share of a global batch, so that the effective batch size stays
        the same on any number of slots:

            batch_size = context.distributed.shard_batch_size(128)   # 64 on 2 slots
        """
        if isinstance(global_batch_size, bool) or not isinstance(global_batch_size, int) \
                or global_batch_size < 1:
            raise ValueError(f"shard_batch_size() needs a positive integer global batch size, "
                             f"got {global_batch_size!r}")
        if global_batch_size % self.size:
            raise ValueError(f"the global batch size {global_batch_size} does not split evenly "
                             f"over {self.size} processes; make it a multiple of {self.size}")
        return global_batch_size // self.size

    def get_num_agents(self) -> int:
        return self.cross_size

    def _single_process(self, operation: str) -> None:
        if self.size > 1:
            raise NotImplementedError(
                f"DistributedContext.{operation}() across {self.size} processes is not "
                "available yet in localdet; run the trial with slots_per_trial: 1")

    def gather(self, stuff: Any) -> Optional[List]:
        self._single_process("gather")
        return [stuff]

    def gather_local(self, stuff: Any) -> Optional[List]:
        self._single_process("gather_local")
        return [stuff]

    def allgather(self, stuff: Any) -> List:
        self._single_process("allgather")
        return [stuff]

    def allgather_local(self, stuff: Any) -> List:
        self._single_process("allgather_local")
        return [stuff]

    def broadcast(self, stuff: Any) -> Any:
        self._single_process("broadcast")
        return stuff

    def broadcast_local(self, stuff: Optional[Any] = None) -> Any:
        self._single_process("broadcast_local")
        return stuff
