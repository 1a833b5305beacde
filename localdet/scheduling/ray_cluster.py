"""Trials on a Ray cluster: the cluster's slots, and each trial launch as a Ray actor.

    cluster = RayCluster.connect("auto", layout)   # or "HOST:6379": a running cluster
    cluster.slots()                                 # one per GPU, or per `localdet_slot`
    handle = cluster.start(spec, trial, slots)      # what the daemon needs of a Popen
    handle = cluster.adopt(trial)                   # after a daemon restart; None: gone

A launch runs in a detached actor named after the trial and its launch, in a namespace of
this LOCALDET_HOME, placed on the node of its slots and holding them there: `num_gpus` for
GPU slots, the custom resource `localdet_slot` (`ray start --resources
'{"localdet_slot": 2}'`) on CPU-only nodes. The actor starts the trial's program as its child
in a session of its own, with the trial's environment over the node's own (Ray's
`CUDA_VISIBLE_DEVICES` stays), in the model folder, which travels through Ray's object
store (zipped once per folder, unpacked once per node). The child dies with the actor
(PR_SET_PDEATHSIG), so a lost node or a killed actor leaves no process training. The actor
keeps the child's output until the daemon pulls it into the trial's log.

Detached, the actor outlives a daemon killed with -9; the next daemon finds it by name and
adopts the launch, so no trial runs twice. A launch whose node died is `lost`: the daemon
relaunches it from its latest checkpoint elsewhere without counting a restart.
"""

from __future__ import annotations

import ctypes
import hashlib
import io
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from determined.core._reporting import MODEL_DIR_VAR, TRIAL_DIR_VAR
from localdet.paths import Layout
from localdet.processes.capped_log import CappedLog
from localdet.records.db import Trial
from localdet.scheduling.slots import CPU, GPU, Slot

SLOT_RESOURCE = "localdet_slot"  # what CPU-only nodes declare: trials each node may run
NODE_CHECK_SECONDS = 2.0         # how often the cluster's nodes are looked at again
LOST_EXIT = -9                   # the exit status told for a launch whose actor died
NODE_DEATH_SECONDS = 30.0        # how long an actor's death may precede its node's
KILLED_CONFIRM_SECONDS = 3.0     # an actor answering this long after its child was killed
                                 # by a signal is on a live node (one whose node went away
                                 # exits within a second)
SLOTS_READY_SECONDS = 60.0       # how long a launch waits for the cluster to hold its slots


class RayError(RuntimeError):
    """The cluster cannot be used as asked; the message says why and what to do."""


def _ray():
    try:
        import ray
    except ImportError:
        raise RayError("Ray is not installed; install it with `pip install localdet[ray]`") \
            from None
    return ray


def namespace_of(layout: Layout) -> str:
    """One Ray namespace per LOCALDET_HOME: two daemons on one cluster never meet."""
    return "localdet-" + hashlib.sha256(str(layout.home.resolve()).encode()).hexdigest()[:12]


def actor_name(trial: Trial) -> str:
    # Named by the launch's start (the trial's started_at, set by the daemon as it launches),
    # so an actor lingering after its launch ended is never taken for the next launch's.
    return f"trial-{trial.id}-{trial.started_at or 'new'}"


