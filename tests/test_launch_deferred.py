"""A cluster that cannot start a trial for now (its slots not yet released by the trial
before, a node gone meanwhile: `LaunchDeferred`) leaves the trial queued, its restarts
untouched (max_restarts is often 0), tries it again on the next pass, and ends it with the
reason after MAX_DEFERRALS tries in a row; a launch that fails for the trial's own reasons
(`LaunchError`) ends it at once. The daemon, its search and its records are real; the cluster
is test_daemon_pass_scale's fake, made to refuse."""

from __future__ import annotations

from test_daemon_pass_scale import MODEL_DEF, _Cluster

from localdet.config.experiment import parse_config
from localdet.daemon.daemon import Daemon
from localdet.paths import Layout
from localdet.processes.launcher import LaunchDeferred, LaunchError
from localdet.records.db import StateDB


class _Refusing(_Cluster):
    def __init__(self, refusals: list[LaunchError]):
        super().__init__()
        self.refusals = refusals

    def start(self, spec, trial, slots):
        if self.refusals:
            raise self.refusals.pop(0)
        return super().start(spec, trial, slots)


def _one_trial(tmp_path, cluster: _Refusing, max_restarts: int, passes: int) -> dict:
    layout = Layout(tmp_path / "home").ensure()
    model = tmp_path / "model"
    model.mkdir()
    (model / "model_def.py").write_text(MODEL_DEF)
    config = parse_config({
        "entrypoint": "model_def:Trial", "hyperparameters": {"global_batch_size": 8},
        "searcher": {"name": "single", "metric": "val_loss", "max_length": 10},
        "max_restarts": max_restarts}).config
    db = StateDB.open(layout.db)
    try:
        experiment_id = db.create_experiment(
            name="deferred", description="", config=config, original_config="",
            searcher="single", metric="val_loss", smaller_is_better=True, experiment_seed=1,
            model_dir=str(model))
        daemon = Daemon(layout, cluster=cluster, log=lambda message: None).open(db)
        for _ in range(passes):
            daemon.step()
        (trial,) = db.trials(experiment_id)
        deferred = [e["payload"]["reason"] for e in db.events(experiment_id)
                    if e["kind"] == "trial_launch_deferred"]
        return {"state": trial.state, "restarts": trial.restarts, "error": trial.error,
                "deferred": deferred}
    finally:
        db.close()


def test_a_deferred_launch_stays_queued_without_using_a_restart_and_then_runs(tmp_path):
    busy = "the slots of the trial's 2 ranks could not be reserved on Ray nodes a, b within 60 s"
    cluster = _Refusing([LaunchDeferred(busy), LaunchDeferred(busy)])
    trial = _one_trial(tmp_path, cluster, max_restarts=0, passes=4)
    assert trial == {"state": "RUNNING", "restarts": 0, "error": None, "deferred": [busy, busy]}
    assert len(cluster.handles) == 1


def test_deferred_launches_past_their_limit_end_the_trial_with_the_reason(tmp_path):
    from localdet.daemon.launches import MAX_DEFERRALS

    busy = "the trial's 1 slot(s) could not be reserved on Ray node a within 60 s"
    cluster = _Refusing([LaunchDeferred(busy) for _ in range(MAX_DEFERRALS + 2)])
    trial = _one_trial(tmp_path, cluster, max_restarts=3, passes=MAX_DEFERRALS + 1)
    assert trial["state"] == "ERROR" and trial["restarts"] == 0, trial
    assert trial["error"] == (f"{busy}; it could not start in {MAX_DEFERRALS} tries (see "
                              "`ray status` for what holds the cluster's slots)")
    assert len(trial["deferred"]) == MAX_DEFERRALS - 1
    assert not cluster.handles and len(cluster.refusals) == 2  # no launch after the end


def test_a_launch_that_fails_for_the_trial_ends_it_at_once(tmp_path):
    cluster = _Refusing([LaunchError("the trial could not start on Ray node a: no python3")])
    trial = _one_trial(tmp_path, cluster, max_restarts=3, passes=2)
    assert trial == {"state": "ERROR", "restarts": 0, "deferred": [],
                     "error": "the trial could not start on Ray node a: no python3"}
