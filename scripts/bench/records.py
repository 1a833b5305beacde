"""Do a thousand trials stay fast? The dashboard, `localdet status` and the daemon's pass
over an experiment of 1,000 trials with 1.1 million metric rows.

Builds a state folder (a temporary LOCALDET_HOME): `--others` experiments (200) as
`scripts/bench/cli.py` builds them (its `build`: the real search driver, records API), then
one random search of `--trials` trials (1,000) created by the real search driver 16 at a
time, each launched, with `--rows` training rows (1,000, every 100 batches) and
`--validations` validation rows (100) recorded in bulk, the rows of trials running together
interleaved as a daemon records them (`fill_experiment`, also used by
tests/test_records_scale.py), one checkpoint each; all but its last four trials completed,
those four RUNNING half-way (the search is still ACTIVE). Then times, each the fastest of
`--repeats` runs (the first run too, where it differs):

- the experiments list's data (`/api/experiments`, `/api/daemon`), where a user starts: the
  dashboard then imports Optuna in a thread, for the experiment page's importances;
- the experiment page's data: what the page's script requests, from the real dashboard
  (`localdet web`, its own process, with its token), as the browser requests it
  (`/api/experiments/ID`, `/api/daemon`), seconds and bytes; target <= 0.5 s and < 2 MB.
  The first view also computes the importances and caches them;
- one trial's page's data (`/api/trials/ID`, `/api/daemon`); the same targets;
- every point of the drawn trials' curves, on request (`/api/experiments/ID/curves?full=1`);
- `localdet status ID` (a subprocess, as typed: the best, the running and the latest trials,
  a line counting the rest); target <= 0.5 s (its CPU seconds beside); `--all`, every row
  (no target);
- `localdet metrics ID --csv` (every row; no target);
- the daemon's pass (`Daemon.step` over this database, one slot, nothing to launch); no
  target here: scripts/bench/cluster.py measures how it grows with finished trials.

    python scripts/bench/records.py            # builds (~40 s), times, removes
    python scripts/bench/records.py --keep     # keeps the folder and says where
    python scripts/bench/records.py --home F   # times a folder kept before
    python scripts/bench/records.py --smoke    # 20 trials x 50 rows, 3 others: seconds

Each run has a cache folder of its own (LOCALDET_CACHE), empty at first: `status`'s first
run (before the dashboard's) summarises the validations, which later runs read from it
(localdet/operations/kept_summaries.py), and the page's first view computes the importances.

Timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid as uuidlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
PAGE_SECONDS, PAGE_BYTES, STATUS_SECONDS = 0.5, 2_000_000, 0.5
TRAIN_EVERY = 100  # batches between training rows
BIG_NAME = "thousand-trials"


def fill_experiment(db, trials: int, rows: int, validations: int, *, running: int = 4,
                    name: str = BIG_NAME, seed: int = 0) -> int:
    """One random search of `trials` trials recorded as the daemon and the trial processes
    would have left it (created by the real search driver, 16 at a time, launched, a
    checkpoint each), with `rows` training rows (every 100 batches) and `validations`
    validation rows a trial, inserted in bulk, the rows of the trials running together
    interleaved; the last `running` trials RUNNING with half their rows, the rest completed.
    Returns the experiment's id."""
    from localdet.checkpoints.manifest import build_manifest
    from localdet.checkpoints.store import FileEntry
    from localdet.config.experiment import parse_config
    from localdet.records.db import now
    from localdet.records.states import TrialState
    from localdet.search.driver import Search

    rng = random.Random(seed)
    length = rows * TRAIN_EVERY
    validate_every = length // max(1, validations)
    config = parse_config({
        "name": name, "entrypoint": "model_def:DigitsTrial",
        "hyperparameters": {"global_batch_size": 32,
                            "learning_rate": {"type": "log", "base": 10, "minval": -4,
                                              "maxval": -1},
                            "hidden_units": {"type": "int", "minval": 16, "maxval": 256},
                            "dropout": {"type": "double", "minval": 0.0, "maxval": 0.5}},
        "searcher": {"name": "random", "metric": "val_loss", "smaller_is_better": True,
                     "max_length": {"batches": length}, "max_trials": trials,
                     "max_concurrent_trials": 16},
        "checkpoint_storage": {"save_trial_latest": 1, "save_trial_best": 0,
                               "save_experiment_best": 0},
    }).config
    search = Search(db, log=lambda message: None)
    with db.atomic():
        experiment_id = db.create_experiment(
            name=name, description=f"random search of {trials} trials", config=config,
            original_config=json.dumps(config), searcher="random", metric="val_loss",
            smaller_is_better=True, experiment_seed=seed, model_dir="/nonexistent/model")
        experiment = db.experiment(experiment_id)
        search.start(experiment)
    made = 0
    while made < trials:
        # The trials queued together train together: their rows interleave in the table,
        # as a daemon running them side by side records them.
        queued = db.trials(experiment_id, states=(TrialState.QUEUED,))
        if not queued:
            break
        rows_of, best_of, ends = [], {}, {}
        with db.atomic():
            at = now()
            for trial in queued:
                made += 1
                db.update_trial(trial.id, state=TrialState.RUNNING,
                                pid=rng.randrange(2, 99999), started_at=at,
                                slots=json.dumps([made % 8]))
                db.log_event("trial_launched", experiment_id=experiment_id,
                             trial_id=trial.id, pid=1, slots=[made % 8], keras_line="keras3",
                             keras_line_reason="rule default, decided by TensorFlow 2.21 "
                                               "(Keras 3)", engine="single", log_offset=0,
                             warm=True)
                db.log_event("trial_first_batch", experiment_id=experiment_id,
                             trial_id=trial.id, seconds=round(rng.uniform(0.8, 3.5), 2))
                ends[trial.id] = length // 2 if made > trials - running else length
                loss, best = rng.uniform(0.5, 2.5), float("inf")
                for batches in range(TRAIN_EVERY, ends[trial.id] + 1, TRAIN_EVERY):
                    loss *= rng.uniform(0.995, 1.0)
                    noisy = loss * rng.uniform(0.97, 1.03)
                    rows_of.append((batches, trial.id, "training", json.dumps(
                        {"loss": noisy, "accuracy": 1 - noisy / 3})))
                    if batches % validate_every == 0:
                        best = min(best, loss * 1.1)
                        rows_of.append((batches, trial.id, "validation", json.dumps(
                            {"val_loss": loss * 1.1, "val_accuracy": 1 - loss / 3})))
                best_of[trial.id] = best
            rows_of.sort(key=lambda row: row[0])  # stable: each batch's rows, trial by trial
            db.db.conn.executemany(
                "INSERT INTO metrics (trial_id, kind, batches_trained, metrics, recorded_at) "
                "VALUES (?, ?, ?, ?, ?)",
                [(trial_id, kind, batches, text, at) for batches, trial_id, kind, text in rows_of])
            for trial in queued:
                end = ends[trial.id]
                db.db.execute("UPDATE trials SET batches_trained = ? WHERE id = ?",
                              [end, trial.id])
                files = {"determined-keras-model.h5": FileEntry(
                             f"{rng.getrandbits(256):064x}", 2_400_000),
                         "trial_state.json": FileEntry(f"{rng.getrandbits(256):064x}", 300)}
                db.add_checkpoint(build_manifest(
                    uuid=str(uuidlib.UUID(int=rng.getrandbits(128))),
                    experiment_id=experiment_id, trial_id=trial.id, batches_trained=end,
                    files=files, metadata={"framework": "tensorflow", "steps_completed": end}))
        for trial in queued:
            if ends[trial.id] == length:  # the rest stay RUNNING, part-way
                search.validation_completed(experiment, db.trial(trial.id),
                                            metric=best_of[trial.id])
    return experiment_id