class TrialActor:
    """Runs one launch of a trial on its node (Ray instantiates it there)."""

    def __init__(self) -> None:
        self._process: subprocess.Popen | None = None
        self._output = bytearray()
        self._read_upto = 0  # stream offset of `_output[0]`
        self._lock = threading.Lock()
        self._started = threading.Event()
        self._ended = threading.Event()
        self._error: str | None = None

    def start(self, argv: list[str], env: dict[str, str], unset: list[str],
              model: bytes, digest: str) -> dict:
        """Start the trial's program in its model folder (`model`: the folder as a zip, by
        its digest); its pid and where it runs."""
        import ray

        folder = _unpacked(model, digest)
        environment = dict(os.environ)
        for key in unset:
            environment.pop(key, None)
        environment.update(env)
        environment[MODEL_DIR_VAR] = str(folder)
        trial_dir = environment.get(TRIAL_DIR_VAR)
        if not trial_dir or not os.path.isdir(os.path.dirname(trial_dir)):
            # The daemon's folders are not on this node (no shared file system).
            environment[TRIAL_DIR_VAR] = tempfile.mkdtemp(prefix="localdet-trial-")
        if argv and argv[0] == "python":  # the node's interpreter: the same localdet on each
            argv = [sys.executable, *argv[1:]]
        # One thread starts the child and waits for it: PR_SET_PDEATHSIG fires when the
        # thread that forked a child ends, so it must live as long as the child does.
        threading.Thread(target=self._run, args=(argv, environment, folder),
                         daemon=True).start()
        self._started.wait()
        if self._error:
            raise RuntimeError(self._error)
        if self._process is None:  # _run sets it or _error before _started
            raise RuntimeError("the trial's process did not start on its node, no reason given")
        return {"pid": self._process.pid, "node": ray.get_runtime_context().get_node_id()}

    def _run(self, argv: list[str], environment: dict[str, str], folder: Path) -> None:
        try:
            self._process = subprocess.Popen(
                argv, env=environment, cwd=folder, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_die_with_parent)
        except OSError as error:
            self._error = f"cannot start '{argv[0]}' on its node: {error.strerror or error}"
            self._started.set()
            return
        self._started.set()
        stdout = cast(io.BufferedReader, self._process.stdout)  # stdout=PIPE makes it
        for chunk in iter(lambda: stdout.read1(1 << 16), b""):
            with self._lock:
                self._output += chunk
        self._process.wait()
        self._ended.set()

    def read_output(self, offset: int) -> tuple[int, bytes]:
        """The output from stream offset `offset` on (what came before it is dropped: the
        daemon has it), with the offset it starts at (later than asked if some was lost)."""
        with self._lock:
            drop = max(0, min(offset - self._read_upto, len(self._output)))
            del self._output[:drop]
            self._read_upto += drop
            return self._read_upto, bytes(self._output)

    def wait(self) -> int:
        """The child's exit status, once it has ended and its output is all read."""
        self._started.wait()
        if self._process is None:
            return 127
        self._ended.wait()
        return self._process.returncode

    def free_ports(self, count: int) -> dict:
        """This node's address and `count` ports free on it now (a rank's listening ports:
        the chief's and each worker's TF_CONFIG entry)."""
        import ray

        host = ray.util.get_node_ip_address()
        probes = [socket.socket() for _ in range(count)]
        try:  # all open at once, so that they differ
            for probe in probes:
                probe.bind((host, 0))
            return {"host": host, "ports": [probe.getsockname()[1] for probe in probes],
                    "node": ray.get_runtime_context().get_node_id(),
                    "iface": _interface_of(host)}
        finally:
            for probe in probes:
                probe.close()

    def rendezvous(self, hosts: str, size: int) -> int:
        """Serve Horovod's Gloo rendezvous for the trial's ranks on this node (rank 0's)
        for as long as the actor lives; its port."""
        import ray

        from localdet.processes.ranks import horovod_rendezvous

        self._rendezvous = horovod_rendezvous(size, hosts, ray.util.get_node_ip_address())
        threading.Thread(target=self._rendezvous.serve_forever, daemon=True).start()
        return self._rendezvous.server_address[1]

    def signal(self, signum: int) -> None:
        if self._process is not None and self._process.poll() is None:
            try:
                os.killpg(self._process.pid, signum)
            except ProcessLookupError:
                pass


def _interface_of(address: str) -> str:
    """The network interface that has `address` on this node (Horovod's Gloo binds to it)."""
    import psutil  # Ray's own dependency

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address == address for a in addresses):
            return name
    return "lo" if address.startswith("127.") else ""


def _unpacked(model: bytes, digest: str) -> Path:
    """The model folder on this node, unpacked once per content (trials of an experiment,
    and experiments of the same folder, share it)."""
    root = Path(tempfile.gettempdir()) / "localdet-models"
    folder = root / digest
    if not folder.is_dir():
        root.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=f".{digest}-", dir=root))
        with zipfile.ZipFile(io.BytesIO(model)) as archive:
            archive.extractall(partial)
        try:
            os.rename(partial, folder)
        except OSError:  # another trial unpacked it first
            shutil.rmtree(partial, ignore_errors=True)
    return folder


def pack(folder: Path) -> tuple[bytes, str]:
    """The model folder as a zip (file modes kept) and the sha256 of its files."""
    buffer, digest = io.BytesIO(), hashlib.sha256()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            name = path.relative_to(folder).as_posix()
            data = path.read_bytes()
            digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
            info = zipfile.ZipInfo(name)
            info.external_attr = (path.stat().st_mode & 0o777) << 16
            archive.writestr(info, data, zipfile.ZIP_DEFLATED)
    return buffer.getvalue(), digest.hexdigest()[:32]


