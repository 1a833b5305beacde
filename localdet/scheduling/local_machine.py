"""Trials on this machine: the default place a daemon runs them.

    machine = LocalMachine(detect_slots(cpu_slots=2), pool)
    machine.slots()                          # its GPUs, or CPU slots
    handle = machine.start(spec, trial, [0]) # a process of its own, or forked from a warm one

The daemon's scheduler asks where trials may run and starts them through one interface:
`slots()`, `available()`, `node_key(slot)`, `largest_node_seen()`, `report_host()`,
`start(spec, trial, slots)` and `close()`. This class is that interface for one machine;
`localdet.scheduling.ray_cluster.RayCluster` is the same interface over a Ray cluster's nodes (and a
Slurm or Kubernetes launcher would be a third, see docs/cluster.md). What only a process on
this machine has (a pid to watch for memory, to adopt after a restart, to fork warm) the
daemon asks of it where `runs_here` is set.
"""

from __future__ import annotations

from collections.abc import Callable

from localdet.processes import launcher
from localdet.records.db import Trial
from localdet.scheduling.slots import Slot

THIS_MACHINE = "this machine"


class LocalMachine:
    runs_here = True

    def __init__(self, slots: list[Slot], pool, idle: Callable[[], bool] = lambda: True):
        self._slots = slots
        self.pool = pool  # warm trial processes (localdet/processes/warm_pool.py)
        self.idle = idle  # whether no trial runs (the daemon's watched processes)

    def slots(self) -> list[Slot]:
        return list(self._slots)

    def available(self) -> set[int]:
        return {slot.index for slot in self._slots}

    def node_key(self, slot: int) -> tuple[float, str]:
        return 0.0, THIS_MACHINE  # one machine: every slot's the same

    def largest_node_seen(self) -> list[int]:
        return [len(self._slots)]

    def report_host(self) -> str:
        return "127.0.0.1"

    def describe_node(self, node: str) -> str:
        return THIS_MACHINE

    def start(self, spec: launcher.LaunchSpec, trial: Trial, slots: list[int]):
        """The trial's process, forked from a warm process of its kind where it can run
        warm. Where none is kept yet and no trial runs, one is started for it; beside running
        trials it starts cold instead: handing it to a warm process still importing would hold
        the daemon for the import, with their pauses and exits unattended."""
        warm = self.pool.for_launch(spec) if self.idle() else self.pool.take(spec)
        return launcher.start(spec, warm)

    def close(self) -> None:
        pass  # the warm processes are the daemon's to close