def build(home: Path, others: int, other_trials: int, trials: int, rows: int,
          validations: int) -> int:
    """The state folder: the other experiments (cli.py's build), then the big one."""
    sys.path.insert(0, str(HERE))
    from cli import build as build_others  # scripts/bench/cli.py

    from localdet.paths import Layout
    from localdet.records.db import StateDB

    if others:
        build_others(home, others, other_trials)
    layout = Layout(home).ensure()
    with StateDB.open(layout.db) as db:
        experiment_id = fill_experiment(db, trials, rows, validations)
        counts = {table: db.db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
                  for table in ("experiments", "trials", "metrics")}
    print("recorded: " + ", ".join(f"{n} {table}" for table, n in counts.items())
          + f"; the big experiment is {experiment_id}", file=sys.stderr)
    return experiment_id


# -- timing -------------------------------------------------------------------------------

def _localdet() -> list[str]:
    script = Path(sys.executable).parent / "localdet"
    return [str(script)] if script.exists() else [sys.executable, "-m", "localdet"]


class Dashboard:
    """`localdet web` in its own process on a free port; requests carry its token."""

    def __init__(self, env: dict):
        sys.path.insert(0, str(HERE.parents[1] / "tests"))
        from browser import free_port  # tests/browser.py

        self.process = subprocess.Popen(
            [*_localdet(), "web", "--port", str(free_port())], env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        line = self.process.stderr.readline() if self.process.stderr else ""
        found = re.search(r"(http://\S+)/\?token=(\S+)", line)
        if not found:
            self.close()
            raise RuntimeError(f"the dashboard did not start: {line.strip()}")
        self.url, self.token = found.groups()
        for _ in range(200):  # until it answers
            try:
                self.get("/api/daemon")
                break
            except OSError:
                time.sleep(0.05)

    def get(self, path: str) -> tuple[float, int, bytes]:
        request = urllib.request.Request(self.url + path,
                                         headers={"Authorization": f"Bearer {self.token}",
                                                  "Accept-Encoding": "identity"})
        start = time.perf_counter()
        with urllib.request.urlopen(request, timeout=300) as response:
            body = response.read()
        return time.perf_counter() - start, len(body), body

    def cpu(self) -> float:
        """The server process's CPU seconds so far (user and system, all its threads)."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(30)


def time_page(dashboard: Dashboard, paths: list[str],
              repeats: int) -> tuple[float, float, int, float]:
    """(first, fastest) seconds for all of a page's data requests one after another, as
    the page's script makes them, their bytes, and the least CPU seconds the dashboard's
    process spent on them (a measure that others' work on the machine moves less)."""
    totals, cpu, size = [], [], 0
    for _ in range(repeats):
        before = dashboard.cpu()
        results = [dashboard.get(path) for path in paths]
        cpu.append(dashboard.cpu() - before)
        totals.append(sum(r[0] for r in results))
        size = sum(r[1] for r in results)
    return totals[0], min(totals), size, min(cpu)


def _verdict(seconds: float, target: float, size: int | None = None) -> str:
    fits = seconds <= target and (size is None or size < PAGE_BYTES)
    return f"{seconds / target:5.2f}x target  {'yes' if fits else 'NO'}"


def time_daemon_pass(home: Path, repeats: int) -> tuple[float, float]:
    """(first, fastest) seconds of `Daemon.step` over this database, on no slots free to
    launch on (every trial it might launch would need a TensorFlow process)."""
    from localdet.daemon.daemon import Daemon
    from localdet.paths import Layout

    daemon = Daemon(Layout(home), slots=1, warm=0, log=lambda message: None).open()
    try:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            daemon.step()
            times.append(time.perf_counter() - start)
        return times[0], min(times)
    finally:
        daemon.pool.close()
        daemon.db.close()


def measure(home: Path, experiment_id: int, repeats: int) -> None:
    sys.path.insert(0, str(HERE))
    from cli import best_of  # scripts/bench/cli.py

    from localdet.paths import Layout
    from localdet.records.db import StateDB

    with StateDB.open(Layout(home).db) as db:
        trial_id = db.trials(experiment_id)[len(db.trials(experiment_id)) // 2].id
        rows = db.db.execute("SELECT COUNT(*) FROM metrics WHERE trial_id IN (SELECT id FROM "
                             "trials WHERE experiment_id = ?)", [experiment_id]).fetchone()[0]
    # A cache of its own (importances, kept validation summaries): the first runs start cold.
    cache = tempfile.mkdtemp(prefix="localdet-records-bench-cache-")
    env = {**os.environ, "LOCALDET_HOME": str(home), "COLUMNS": "160", "LOCALDET_CACHE": cache}
    env.pop("DET_MASTER", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    print(f"experiment {experiment_id}: {rows} metric rows; trial {trial_id} for its page")
    print(f"{'what':<44} {'first s':>8} {'best s':>8} {'bytes':>10}  ratio / verdict")
    start = time.perf_counter()  # `status`'s first run, cold (printed below)
    subprocess.run([*_localdet(), "status", str(experiment_id)], env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    status_first = time.perf_counter() - start
    dashboard = Dashboard(env)
    try:
        for label, paths in (
                ("experiments list data (where a user starts)",
                 ["/api/experiments", "/api/daemon"]),
                (f"experiment page data ({experiment_id})",
                 [f"/api/experiments/{experiment_id}", "/api/daemon"]),
                (f"trial page data ({trial_id})", [f"/api/trials/{trial_id}", "/api/daemon"])):
            first, best, size, cpu = time_page(dashboard, paths, repeats)
            print(f"{label:<44} {first:8.3f} {best:8.3f} {size:10d}  "
                  f"{_verdict(best, PAGE_SECONDS, size)} (<= {PAGE_SECONDS} s, < 2 MB; "
                  f"server CPU {cpu:.3f} s)")
        full = f"/api/experiments/{experiment_id}/curves?full=1"
        try:
            first, best, size, _ = time_page(dashboard, [full], 1)
            print(f"{'full curves on request':<44} {first:8.3f} {best:8.3f} {size:10d}  "
                  "(no target)")
        except OSError as error:
            print(f"{'full curves on request':<44} not served here: {error}")
    finally:
        dashboard.close()
    seconds, cpu, failure = best_of([*_localdet(), "status", str(experiment_id)], env,
                                    repeats)
    print(f"{f'localdet status {experiment_id}':<44} {status_first:8.3f} {seconds:8.3f} {'':>10}  "
          + (f"FAILED: {failure}" if failure else
             f"{_verdict(seconds, STATUS_SECONDS)} (<= {STATUS_SECONDS} s; CPU {cpu:.3f} s)"))
    seconds, cpu, failure = best_of([*_localdet(), "status", str(experiment_id), "--all"], env,
                                    repeats)
    print(f"{f'localdet status {experiment_id} --all':<44} {'':>8} {seconds:8.3f} {'':>10}  "
          + (f"FAILED: {failure}" if failure else f"every row (no target; CPU {cpu:.3f} s)"))
    start = time.perf_counter()
    done = subprocess.run([*_localdet(), "metrics", str(experiment_id), "--csv"], env=env,
                          capture_output=True)
    seconds = time.perf_counter() - start
    lines = done.stdout.count(b"\n") - 1
    print(f"{f'localdet metrics {experiment_id} --csv':<44} {seconds:8.3f} {'':>8} "
          f"{len(done.stdout):10d}  {lines} rows (no target)"
          + (f" FAILED: {done.stderr.decode().strip().splitlines()[-1:]}"
             if done.returncode else ""))
    first, best = time_daemon_pass(home, repeats)
    print(f"{'daemon pass (Daemon.step)':<44} {first:8.3f} {best:8.3f} {'':>10}  (no target "
          "here; scripts/bench/cluster.py)")
    print(f"(fastest of {repeats} runs; load average {os.getloadavg()[0]:.2f}; "
          f"{os.cpu_count()} CPUs)")
    shutil.rmtree(cache, ignore_errors=True)


parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--trials", type=int, default=1000)
parser.add_argument("--rows", type=int, default=1000, help="training rows a trial")
parser.add_argument("--validations", type=int, default=100, help="validation rows a trial")
parser.add_argument("--others", type=int, default=200, help="other experiments")
parser.add_argument("--other-trials", type=int, default=1000,
                    help="trials of the other experiments in all")
parser.add_argument("--repeats", type=int, default=5)
parser.add_argument("--home", type=Path, help="time this state folder (built by --keep)")
parser.add_argument("--keep", action="store_true", help="keep the state folder it builds")
parser.add_argument("--smoke", action="store_true",
                    help="20 trials x 50 rows, 3 other experiments, one run each: seconds")


def main() -> None:
    args = parser.parse_args()
    if args.smoke:
        args.trials, args.rows, args.validations = 20, 50, 5
        args.others, args.other_trials, args.repeats = 3, 6, 1
    home = args.home
    built = home is None
    if built:
        home = Path(tempfile.mkdtemp(prefix="localdet-records-bench-"))
        start = time.perf_counter()
        print(f"building {args.others} experiments and one of {args.trials} trials x "
              f"{args.rows} + {args.validations} rows in {home}", file=sys.stderr)
        experiment_id = build(home, args.others, args.other_trials, args.trials, args.rows,
                              args.validations)
        print(f"built in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    else:
        from localdet.paths import Layout
        from localdet.records.db import StateDB

        with StateDB.open(Layout(home).db) as db:
            found = db.db.execute("SELECT id FROM experiments WHERE name = ? ORDER BY id DESC",
                                  [BIG_NAME]).fetchone()
        if found is None:
            sys.exit(f"{home} has no experiment named {BIG_NAME}; build one with --keep")
        experiment_id = found[0]
    try:
        measure(home, experiment_id, args.repeats)
    finally:
        sys.path.insert(0, str(HERE))
        from cli import done_with  # scripts/bench/cli.py

        done_with(home, built, args.keep)


if __name__ == "__main__":
    main()
