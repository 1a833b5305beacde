"""A trial's memory limit: `resources.max_memory`, or else the daemon's
`--trial-memory-fraction` of the machine's memory, over the trial's whole process tree.

    sizes.parse_memory_limit("4GB")                   # 4_000_000_000; ValueError: one sentence
    guard = Guard(layout, fraction=0.8, log=print)    # the daemon's, one for all its trials
    guard.watch(trial, pid, experiment.config)        # after a launch, and after an adoption
    guard.settle(trial, experiment.config)            # when it exited, before its log is read
    memory_limit.exceeded(failure)                    # the launch ended for its memory limit

How it is enforced, decided once per daemon (its log says which; each trial's log says its
limit and how):

- cgroup: where the daemon may make child cgroups of its own cgroup v1 memory controller
  (root in a container), and a probe shows the kernel really enforces a limit there. Each
  launch gets `localdet-trial-<trial>-<pid>` with the limit (swap included); the trial
  joins it right after it starts and its children inherit it. The kernel then stops the
  trial, never the daemon, even when no daemon is running. The guard notices the kill
  (`oom_kill` in memory.oom_control) and stops the rest of the trial's processes.
- watcher: elsewhere (cgroup v2 desktops, where a user may not make memory cgroups without
  moving the daemon itself). A thread sums the memory each process of the trial's session
  or process group holds alone (its USS, read through psutil: shared libraries and pages
  shared with a warm process are left out) every POLL_SECONDS and kills the session with
  SIGKILL when it is over. It works only while a daemon runs. LOCALDET_MEMORY_WATCHER=1
  chooses it everywhere. (The cgroup files below are the kernel's own: psutil has no
  cgroups.)

RLIMIT_AS is not used: it caps one process, not the tree, and TensorFlow reserves far more
address space than it uses (it cannot even import under a 1 GB RLIMIT_AS).

A trial stopped this way gets two lines in its log: what happened, and the trial runner's
failure mark (`determined.core._reporting.FAILURE_MARK`) with SIGNATURE, so
`failures.record` reads it like any failure and the daemon ends the trial ERROR without a
restart (it would only reach the limit again).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from localdet.config.sizes import gigabytes, physical_memory

SIGNATURE = "MemoryLimitExceeded"
POLL_SECONDS = 0.5
_CGROUP_PREFIX = "localdet-trial-"
_SWEEP_SECONDS = 5.0  # how long after joining a cgroup strays of the trial are moved in


# -- limits -----------------------------------------------------------------------------
def limit_for(config: dict, fraction: float | None) -> tuple[int, str] | None:
    """The launch's limit in bytes and where it came from (for the error), or None: the
    config's `resources.max_memory` (bytes, as config.py leaves it), else `fraction` of the
    machine's memory."""
    configured = (config.get("resources") or {}).get("max_memory")
    if configured is not None:
        return int(configured), "resources.max_memory"
    if fraction is None:
        return None
    return (int(fraction * physical_memory()),
            f"localdet daemon --trial-memory-fraction {fraction:g}")


def message(limit: int, source: str) -> str:
    """What the user is told: one sentence, naming what to fix."""
    fix = ("raise resources.max_memory" if source == "resources.max_memory"
           else "set a higher resources.max_memory in the config")
    return (f"the trial exceeded its memory limit of {gigabytes(limit)} ({source}) and was "
            f"stopped; {fix}, or make the trial use less memory")


def exceeded(failure) -> bool:
    """Whether a `launcher.Failure` is a launch this module stopped."""
    return failure.signature.startswith(f"{SIGNATURE}:")


# -- enforcement ----------------------------------------------------------------------------
@dataclass
class _Watched:
    trial_id: int
    pid: int               # the trial's process: it leads its session and process group
    limit: int
    source: str
    log_path: Path
    cgroup: Path | None    # None: the watcher sums its processes' memory
    since: float
    stopped: bool = False  # the guard stopped it and said so in its log


