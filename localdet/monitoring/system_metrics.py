"""Each running trial's system metrics, sampled by the daemon: its process tree's CPU,
memory and disk (psutil), and its GPUs' utilisation, memory and power where NVML is present
(nvidia-ml-py's `pynvml`). Recorded in the database (localdet/records/system_metrics.py).

    metrics = SystemMetrics(period=5.0, machine=slots, log=print)   # the daemon's, one
    metrics.note(db, watched)   # each pass: which trials run where; writes what was sampled
    metrics.close()             # the daemon stops

Sampling runs in a thread of its own, so a pass never waits on it: the pass hands over the
running trials (a dict, when they changed) and writes the samples taken since the last pass
in one transaction. One sample is one scan of the machine's processes for all the trials,
then each tree's counters and each GPU's.

What a sample holds (names as Determined's profiler spelled them where they mean the same):

- `cpu_util`: the tree's CPU use since the last sample, in percent of one core (as `top`:
  200 is two cores busy);
- `memory_rss`: the tree's resident memory, in bytes, summed over its processes;
- `disk_throughput_read`, `disk_throughput_write`: bytes a second the tree read from and
  wrote to storage since the last sample;
- `processes`: how many processes the tree has;
- with NVML: `gpu_util` (percent, averaged over the trial's GPUs), `gpu_memory_used` (bytes,
  summed) and `gpu_power` (watts, summed). A GPU is the whole device: another process on it
  (outside localdet) counts too.

The experiment's `profiling` section (Determined's) decides per trial: `enabled: false`
samples nothing of it; `begin_on_batch` and `end_after_batch` record samples only while the
trial's recorded batches lie between them. `localdet daemon --system-metrics-period 0` (or
LOCALDET_SYSTEM_METRICS_PERIOD=0) samples nothing at all. Trials on a Ray cluster are not
sampled (their processes are on other machines).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psutil

from localdet.records import system_metrics as records
from localdet.records.db import StateDB
from localdet.records.system_metrics import Sample

DEFAULT_PERIOD = 5.0
PERIOD_VAR = "LOCALDET_SYSTEM_METRICS_PERIOD"  # `localdet daemon --system-metrics-period`


def trial_window(config: dict[str, Any]) -> tuple[int, int | None] | None:
    """The batches between which an experiment's trials are sampled (Determined's
    `profiling.begin_on_batch`, `end_after_batch`), or None: `profiling.enabled: false`."""
    profiling = config.get("profiling") if isinstance(config, dict) else None
    profiling = profiling if isinstance(profiling, dict) else {}
    if profiling.get("enabled") is False:
        return None
    return int(profiling.get("begin_on_batch") or 0), profiling.get("end_after_batch")


# -- processes ------------------------------------------------------------------------------
class Trees:
    """The CPU, memory and disk of process trees. CPU and disk are rates since the
    process's last sample (since its start, the first time it is seen), so a short-lived
    process counts too. A tree is walked down from its root through Linux's
    /proc/PID/task/TID/children (a few small reads a process, whatever else runs on the
    machine); where the kernel has no such files, through one scan of every process."""

    def __init__(self) -> None:
        # (pid, create time) -> (seconds of CPU, bytes read, bytes written, when)
        self._last: dict[tuple[int, float], tuple[float, int, int, float]] = {}
        self._children_files = os.path.exists(
            f"/proc/{os.getpid()}/task/{os.getpid()}/children")

    def sample(self, roots: dict[int, int]) -> dict[int, dict[str, float]]:
        """Trial id -> its tree's metrics, for each root pid (trial id -> pid) still alive."""
        children = None if self._children_files else self._scan()
        seen: set[tuple[int, float]] = set()
        found = {}
        for trial_id, root in roots.items():
            tree, stack = [], [root]
            while stack:
                pid = stack.pop()
                try:
                    tree.append(psutil.Process(pid))
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                stack.extend(_children(pid) if children is None else children.get(pid, ()))
            if tree:
                found[trial_id] = self._tree(tree, seen)
        for key in set(self._last) - seen:
            del self._last[key]
        return found

    @staticmethod
    def _scan() -> dict[int, list[int]]:
        children: dict[int, list[int]] = {}
        for process in psutil.process_iter(["ppid"]):
            children.setdefault(process.info["ppid"], []).append(process.pid)
        return children

    def _tree(self, tree: list[psutil.Process], seen: set) -> dict[str, float]:
        cpu = rss = read = write = 0.0
        count = 0
        for process in tree:
            try:
                with process.oneshot():
                    key = (process.pid, process.create_time())
                    times = process.cpu_times()
                    memory = process.memory_info()
                    try:
                        io = process.io_counters()
                        read_bytes, write_bytes = io.read_bytes, io.write_bytes
                    except (psutil.AccessDenied, AttributeError):  # (no /proc/PID/io)
                        read_bytes = write_bytes = 0
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                continue
            now = time.time()
            used = times.user + times.system
            last = self._last.get(key, (0.0, 0, 0, key[1]))
            elapsed = max(now - last[3], 1e-3)
            cpu += max(0.0, used - last[0]) / elapsed * 100
            read += max(0, read_bytes - last[1]) / elapsed
            write += max(0, write_bytes - last[2]) / elapsed
            rss += memory.rss
            count += 1
            self._last[key] = (used, read_bytes, write_bytes, now)
            seen.add(key)
        return {"cpu_util": round(cpu, 2), "memory_rss": int(rss),
                "disk_throughput_read": round(read), "disk_throughput_write": round(write),
                "processes": count}


