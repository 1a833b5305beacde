"""A trial whose work is all recorded ends at once (its search goes on), while its process
may tear down for seconds more. On this machine its slot passes to the next trial at once;
on a cluster the launch holds its slots there until it ends (a Ray actor's resources are
freed only when the actor is), so the daemon keeps them busy until then: launching on them
earlier would wait on the cluster, the daemon with it. The daemon, search and records are
real; the cluster is test_daemon_pass_scale's fake, its handles told when to end."""

from __future__ import annotations

import pytest
from test_daemon_pass_scale import MODEL_DEF, _Cluster, _finish_trial, _Handle

from localdet.config.experiment import parse_config
from localdet.daemon.daemon import Daemon
from localdet.paths import Layout
from localdet.records.db import StateDB


class _HeldHandle(_Handle):
    slots_held_until_exit = True


class _HoldingCluster(_Cluster):
    def start(self, spec, trial, slots):
        self.handles[trial.id] = _HeldHandle(trial.id)
        return self.handles[trial.id]


@pytest.mark.parametrize("cluster_kind", [_HoldingCluster, _Cluster])
def test_a_tearing_down_launch_keeps_its_slots_until_it_ends_where_the_cluster_holds_them(
        tmp_path, cluster_kind):
    layout = Layout(tmp_path / "home").ensure()
    model = tmp_path / "model"
    model.mkdir()
    (model / "model_def.py").write_text(MODEL_DEF)
    config = parse_config({
        "entrypoint": "model_def:Trial", "hyperparameters": {
            "global_batch_size": 8, "x": {"type": "categorical", "vals": [1, 2, 3]}},
        "searcher": {"name": "grid", "metric": "val_loss", "max_length": 10},
        "max_restarts": 0}).config
    db = StateDB.open(layout.db)
    try:
        db.create_experiment(
            name="held", description="", config=config, original_config="", searcher="grid",
            metric="val_loss", smaller_is_better=True, experiment_seed=1, model_dir=str(model))
        cluster = cluster_kind()
        daemon = Daemon(layout, cluster=cluster, log=lambda message: None).open(db)
        daemon.step()
        first, second = sorted(cluster.handles)  # the two slots taken, the third waits
        _finish_trial(db, first, 0.5)  # its work recorded; its process still runs
        daemon.step()
        assert db.trial(first).state == "COMPLETED"
        holds = cluster_kind is _HoldingCluster
        assert len(cluster.handles) == (2 if holds else 3)
        if holds:
            assert daemon.running() == {second}
            assert sorted(daemon.watched.slots_of) == [first, second]
            cluster.handles[first].returncode = 0  # it ends: the cluster frees its slot
            daemon.step()
            assert len(cluster.handles) == 3 and first not in daemon.watched.slots_of
    finally:
        db.close()