class Guard:
    """Enforces every trial's limit for one daemon; see the module's docstring."""

    def __init__(self, layout, fraction: float | None = None, log=print):
        self.layout = layout
        self.fraction = fraction
        self.log = log
        self._lock = threading.Lock()
        self._watched: dict[int, _Watched] = {}
        self._thread: threading.Thread | None = None
        self._told = False
        # Decided now, in the background: a trial must join its cgroup the moment it starts.
        threading.Thread(target=enforcement, daemon=True, name="memory-limit-probe").start()

    def limit_for(self, config: dict) -> tuple[int, str] | None:
        return limit_for(config, self.fraction)

    @property
    def cgroup_base(self) -> Path | None:
        """Where trial cgroups are made; None: the watcher enforces limits."""
        base, why = enforcement()
        if not self._told:
            self._told = True
            self.log(f"trial memory limits are enforced by {why}")
        return base

    def watch(self, trial, pid: int, config: dict) -> None:
        """Enforce the trial's limit on the process `pid` leads, if it has a limit."""
        limit = self.limit_for(config)
        if limit is None:
            return
        with self._lock:
            if trial.id in self._watched:  # its previous launch, ended a moment ago
                self._finish(self._watched[trial.id])
            cgroup = self._cgroup(trial.id, pid, limit[0])
            log_path = self.layout.trial_log(trial.experiment_id, trial.id)
            watched = _Watched(trial.id, pid, *limit, log_path, cgroup, time.monotonic())
            self._watched[trial.id] = watched
            how = (f"a cgroup ({cgroup})" if cgroup else
                   f"a watcher of its processes' resident memory, every {POLL_SECONDS:g} s")
            _append(watched.log_path, f"[localdet] memory limit {gigabytes(limit[0])} "
                                      f"({limit[1]}) over all its processes, enforced by {how}")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="memory-limit")
                self._thread.start()

    def settle(self, trial, config: dict) -> None:
        """The trial's process ended: make sure a stop for memory is in its log before the
        log is read (the kernel may have killed it before the watcher looked), and tidy up.
        Also for a trial that died while no daemon watched it."""
        with self._lock:
            watched = self._watched.get(trial.id)
            if watched is None or watched.pid != trial.pid:
                watched = self._leftover(trial, config)
            if watched is not None:
                self._check(watched, _members({watched.pid}))
                self._finish(watched)

    # -- the watcher thread -------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            time.sleep(POLL_SECONDS)
            try:
                with self._lock:
                    if not self._watched:
                        continue
                    members = _members({w.pid for w in self._watched.values()})
                    for watched in list(self._watched.values()):
                        self._check(watched, members)
                        if not members.get(watched.pid):
                            self._finish(watched)
            except Exception as error:  # a limit unenforced for a moment beats a dead thread
                self.log(f"memory limit watcher: unexpected error, carrying on: {error!r}")

    def _check(self, watched: _Watched, members: dict[int, list[int]]) -> None:
        pids = members.get(watched.pid, [])
        if watched.stopped:
            return
        if watched.cgroup is not None:
            if time.monotonic() - watched.since < _SWEEP_SECONDS:
                _join(watched.cgroup, pids)  # a child it started before it joined
            if _oom_kills(watched.cgroup) == 0:
                return
            what = "the kernel stopped one of its processes at the cgroup's limit"
        else:
            used = sum(_resident(pid) for pid in pids)
            if used <= watched.limit:
                return
            what = f"{gigabytes(used)} resident in {len(pids)} process(es)"
        # Kill first: once it is dead nothing it writes can follow the mark in its log.
        _kill(watched, pids)
        watched.stopped = True
        told = message(watched.limit, watched.source)
        mark = {"signature": f"{SIGNATURE}: the trial exceeded its memory limit of "
                             f"{gigabytes(watched.limit)}",
                "stage": None, "trained": None, "message": told}
        from determined.core._reporting import FAILURE_MARK

        _append(watched.log_path, f"[localdet] {told} ({what})\n"
                                  f"{FAILURE_MARK}{json.dumps(mark)}")
        self.log(f"trial {watched.trial_id} exceeded its memory limit of "
                 f"{gigabytes(watched.limit)} ({what}); stopped it")

    def _finish(self, watched: _Watched) -> None:
        if watched.cgroup is not None:
            try:
                watched.cgroup.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                return  # a process is still in it; the next poll tries again
        if self._watched.get(watched.trial_id) is watched:
            del self._watched[watched.trial_id]

    # -- cgroups ---------------------------------------------------------------------------
    def _cgroup(self, trial_id: int, pid: int, limit: int) -> Path | None:
        """The launch's cgroup with the process in it, or None for the watcher."""
        current = _cgroup_folder(pid)
        if current is not None and current.name.startswith(f"{_CGROUP_PREFIX}{trial_id}-"):
            return current  # adopted: it joined its cgroup at launch
        base = self.cgroup_base
        if base is None:
            return None
        if current is not None and current != base:
            # Adopted from a daemon that used the watcher: its memory so far is counted
            # elsewhere, so a new cgroup would undercount. Watch it instead.
            return None
        path = base / f"{_CGROUP_PREFIX}{trial_id}-{pid}"
        try:
            _make_cgroup(path, limit)
            _join(path, [pid])
        except OSError as error:
            self.log(f"trial {trial_id}: cannot put it in a memory cgroup ({error}); "
                     "watching its memory instead")
            try:
                path.rmdir()
            except OSError:
                pass
            return None
        return path

    def _leftover(self, trial, config: dict) -> _Watched | None:
        """A cgroup of a launch no daemon watched to its end (found by its name)."""
        base = _v1_base()
        if base is None or not trial.pid:
            return None
        path = base / f"{_CGROUP_PREFIX}{trial.id}-{trial.pid}"
        if not path.is_dir():
            return None
        source = ("resources.max_memory" if (config.get("resources") or {}).get("max_memory")
                  else "localdet daemon --trial-memory-fraction")
        watched = _Watched(trial.id, trial.pid, _read_int(path / "memory.limit_in_bytes"),
                           source, self.layout.trial_log(trial.experiment_id, trial.id),
                           path, 0.0)
        watched.stopped = _marked(watched.log_path)  # a former daemon said so already
        return watched


