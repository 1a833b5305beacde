"""A daemon's pass reads what is live, never what is finished: the same passes over an
experiment with ten times as many finished trials run the same SQLite work.

The work is counted in SQLite virtual-machine instructions on the daemon's connection
(`set_progress_handler`), not in seconds: an indexed lookup is a fixed number of them
whatever the table's size, a scan of an experiment's trials, checkpoints or metrics grows
with it. The trials are a fake cluster's (no process); everything else is the real daemon,
search and retention.
"""

from __future__ import annotations

import uuid

from localdet.config.experiment import parse_config
from localdet.daemon.daemon import Daemon
from localdet.records.db import StateDB, now
from localdet.search.driver import Search

MODEL_DEF = "class Trial:\n    pass\n"
LENGTH = 10


class _Handle:
    warm, log_writer, orphaned, lost = False, None, False, False

    def __init__(self, trial_id: int):
        self.trial_id, self.pid, self.node, self.host = trial_id, 1, "node0", "node0"
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        return self.returncode


class _Cluster:
    """RayCluster's surface over two slots of one node; a launch is only a handle."""

    def __init__(self):
        from localdet.scheduling.slots import CPU, Slot

        self._slots = [Slot(i, CPU, "CPU on node0") for i in range(2)]
        self.handles: dict[int, _Handle] = {}

    def slots(self):
        return list(self._slots)

    def available(self) -> set[int]:
        return {0, 1}

    def largest_node_seen(self) -> list[int]:
        return [2]

    def node_key(self, slot: int):
        return 0.0, "node0"

    def node_of(self, slot: int) -> str:
        return "node0"

    def node_alive(self, node: str) -> bool:
        return True

    def describe_node(self, node: str) -> str:
        return node

    def report_host(self) -> str:
        return "127.0.0.1"

    def start(self, spec, trial, slots):
        self.handles[trial.id] = _Handle(trial.id)
        return self.handles[trial.id]

    def adopt(self, trial, log_path, max_log_bytes):
        return None

    def close(self) -> None:
        pass


def _finish_trial(db: StateDB, trial_id: int, value: float) -> None:
    """What a trial reports before it exits: training to its length, a validation there
    and a checkpoint there (one shared fake blob: nothing reads it)."""
    trial = db.trial(trial_id)
    experiment_id = trial.experiment_id
    db.record_metrics(trial_id, "training", LENGTH, {"loss": value})
    db.record_metrics(trial_id, "validation", LENGTH, {"val_loss": value})
    db.add_checkpoint({"uuid": str(uuid.uuid4()), "experiment_id": experiment_id,
                       "trial_id": trial_id, "batches_trained": LENGTH, "size_bytes": 1,
                       "metadata": {}, "created_at": now(),
                       "files": {"model.h5": {"sha256": "0" * 64, "size": 1}}})


def _instructions_of_passes(tmp_path, recorded: int) -> int:
    from localdet.paths import Layout

    layout = Layout(tmp_path / "home").ensure()
    model = tmp_path / "model"
    model.mkdir()
    (model / "model_def.py").write_text(MODEL_DEF)
    config = parse_config({
        "entrypoint": "model_def:Trial", "hyperparameters": {"global_batch_size": 8,
                                                             "x": {"type": "double",
                                                                   "minval": 0, "maxval": 1}},
        "searcher": {"name": "random", "metric": "val_loss", "max_length": LENGTH,
                     "max_trials": recorded + 100, "max_concurrent_trials": 2},
        "max_restarts": 0}).config
    db = StateDB.open(layout.db)
    trials = StateDB.open(layout.db)  # the trials' own connection
    try:
        experiment_id = db.create_experiment(
            name="scale", description="", config=config, original_config="",
            searcher="random", metric="val_loss", smaller_is_better=True, experiment_seed=1,
            model_dir=str(model))
        search = Search(db, log=lambda message: None)
        search.start(db.experiment(experiment_id))
        for n in range(recorded):  # finished before the daemon starts
            (trial_id,) = db.db.execute(
                "SELECT id FROM trials WHERE experiment_id = ? AND state = 'QUEUED' "
                "ORDER BY id LIMIT 1", [experiment_id]).fetchone()
            db.update_trial(trial_id, state="RUNNING", pid=1)
            _finish_trial(db, trial_id, n / recorded)
            search.validation_completed(db.experiment(experiment_id), db.trial(trial_id),
                                        n / recorded)
        cluster = _Cluster()
        daemon = Daemon(layout, cluster=cluster, log=lambda message: None).open(db)
        daemon.step()
        # Once a daemon: the search method's state replayed from the recorded events.
        daemon.search.method(db.experiment(experiment_id))
        count = [0]

        def counted() -> int:
            count[0] += 1
            return 0

        db.db.conn.set_progress_handler(counted, 10)
        for _ in range(4):  # four exits and four launches a round, at any size
            for trial_id, handle in list(cluster.handles.items()):
                if handle.returncode is None:
                    _finish_trial(trials, trial_id, 0.5)
                    handle.returncode = 0
            daemon.step()
        db.db.conn.set_progress_handler(None, 0)
        states = dict(db.db.execute("SELECT state, COUNT(*) FROM trials GROUP BY state"))
        assert states.get("COMPLETED") == recorded + 8, states  # the passes did their work
        assert states.get("RUNNING") == 2, states
        return count[0]
    finally:
        trials.close()
        db.close()


def test_a_pass_does_the_same_work_with_ten_times_the_finished_trials(tmp_path):
    small = _instructions_of_passes(tmp_path / "small", 30)
    large = _instructions_of_passes(tmp_path / "large", 300)
    # A scan of the experiment's trials (or checkpoints, metrics, events) in any part of
    # the pass would add thousands here; indexed lookups add nothing.
    assert large <= small * 1.1, (small, large)
