"""Requests never race: pause, resume and kill, for experiments and single trials, sent at
random moments of a trial's life (queued, launching, training, pausing, checkpointing,
exiting, restarting after a crash) and to each other, end where the last request says.

One real daemon on 6 CPU slots runs 80 seeded sequences (RACE_SEQUENCES=1000 for a longer
hunt), 6 at a time, of the counter trial
(`tests/trials/counter`: a real trial process that trains in milliseconds through the
`TrialReporter` seam). After each sequence has settled:

- each trial ends as the last request that reached it implies (a kill is final: nothing
  after it revives a trial): kill -> CANCELED, pause -> PAUSED, resume (or none) ->
  COMPLETED; COMPLETED is also right after a pause or kill that came too late (the trial
  had trained its last workload, or had ended);
- the experiment follows: CANCELED after a kill of it, PAUSED while a trial is paused, else
  COMPLETED (or CANCELED when every trial was killed);
- no trial is PAUSED under an ACTIVE experiment with nothing running;
- every COMPLETED trial's final weights equal an uninterrupted run's, bit for bit; sequences
  that ended PAUSED are then resumed and must complete with those weights too.
"""

from __future__ import annotations

import json
import random
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from conftest import TEST_TRIALS, wait_for

pytestmark = pytest.mark.slow

SEQUENCES = int(__import__("os").environ.get("RACE_SEQUENCES", 80))
WORKERS = 6
TARGET = 12
COUNTER = TEST_TRIALS / "counter"
SETTLED = ("COMPLETED", "CANCELED", "ERROR", "PAUSED")