# -- processes --------------------------------------------------------------------------------
_GONE = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)


def _members(leaders: set[int]) -> dict[int, list[int]]:
    """The live processes of each leader's session or process group (the trial's tree:
    the rank supervisor keeps its ranks in its group; a process that left the tree, its
    parent gone, is still in them)."""
    found: dict[int, list[int]] = {leader: [] for leader in leaders}
    for process in psutil.process_iter(["status"]):
        if process.info["status"] in _GONE:
            continue
        try:
            ids = {os.getpgid(process.pid), os.getsid(process.pid)}
        except OSError:
            continue  # gone meanwhile
        for leader in ids & leaders:
            found[leader].append(process.pid)
    return found


def _resident(pid: int) -> int:
    """The memory a process holds alone, in bytes (0 when it is gone): its unique set size
    (USS), the pages it would free by exiting. A trial forked from a warm process shares
    TensorFlow's pages with it until it writes them, and those are not its growth (RSS
    would count them in every trial); where USS cannot be read, its resident memory less
    what it maps from files."""
    try:
        process = psutil.Process(pid)
        try:
            return process.memory_full_info().uss
        except psutil.AccessDenied:
            memory = process.memory_info()
            return max(memory.rss - memory.shared, 0)
    except psutil.Error:
        return 0