def _children(pid: int) -> list[int]:
    """The process's children, as its threads' children files list them."""
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as listing:
                found.extend(int(child) for child in listing.read().split())
    except OSError:  # it (or a thread) ended meanwhile
        pass
    return found


# -- GPUs -----------------------------------------------------------------------------------
class Gpus:
    """The GPUs' utilisation, memory and power through NVML. `open` returns None, with the
    reason, where NVML is absent."""

    def __init__(self, pynvml: Any, handles: dict[str, Any]) -> None:
        self._nvml = pynvml
        self._handles = handles   # a slot's device id (index or UUID) -> NVML handle
        self._unsupported: set[tuple[str, str]] = set()

    @classmethod
    def open(cls) -> tuple[Gpus | None, str]:
        """(Gpus, how many GPUs) or (None, why not)."""
        try:
            import pynvml
        except ImportError as error:
            return None, f"nvidia-ml-py is not installed ({error})"
        try:
            pynvml.nvmlInit()
            handles: dict[str, Any] = {}
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = pynvml.nvmlDeviceGetUUID(handle)
                handles[str(index)] = handles[uuid if isinstance(uuid, str)
                                              else uuid.decode()] = handle
        except pynvml.NVMLError as error:
            return None, f"NVML is not available ({error})"
        if not handles:
            return None, "NVML finds no GPU"
        return cls(pynvml, handles), f"{len(handles) // 2} GPU(s) through NVML"

    def handle(self, device: str) -> Any:
        """The NVML handle of a slot's device id: an index, a UUID or a unique prefix of
        one; None for what NVML does not list (a MIG instance)."""
        if device in self._handles:
            return self._handles[device]
        matches = {id(h): h for key, h in self._handles.items() if key.startswith(device)}
        return next(iter(matches.values())) if len(matches) == 1 else None

    def sample(self, devices: list[str]) -> dict[str, float]:
        """gpu_util (mean), gpu_memory_used and gpu_power (sums) of the devices; a reading
        a device does not support is left out."""
        nvml = self._nvml
        utils: list[float] = []
        memory: list[float] = []
        power: list[float] = []
        for device in devices:
            handle = self.handle(device)
            if handle is None:
                continue
            for name, read, into in (
                    ("util", lambda h: nvml.nvmlDeviceGetUtilizationRates(h).gpu, utils),
                    ("memory", lambda h: nvml.nvmlDeviceGetMemoryInfo(h).used, memory),
                    ("power", lambda h: nvml.nvmlDeviceGetPowerUsage(h) / 1000, power)):
                if (device, name) in self._unsupported:
                    continue
                try:
                    into.append(read(handle))
                except nvml.NVMLError:  # (not supported on this device: asked once)
                    self._unsupported.add((device, name))
        found: dict[str, float] = {}
        if utils:
            found["gpu_util"] = sum(utils) / len(utils)
        if memory:
            found["gpu_memory_used"] = sum(memory)
        if power:
            found["gpu_power"] = round(sum(power), 2)
        return found


# -- the daemon's part ----------------------------------------------------------------------
@dataclass
class _Target:
    pid: int
    devices: list[str]
    due: float


