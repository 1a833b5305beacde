"""A rank supervisor: one process that runs a trial's N rank processes and stands for them.

The daemon keeps one process per trial (its pid, adoption after a restart, killpg), so a
multi-process trial starts this instead, in its own session, its stdout the trial's log:

    python -P -m localdet.processes.ranks --size 2 [--tf-config | --horovod] [--grace 5] \\
        -- python3 train.py

(-P: the trial's folder is the working directory, and its json.py must not shadow ours.)

- Each rank gets distributed_environments(N) (LOCALDET_RANK, ...), the r-th of the
  supervisor's LOCALDET_SLOTS and, when it lists one device per rank, the r-th of its
  CUDA_VISIBLE_DEVICES; with --tf-config a TF_CONFIG for MultiWorkerMirroredStrategy on
  127.0.0.1 (worker r of N, a free port each: the multi_worker_mirrored engine's, and given
  to gradient_allreduce ranks too, whose own exchange needs only the LOCALDET_* variables,
  for code that builds its own strategy); with --horovod, Horovod's Gloo variables
  (HOROVOD_RANK, ...) and the rendezvous server that `horovodrun --gloo` would run, here in
  the supervisor, on 127.0.0.1.
- Every line a rank writes (stdout and stderr) is copied to stdout as "[rank r] line".
- The first rank to fail (non-zero, or a signal) stops the others (SIGTERM, SIGKILL after
  --grace seconds) and the supervisor exits with its status (128+signum for a signal).
  SIGTERM/SIGINT/SIGHUP to the supervisor go to the ranks, which get --grace seconds; it
  then dies by that same signal.
- No orphans: ranks stay in the supervisor's process group (the daemon's killpg reaches
  them) and on Linux each asks the kernel for SIGKILL when the supervisor dies
  (PR_SET_PDEATHSIG), which covers a `kill -9` of the supervisor alone.
- --size 1 execs the command unchanged: same pid, no prefix, no added variables.
- In a warm trial process (localdet/processes/warm_process.py runs the supervisor in the
  process it forked, TensorFlow already imported), each rank is forked from the supervisor
  instead of started anew: `main(args, run_forked=...)`, where `run_forked(argv)` runs the
  rank's command in the forked process and exits. The ranks skip the interpreter's and
  TensorFlow's start-up as a single-slot trial does.
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import NoReturn

from determined.core import distributed_environments
from determined.core._reporting import CHIEF_ADDR_VAR, FORKED_AT_VAR, SLOTS_VAR

_PR_SET_PDEATHSIG = 1
_MAX_LINE = 64 * 1024  # a line without a newline (a progress bar) is copied at this size


def rank_environments(size: int, base: dict[str, str], tf_config: bool = False
                      ) -> list[dict[str, str]]:
    """The full environment of each rank, rank 0's first. ValueError for a launcher bug."""
    envs = [{**base, **ranked} for ranked in distributed_environments(size)]
    slots = base.get(SLOTS_VAR, "").split(",")
    if slots != [""] and len(slots) != size:
        raise ValueError(f"LOCALDET_SLOTS={base['LOCALDET_SLOTS']} lists {len(slots)} slots "
                         f"but --size is {size}; give one slot per rank")
    # CUDA_VISIBLE_DEVICES "" (CPU slots) stays ""; a list of another length is the user's.
    devices = base.get("CUDA_VISIBLE_DEVICES", "").split(",")
    # Each zip is one value per rank, or [] (none to set): strict=False lets [] stop it.
    for env, device in zip(envs, devices if len(devices) == size else [], strict=False):
        env["CUDA_VISIBLE_DEVICES"] = device
    for env, slot in zip(envs, slots if slots != [""] else [], strict=False):
        env[SLOTS_VAR] = slot
    if tf_config:
        chief_port = int(envs[0][CHIEF_ADDR_VAR].rsplit(":", 1)[1])
        workers = [f"127.0.0.1:{port}" for port in _free_ports(size, chief_port)]
        for index, env in enumerate(envs):
            env["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers},
                                           "task": {"type": "worker", "index": index}})
    return envs