def counter_config(folder: Path, name: str, searcher: str, crash_at: int) -> Path:
    variant = {"type": "categorical", "vals": [0, 1]} if searcher == "grid" else 0
    config = {
        "name": name, "entrypoint_script": "python3 train.py",
        "hyperparameters": {"variant": variant, "batch_seconds": 0.03,
                            "checkpoint_seconds": 0.15, "crash_at": crash_at},
        "searcher": {"name": searcher, "metric": "val_loss", "smaller_is_better": True,
                     "max_length": {"batches": TARGET}},
        "scheduling_unit": 2, "min_checkpoint_period": {"batches": 4},
        "max_restarts": 1, "reproducibility": {"experiment_seed": 5},
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


class Bench:
    """The daemon's state folder, seen from the test process (as the CLI sees it)."""

    def __init__(self, layout, tmp_path: Path):
        self.layout = layout
        self.tmp_path = tmp_path
        self.local = threading.local()

    @property
    def db(self):
        from localdet.records.db import StateDB

        if not hasattr(self.local, "db"):  # SQLite connections stay in their thread
            self.local.db = StateDB.open(self.layout.db)
        return self.local.db

    def submit(self, name: str, searcher: str, crash_at: int = 0) -> int:
        from localdet.daemon.submissions import submit

        submit(self.layout, counter_config(self.tmp_path, name, searcher, crash_at), COUNTER)
        return wait_for(lambda: next((e.id for e in self.db.experiments() if e.name == name),
                                     None), 120, f"experiment {name} to be accepted", 0.05)

    def settled(self, experiment_id: int) -> bool:
        # One read transaction, one snapshot: a request the daemon carries out between two
        # separate reads (trials read PAUSED, then the resume gone from the pending ones)
        # would look settled.
        conn = self.db.db.conn
        conn.execute("BEGIN")
        try:
            experiment = self.db.experiment(experiment_id)
            trials = self.db.trials(experiment_id)
            pending = [r for r in self.db.pending_requests()
                       if r["experiment_id"] == experiment_id
                       or r["trial_id"] in {t.id for t in trials}]
        finally:
            conn.rollback()
        return (not pending and experiment.state in SETTLED
                and not any(t.state in ("RUNNING", "QUEUED") for t in trials))

    def weights(self, trial) -> list[float]:
        from localdet.reporting.sqlite_reporter import CheckpointReader

        folder = self.tmp_path / "exported" / trial.latest_checkpoint
        if not folder.exists():
            CheckpointReader(self.layout).materialize(trial.latest_checkpoint, folder)
        return json.loads((folder / "state.json").read_text())["weights"]

    def requests(self, experiment_id: int) -> list[dict]:
        trial_ids = {t.id for t in self.db.trials(experiment_id)}
        return [r for r in self.db.db["requests"].rows_where(order_by="id")
                if r["experiment_id"] == experiment_id or r["trial_id"] in trial_ids]

    def event_at(self, trial_id: int | None, state: str,
                 experiment_id: int | None = None) -> str | None:
        """When the trial (or, with no trial, the experiment) last entered `state`."""
        kind = "trial_state" if trial_id is not None else "experiment_state"
        rows = [e for e in self.db.events(experiment_id) if e["kind"] == kind
                and e["trial_id"] == trial_id and e["payload"]["state"] == state]
        return rows[-1]["at"] if rows else None

    def trained_after(self, trial_id: int, at: str) -> bool:
        """Whether the trial passed a workload boundary short of its end after `at`: the
        moment it asks whether to pause."""
        return any(row.recorded_at > at and row.batches_trained < TARGET
                   for row in self.db.metrics(trial_id, "training"))


def expected_trial_state(bench: Bench, trial, requests: list[dict]) -> set[str]:
    reaching = [r for r in requests if r["trial_id"] in (None, trial.id)]
    kills = [r for r in reaching if r["action"] == "kill"]
    last = kills[0] if kills else reaching[-1] if reaching else None  # a kill is final
    if last is None or last["action"] == "resume":
        return {"COMPLETED"}
    if last["action"] == "kill":
        completed = bench.event_at(trial.id, "COMPLETED", trial.experiment_id)
        return {"CANCELED", "COMPLETED"} if completed and completed < last["handled_at"] \
            else {"CANCELED"}
    # A pause reaches a trial at its next boundary short of the end.
    return {"PAUSED"} if bench.trained_after(trial.id, last["handled_at"]) \
        else {"PAUSED", "COMPLETED"}


def check_settled(bench: Bench, experiment_id: int, references: dict, label: str) -> str:
    experiment = bench.db.experiment(experiment_id)
    trials = bench.db.trials(experiment_id)
    requests = bench.requests(experiment_id)
    for trial in trials:
        allowed = expected_trial_state(bench, trial, requests)
        assert trial.state in allowed, (
            f"{label}: trial {trial.id} is {trial.state}, expected {allowed}; "
            f"requests {[(r['action'], r['trial_id']) for r in requests]}")
        if trial.state == "COMPLETED":
            assert bench.weights(trial) == references[(experiment.searcher, trial.request_id)], (
                f"{label}: trial {trial.id}'s final weights differ from an uninterrupted run's")
    states = {t.state for t in trials}
    assert not (experiment.state == "ACTIVE" and "PAUSED" in states
                and not states & {"RUNNING", "QUEUED"}), f"{label}: stuck ACTIVE with PAUSED trials"
    killed = [r for r in requests if r["trial_id"] is None and r["action"] == "kill"]
    if killed:
        completed = bench.event_at(None, "COMPLETED", experiment_id)
        allowed = {"CANCELED", "COMPLETED"} if completed and completed < killed[0][
            "handled_at"] else {"CANCELED"}
    elif "PAUSED" in states or not trials:  # paused before its search made a trial
        allowed = {"PAUSED"}
    else:
        allowed = {"COMPLETED"} if "COMPLETED" in states else {"CANCELED"}
    assert experiment.state in allowed, (
        f"{label}: experiment is {experiment.state}, expected {allowed}; trials {states}")
    return experiment.state


def run_sequence(bench: Bench, index: int, references: dict, tally: dict,
                 lock: threading.Lock) -> None:
    from localdet.records.actions import ActionError, request

    rng = random.Random(index)
    searcher = rng.choice(["single", "single", "single", "grid"])
    crash_at = rng.choice([0, 0, 0, 5])
    experiment_id = bench.submit(f"race-{index}", searcher, crash_at)
    sent = []
    for _ in range(rng.randint(1, 5)):
        time.sleep(rng.choice([0.0, rng.uniform(0, 0.15), rng.uniform(0.15, 0.5),
                               rng.uniform(0, 0.9)]))
        # Mostly the other of pause and resume: a request that changes nothing is refused.
        paused = sent and sent[-1].startswith("pause")
        action = rng.choices(["pause", "resume", "kill"],
                             [0.3, 0.6, 0.1] if paused else [0.6, 0.25, 0.15])[0]
        trials = bench.db.trials(experiment_id)
        trial_id = rng.choice(trials).id if trials and rng.random() < 0.4 else None
        try:
            request(bench.layout, bench.db, action,
                    experiment_id=None if trial_id else experiment_id, trial_id=trial_id)
            sent.append(f"{action}{'@trial' if trial_id else ''}")
        except ActionError:
            sent.append(f"({action} refused)")
    label = f"sequence {index} ({searcher}, crash_at={crash_at}): {' '.join(sent)}"
    wait_for(lambda: bench.settled(experiment_id), 120, f"{label} to settle", 0.1)
    end = check_settled(bench, experiment_id, references, label)
    if end == "PAUSED":  # then it must finish exactly as if never stopped
        request(bench.layout, bench.db, "resume", experiment_id=experiment_id)
        wait_for(lambda: bench.settled(experiment_id), 120, f"{label} to finish", 0.1)
        assert check_settled(bench, experiment_id, references, label + " resume") in (
            "COMPLETED", "CANCELED")
    with lock:
        tally[end] = tally.get(end, 0) + 1
        tally["requests"] = tally.get("requests", 0) + sum("refused" not in s for s in sent)
        tally["refused"] = tally.get("refused", 0) + sum("refused" in s for s in sent)


def test_random_request_sequences_end_where_the_last_request_says(home, tmp_path, daemons):
    from localdet.paths import Layout

    layout = Layout(home.path)
    # Launches fork from one warm process: the kills then land in the moment right after a
    # fork too (a trial killed before its session existed once held the daemon's write lock).
    daemon = daemons(home, "--slots", str(WORKERS), "--warm", "1")
    bench = Bench(layout, tmp_path)
    references = {}
    for searcher in ("single", "grid"):  # uninterrupted runs, one at a time
        experiment_id = bench.submit(f"reference-{searcher}", searcher)
        wait_for(lambda experiment_id=experiment_id:
                 bench.db.experiment(experiment_id).state == "COMPLETED", 120,
                 f"the {searcher} reference to complete", 0.1)
        for trial in bench.db.trials(experiment_id):
            references[(searcher, trial.request_id)] = bench.weights(trial)
    tally, lock = {}, threading.Lock()
    with ThreadPoolExecutor(WORKERS) as pool:
        for future in [pool.submit(run_sequence, bench, i, references, tally, lock)
                       for i in range(SEQUENCES)]:
            future.result()
    print(f"{SEQUENCES} sequences: {tally}")
    assert daemon.process.poll() is None, "the daemon died"
    assert "unexpected error" not in daemon.log_path.read_text()
    assert sum(tally.get(s, 0) for s in SETTLED) == SEQUENCES
    # The draw covers every ending, so each rule above was exercised.
    assert all(tally.get(s, 0) > 0 for s in ("COMPLETED", "CANCELED", "PAUSED"))
    # ... and the resume that came while its trial was already pausing (it had seen
    # the pause and was checkpointing to exit) relaunched that trial.
    requeued = daemon.log_path.read_text().count("queued again as resumed")
    print(f"resumed while pausing, relaunched: {requeued}")
    assert requeued > 0
    daemon.stop()
    shutil.rmtree(tmp_path / "exported", ignore_errors=True)