def _kill(watched: _Watched, pids: list[int]) -> None:
    targets = set(pids)
    if watched.cgroup is not None:
        targets |= set(_read_pids(watched.cgroup / "cgroup.procs"))
    try:
        os.killpg(watched.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in targets:  # one that left the group or session
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _append(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as log:
            log.write(f"{text}\n")
    except OSError:
        pass  # the daemon's own log line still says it


def _marked(path: Path) -> bool:
    """Whether the log's last failure mark is this module's."""
    from localdet.processes.launcher import failure

    found = failure(path)
    return found is not None and exceeded(found)


# -- cgroup v1 --------------------------------------------------------------------------------
_decided: tuple[Path | None, str] | None = None
_deciding = threading.Lock()


def enforcement() -> tuple[Path | None, str]:
    """How this process enforces limits, decided once: (where trial cgroups are made, or
    None for the watcher; a phrase saying which and why)."""
    global _decided
    with _deciding:
        if _decided is None:
            _decided = _choose()
            if _decided[0] is not None:
                _remove_stale(_decided[0])
        return _decided


def _remove_stale(base: Path) -> None:
    """Empty trial cgroups a stopped daemon left behind, except those recording an OOM kill:
    the next daemon reads that when it finishes the trial (`Guard.settle`)."""
    for path in base.glob(f"{_CGROUP_PREFIX}*"):
        if not _read_pids(path / "cgroup.procs") and _oom_kills(path) == 0:
            try:
                path.rmdir()
            except OSError:
                pass  # a process joined it meanwhile


def _choose() -> tuple[Path | None, str]:
    """Where to make trial cgroups (None: the watcher), and a phrase saying why."""
    watcher = "a watcher thread polling the trials' resident memory"
    if os.environ.get("LOCALDET_MEMORY_WATCHER") == "1":
        return None, f"{watcher} (LOCALDET_MEMORY_WATCHER=1)"
    base = _v1_base()
    if base is None:
        return None, f"{watcher} (no cgroup v1 memory controller)"
    problem = _probe(base)
    if problem:
        return None, f"{watcher} (a memory cgroup under {base} {problem})"
    return base, f"cgroup v1 memory limits under {base}"


def _v1_mount() -> tuple[Path, str] | None:
    """The cgroup v1 memory controller's mount point, and the cgroup it shows as its root."""
    try:
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for mount in mounts:
        before, _, after = mount.partition(" - ")
        parts, kind = before.split(), after.split()
        if len(parts) > 4 and len(kind) > 2 and kind[0] == "cgroup" \
                and "memory" in kind[2].split(","):
            return Path(parts[4]), parts[3]
    return None


def _cgroup_folder(pid: int | str) -> Path | None:
    """The folder of the cgroup v1 memory cgroup a process is in ("self": ours), or None."""
    mount = _v1_mount()
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if mount is None or "memory" not in controllers.split(","):
            continue
        point, root = mount
        if root != "/" and path.startswith(root):
            path = path[len(root):]
        folder = point / path.lstrip("/")
        return folder if folder.is_dir() else None
    return None


def _v1_base() -> Path | None:
    return _cgroup_folder("self")


def _make_cgroup(path: Path, limit: int) -> None:
    path.mkdir(exist_ok=True)
    (path / "memory.limit_in_bytes").write_text(str(limit))
    try:  # memory and swap together, where the kernel accounts swap
        (path / "memory.memsw.limit_in_bytes").write_text(str(limit))
    except OSError:
        pass


def _join(path: Path, pids: list[int]) -> None:
    for pid in pids:
        try:
            (path / "cgroup.procs").write_text(str(pid))
        except ProcessLookupError:
            pass


def _oom_kills(path: Path) -> int:
    try:
        for line in (path / "memory.oom_control").read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return 0


def _read_pids(path: Path) -> list[int]:
    try:
        return [int(line) for line in path.read_text().split()]
    except (OSError, ValueError):
        return []


_PROBE = "import sys; sys.stdin.readline(); data = b'x' * (256 << 20)"


def _probe(base: Path) -> str | None:
    """None when a 64 MB limit in a child cgroup stops a process that fills 256 MB (a
    sandboxed kernel may take the settings and not enforce them); else what went wrong."""
    path = base / f"{_CGROUP_PREFIX}probe-{os.getpid()}"
    process = None
    try:
        _make_cgroup(path, 64 << 20)
        if not (path / "memory.oom_control").is_file():
            return "reports no OOM kills"
        process = subprocess.Popen([sys.executable, "-S", "-c", _PROBE], stdin=subprocess.PIPE,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _join(path, [process.pid])
        if process.stdin is None:  # stdin=PIPE makes it
            raise RuntimeError("the memory probe has no stdin pipe")
        process.stdin.write(b"go\n")  # only now, inside the cgroup, does it fill memory
        process.stdin.close()
        code = process.wait(timeout=30)
        if code != -signal.SIGKILL or _oom_kills(path) < 1:
            return f"did not stop a process over its limit (it exited with {code})"
        return None
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"cannot be used ({error})"
    finally:
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()
        for _ in range(20):  # the killed probe leaves its cgroup a moment after it is reaped
            try:
                path.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.05)