def cluster_rank_environments(base: dict[str, str], addresses: list[dict],
                              tf_config: bool = True) -> list[dict[str, str]]:
    """The environment of each rank of a trial whose ranks run on several machines (one
    process each, started by a cluster launcher rather than a supervisor): `addresses[r]` is
    rank r's machine, {"host": ..., "ports": [...]} with ports free there, two for rank 0
    (the chief's coordination port, then its TF_CONFIG port) and one for the others. Each rank
    gets the r-th of `base`'s LOCALDET_SLOTS and, with `tf_config`, a TF_CONFIG for
    MultiWorkerMirroredStrategy over the machines' addresses."""
    size = len(addresses)
    envs = rank_environments(size, base)
    chief = addresses[0]["host"]
    chief = f"[{chief}]:{addresses[0]['ports'][0]}" if ":" in chief else \
        f"{chief}:{addresses[0]['ports'][0]}"
    workers = [f"{a['host']}:{a['ports'][-1]}" for a in addresses]
    for index, env in enumerate(envs):
        env[CHIEF_ADDR_VAR] = chief
        if tf_config:
            env["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers},
                                           "task": {"type": "worker", "index": index}})
    return envs


def horovod_rendezvous(size: int, hosts: str | None = None, address: str = "127.0.0.1"):
    """Horovod's HTTP rendezvous for `size` Gloo ranks on `hosts` (Horovod's "name:ranks,..."
    form; default all on this machine), bound to `address` but not yet serving
    (`serve_forever` in a thread once the ranks are started: a thread must not run while the
    supervisor forks them). Horovod's own runner parts, as `horovodrun --gloo` uses them;
    its last release (0.28.1) is what localdet supports."""
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

    server = RendezvousHTTPServer((address, 0), RendezvousHandler, 0)
    server.init(get_host_assignments(parse_hosts(hosts or f"localhost:{size}"), size))
    return server


def horovod_hosts(addresses: list[dict]) -> list[str]:
    """Each rank's machine as Horovod names it ("node0", "node1", ... in rank order: two
    machines may share an address, as test nodes on one machine do). A machine's ranks must
    be consecutive, as Horovod assigns ranks host by host."""
    names: dict[str, str] = {}
    hosts = [names.setdefault(a["node"], f"node{len(names)}") for a in addresses]
    for first, second in itertools.pairwise(hosts):
        if first != second and second in hosts[:hosts.index(first) + 1]:
            raise ValueError(f"the ranks of a machine must be consecutive, got {hosts}")
    return hosts


def horovod_host_spec(hosts: list[str]) -> str:
    """Horovod's "name:ranks,..." for each rank's machine name (`horovod_hosts`)."""
    return ",".join(f"{host}:{hosts.count(host)}" for host in dict.fromkeys(hosts))


def cluster_horovod_environments(envs: list[dict[str, str]], addresses: list[dict],
                                 port: int) -> None:
    """Add Horovod's Gloo variables for ranks on several machines (`addresses` as for
    `cluster_rank_environments`, each with its "node" and network "iface"), meeting at the
    rendezvous on rank 0's machine at `port`: Horovod's own host assignment, as the
    rendezvous has it."""
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts

    hosts = horovod_hosts(addresses)
    slots = get_host_assignments(parse_hosts(horovod_host_spec(hosts)), len(envs))
    for rank, (env, address, slot) in enumerate(zip(envs, addresses, slots, strict=True)):
        if (slot.rank, slot.hostname) != (rank, hosts[rank]):
            raise ValueError(f"Horovod put rank {slot.rank} on {slot.hostname}, not rank "
                             f"{rank} on {hosts[rank]}")
        env.update({
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": addresses[0]["host"],
            "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
            "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_GLOO_IFACE": address["iface"], "HOROVOD_HOSTNAME": slot.hostname,
            "HOROVOD_RANK": str(slot.rank), "HOROVOD_SIZE": str(slot.size),
            "HOROVOD_LOCAL_RANK": str(slot.local_rank),
            "HOROVOD_LOCAL_SIZE": str(slot.local_size),
            "HOROVOD_CROSS_RANK": str(slot.cross_rank),
            "HOROVOD_CROSS_SIZE": str(slot.cross_size),
        })


def horovod_environments(envs: list[dict[str, str]], port: int) -> None:
    """Add what Horovod's Gloo controller reads to each rank's environment."""
    for rank, env in enumerate(envs):
        env.update({
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
            "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
            "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_GLOO_IFACE": "lo", "HOROVOD_HOSTNAME": "localhost",
            "HOROVOD_RANK": str(rank), "HOROVOD_SIZE": str(len(envs)),
            "HOROVOD_LOCAL_RANK": str(rank), "HOROVOD_LOCAL_SIZE": str(len(envs)),
            "HOROVOD_CROSS_RANK": "0", "HOROVOD_CROSS_SIZE": "1",
        })


