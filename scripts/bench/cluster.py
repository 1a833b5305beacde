"""How many slots can one daemon keep busy? The real daemon against a simulated cluster.

The daemon (`Daemon(layout, cluster=SimulatedCluster(...))`, in this process's main thread,
with its report server) takes a real submission through its queue into a real SQLite file in
a temporary LOCALDET_HOME, runs a real random search and schedules its trials onto the
simulated cluster's slots (`--nodes` x `--slots`/`--nodes`). Nothing else is simulated: the
trials report through the real transport a Ray trial uses, `HTTPReporter` to the daemon's
`ReportServer` (which writes with `SQLiteReporter`), because a daemon with a cluster always
serves reports over HTTP; measuring SQLiteReporter here would leave out the server, which
is where every remote trial's reports land.

A "trial" is a thread in a worker process (`--workers`, default 1; the machine has 2 cores,
so 256 trial processes cannot run at once): it says hello (waiting for its launch to be
recorded), reads its trial info, then for each scheduling unit (100 batches of 300) sleeps
its share of `--trial-seconds` (default 3 s, jittered +-20 %), reports the first batch once,
a training-metrics row, asks `should_pause` and heartbeats, as `TrialController` does; at the
end a validation row and a checkpoint (`--checkpoint-kb` of random bytes, uploaded, stored,
fsynced and committed), then it waits for its reports and exits 0. No TensorFlow.

Printed, over the whole run (first launch to last exit) and over the steady state (from the
launch that filled the last slot to the last launch, before the queue runs dry):

  decisions/s      launches + exits the daemon handled, per second
  commits/s        SQLite commits of every connection in this process (the daemon's and
                   the report server's), counted by a trace callback on each connection
                   that StateDB.open makes: each COMMIT statement, plus each write run
                   outside a transaction (SQLite commits it by itself)
  utilisation      busy slot-seconds / (slots x wall); a slot is busy from the cluster's
                   start() to the trial thread's end
  launch latency   the k-th exit to the (slots+k)-th launch (the trial that takes the
                   freed slot), median and p95, in the steady state
  stretch          a trial's launch-to-exit time over the sleep it was given: time spent
                   waiting on reports (hello, should_pause, checkpoint, the final flush)
  report writer    the writes the report server's writer committed, in how many
                   transactions, and the reads it ran beside them
  CPU              CPU seconds of the daemon's process (its loop's thread), of the report
                   server's process (its writer, its event loop, what it hands to worker
                   threads; told by the server as it stops) and of the trials' workers, and
                   the load average at the end: the machine is shared. With --in-process
                   (the report server in the daemon's process, as before issue 34 item 4)
                   the writer's and the requests' threads are counted in the daemon's

and where the daemon's main loop spent its time (perf_counter around each part of `step`).
`--profile` adds a cProfile of the daemon's thread by CPU time, `--profile-server` (with
`--in-process`) one of every report server thread by CPU time; the report server's own
process is profiled with py-spy (`py-spy record --pid PID`, its pid in `ps`). With no
`--slots`, the run is made for 32, 64 and 256 slots, and ratios to the 32-slot figures are
printed.

    python scripts/bench/cluster.py                    # 32, 64, 256 slots (about 6 minutes)
    python scripts/bench/cluster.py --slots 256 --nodes 32 --trial-seconds 8
    python scripts/bench/cluster.py --slots 256 --nodes 32 --in-process --profile-server
    python scripts/bench/cluster.py --slots 256 --nodes 32 --in-process   # the server as before
    python scripts/bench/cluster.py --slots 64 --seconds 30 --trial-seconds 2

Measured on the shared 2-vCPU test machine (Python 3.11), one worker process, nice 10, other
people's tests beside it. Before: e3fae16 (load average 0.7 at the start of the 3-s
invocation, 9.4 at its end); after: d2b9a64 (8.9 at the start; 5.1, 6.3, 7.2 at the end of
each slot count; 6.6 to 3.4 for the 8-s run):

  slots (nodes)          trials       decisions/s   commits/s   utilisation    launch latency
                                      all / steady              all / steady   median / p95
  32 (4), 3 s   before   640          17.7 / 17.8    97         0.953 / 0.978  36 ms / 388 ms
                after    640          18.9 / 19.0    83         0.968 / 0.998  11 ms / 41 ms
  64 (8), 3 s   before   1280         16.2 / 16.1    89         0.753 / 0.767  1.2 s / 5.7 s
                after    1280         35.9 / 36.2   128         0.953 / 0.985  25 ms / 235 ms
  256 (32), 3 s before   1534 of 5120 in the 170-s cut-off
                                      14.0 / 12.4    75         0.286 / 0.274  28 s / 50 s
                after    5120 in 165 s
                                      62.2 / 62.4    92         0.618 / 0.625  3.0 s / 4.6 s
  256 (32), 8 s before   1056 of 1920 in the cut-off, 231 gave up reporting after 60 s
                                      11.3 / 9.7     47         0.676 / 0.660  11 s / 48 s
                after    1920         54.9 / 55.8   184         0.887 / 0.963  57 ms / 1.7 s

One daemon on this machine handles about 60 decisions a second (before: 15 to 20), which
keeps 64 slots of 3-s trials busy and 256 slots of 8-s trials (0.963; 0.947 at 7 s); 256
slots of 3-s trials need 171 a second and get 0.625. The daemon's process then uses most of
a core, 25 to 28 ms of CPU a trial (a third in the loop's thread, a quarter in the report
writer, the rest in the request threads).
What limits it, and what would come next: docs/cluster.md.

A pass whatever the trials recorded (issue 25, item 4): `--recorded N` first records N
finished trials of the experiment (launched, reported, checkpointed, closed by the real
search), and "pass cost, steady" gives the steady state's passes in wall and in the loop
thread's CPU time. 64 slots (8 nodes), 3-s trials for 15 s, nice 0, while the machine's
other sessions paused (load average 1 to 4.5); before 1838630, after 039143d:

  finished trials      pass median (CPU)   pass mean (CPU)     p95      loop CPU a decision
  1,000     before     15.1 ms (9.0 ms)    24.2 ms (13.0 ms)    74 ms   4.22 ms
            after       5.8 ms (4.4 ms)     7.3 ms (4.5 ms)     20 ms   2.22 ms
  20,000    before     29.7 ms (19.2 ms)   61.5 ms (36.9 ms)   280 ms   9.15 ms
            after       5.7 ms (4.3 ms)     8.9 ms (5.7 ms)     22 ms   2.64 ms

256 slots (32 nodes) of 3-s trials, nice 0, the same quiet machine: before (load 3.3 to
4.9) all 5,120 in 127 s, 81.0 decisions/s steady, utilisation 0.658 (steady 0.666), launch
latency 2.2 s / 3.1 s, 25 ms of the daemon's CPU a trial; after (load 0.8 to 3.3) all in
91 s, 114.7 decisions/s, utilisation 0.941 (steady 0.973), 84 ms / 0.39 s, 17 ms a trial;
trials stretched 1.38x and 1.39x (waiting for the report server). Beside other sessions'
tests (load 9 to 15): before 0.521, cut off at 170 s; after (bc97d4a) 0.911, stretch 2.04x.

    python scripts/bench/cluster.py --slots 64 --seconds 15 --recorded 20000
    python scripts/bench/cluster.py --smoke            # seconds: 8 slots, 20 recorded
"""