def _die_with_parent() -> None:
    """In the trial's child, before it runs: killed when the thread that started it (the
    actor's) ends, whatever the reason."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class _Node:
    id: str
    host: str
    alive: bool


class RayTrial:
    """A launch running in a Ray actor: what the daemon needs of a Popen (pid, poll, wait)
    plus `end()`, `lost` (its node died) and `node`. Its output goes into the trial's log
    as the daemon polls it."""

    warm = False
    log_writer = None
    orphaned = False
    slots_held_until_exit = True  # Ray frees an actor's slots only once the actor ends

    def __init__(self, cluster: "RayCluster", actor, name: str, pid: int | None, node: str,
                 host: str, log: CappedLog | _RankLog):
        self.cluster, self.actor, self.name = cluster, actor, name
        self.pid, self.node, self.host = pid, node, host
        self.returncode: int | None = None
        self.lost = False
        self._log = log
        self._offset = 0
        self._waiting = actor.wait.remote()
        self._reading = None
        self._died_at: float | None = None  # when its actor was found dead
        self._killed: tuple[int, float] | None = None  # its child's signal status, and when
        self._alive_check = None  # the call that finds its actor alive after a kill

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        ray = _ray()
        self._pull_output(block=False)
        if self._died_at is None and self._killed is None:
            ready, _ = ray.wait([self._waiting], timeout=0)
            if not ready:
                return None
            try:
                code = ray.get(self._waiting)
                self._pull_output(block=True)
            except ray.exceptions.RayActorError:
                self._died_at = time.monotonic()
            else:
                if code >= 0:
                    return self._ended(code)
                # Killed by a signal: maybe as its node went away, the child first and
                # the actor answering still (CI saw it), so not the trial's doing until
                # the actor proves alive after it.
                self._killed = (code, time.monotonic())
        if not self.cluster.node_alive(self.node):
            self.lost = True
            return self._ended(LOST_EXIT)
        if self._killed is not None:
            code, killed_at = self._killed
            since = time.monotonic() - killed_at
            if since < KILLED_CONFIRM_SECONDS:
                return None
            if self._alive_check is None:
                self._alive_check = self.actor.__ray_ready__.remote()
            ready, _ = ray.wait([self._alive_check], timeout=0)
            if ready:
                try:
                    ray.get(self._alive_check)
                    return self._ended(code)  # its actor outlived it: its node is alive
                except ray.exceptions.RayActorError:
                    self._died_at, self._killed = killed_at, None  # the actor died after
            elif since < NODE_DEATH_SECONDS:
                return None
            else:
                return self._ended(code)
        # The actor died: with its node (the cluster notices within seconds), or alone.
        if time.monotonic() - cast(float, self._died_at) < NODE_DEATH_SECONDS:
            return None
        return self._ended(LOST_EXIT)

    @property
    def settling(self) -> bool:
        """Its program ended or its actor died, and whether its node went too is not known
        yet."""
        return self.returncode is None and (self._killed or self._died_at) is not None

    def _ended(self, code: int) -> int:
        self._end_actor()
        self.returncode = code
        return code

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:  # poll() returns the returncode it sets
            if timeout is not None and deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.name, timeout)
            time.sleep(0.1)
        return code

    def end(self) -> None:
        """Kill the launch: its child's process group, then the actor."""
        ray = _ray()
        try:
            ray.get(self.actor.signal.remote(signal.SIGKILL), timeout=10)
        except Exception:  # the actor or its node is gone: so is the child (PDEATHSIG)
            pass
        self._end_actor()
        if self.returncode is None:
            self.returncode = -signal.SIGKILL

    def _end_actor(self) -> None:
        try:
            _ray().kill(self.actor, no_restart=True)
        except Exception:
            pass
        self._log.close()

    def _pull_output(self, block: bool) -> None:
        """Append what the trial printed since the last pull to its log."""
        ray = _ray()
        while True:
            if self._reading is None:
                self._reading = self.actor.read_output.remote(self._offset)
            ready, _ = ray.wait([self._reading], timeout=30 if block else 0)
            if not ready:
                return
            try:
                start, data = ray.get(self._reading)
            except ray.exceptions.RayActorError:
                self._reading = None
                return
            self._reading = None
            if start > self._offset:
                self._log.write(f"[localdet] {start - self._offset} bytes of the trial's "
                                "output were lost while no daemon read it\n".encode())
            if data:
                self._log.write(data)
            self._offset = start + len(data)
            if not block or not data:
                return