def _free_ports(count: int, taken: int) -> list[int]:
    # All probes open at once, so the ports differ; one spare in case one is `taken`.
    probes = [socket.socket() for _ in range(count + 1)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [port for port in (probe.getsockname()[1] for probe in probes)
                if port != taken][:count]
    finally:
        for probe in probes:
            probe.close()


def _die_with_parent(parent: int):
    """A preexec_fn asking the kernel to SIGKILL the rank when its parent (this supervisor)
    dies: a kill -9 of the supervisor alone then leaves no rank behind. None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)

    def preexec() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the supervisor died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)
    return preexec


class _ForkedRank:
    """A rank forked from the supervisor: what the supervisor needs of a Popen."""

    def __init__(self, pid: int, stdout):
        self.pid, self.stdout = pid, stdout
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return int(self.returncode)

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:  # not reaped: the pid is still this rank's
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class _Pipe:
    """A rank's output: its rank, its pipe, and the bytes not yet copied."""

    def __init__(self, rank: int, file):
        self.rank, self.file, self.pending = rank, file, bytearray()


class Supervisor:
    def __init__(self, grace: float = 5.0, serving=None,
                 run_forked: Callable[[list[str]], NoReturn] | None = None):
        self.grace = grace
        self.serving = serving  # a server to serve_forever once the ranks are started
        self.run_forked = run_forked  # set: fork each rank, which runs its command in it
        self.procs: list = []  # subprocess.Popen, or _ForkedRank
        self.selector = selectors.DefaultSelector()  # the open pipes, data: a _Pipe
        self.signals: list[int] = []                 # stop requests, from the handler

    def say(self, text: str) -> None:
        self._write(f"[localdet] {text}\n".encode())

    def _write(self, data: bytes) -> None:
        try:  # a full disk must not make the supervisor die with its ranks running
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        except (OSError, ValueError):
            pass

    def _copy(self, pipe: _Pipe, final: bool = False) -> None:
        pending = pipe.pending
        while b"\n" in pending or len(pending) >= _MAX_LINE or (final and pending):
            end = pending.find(b"\n")
            cut = end + 1 if 0 <= end < _MAX_LINE else _MAX_LINE
            line = bytes(pending[:cut]).rstrip(b"\n").decode("utf-8", "replace").encode()
            self._write(b"[rank %d] %s\n" % (pipe.rank, line))
            del pending[:cut]

    def pump(self, timeout: float) -> None:
        """Copy what the ranks wrote, waiting up to `timeout` seconds for some."""
        if not self.selector.get_map():
            return time.sleep(timeout)
        for key, _ in self.selector.select(timeout):
            try:
                data = os.read(key.fd, 65536)
            except BlockingIOError:
                continue
            key.data.pending += data
            self._copy(key.data, final=not data)
            if not data:  # the end of the rank's output
                self.selector.unregister(key.fd)
                key.data.file.close()

    def drain(self, seconds: float, rank: int | None = None) -> None:
        """Copy a rank's output (all ranks': None) to its end, waiting `seconds` at most: a
        child of the rank may hold the pipe open."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and any(
                rank in (None, key.data.rank) for key in self.selector.get_map().values()):
            self.pump(0.05)

    def cannot_start(self, program: str, error: OSError) -> int:
        self.say(f"cannot start {program!r}: {error.strerror}")
        return 127 if isinstance(error, FileNotFoundError) else 126  # as a shell does

    def start(self, argv: list[str], envs: list[dict[str, str]]) -> int | None:
        """Start the ranks; an exit status if the program cannot be started."""
        die_with_parent = _die_with_parent(os.getpid())
        for rank, env in enumerate(envs):
            # Same process group as the supervisor (no new session): killpg reaches ranks.
            # preexec_fn is safe here: the supervisor has no other thread.
            try:
                proc = self._fork(argv, env, die_with_parent) if self.run_forked else \
                    subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT,
                                     preexec_fn=die_with_parent)  # noqa: PLW1509
            except OSError as error:
                return self.cannot_start(argv[0], error)
            self.procs.append(proc)
            if proc.stdout is None:  # stdout=PIPE makes it
                raise RuntimeError(f"rank {rank}'s process has no stdout pipe")
            os.set_blocking(proc.stdout.fileno(), False)
            self.selector.register(proc.stdout, selectors.EVENT_READ, _Pipe(rank, proc.stdout))
        if self.run_forked is not None:
            self.say(f"{len(envs)} ranks forked from a warm process")
        if self.serving is not None:
            threading.Thread(target=self.serving.serve_forever, daemon=True).start()
        return None

    def _fork(self, argv: list[str], env: dict[str, str], die_with_parent) -> _ForkedRank:
        """A rank forked from this process, its output into a pipe as a started one's."""
        if self.run_forked is None:
            raise RuntimeError("ranks are forked only where run_forked is given")
        read_end, write_end = os.pipe()
        forked_at = time.time()
        pid = os.fork()
        if pid == 0:  # the rank: nothing of the supervisor's but what it needs
            try:
                os.close(read_end)
                for key in list(self.selector.get_map().values()):  # earlier ranks' pipes
                    os.close(key.fd)
                os.dup2(write_end, 1)
                os.dup2(write_end, 2)
                os.close(write_end)
                for signum in (signal.SIGTERM, signal.SIGHUP):
                    signal.signal(signum, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.default_int_handler)
                if die_with_parent is not None:
                    die_with_parent()
                os.environ.clear()
                os.environ.update(env)
                os.environ[FORKED_AT_VAR] = repr(forked_at)  # its timeline: a warm start
            except BaseException:
                os._exit(126)
            self.run_forked(argv)
        os.close(write_end)
        return _ForkedRank(pid, os.fdopen(read_end, "rb", buffering=0))

    def stop(self, signum: int) -> None:
        """Send `signum` to the running ranks; SIGKILL those left after the grace period."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signum)
        deadline = time.monotonic() + self.grace
        while any(p.poll() is None for p in self.procs) and time.monotonic() < deadline:
            self.pump(0.05)
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def supervise(self, argv: list[str], envs: list[dict[str, str]]) -> int:
        """Run the ranks; the supervisor's exit status (negative: die by that signal)."""
        try:
            status = self.start(argv, envs)
            return self.run() if status is None else status
        finally:  # also on a bug in here: no rank outlives the supervisor
            self.stop(signal.SIGKILL)
            self.drain(1.0)
            for key in self.selector.get_map().values():  # held open by a rank's child
                self._copy(key.data, final=True)

    def run(self) -> int:
        while True:
            if self.signals:
                self.say(f"received {_signal_name(self.signals[0])}; stopping the ranks")
                self.stop(self.signals[0])
                return -self.signals[0]
            for rank, proc in enumerate(self.procs):
                code = proc.poll()
                if code:  # the first failure seen is the trial's
                    self.drain(0.5, rank)  # its last words before ours
                    how = (f"exited with status {code}" if code > 0 else
                           f"was killed by {_signal_name(-code)}")
                    self.say(f"rank {rank} {how}; stopping the other ranks")
                    self.stop(signal.SIGTERM)
                    return code if code > 0 else 128 - code  # as a shell reports it
            if all(proc.poll() == 0 for proc in self.procs):
                return 0
            self.pump(0.1)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def main(args: list[str] | None = None,
         run_forked: Callable[[list[str]], NoReturn] | None = None) -> int:
    """`run_forked`: fork the ranks from this process (see the module's docstring)."""
    args = sys.argv[1:] if args is None else args
    parser = argparse.ArgumentParser(prog="python -m localdet.ranks",
                                     usage="%(prog)s --size N [--tf-config | --horovod] "
                                           "-- ARGV...")
    parser.add_argument("--size", type=int, required=True, help="how many ranks")
    parser.add_argument("--tf-config", action="store_true",
                        help="set TF_CONFIG for MultiWorkerMirroredStrategy")
    parser.add_argument("--horovod", action="store_true",
                        help="run Horovod's Gloo rendezvous and set its variables")
    parser.add_argument("--grace", type=float, default=5.0,
                        help="seconds between SIGTERM and SIGKILL when stopping ranks")
    split = args.index("--") if "--" in args else len(args)
    options, argv = parser.parse_args(args[:split]), args[split + 1:]
    if not argv or options.size < 1:
        parser.error("give --size N of at least 1, and the command after '--'")
    try:
        envs = rank_environments(options.size, dict(os.environ), options.tf_config) \
            if options.size > 1 else []
    except ValueError as error:
        parser.error(str(error))
    rendezvous = None
    if options.horovod and options.size > 1:
        try:
            rendezvous = horovod_rendezvous(options.size)
        except ImportError as error:
            print(f"[localdet] --horovod needs Horovod's runner, which does not import here: "
                  f"{error}", flush=True)
            return 1
        horovod_environments(envs, rendezvous.server_address[1])
    supervisor = Supervisor(grace=options.grace, serving=rendezvous,
                            run_forked=run_forked if options.size > 1 else None)
    if options.size == 1:
        try:
            os.execvp(argv[0], argv)  # the trial as if started directly
        except OSError as error:
            return supervisor.cannot_start(argv[0], error)
    # Before the first rank starts, so that a stop request never leaves one unsupervised.
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda number, _: supervisor.signals.append(number))
    status = supervisor.supervise(argv, envs)
    if status < 0:  # die by the signal we were sent, as the ranks did
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
        return 128 - status  # not reached: the signal ends the process
    return status


if __name__ == "__main__":
    sys.exit(main())