@dataclass
class SystemMetrics:
    period: float
    machine: list  # the daemon's slots (localdet.scheduling.slots.Slot)
    log: Any = print
    local: bool = True  # trials run here (not on a Ray cluster)
    gpus: Gpus | None = None
    _targets: dict[int, _Target] = field(default_factory=dict)
    _windows: dict[int, tuple[int, int | None] | None] = field(default_factory=dict)
    _noted: frozenset = frozenset()
    _pending: list[Sample] = field(default_factory=list)
    _rows: dict[int, int] = field(default_factory=dict)  # trial id -> its rows recorded
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    trees: Trees = field(default_factory=Trees)
    cost: list[float] = field(default_factory=lambda: [0.0, 0])  # seconds, samples

    def __post_init__(self) -> None:
        if not self.local:
            self.period = 0
            self.log("system metrics: not sampled (trials run on the Ray cluster)")
            return
        if self.period <= 0:
            self.log("system metrics: not sampled (--system-metrics-period 0)")
            return
        self.gpus, said = Gpus.open()
        what = "CPU, memory and disk" + (f", and GPUs ({said})" if self.gpus else "")
        self.log(f"system metrics: each trial's {what}, every {self.period:g} s"
                 + ("" if self.gpus else f"; GPU metrics are not sampled: {said}"))

    def note(self, db: StateDB, watched: Any) -> None:
        """Once a pass: follow the trials `watched` (localdet.daemon.watched.Watched) runs,
        and write the samples taken since the last pass."""
        if self.period <= 0:
            return
        running = frozenset(watched.ids())
        if running != self._noted:
            self._follow(db, watched, running)
        with self._lock:
            pending, self._pending = self._pending, []
        if pending:
            self._write(db, pending)

    def _follow(self, db: StateDB, watched: Any, running: frozenset) -> None:
        targets = {}
        for trial_id in running:
            if trial_id not in self._windows:
                row = db.db.execute("SELECT e.config FROM trials t JOIN experiments e ON "
                                    "e.id = t.experiment_id WHERE t.id = ?",
                                    [trial_id]).fetchone()
                self._windows[trial_id] = trial_window(json.loads(row[0])) if row else None
            process = watched.processes.get(trial_id)
            pid = watched.adopted.get(trial_id) if process is None else process.pid
            if self._windows[trial_id] is None or not isinstance(pid, int):
                continue  # not to be sampled, or on a cluster (no local pid)
            slots = [self.machine[i] for i in watched.slots_of.get(trial_id, ())
                     if i < len(self.machine)]
            devices = [s.device for s in slots if s.kind == "gpu" and s.device is not None]
            known = self._targets.get(trial_id)
            targets[trial_id] = known if known is not None and known.pid == pid else \
                _Target(pid, devices, time.time() + self.period)
        for trial_id in set(self._windows) - running:
            del self._windows[trial_id]
            self._rows.pop(trial_id, None)
        with self._lock:
            self._targets = targets
        self._noted = running
        if targets and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="system-metrics",
                                            daemon=True)
            self._thread.start()

    def _write(self, db: StateDB, pending: list[Sample]) -> None:
        windows = {s.trial_id: w for s in pending
                   if (w := self._windows.get(s.trial_id)) is not None}
        written = records.record(db, pending, windows)
        for trial_id, rows in written.items():
            if trial_id not in self._rows:
                self._rows[trial_id] = records.count(db, trial_id)
            else:
                self._rows[trial_id] += rows
            if self._rows[trial_id] > records.MAX_ROWS:
                self._rows[trial_id] = records.thin(db, trial_id)

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.time()
            with self._lock:
                due = {i: t for i, t in self._targets.items() if t.due <= now}
                soonest = min((t.due for t in self._targets.values()), default=now + self.period)
            if due:
                self.sample(due)
                for target in due.values():
                    target.due = now + self.period
                continue
            self._stop.wait(min(self.period, max(0.05, soonest - now)))

    def sample(self, targets: dict[int, _Target]) -> list[Sample]:
        """Sample these trials now; the samples wait for the next pass's `note`."""
        started = time.perf_counter()
        found = self.trees.sample({i: t.pid for i, t in targets.items()})
        at = time.time()
        samples = []
        for trial_id, metrics in found.items():
            if self.gpus is not None and targets[trial_id].devices:
                metrics.update(self.gpus.sample(targets[trial_id].devices))
            samples.append(Sample(trial_id, at, metrics))
        with self._lock:
            self._pending.extend(samples)
        self.cost[0] += time.perf_counter() - started
        self.cost[1] += 1
        return samples

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.cost[1]:
            self.log(f"system metrics: {self.cost[1]} samples, "
                     f"{1000 * self.cost[0] / self.cost[1]:.1f} ms each on average")
