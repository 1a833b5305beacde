"""DistributedContext: who this process is among the trial's processes, and collectives
across them.

In a trial, use the context the harness made (`context.distributed`):

    distributed = context.distributed
    distributed.get_rank(), distributed.get_size()     # e.g. 1, 4
    distributed.allgather(loss)                        # every rank: [rank 0's loss, ...]
    distributed.gather(stats)                          # rank 0: [.., .., .., ..]; others: None
    distributed.broadcast(plan)                        # every rank: rank 0's plan
    distributed.allgather_local(x)                     # the same, over this machine's ranks

Every rank must call the same collectives in the same order (each from one thread), as in
Determined: rank 0 checks, and a rank that calls a different one, goes away or stays silent
for 30 minutes makes every rank raise an error that names it; after that the context's
collectives fail at once. The collectives are for coordination (any picklable objects),
not a replacement for the training framework's own all-reduce.

The harness builds the context in every trial process with
`DistributedContext.from_environment()`, from the LOCALDET_* variables the launcher sets
(see `determined.core._distributed_env`). Without them a process is rank 0 of 1 and the
collectives return at once (`[x]`, `x`) without opening a socket. Other processes can
describe themselves with `from_horovod(hvd)` or `from_tf_config()` (which also gives
the `tf.distribute` strategy); their collectives use
the same transport, and so need LOCALDET_CHIEF_ADDR (or chief_ip and pub_port) and
LOCALDET_DIST_AUTHKEY. With more than one process the connections open on the first
collective and close with `close()` (or at exit); see `determined.core._process_group`.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Dict, List, Optional, Tuple, Union

from determined.core._distributed_env import read_distributed_environment, read_rendezvous
from determined.core._process_group import ProcessGroup
from determined.core._reporting import AUTHKEY_VAR


class DistributedContext:
    """Rank information for the processes of one trial, and collectives across them.

    rank/size: this process among all of the trial's; local_rank/local_size: among those on
    this machine; cross_rank/cross_size: this machine among the trial's machines. localdet
    runs on one machine, where local equals global and cross is 0 of 1, which is what the
    local and cross arguments default to:

        DistributedContext()                      # rank 0 of 1: a one-slot trial
        DistributedContext(rank=1, size=4)        # local rank 1 of 4, machine 0 of 1

    chief_ip (or DET_CHIEF_IP) and pub_port + port_offset say where rank 0 listens when
    LOCALDET_CHIEF_ADDR does not; pull_port and force_tcp are Determined's ZeroMQ settings,
    accepted so that code written for it runs, and unused (one port serves here).
    """

    def __init__(self, *, rank: int = 0, size: int = 1, local_rank: Optional[int] = None,
                 local_size: Optional[int] = None, cross_rank: Optional[int] = None,
                 cross_size: Optional[int] = None, chief_ip: Optional[str] = None,
                 pub_port: int = 12360, pull_port: int = 12376, port_offset: int = 0,
                 force_tcp: bool = False):
        _check_index("rank", rank, "size", size)
        if cross_size is None or cross_size == 1:
            local_rank = rank if local_rank is None else local_rank
            local_size = size if local_size is None else local_size
            cross_rank, cross_size = (0 if cross_rank is None else cross_rank), 1
            if (local_rank, local_size) != (rank, size):
                raise ValueError(f"on one machine (cross_size 1) local_rank and local_size "
                                 f"equal rank and size ({rank}, {size}), got "
                                 f"({local_rank}, {local_size})")
        elif local_rank is None or local_size is None or cross_rank is None:
            raise ValueError("with cross_size > 1 (several machines) DistributedContext "
                             "needs local_rank, local_size and cross_rank too")
        _check_index("local_rank", local_rank, "local_size", local_size)
        _check_index("cross_rank", cross_rank, "cross_size", cross_size)
        self.rank, self.size = rank, size
        self.local_rank, self.local_size = local_rank, local_size
        self.cross_rank, self.cross_size = cross_rank, cross_size
        # Determined's folder of IPC sockets; the ranks here meet over TCP, so there is none.
        self.tempdir: Optional[str] = None

        # Where rank 0 listens and the key that admits the trial's processes: the launcher's
        # LOCALDET_CHIEF_ADDR first, else chief_ip/DET_CHIEF_IP (this machine when there is
        # only one) at pub_port + port_offset.
        self._chief_ip = chief_ip or os.environ.get("DET_CHIEF_IP")
        self._chief_addr, self._authkey = read_rendezvous() if size > 1 else (None, None)
        if self._chief_addr is None and size > 1:
            if cross_size > 1 and not self._chief_ip:
                raise ValueError(f"a trial on {cross_size} machines needs the chief's "
                                 "address: pass chief_ip or set DET_CHIEF_IP")
            self._chief_addr = (self._chief_ip or "127.0.0.1", pub_port + port_offset)
        self._group: Optional[ProcessGroup] = None

    @classmethod
    def from_environment(cls) -> "DistributedContext":
        """This process's context in a trial the localdet launcher started: LOCALDET_RANK,
        LOCALDET_SIZE, LOCALDET_CHIEF_ADDR, LOCALDET_DIST_AUTHKEY; rank 0 of 1 without them."""
        env = read_distributed_environment()
        return cls(rank=env.rank, size=env.size)

    @classmethod
    def from_horovod(cls, hvd: Any, chief_ip: Optional[str] = None) -> "DistributedContext":
        """Rank information from an initialised Horovod module:

            import horovod.tensorflow.keras as hvd
            hvd.init()
            distributed = DistributedContext.from_horovod(hvd)
        """
        return cls(rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(),
                   local_size=hvd.local_size(), cross_rank=hvd.cross_rank(),
                   cross_size=hvd.cross_size(), chief_ip=chief_ip)

    @classmethod
    def from_deepspeed(cls, *args: Any, **kwargs: Any) -> "DistributedContext":
        """Determined's constructor for DeepSpeed trials, which localdet does not run."""
        from determined.errors import refuse

        raise refuse("DistributedContext.from_deepspeed (DeepSpeed trials)",
                     "a Keras trial gets its context as context.distributed")

    @classmethod
    def from_torch_distributed(cls, *args: Any, **kwargs: Any) -> "DistributedContext":
        """Determined's constructor for PyTorch trials, which localdet does not run."""
        from determined.errors import refuse

        raise refuse("DistributedContext.from_torch_distributed (PyTorch trials)",
                     "a Keras trial gets its context as context.distributed")

    @classmethod
    def from_tf_config(cls) -> Tuple["DistributedContext", Any]:
        """Determined 0.38's constructor for a TensorFlow script: the context and the
        `tf.distribute` strategy its TF_CONFIG calls for (which localdet's launcher sets on
        each rank of a multi-process trial, as `determined.launch.tensorflow` did):

            distributed, strategy = det.core.DistributedContext.from_tf_config()
            with strategy.scope():
                model = build_and_compile()

        Several workers: MultiWorkerMirroredStrategy. Otherwise rank 0 of 1, with a
        MirroredStrategy over this process's GPUs when it has more than one, else the
        default strategy.
        """
        import tensorflow as tf

        if os.environ.get("TF_CONFIG"):
            distributed = cls._ranks_from_tf_config()
            if distributed.size > 1:
                return distributed, tf.distribute.MultiWorkerMirroredStrategy()
        gpus = len(tf.config.list_physical_devices("GPU"))
        strategy = tf.distribute.MirroredStrategy() if gpus > 1 else tf.distribute.get_strategy()
        return cls(), strategy

    @classmethod
    def _ranks_from_tf_config(cls, tf_config: Union[str, Dict[str, Any], None] = None
                              ) -> "DistributedContext":
        """Rank information from MultiWorkerMirroredStrategy's TF_CONFIG (a JSON string or
        its dict; default: the TF_CONFIG environment variable):

            {"cluster": {"worker": ["127.0.0.1:20001", "127.0.0.1:20002"]},
             "task": {"type": "worker", "index": 1}}          # rank 1 of 2

        A "chief" task, if the cluster has one, comes first. Machines are told apart by the
        host part of the addresses; the first worker's host is where rank 0 listens unless
        LOCALDET_CHIEF_ADDR says otherwise. Without LOCALDET_DIST_AUTHKEY (a script started
        by hand, off localdet) the collectives' key is derived from the cluster description,
        which every worker has.
        """
        if tf_config is None:
            tf_config = os.environ.get("TF_CONFIG")
            if not tf_config:
                raise ValueError("TF_CONFIG is not set: from_tf_config() needs the cluster "
                                 "description of MultiWorkerMirroredStrategy")
        try:
            config = json.loads(tf_config) if isinstance(tf_config, str) else tf_config
            cluster, task = config["cluster"], config["task"]
            chiefs, workers = list(cluster.get("chief", [])), list(cluster.get("worker", []))
            kind, index = task["type"], int(task["index"])
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise ValueError(f"TF_CONFIG must be JSON with cluster.worker (a list of "
                             f"host:port) and task.type and task.index: {error}") from None
        if kind not in ("chief", "worker"):
            raise ValueError(f"TF_CONFIG task type {kind!r} does not train; "
                             "DistributedContext describes 'chief' and 'worker' tasks")
        same_kind = chiefs if kind == "chief" else workers
        if not 0 <= index < len(same_kind):
            raise ValueError(f"TF_CONFIG task index {index} is not in cluster.{kind}, which "
                             f"has {len(same_kind)} entries")
        rank = index if kind == "chief" else len(chiefs) + index
        hosts = [_host(str(address)) for address in chiefs + workers]
        machines = list(dict.fromkeys(hosts))
        distributed = cls(rank=rank, size=len(hosts),
                          local_rank=hosts[:rank].count(hosts[rank]),
                          local_size=hosts.count(hosts[rank]),
                          cross_rank=machines.index(hosts[rank]), cross_size=len(machines),
                          chief_ip=hosts[0])
        if distributed.size > 1 and distributed._authkey is None:
            # Started by hand (no launcher key), as Determined's off-cluster scripts were:
            # the workers share the cluster description, so the key comes from it. That
            # admits no one TensorFlow's own servers at those addresses do not already
            # admit.
            cluster_text = json.dumps({"chief": chiefs, "worker": workers}, sort_keys=True)
            distributed._authkey = hashlib.sha256(
                b"localdet TF_CONFIG cluster\0" + cluster_text.encode()).digest()
        return distributed

    # -- who this process is ----------------------------------------------------------------

    def get_rank(self) -> int:
        return self.rank

    def get_local_rank(self) -> int:
        return self.local_rank

    def get_size(self) -> int:
        return self.size

    def get_num_agents(self) -> int:
        return self.cross_size

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

    # -- collectives: every rank calls the same ones in the same order ----------------------

    def gather(self, stuff: Any) -> Optional[List]:
        """Rank 0 gets everyone's stuff in rank order; the other ranks get None."""
        if self.size == 1:
            return [stuff]
        return self._process_group("gather").gather("gather", stuff)

    def allgather(self, stuff: Any) -> List:
        """Every rank gets everyone's stuff in rank order."""
        if self.size == 1:
            return [stuff]
        return self._process_group("allgather").allgather("allgather", stuff)

    def broadcast(self, stuff: Any) -> Any:
        """Every rank gets rank 0's stuff."""
        if self.size == 1:
            return stuff
        return self._process_group("broadcast").broadcast("broadcast", stuff)

    # On one machine, this machine's ranks are all the ranks: the local collectives are the
    # global ones (under their own names, for the order check).

    def gather_local(self, stuff: Any) -> Optional[List]:
        """This machine's local rank 0 gets the stuff of this machine's ranks in local rank
        order; the others get None."""
        if self.size == 1:
            return [stuff]
        if self.cross_size == 1:
            return self._process_group("gather_local").gather("gather_local", stuff)
        mine = self._machine_entries("gather_local", stuff)
        return mine if self.local_rank == 0 else None

    def allgather_local(self, stuff: Any) -> List:
        """Every rank gets the stuff of this machine's ranks in local rank order."""
        if self.size == 1:
            return [stuff]
        if self.cross_size == 1:
            return self._process_group("allgather_local").allgather("allgather_local", stuff)
        return self._machine_entries("allgather_local", stuff)

    def broadcast_local(self, stuff: Optional[Any] = None) -> Any:
        """Every rank gets the stuff of this machine's local rank 0."""
        if self.size == 1:
            return stuff
        if self.cross_size == 1:
            return self._process_group("broadcast_local").broadcast("broadcast_local", stuff)
        return self._machine_entries("broadcast_local",
                                     stuff if self.local_rank == 0 else None)[0]

    def close(self) -> None:
        """Close the connections to the other ranks (also done at exit); collectives across
        processes fail after this."""
        if self._group is not None:
            self._group.close()

    def __enter__(self) -> "DistributedContext":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def _machine_entries(self, name: str, stuff: Any) -> List:
        # Several machines: one allgather through rank 0, each rank keeping its machine's
        # entries. Enough for coordination, and every rank takes part, so the order of
        # collectives stays the same on every rank.
        entries = self._process_group(name).allgather(
            name, (self.cross_rank, self.local_rank, stuff))
        mine = sorted((entry for entry in entries if entry[0] == self.cross_rank),
                      key=lambda entry: entry[1])
        return [entry[2] for entry in mine]

    def _process_group(self, operation: str) -> ProcessGroup:
        if self._group is None:
            if self._authkey is None:
                raise RuntimeError(
                    f"{operation}() across {self.size} processes needs {AUTHKEY_VAR}: the "
                    "same secret key (hex) in every process of the trial, which localdet's "
                    "launcher sets; to set it yourself: "
                    "python3 -c 'import secrets; print(secrets.token_hex(32))'")
            if self._chief_addr is None:  # set in __init__ whenever size > 1
                raise RuntimeError(
                    f"{operation}() across {self.size} processes needs rank 0's address: "
                    "LOCALDET_CHIEF_ADDR, or chief_ip (DET_CHIEF_IP) and pub_port")
            self._group = ProcessGroup(self.rank, self.size, self._chief_addr, self._authkey)
        return self._group


class DummyDistributedContext(DistributedContext):
    """Rank 0 of 1: the context of a process that trains alone (Determined's name)."""

    def __init__(self) -> None:
        super().__init__()


def _check_index(index_name: str, index: int, count_name: str, count: int) -> None:
    if not isinstance(count, int) or count < 1:
        raise ValueError(f"{count_name} must be a positive integer, got {count!r}")
    if not isinstance(index, int) or not 0 <= index < count:
        raise ValueError(f"{index_name} must be in [0, {count}), got {index!r}")


def _host(address: str) -> str:
    host, sep, _ = address.rpartition(":")
    return (host if sep else address).strip("[]")