class _RankLog:
    """One rank's view of the trial's log: its lines prefixed `[rank r] `, as the rank
    supervisor writes them on one machine."""

    def __init__(self, log: CappedLog, rank: int):
        self.log, self.rank, self.pending = log, rank, b""

    def write(self, data: bytes) -> None:
        *lines, self.pending = (self.pending + data).split(b"\n")
        if lines:
            self.log.write(b"".join(b"[rank %d] %s\n" % (self.rank, line) for line in lines))

    def close(self) -> None:  # the trial's log is the ranks' together: closed by RayRanks
        if self.pending:
            self.write(b"\n")


class RayRanks:
    """A launch whose ranks run on several nodes, one actor each, in a placement group
    that holds their slots: what the daemon needs of a Popen, as RayTrial. The first rank
    to fail ends the others (as the rank supervisor does on one machine); the launch is
    `lost` when a rank's node died."""

    warm = False
    log_writer = None
    orphaned = False
    slots_held_until_exit = True  # Ray frees an actor's slots only once the actor ends

    def __init__(self, cluster: "RayCluster", name: str, ranks: list[RayTrial], group,
                 log: CappedLog):
        self.cluster, self.name, self.ranks, self.group = cluster, name, ranks, group
        chief = ranks[0]
        self.pid, self.node, self.host = chief.pid, chief.node, chief.host
        self.nodes = [rank.node for rank in ranks]  # each rank's, rank 0's first
        self.hosts = [rank.host for rank in ranks]
        self.returncode: int | None = None
        self.lost = False
        self._log = log

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        codes = [rank.poll() for rank in self.ranks]
        failed = next((rank for rank in self.ranks if rank.returncode not in (None, 0)), None)
        if failed is None and None in codes:
            return None
        if failed is not None and any(rank.settling for rank in self.ranks):
            return None  # a rank whose node may have gone: the likelier cause of the failure
        if failed is not None:
            # A rank's failure brings its peers' collective ops down with it: the cause is
            # a lost node if any rank's node died, whichever rank noticed first.
            self.lost = any(rank.lost or not self.cluster.node_alive(rank.node)
                            for rank in self.ranks)
            self._log.write(f"[localdet] rank {self.ranks.index(failed)} ended with status "
                            f"{failed.returncode}; stopping the other ranks\n".encode())
        self._close(ended=failed is not None)
        self.returncode = LOST_EXIT if self.lost else (failed.returncode if failed else 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        return RayTrial.wait(self, timeout)  # type: ignore[arg-type]  # the same, by its poll()

    def end(self) -> None:
        self._close(ended=True)
        if self.returncode is None:
            self.returncode = -signal.SIGKILL

    def _close(self, ended: bool) -> None:
        if ended:
            for rank in self.ranks:
                if rank.returncode is None:
                    rank.end()
        for rank in self.ranks:
            rank._end_actor()
        try:
            _ray().util.remove_placement_group(self.group)
        except Exception:  # already gone (its creator's namespace was cleaned up)
            pass
        self._log.close()


class RayCluster:
    """The daemon's connection to a Ray cluster."""

    def __init__(self, layout: Layout, address: str):
        self.layout, self.address = layout, address
        self._slots: list[Slot] = []
        self._node_of: dict[int, str] = {}  # slot index -> node id
        self._nodes: dict[str, _Node] = {}
        self._checked = 0.0
        self._models: dict[Path, tuple] = {}  # model folder -> (object ref, digest)
        self._last_launch: dict[str, float] = {}  # node id -> when a trial last started there

    @classmethod
    def connect(cls, address: str, layout: Layout) -> "RayCluster":
        ray = _ray()
        cluster = cls(layout, address)
        try:
            ray.init(address=address, namespace=namespace_of(layout), log_to_driver=False,
                     logging_level="WARNING", configure_logging=False)
        except (ConnectionError, ValueError, RuntimeError) as error:
            raise RayError(f"cannot connect to the Ray cluster at {address!r} ({error}); "
                           "start one with `ray start --head` or give its address as "
                           "--ray HOST:PORT") from None
        cluster._refresh(force=True)
        if not cluster._slots:
            ray.shutdown()
            raise RayError(f"the Ray cluster at {address!r} has no GPU and no "
                           f"'{SLOT_RESOURCE}' resource; start its CPU-only nodes with "
                           f"`ray start --resources '{{\"{SLOT_RESOURCE}\": N}}'` (N trials "
                           "each)")
        return cluster

    def close(self) -> None:
        _ray().shutdown()

    def report_host(self) -> str:
        """The address the cluster's nodes reach this machine at (the report server's)."""
        return _ray().util.get_node_ip_address()

    # -- slots ------------------------------------------------------------------------
    def _refresh(self, force: bool = False) -> None:
        """Look at the nodes again (every NODE_CHECK_SECONDS): new nodes add slots, whose
        indices never change; a dead node's slots are unavailable."""
        if not force and time.monotonic() - self._checked < NODE_CHECK_SECONDS:
            return
        self._checked = time.monotonic()
        nodes = sorted(_ray().nodes(), key=lambda n: (n["NodeManagerAddress"], n["NodeID"]))
        gpus = any(n["Resources"].get("GPU") for n in nodes if n["Alive"])
        for node in nodes:
            self._nodes[node["NodeID"]] = _Node(node["NodeID"], node["NodeManagerAddress"],
                                                node["Alive"])
            if not node["Alive"]:
                continue
            kind = GPU if gpus else CPU
            count = int(node["Resources"].get("GPU" if gpus else SLOT_RESOURCE, 0))
            have = [i for i, n in self._node_of.items() if n == node["NodeID"]]
            for _ in range(count - len(have)):
                index = len(self._slots)
                self._slots.append(Slot(index, kind,
                                        f"{kind.upper()} on {node['NodeManagerAddress']} "
                                        f"({node['NodeID'][:8]})"))
                self._node_of[index] = node["NodeID"]

    def slots(self) -> list[Slot]:
        """Every slot the cluster has had (indices are stable); `available` says which can
        be used now."""
        self._refresh()
        return list(self._slots)

    def available(self) -> set[int]:
        self._refresh()
        return {i for i, node in self._node_of.items() if self._nodes[node].alive}

    def largest_node_seen(self) -> list[int]:
        """The slots of the biggest node seen (alive or not), as a one-item list; [] if none."""
        counts: dict[str, int] = {}
        for node in self._node_of.values():
            counts[node] = counts.get(node, 0) + 1
        return [max(counts.values())] if counts else []

    def node_key(self, slot: int) -> tuple[float, str]:
        """Orders the nodes for the scheduler: the one launched on least recently first."""
        node = self._node_of[slot]
        return self._last_launch.get(node, 0.0), node

    def node_of(self, slot: int) -> str:
        return self._node_of[slot]

    def node_alive(self, node_id: str) -> bool:
        self._refresh(force=True)
        node = self._nodes.get(node_id)
        return node is not None and node.alive

    def describe_node(self, node_id: str) -> str:
        node = self._nodes.get(node_id)
        return f"{node.host} ({node_id[:8]})" if node else node_id[:8]

    # -- launches -----------------------------------------------------------------------
    def start(self, spec, trial: Trial, slots: list[int]) -> RayTrial | RayRanks:
        """Launch the trial in an actor on its slots' node, or, when its slots are on
        several nodes (a multi-process engine's ranks), one actor per rank."""
        if len({self._node_of[slot] for slot in slots}) > 1:
            return self._start_ranks(spec, trial, slots)
        ray = _ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from localdet.processes.launcher import LaunchDeferred

        node = self._node_of[slots[0]]
        self._last_launch[node] = time.monotonic()
        name = actor_name(trial)
        actor = ray.remote(TrialActor).options(
            name=name, lifetime="detached", num_cpus=0, max_concurrency=4, max_restarts=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
            **self._holding(slots)).remote()
        log = CappedLog(spec.log_path, spec.max_log_bytes)
        where = f"Ray node {self.describe_node(node)}"
        if spec.header:
            log.write(f"{spec.header}; on {where}\n".encode())
        # Placed once its slots are free there: waited for here with a limit, so that a
        # slot the cluster still holds defers the launch instead of stalling the daemon.
        ready, _ = ray.wait([actor.__ray_ready__.remote()], timeout=SLOTS_READY_SECONDS)
        if not ready:
            log.write(b"error: the trial's slot could not be reserved on its Ray node\n")
            log.close()
            ray.kill(actor, no_restart=True)  # never placed: no program to stop in it
            raise LaunchDeferred(f"the trial's {len(slots)} slot(s) could not be reserved on "
                                 f"{where} within {SLOTS_READY_SECONDS:.0f} s")
        argv = ["python", *spec.argv[1:]] if spec.argv[0] == sys.executable else spec.argv
        started = self._started([actor], [(argv, spec.env)], spec.cwd, log, None, where)[0]
        return RayTrial(self, actor, name, started["pid"], started["node"],
                        self._nodes[started["node"]].host, log)

    def _start_ranks(self, spec, trial: Trial, slots: list[int]) -> RayRanks:
        """One actor per rank, each in its bundle of a placement group pinned to the node of
        its slot (the daemon chose the nodes; the group reserves them all or none), with
        the chief's address and TF_CONFIG (or Horovod's Gloo variables and rendezvous, on
        rank 0's node) built from the nodes' addresses."""
        ray = _ray()
        from ray.util.placement_group import NODE_ID_LABEL_KEY, placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from localdet.config import engines
        from localdet.processes.launcher import LaunchDeferred, unsupervised_argv
        from localdet.processes.ranks import (
            cluster_horovod_environments,
            cluster_rank_environments,
            horovod_host_spec,
            horovod_hosts,
        )

        nodes = [self._node_of[slot] for slot in slots]
        for node in nodes:
            self._last_launch[node] = time.monotonic()
        name = actor_name(trial)
        holding = self._holding(slots[:1])
        bundle = {"GPU": 1} if "num_gpus" in holding else {SLOT_RESOURCE: 1}
        group = placement_group([dict(bundle) for _ in slots], strategy="PACK", name=name,
                                lifetime="detached",
                                bundle_label_selector=[{NODE_ID_LABEL_KEY: n} for n in nodes])
        where = ", ".join(dict.fromkeys(self.describe_node(n) for n in nodes))
        log = CappedLog(spec.log_path, spec.max_log_bytes)
        if spec.header:
            log.write(f"{spec.header}; ranks on Ray nodes {where}\n".encode())
        ready, _ = ray.wait([group.ready()], timeout=SLOTS_READY_SECONDS)
        if not ready:
            log.write(b"error: the trial's slots could not be reserved on its Ray nodes\n")
            log.close()
            ray.util.remove_placement_group(group)
            raise LaunchDeferred(f"the slots of the trial's {len(slots)} ranks could not "
                                 f"be reserved on Ray nodes {where} within "
                                 f"{SLOTS_READY_SECONDS:.0f} s")
        actors = [ray.remote(TrialActor).options(
            name=f"{name}-rank-{rank}", lifetime="detached", num_cpus=0, max_concurrency=4,
            max_restarts=0, **holding,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                group, placement_group_bundle_index=rank)).remote()
            for rank in range(len(slots))]
        envs, failed = [], None
        try:
            addresses = ray.get([actor.free_ports.remote(2 if rank == 0 else 1)
                                 for rank, actor in enumerate(actors)], timeout=120)
            horovod = spec.engine == engines.HOROVOD
            envs = cluster_rank_environments(spec.env, addresses, tf_config=not horovod)
            if horovod:  # the rendezvous runs beside rank 0, as long as its actor
                port = ray.get(actors[0].rendezvous.remote(
                    horovod_host_spec(horovod_hosts(addresses)), len(slots)), timeout=60)
                cluster_horovod_environments(envs, addresses, port)
        except Exception as error:  # a node went away meanwhile: nothing started yet
            failed = error
        argv = unsupervised_argv(spec.argv)
        argv = ["python", *argv[1:]] if argv[0] == sys.executable else argv
        started = self._started(actors, [(argv, env) for env in envs], spec.cwd, log, group,
                                f"Ray nodes {where}", failed=failed)
        ranks = [RayTrial(self, actor, f"{name}-rank-{rank}", info["pid"], info["node"],
                          self._nodes[info["node"]].host, _RankLog(log, rank))
                 for rank, (actor, info) in enumerate(zip(actors, started, strict=True))]
        return RayRanks(self, name, ranks, group, log)

    def _holding(self, slots: list[int]) -> dict:
        """The actor options that hold these slots on their node."""
        if self._slots[slots[0]].kind == GPU:
            return {"num_gpus": len(slots)}
        return {"resources": {SLOT_RESOURCE: len(slots)}}

    def _started(self, actors: list, programs: list[tuple[list[str], dict]], folder: Path,
                 log: CappedLog, group, where: str, failed: Exception | None = None
                 ) -> list[dict]:
        """Start each actor's program (argv, environment); their pids and nodes. On any
        failure the actors (and the group) are ended and LaunchError says why."""
        ray = _ray()
        from localdet.processes.launcher import LaunchDeferred, LaunchError

        # Failing to reach the actors is the cluster's doing, for now; failing to start the
        # program in them is the trial's.
        raised: type[LaunchError] = LaunchDeferred
        if failed is None:
            model, digest = self._model(folder)
            calls = []
            for actor, (argv, env) in zip(actors, programs, strict=True):
                own, unset = _trial_environment(env)
                calls.append(actor.start.remote(argv, own, unset, model, digest))
            try:
                return ray.get(calls)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as error:
                failed = error
            except Exception as error:
                failed, raised = error, LaunchError
        log.write(f"error: the trial could not start on {where}: {failed}\n".encode())
        log.close()
        _end_actors(actors, group)
        raise raised(f"the trial could not start on {where}: {_first_line(failed)}") from None

    def _model(self, folder: Path):
        """The model folder in Ray's object store (once per folder: a submission's snapshot
        does not change), and its digest."""
        if folder not in self._models:
            data, digest = pack(folder)
            self._models[folder] = (_ray().put(data), digest)
        return self._models[folder]

    def adopt(self, trial: Trial, log_path, max_log_bytes: int) -> RayTrial | RayRanks | None:
        """The running launch of `trial` a former daemon started, or None if its actor is
        gone (its node died, or it was killed). A launch of ranks on several nodes is
        adopted whole or not at all: a missing rank ends the others."""
        ray = _ray()
        name = actor_name(trial)
        try:
            actor = ray.get_actor(name)
        except ValueError:
            return self._adopt_ranks(trial, name, log_path, max_log_bytes)
        node = next((n for i, n in self._node_of.items() if i in (trial.slots or [])), "")
        host = self._nodes[node].host if node in self._nodes else "?"
        return RayTrial(self, actor, name, trial.pid, node, host,
                        CappedLog(log_path, max_log_bytes))

    def _adopt_ranks(self, trial: Trial, name: str, log_path, max_log_bytes: int
                     ) -> RayRanks | None:
        ray = _ray()
        slots = trial.slots or []
        actors = []
        for rank in range(len(slots)):
            try:
                actors.append(ray.get_actor(f"{name}-rank-{rank}"))
            except ValueError:
                break
        try:
            group = ray.util.get_placement_group(name)
        except ValueError:
            group = None
        if len(slots) < 2 or len(actors) < len(slots) or group is None:
            _end_actors(actors, group)  # a rank alone cannot go on: its peers are gone
            return None
        log = CappedLog(log_path, max_log_bytes)
        ranks = []
        for rank, (actor, slot) in enumerate(zip(actors, slots, strict=True)):
            node = self._node_of.get(slot, "")
            host = self._nodes[node].host if node in self._nodes else "?"
            ranks.append(RayTrial(self, actor, f"{name}-rank-{rank}",
                                  trial.pid if rank == 0 else None, node, host,
                                  _RankLog(log, rank)))
        return RayRanks(self, name, ranks, group, log)


def _end_actors(actors: list, group=None) -> None:
    """Kill each actor's child process group, then the actor; then the placement group."""
    ray = _ray()
    for actor in actors:
        try:
            ray.get(actor.signal.remote(signal.SIGKILL), timeout=10)
        except Exception:  # the actor or its node is gone: so is the child (PDEATHSIG)
            pass
        try:
            ray.kill(actor, no_restart=True)
        except Exception:
            pass
    if group is not None:
        try:
            ray.util.remove_placement_group(group)
        except Exception:  # already gone
            pass


def _trial_environment(env: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """What the trial's environment sets beyond the daemon's own, and what it removes: the
    node's own environment (its PATH, Ray's CUDA_VISIBLE_DEVICES) is the base there."""
    own = {k: v for k, v in env.items()
           if os.environ.get(k) != v or k.startswith(("LOCALDET_", "TF_", "PYTHON"))}
    own.pop("CUDA_VISIBLE_DEVICES", None)  # what Ray assigned the actor
    own.pop("CUDA_DEVICE_ORDER", None)
    unset = [k for k in os.environ if k not in env and k != "CUDA_VISIBLE_DEVICES"]
    return own, unset


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[-1] if text else type(error).__name__