from __future__ import annotations

import argparse
import atexit
import cProfile
import io
import json
import multiprocessing
import os
import pstats
import random
import resource
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

BATCHES, UNIT = 300, 100  # a trial's length and scheduling unit: three training rows


# -- the trials' side: a worker process hosting trial threads ------------------------------

def _trial(send, lock, trial_id: int, env: dict, seconds: float, checkpoint_kb: int,
           killed: threading.Event) -> None:
    from localdet.reporting.http_reporter import HTTPReporter

    code, started = 0, time.time()
    reporter = None
    try:
        reporter = HTTPReporter(env["LOCALDET_REPORT_URL"], trial_id,
                                int(env["LOCALDET_LAUNCH"]), env["LOCALDET_REPORT_TOKEN"],
                                model_dir=Path(env["LOCALDET_MODEL_DIR"]),
                                trial_dir=Path(tempfile.gettempdir()), retry_seconds=60)
        atexit.unregister(reporter._at_exit)  # closed below: thousands would pile up
        reporter.start()
        info = reporter.trial_info()
        rng = random.Random(trial_id)
        units = max(1, info.target_batches // UNIT)
        for unit in range(1, units + 1):
            if killed.wait(seconds / units):
                code = -9
                return
            batches = unit * UNIT
            if unit == 1:
                reporter.report_first_batch()
            reporter.report_training_metrics(batches, {"loss": rng.random()})
            if unit == units:
                reporter.report_validation_metrics(batches, {"val_accuracy": rng.random()})
                folder = Path(tempfile.mkdtemp(prefix=".bench-checkpoint-"))
                (folder / "determined-keras-model.h5").write_bytes(
                    rng.randbytes(checkpoint_kb * 1024))
                (folder / "metadata.json").write_text(json.dumps({"trial_id": trial_id}))
                reporter.save_checkpoint(folder, batches, {"trial_id": trial_id})
            else:
                reporter.should_pause()
            reporter.heartbeat()
        reporter.wait_for_checkpoints()
    except BaseException as error:  # told to the driver, counted as a failed trial
        code = 1
        print(f"trial {trial_id}: {type(error).__name__}: {error}", file=sys.stderr)
    finally:
        if reporter is not None:
            reporter._at_exit()
        with lock:
            send.send(("exit", trial_id, code, started, time.time()))


def _worker(conn, checkpoint_kb: int) -> None:
    """Runs trial threads as the daemon's cluster asks, and tells it when each ends."""
    lock = threading.Lock()
    killed: dict[int, threading.Event] = {}
    while True:
        message = conn.recv()
        if message[0] == "stop":
            for event in killed.values():
                event.set()
            return
        if message[0] == "start":
            _, trial_id, env, seconds = message
            killed[trial_id] = threading.Event()
            threading.Thread(target=_trial, args=(conn, lock, trial_id, env, seconds,
                                                  checkpoint_kb, killed[trial_id]),
                             daemon=True).start()
        elif message[0] == "end":
            event = killed.get(message[1])
            if event is not None:
                event.set()


# -- the daemon's side: the cluster ----------------------------------------------------------

class SimulatedTrial:
    """What the daemon needs of a launch (RayTrial's surface)."""

    warm = False
    log_writer = None
    orphaned = False
    lost = False

    def __init__(self, cluster: "SimulatedCluster", trial_id: int, node: str, worker):
        self.cluster, self.trial_id, self.node, self.host = cluster, trial_id, node, node
        self.name = f"sim-trial-{trial_id}"
        self.pid = worker.pid
        self.returncode: int | None = None
        self.ended = threading.Event()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        self.ended.wait(timeout)
        return self.returncode

    def end(self) -> None:
        self.cluster._send(self.trial_id, ("end", self.trial_id))
        self.ended.wait(30)
        if self.returncode is None:
            self.returncode = -9


class SimulatedCluster:
    """RayCluster's methods over `nodes` nodes of `slots // nodes` CPU slots each; trials
    are threads in `workers` processes."""

    def __init__(self, slots: int, nodes: int, trial_seconds: float, workers: int,
                 checkpoint_kb: int):
        from localdet.scheduling.slots import CPU, Slot

        per_node = slots // nodes
        self._slots = [Slot(i, CPU, f"CPU on node{i // per_node}") for i in range(slots)]
        self._node_of = {i: f"node{i // per_node}" for i in range(slots)}
        self._per_node = per_node
        self.trial_seconds = trial_seconds
        self._last_launch: dict[str, float] = {}
        self._handles: dict[int, SimulatedTrial] = {}
        self._slots_of: dict[int, list[int]] = {}
        self.launches: list[tuple[float, int]] = []          # (time, trial)
        self.exits: list[tuple[float, float, int, int]] = []  # (end, started, trial, code)
        self.busy: list[tuple[float, float, int]] = []      # (start, end, slots)
        self._starts: dict[int, float] = {}
        self._planned: dict[int, float] = {}
        self.stretch: list[float] = []
        context = multiprocessing.get_context("spawn")  # no copy of the daemon's threads
        self._workers = []
        for _ in range(workers):
            ours, theirs = context.Pipe()
            process = context.Process(target=_worker, args=(theirs, checkpoint_kb),
                                      daemon=True)
            process.start()
            self._workers.append((process, ours, threading.Lock()))
            threading.Thread(target=self._listen, args=(ours,), daemon=True).start()

    def _worker_of(self, trial_id: int):
        return self._workers[trial_id % len(self._workers)]

    def _send(self, trial_id: int, message) -> None:
        _, conn, lock = self._worker_of(trial_id)
        with lock:
            conn.send(message)

    def _listen(self, conn) -> None:
        while True:
            try:
                _, trial_id, code, _started, ended = conn.recv()
            except (EOFError, OSError):
                return
            handle = self._handles.pop(trial_id, None)
            start = self._starts.pop(trial_id, ended)
            self.exits.append((ended, start, trial_id, code))
            self.busy.append((start, ended, len(self._slots_of.pop(trial_id, [0]))))
            planned = self._planned.pop(trial_id, None)
            if planned and code == 0:
                self.stretch.append((ended - start) / planned)
            if handle is not None:
                handle.returncode = code
                handle.ended.set()

    # -- RayCluster's surface --
    def slots(self):
        return list(self._slots)

    def available(self) -> set[int]:
        return set(self._node_of)

    def largest_node_seen(self) -> list[int]:
        return [self._per_node]

    def node_key(self, slot: int):
        node = self._node_of[slot]
        return self._last_launch.get(node, 0.0), node

    def node_of(self, slot: int) -> str:
        return self._node_of[slot]

    def node_alive(self, node: str) -> bool:
        return True

    def describe_node(self, node: str) -> str:
        return node

    def report_host(self) -> str:
        return "127.0.0.1"

    def start(self, spec, trial, slots: list[int]) -> SimulatedTrial:
        node = self._node_of[slots[0]]
        now = time.time()
        self._last_launch[node] = time.monotonic()
        from localdet.processes.capped_log import CappedLog

        log = CappedLog(spec.log_path, spec.max_log_bytes)  # as RayCluster.start does
        log.write(f"{spec.header}; on simulated {node}\n".encode())
        log.close()
        seconds = self.trial_seconds * random.Random(trial.id).uniform(0.8, 1.2)
        _, worker_conn, _ = self._worker_of(trial.id)
        handle = SimulatedTrial(self, trial.id, node, self._worker_of(trial.id)[0])
        self._handles[trial.id] = handle
        self._starts[trial.id] = now
        self._planned[trial.id] = seconds
        self._slots_of[trial.id] = slots
        self.launches.append((now, trial.id))
        self._send(trial.id, ("start", trial.id, spec.env, seconds))
        return handle

    def adopt(self, trial, log_path, max_log_bytes):
        return None

    def close(self) -> None:
        for process, conn, lock in self._workers:
            with lock:
                try:
                    conn.send(("stop",))
                except OSError:
                    pass
            process.join(5)
            if process.is_alive():
                process.kill()


# -- counting commits ----------------------------------------------------------------------

class Commits:
    """Counts SQLite commits on every connection StateDB.open makes in this process."""

    WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE")

    def __init__(self):
        self.count = 0
        self._lock = threading.Lock()

    def install(self) -> None:
        from localdet.records import db as db_module
        opened = db_module.StateDB.open.__func__

        def open_counted(cls, path, **options):  # (migrate=True: the daemon's start)
            state = opened(cls, path, **options)
            conn = state.db.conn

            def trace(sql: str) -> None:
                head = sql.lstrip()[:7].upper()
                if head.startswith("COMMIT") or (head.startswith(self.WRITES)
                                                 and not conn.in_transaction):
                    with self._lock:
                        self.count += 1

            conn.set_trace_callback(trace)
            return state

        db_module.StateDB.open = classmethod(open_counted)


# -- one run -----------------------------------------------------------------------------------

MODEL_DEF = '''"""Never imported: the benchmark's trials are simulated."""


class BenchTrial:
    pass
'''


def config(trials: int, slots: int) -> dict:
    return {
        "name": "cluster-bench",
        "entrypoint": "model_def:BenchTrial",
        "hyperparameters": {"global_batch_size": 32,
                            "hidden_units": {"type": "int", "minval": 16, "maxval": 256},
                            "learning_rate": {"type": "log", "minval": -4, "maxval": -1}},
        "scheduling_unit": UNIT,
        "searcher": {"name": "random", "metric": "val_accuracy", "smaller_is_better": False,
                     "max_length": {"batches": BATCHES}, "max_trials": trials,
                     "max_concurrent_trials": slots},
        "max_restarts": 0,
        "reproducibility": {"experiment_seed": 1},
    }


class Sections:
    """perf_counter totals around each part of Daemon.step."""

    PARTS = ("intake", "_watch_scripts", "_handle_requests", "_watch_space", "_search",
             "_reap", "_schedule", "_launch", "_record_launches", "_finish", "_finish_all",
             "_collect")  # (those a daemon has: the bench also runs older ones)
    # Where each part is in a daemon whose parts are collaborators that `open` makes
    # (localdet/daemon/*.py): (attribute, method). Older daemons have them as their methods.
    PLACES = {"_watch_scripts": [("scripts", "watch")],
              "_handle_requests": [("requests", "handle")],
              "_watch_space": [("space", "watch")],
              "_search": [("experiments", "start_searches")],
              "_reap": [("exits", "reap"), ("retention", "collect_exited")],
              "_schedule": [("scheduler", "schedule")],
              "_launch": [("launches", "launch")],
              "_record_launches": [("launches", "record")],
              "_finish": [("exits", "finish")],
              "_finish_all": [("exits", "finish_all")],
              "_collect": [("retention", "collect")]}

    def __init__(self, daemon):
        self.totals = {name: 0.0 for name in self.PARTS}
        self.calls = {name: 0 for name in self.PARTS}
        self.passes = 0
        self.pass_times: list[tuple[float, float, float]] = []  # (time, wall s, CPU s)
        for name in self.PARTS[1:]:
            if hasattr(daemon, name):
                setattr(daemon, name, self._timed(name, getattr(daemon, name)))
        step = daemon.step

        def counted_step():
            self.passes += 1
            at, begun, cpu = time.time(), time.perf_counter(), time.thread_time()
            try:
                step()
            finally:
                self.pass_times.append((at, time.perf_counter() - begun,
                                        time.thread_time() - cpu))

        daemon.step = counted_step

    def wrap_intake(self, intake) -> None:
        intake.poll = self._timed("intake", intake.poll)

    def wrap_parts(self, daemon) -> None:
        """Time the parts of a daemon split into collaborators (made by its `open`)."""
        for name, places in self.PLACES.items():
            for attribute, method in places:
                part = getattr(daemon, attribute, None)
                if part is not None and hasattr(part, method):
                    setattr(part, method, self._timed(name, getattr(part, method)))

    def _timed(self, name, function):
        def timed(*args, **kwargs):
            begun = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.totals[name] += time.perf_counter() - begun
                self.calls[name] += 1
        return timed


def prefill(layout, config_path: Path, model: Path, cluster: "SimulatedCluster",
            recorded: int) -> float:
    """Record the bench's experiment and `recorded` finished trials of it before the daemon
    starts, as if it had run them: each is launched, reports three training rows, a
    validation row and a checkpoint (one small blob, shared), and the random search closes it
    and creates the next (the real searcher, recorded through the real Search). Returns the
    seconds it took."""
    from localdet.checkpoints.manifest import build_manifest
    from localdet.checkpoints.store import Store
    from localdet.daemon.submissions import Intake, submit
    from localdet.records.db import StateDB, now
    from localdet.records.states import TrialState
    from localdet.scheduling.slots import write_slot_file
    from localdet.search.driver import Search

    begun = time.monotonic()
    layout.ensure()
    write_slot_file(layout.slot_file, cluster.slots())
    queued, _ = submit(layout, config_path, model)
    db = StateDB.open(layout.db)
    experiment_id = Intake(layout, db, slots=cluster.slots()).ingest(queued)
    if experiment_id is None:
        raise RuntimeError(f"the bench's submission was refused; see {layout.rejected}")
    experiment = db.experiment(experiment_id)
    search = Search(db, log=lambda message: None)
    search.start(experiment)
    blob = Path(tempfile.mkdtemp(prefix=".bench-recorded-"))
    (blob / "determined-keras-model.h5").write_bytes(b"recorded" * 128)
    store = Store(layout.store)
    with store.writing():
        files = store.put_directory(blob, consume=True)
    shutil.rmtree(blob, ignore_errors=True)
    template = build_manifest(uuid="00000000-0000-4000-8000-000000000000",
                              experiment_id=experiment_id, trial_id=1,
                              batches_trained=BATCHES, files=files, metadata={})
    rng = random.Random(0)
    done = 0
    while done < recorded:
        with db.atomic():  # a few hundred trials a transaction: the prefill is not measured
            for _ in range(min(250, recorded - done)):
                row = db.db.execute("SELECT id FROM trials WHERE experiment_id = ? AND state = ? "
                                    "ORDER BY id LIMIT 1",
                                    [experiment_id, TrialState.QUEUED]).fetchone()
                trial_id = row[0]
                db.update_trial(trial_id, state=TrialState.RUNNING, pid=1,
                                started_at=now(), slots="[0]")
                for unit in range(1, BATCHES // UNIT + 1):
                    db.record_metrics(trial_id, "training", unit * UNIT,
                                      {"loss": rng.random()})
                db.record_metrics(trial_id, "validation", BATCHES,
                                  {"val_accuracy": rng.random()})
                db.add_checkpoint({**template, "trial_id": trial_id, "created_at": now(),
                                   "uuid": f"{trial_id:08x}-0000-4000-8000-000000000000"})
                trial = db.trial(trial_id)
                search.validation_completed(experiment, trial,
                                            db.metrics(trial_id, "validation")[-1]
                                            .metrics["val_accuracy"])
                done += 1
    db.close()
    return time.monotonic() - begun


def run(slots: int, nodes: int, trials: int, args) -> dict:
    from localdet.daemon.daemon import Daemon
    from localdet.daemon.submissions import submit
    from localdet.paths import Layout

    home = Path(tempfile.mkdtemp(prefix="localdet-cluster-bench-"))
    layout = Layout(home)
    model = home.parent / f"{home.name}-model"
    model.mkdir()
    (model / "model_def.py").write_text(MODEL_DEF)
    config_path = home.parent / f"{home.name}.yaml"
    config_path.write_text(yaml.safe_dump(config(args.recorded + trials, slots)))
    cluster = SimulatedCluster(slots, nodes, args.trial_seconds, args.workers, args.checkpoint_kb)
    prefilled = prefill(layout, config_path, model, cluster, args.recorded) \
        if args.recorded else None
    daemon = Daemon(layout, cluster=cluster, log=lambda message: None)
    sections = Sections(daemon)
    opened = daemon.open

    def open_and_wrap(db=None):
        result = opened(db)
        sections.wrap_intake(daemon.intake)
        sections.wrap_parts(daemon)
        return result

    daemon.open = open_and_wrap
    outcome: dict = {}
    from localdet.reporting import report_process, report_server
    servers: list = []
    started = report_server.ReportServer.start
    process_started = report_process.ReportProcess.start

    def start_and_keep(server):  # to read its writer's counts after the run
        servers.append(server)
        return started(server)

    def start_process_and_keep(server):  # its child tells them as it stops
        servers.append(server)
        return process_started(server)

    report_server.ReportServer.start = start_and_keep
    report_process.ReportProcess.start = start_process_and_keep
    if args.profile_server and not args.in_process:
        print("--profile-server profiles the report server in the daemon's process: with "
              "--in-process only (else: py-spy on its process)")
        args.profile_server = False
    server_profiles = _profile_server(report_server) if args.profile_server else None
    thread_cpu = _count_thread_cpu(report_server)

    def drive() -> None:
        while not (layout.slot_file.exists() and daemon.report_url):
            time.sleep(0.05)
        if prefilled is None:  # (else recorded with its finished trials)
            submit(layout, config_path, model)
        deadline = time.monotonic() + args.max_seconds
        db = sqlite3.connect(layout.db, timeout=30)
        while True:
            time.sleep(0.5)
            row = db.execute("SELECT state FROM experiments").fetchone()
            if row and row[0] not in ("ACTIVE", "PAUSED"):
                outcome["state"] = row[0]
                break
            if time.monotonic() > deadline:
                outcome["state"] = "cut off"
                break
        outcome["trials"] = db.execute(
            "SELECT state, COUNT(*) FROM trials GROUP BY state").fetchall()
        db.close()
        daemon.stop()

    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    # By the thread's CPU time: under load, wall time is mostly waiting for the GIL.
    profile = cProfile.Profile(time.thread_time) if args.profile else None
    begun_commits = commits.count
    cpu = _cpu()
    if profile:
        profile.enable()
    try:
        daemon.run()  # (closes the cluster: its worker processes have ended when it returns)
    finally:
        if profile:
            profile.disable()
        report_server.ReportServer.start = started
        report_process.ReportProcess.start = process_started
    cpu = {key: after - cpu[key] for key, after in _cpu().items()}
    cpu.update(thread_cpu())
    driver.join()
    result = measure(cluster, slots, commits.count - begun_commits)
    writer = getattr(servers[0], "writer", None) if servers else None
    child = getattr(servers[0], "stats", None) if servers else None
    if child:  # the report server's own process: its CPU was counted with the children's
        writer = argparse.Namespace(**{key: child[key] for key in ("groups", "pieces", "reads")})
        server_cpu = child["cpu"]
        cpu["trials"] -= server_cpu["total"]
        cpu.update(server=server_cpu["total"], writer=server_cpu.get("writer", 0.0),
                   requests=server_cpu.get("requests", 0.0) + server_cpu.get("workers", 0.0),
                   workers=server_cpu.get("workers", 0.0))
    if server_profiles is not None:
        server_profiles = server_profiles()
    result.update(outcome=outcome, sections=sections, prefilled=prefilled, profile=profile, cpu=cpu,
                  server_profiles=server_profiles,
                  writer=(writer.groups, writer.pieces, writer.reads) if writer else None)
    if not args.keep:
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(model, ignore_errors=True)
        config_path.unlink(missing_ok=True)
    else:
        print(f"kept {home}")
    return result


def _server_threads(report_server, wrap):
    """Wrap the report server's threads: its event loop's (uvicorn's `Server.run`: HTTP
    parsing, routing, answers), its writer's, and each piece of work it hands to a worker
    thread (uploads, commits, downloads); `wrap(function, key)` -> the wrapped function.
    Returns a function that undoes it."""
    import uvicorn

    from localdet.reporting import checkpoint_routes, report_handler

    writer, pool = report_server.GroupWriter, report_handler.run_in_threadpool
    originals = uvicorn.Server.run, writer._serve

    async def in_pool(function, *args, **kwargs):
        return await pool(wrap(function, "workers"), *args, **kwargs)

    uvicorn.Server.run = wrap(originals[0], "requests")
    writer._serve = wrap(originals[1], "writer")
    report_handler.run_in_threadpool = checkpoint_routes.run_in_threadpool = in_pool

    def undo():
        uvicorn.Server.run, writer._serve = originals
        report_handler.run_in_threadpool = checkpoint_routes.run_in_threadpool = pool

    return undo


def _count_thread_cpu(report_server):
    """CPU seconds of the report server's writer thread, its event loop's thread and its
    work in worker threads (time.thread_time); returns a function that undoes the counting
    and returns {"writer": s, "requests": s (event loop and workers), "workers": s}."""
    totals, lock = {"writer": 0.0, "requests": 0.0, "workers": 0.0}, threading.Lock()

    def counted(original, key):
        def run(*args, **kwargs):
            begun = time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                spent = time.thread_time() - begun
                with lock:
                    totals[key] += spent
                    if key == "workers":
                        totals["requests"] += spent
        return run

    undo_wrapping = _server_threads(report_server, counted)

    def undo():
        undo_wrapping()
        return dict(totals)

    return undo


def _profile_server(report_server):
    """Profile the report server's threads (its event loop, its writer, its work in worker
    threads) by CPU time (time.thread_time), one cProfile a thread; returns a function that
    undoes it and returns the profiles."""
    profiles, lock, mine = [], threading.Lock(), threading.local()

    def profiled(original, key):
        def run(*args, **kwargs):
            profile = getattr(mine, "profile", None)
            if profile is None:
                mine.profile = profile = cProfile.Profile(time.thread_time)
                with lock:
                    profiles.append(profile)
            profile.enable()
            try:
                return original(*args, **kwargs)
            finally:
                profile.disable()
        return run

    undo_wrapping = _server_threads(report_server, profiled)

    def undo():
        undo_wrapping()
        return profiles

    return undo


def _cpu() -> dict:
    """CPU seconds so far: this process (daemon, report server), its main thread (the
    daemon's loop), and the ended children (the trials' worker processes)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), \
        resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"daemon": own.ru_utime + own.ru_stime, "loop": time.thread_time(),
            "trials": children.ru_utime + children.ru_stime, "wall": time.monotonic()}


def measure(cluster: SimulatedCluster, slots: int, commit_count: int) -> dict:
    launches = sorted(t for t, _ in cluster.launches)
    exits = sorted(e[0] for e in cluster.exits)
    first, last = launches[0], max(exits)
    wall = last - first

    def busy_between(a: float, b: float) -> float:
        return sum(max(0.0, min(end, b) - max(start, a)) * n for start, end, n in cluster.busy)

    # Steady: from the launch that filled the last slot to the last launch (after it the
    # queue is empty and slots free up for good).
    steady_from = launches[min(slots, len(launches)) - 1]
    steady_to = launches[-1]
    steady = max(steady_to - steady_from, 1e-9)
    latency = [launches[slots + k] - exits[k] for k in range(len(exits))
               if slots + k < len(launches) and exits[k] >= steady_from]
    events_in = sum(steady_from <= t <= steady_to for t in launches) + \
        sum(steady_from <= t <= steady_to for t in exits)
    failed = sum(1 for e in cluster.exits if e[3] != 0)
    return {
        "launches": len(launches), "exits": len(exits), "failed": failed, "wall": wall,
        "decisions_per_s": (len(launches) + len(exits)) / wall,
        "steady_decisions_per_s": events_in / steady,
        "commits_per_s": commit_count / wall, "commits": commit_count,
        "utilisation": busy_between(first, last) / (slots * wall),
        "steady_utilisation": busy_between(steady_from, steady_to) / (slots * steady),
        "steady_seconds": steady, "steady_from": steady_from, "steady_to": steady_to,
        "steady_decisions": events_in,
        "latency_median": statistics.median(latency) if latency else float("nan"),
        "latency_p95": (statistics.quantiles(latency, n=20)[-1] if len(latency) >= 20
                        else max(latency, default=float("nan"))),
        "stretch": statistics.median(cluster.stretch) if cluster.stretch else float("nan"),
    }


def report(slots: int, nodes: int, trials: int, result: dict, args) -> None:
    r = result
    print(f"\n{slots} slots ({nodes} nodes), {trials} trials of ~{args.trial_seconds:g} s: "
          f"experiment {r['outcome'].get('state')}, trials {dict(r['outcome'].get('trials', []))}")
    print(f"  launches {r['launches']}, exits {r['exits']} ({r['failed']} failed) in "
          f"{r['wall']:.1f} s (first launch to last exit)")
    print(f"  decisions/s        {r['decisions_per_s']:7.1f}   "
          f"steady {r['steady_decisions_per_s']:.1f}"
          f"   (ideal steady {2 * slots / args.trial_seconds:.1f})")
    print(f"  commits/s          {r['commits_per_s']:7.1f}   ({r['commits']} commits)")
    if r.get("writer"):
        groups, pieces, reads = r["writer"]
        print(f"  report writer      {pieces} writes in {groups} transactions "
              f"({pieces / max(groups, 1):.1f} a commit), {reads} reads")
    print(f"  utilisation        {r['utilisation']:7.3f}   steady {r['steady_utilisation']:.3f}"
          f" over {r['steady_seconds']:.1f} s (target >= 0.95)")
    print(f"  launch latency     median {r['latency_median'] * 1000:.0f} ms, "
          f"p95 {r['latency_p95'] * 1000:.0f} ms (slot freed -> next trial started)")
    print(f"  trial stretch      {r['stretch']:.2f}x  (launch-to-exit over the sleep given)")
    cpu = r["cpu"]
    wall = max(cpu["wall"], 1e-9)
    if "server" in cpu:  # the report server in a process of its own
        print(f"  CPU                daemon's process {cpu['daemon']:.1f} s "
              f"({cpu['daemon'] / wall:.0%} of a core; its loop's thread {cpu['loop']:.1f} s),"
              f" report server's process {cpu['server']:.1f} s ({cpu['server'] / wall:.0%}: "
              f"its writer {cpu['writer']:.1f} s, event loop "
              f"{cpu['requests'] - cpu['workers']:.1f} s, worker threads "
              f"{cpu['workers']:.1f} s), trials' workers {cpu['trials']:.1f} s, in the "
              f"daemon's {wall:.1f} s (load average {os.getloadavg()[0]:.1f} at the end)")
    else:
        print(f"  CPU                daemon's process {cpu['daemon']:.1f} s "
              f"({cpu['daemon'] / wall:.0%} of a core: its loop's thread {cpu['loop']:.1f} s, "
              f"the report writer {cpu.get('writer', 0):.1f} s, requests "
              f"{cpu.get('requests', 0):.1f} s, of which worker threads "
              f"{cpu.get('workers', 0):.1f} s), trials' workers {cpu['trials']:.1f} s, in the "
              f"daemon's {wall:.1f} s (load average {os.getloadavg()[0]:.1f} at the end)")
    sections = r["sections"]
    loop = sum(sections.totals[p] for p in ("intake", "_watch_scripts", "_handle_requests",
                                            "_watch_space", "_search", "_reap", "_schedule"))
    print(f"  daemon loop        {sections.passes} passes, {loop:.1f} s in step "
          f"({loop / max(r['wall'], 1e-9):.0%} of the wall): " + ", ".join(
              f"{name.strip('_')} {sections.totals[name]:.1f} s"
              for name in sections.PARTS if sections.totals[name] >= 0.05))
    steady = [(wall, cpu) for at, wall, cpu in sections.pass_times
              if r["steady_from"] <= at <= r["steady_to"]]
    if steady:
        walls, cpus = sorted(w for w, _ in steady), sorted(c for _, c in steady)
        print(f"  pass cost, steady  {len(steady)} passes: median "
              f"{statistics.median(walls) * 1e3:.1f} ms "
              f"({statistics.median(cpus) * 1e3:.1f} ms CPU), p95 "
              f"{walls[int(0.95 * (len(walls) - 1))] * 1e3:.0f} ms, mean "
              f"{statistics.fmean(walls) * 1e3:.1f} ms ({statistics.fmean(cpus) * 1e3:.1f} ms "
              f"CPU); {sum(cpus) / max(r['steady_decisions'], 1) * 1e3:.2f} ms CPU a decision;"
              f" {args.recorded} finished trials recorded before"
              + (f" (in {r['prefilled']:.0f} s)" if r.get("prefilled") else ""))
    if r["profile"] is not None and args.profile_out:
        r["profile"].dump_stats(args.profile_out)
    if r["profile"] is not None:
        text = io.StringIO()
        stats = pstats.Stats(r["profile"], stream=text)
        stats.sort_stats("cumulative").print_stats(35)
        stats.sort_stats("tottime").print_stats(20)
        print(text.getvalue())
    if r.get("server_profiles"):
        text = io.StringIO()
        stats = pstats.Stats(*r["server_profiles"], stream=text)
        print("  report server's threads, CPU time (time.thread_time):")
        stats.sort_stats("cumulative").print_stats(40)
        stats.sort_stats("tottime").print_stats(25)
        print(text.getvalue())


commits = Commits()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slots", type=int, action="append",
                        help="slots in the cluster (repeatable; default 32, 64 and 256)")
    parser.add_argument("--nodes", type=int, help="nodes (default slots / 8)")
    parser.add_argument("--trials", type=int,
                        help="max_trials (default: enough for --seconds of full slots)")
    parser.add_argument("--seconds", type=float, default=60.0,
                        help="how long the trials keep the slots busy, ideally (default 60)")
    parser.add_argument("--trial-seconds", type=float, default=3.0)
    parser.add_argument("--max-seconds", type=float, default=170.0,
                        help="cut a run off after this long (default 170)")
    parser.add_argument("--workers", type=int, default=1,
                        help="processes hosting the trial threads (default 1)")
    parser.add_argument("--checkpoint-kb", type=int, default=64)
    parser.add_argument("--profile", action="store_true",
                        help="cProfile the daemon's thread by CPU time (slows it down)")
    parser.add_argument("--profile-out", help="also write --profile's stats to this file")
    parser.add_argument("--profile-server", action="store_true",
                        help="cProfile the report server's threads by CPU time")
    parser.add_argument("--recorded", type=int, default=0,
                        help="finished trials of the experiment recorded before the daemon "
                             "starts (its search goes on from them); the pass cost line "
                             "compares sizes")
    parser.add_argument("--in-process", action="store_true",
                        help="the report server in the daemon's process, as before 2025's "
                             "issue 34 (LOCALDET_REPORT_IN_PROCESS=1)")
    parser.add_argument("--keep", action="store_true", help="keep the LOCALDET_HOME")
    parser.add_argument("--smoke", action="store_true",
                        help="a few seconds: 8 slots of 0.5-s trials for 2 s, 20 recorded")
    args = parser.parse_args()
    if args.smoke:
        args.slots, args.nodes = args.slots or [8], args.nodes or 2
        args.seconds, args.trial_seconds, args.max_seconds = 2.0, 0.5, 60.0
        args.recorded = args.recorded or 20
    if args.in_process:
        os.environ["LOCALDET_REPORT_IN_PROCESS"] = "1"
    commits.install()
    results = {}
    for slots in args.slots or [32, 64, 256]:
        nodes = args.nodes or max(1, slots // 8)
        trials = args.trials or int(slots * args.seconds / args.trial_seconds)
        results[slots] = run(slots, nodes, trials, args)
        report(slots, nodes, trials, results[slots], args)
    if len(results) > 1:
        base_slots = min(results)
        base = results[base_slots]
        print(f"\nratios to {base_slots} slots:")
        for slots, r in sorted(results.items()):
            print(f"  {slots:4d} slots: decisions/s "
                  f"x{r['decisions_per_s'] / base['decisions_per_s']:.2f}"
                  f" (ideal x{slots / base_slots:.0f}), commits/s "
                  f"x{r['commits_per_s'] / base['commits_per_s']:.2f}, utilisation "
                  f"{r['utilisation'] / base['utilisation']:.2f}, steady utilisation "
                  f"{r['steady_utilisation'] / base['steady_utilisation']:.2f}, median latency "
                  f"x{r['latency_median'] / base['latency_median']:.2f}")


if __name__ == "__main__":
    main()
