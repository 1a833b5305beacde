"""Each launch's timeline: the phases a trial's process notes through its reporter, written
with its heartbeats (never a transaction of their own); the daemon's launch and exit; and a
search's slot-seconds summed by `localdet status ID --timeline`."""

from __future__ import annotations

import json
import time

from click.testing import CliRunner
from conftest import start_trial

from localdet.operations import timeline
from localdet.paths import Layout
from localdet.records import phases
from localdet.records.db import StateDB, now

TRIAL_SIDE = ["process_ready", "model_built", "data_ready", "first_batch", "training",
              "training", "validation", "checkpoint", "checkpoint_store", "training",
              "training", "validation", "checkpoint", "checkpoint_store", "end"]


def test_a_launch_records_its_phases_in_order_with_its_heartbeats(tmp_path):
    from test_trial_controller import ConstantLossTrial

    from determined.keras._trial_controller import TrialController

    db, trial_id, reporter, _ = start_trial(
        tmp_path, target=20, scheduling_unit=5, min_validation_period={"batches": 10},
        min_checkpoint_period={"batches": 10})
    launch = now()
    decided = phases.seconds(launch) - 0.05
    db.update_trial(trial_id, state="RUNNING", started_at=launch)
    with db.atomic():  # as the daemon records it, with the launch
        phases.record_launch(db, 1, trial_id, launch, decided, {"warm": True, "slots": [0]})
    reporter.record_phase("process_ready", None, time.time(), {"warm": True})
    TrialController.for_trial_class(ConstantLossTrial, reporter.trial_info(), reporter).run()
    written = [row["phase"] for row in phases.of_experiment(db, 1)]
    # Noted after the last heartbeat: written with the next one, not on their own.
    assert "end" not in written and "first_batch" in written
    reporter.heartbeat()
    with db.atomic():
        phases.record_exit(db, trial_id, time.time(), {"returncode": 0})

    rows = phases.of_experiment(db, 1)
    assert [row["phase"] for row in rows] == ["launch", *TRIAL_SIDE, "exit"]
    assert {row["launch"] for row in rows} == {launch}
    assert rows[0]["started"] == decided and rows[1]["started"] == phases.seconds(launch)
    for row in rows:
        assert row["ended"] >= row["started"]
    # One after another, but for each checkpoint's store, which goes on beside training.
    serial = [row for row in rows if row["phase"] != "checkpoint_store"]
    for before, after in zip(serial, serial[1:], strict=False):
        assert after["started"] >= before["ended"] - 1e-3, (before, after)
    assert [row["details"]["batches"] for row in rows if row["phase"] == "training"] == [
        [0, 5], [5, 10], [10, 15], [15, 20]]
    stored = [row for row in rows if row["phase"] == "checkpoint_store"]
    checkpoints = {c.uuid for c in db.checkpoints(trial_id=trial_id)}
    assert {row["details"]["uuid"] for row in stored} == checkpoints
    for row in stored:
        assert row["started"] <= row["details"]["durable"] <= row["ended"]
    exit_row = rows[-1]
    assert exit_row["started"] == max(row["ended"] for row in rows[1:-1])
    summary = timeline.summarize(db, 1)
    assert summary["launches"] == 1 and summary["slots"] == 1
    assert abs(sum(summary["shares"].values()) - 100) < 0.5
    assert summary["seconds"]["idle"] == 0 and summary["seconds"]["training"] > 0


def test_phases_written_after_the_exit_record_extend_the_exit(tmp_path):
    """The slot is freed once a trial's end is recorded, a moment before its process is gone:
    its `end`, arriving with its last report after the daemon's exit record, still lies
    within the launch."""
    db, trial_id, _, _ = start_trial(tmp_path, target=10)
    launch = now()
    db.update_trial(trial_id, state="RUNNING", started_at=launch)
    begun = phases.seconds(launch)
    with db.atomic():
        phases.insert(db, 1, trial_id, launch, [("training", begun, begun + 0.1, None)])
        phases.record_exit(db, trial_id, time.time(), {"returncode": 0})
    exit_ended = phases.of_experiment(db, 1)[-1]["ended"]
    with db.atomic():  # a later launch's exit row is not touched
        phases.insert(db, 1, trial_id, "another launch", [("exit", 1.0, 2.0, None)])
    with db.atomic():
        phases.insert(db, 1, trial_id, launch, [("end", exit_ended - 0.01, exit_ended + 0.25,
                                                None)])
    rows = {(row["launch"], row["phase"]): row for row in phases.of_experiment(db, 1)}
    assert rows[(launch, "exit")]["ended"] == exit_ended + 0.25
    assert rows[("another launch", "exit")]["ended"] == 2.0
    with db.atomic():  # an earlier phase changes nothing
        phases.insert(db, 1, trial_id, launch, [("validation", begun, begun + 0.2, None)])
    exits = [row["ended"] for row in phases.of_experiment(db, 1)
             if (row["launch"], row["phase"]) == (launch, "exit")]
    assert exits == [exit_ended + 0.25]


def _search(tmp_path):
    """A grid of three trials on two slots, its phases as the daemon and trials record
    them: trial 3 waits from its creation for trial 1's slot, slot 1 is idle after trial 2."""
    db, first, _, _ = start_trial(tmp_path, target=10)
    experiment_id = db.trial(first).experiment_id
    others = [db.create_trial(experiment_id=experiment_id, request_id=n, hparams={},
                              seed=n, target_batches=10) for n in (2, 3)]
    created = time.time()
    t = created + 1.0  # every launch after the trials were made (their events)
    plan = {  # trial: (slot, launch start offset)
        first: (0, 0.0), others[0]: (1, 0.0), others[1]: (0, 10.5)}
    for trial_id, (slot, at) in plan.items():
        _launched(db, experiment_id, trial_id, slot, t + at)
    return db, experiment_id, created


def _launched(db, experiment_id, trial_id, slot, b):
    with db.atomic():
        launch = f"launch-of-{trial_id}"
        db.db.execute("UPDATE trials SET started_at = ? WHERE id = ?", [launch, trial_id])
        rows = [("launch", b, b + 0.5, {"warm": True, "slots": [slot]}),
                ("process_ready", b + 0.5, b + 1.0, {"warm": True}),
                ("import", b + 1.0, b + 1.5, None),
                ("first_batch", b + 1.5, b + 2.0, None),
                ("training", b + 2.0, b + 7.0, None),
                ("checkpoint", b + 7.0, b + 8.0, None),
                ("checkpoint_store", b + 8.0, b + 8.5, None),  # beside the validation
                ("validation", b + 8.0, b + 9.0, None),
                ("end", b + 9.0, b + 9.5, None),
                ("exit", b + 9.5, b + 10.0, {"returncode": 0})]
        phases.insert(db, experiment_id, trial_id, launch, rows)


def test_a_search_is_summed_in_slot_seconds_that_add_up(tmp_path):
    db, experiment_id, _ = _search(tmp_path)
    summary = timeline.summarize(db, experiment_id)
    # Two slots over 20.5 s: three launches of 10 s, slot 0 free for 0.5 s while trial 3
    # waited (the daemon's), slot 1 free for the last 10.5 s (idle).
    assert (summary["trials"], summary["launches"], summary["slots"]) == (3, 3, 2)
    assert summary["wall_seconds"] == 20.5 and summary["slot_seconds"] == 41.0
    assert summary["seconds"] == {
        "training": 15.0, "start-up": 4.5, "validation": 3.0, "checkpoints": 3.0,
        "shut-down": 1.5, "daemon": 3 * 1.0 + 0.5, "untracked": 0.0, "idle": 10.5}
    assert abs(sum(summary["shares"].values()) - 100) < 0.2
    assert summary["launch_to_first_batch"]["mean"] == 2.0
    assert summary["last_batch_to_slot_free"]["mean"] == 3.0
    assert summary["phases"]["training"] == {"count": 3, "total": 15.0, "mean": 5.0,
                                             "min": 5.0, "max": 5.0}
    assert list(summary["phases"])[:2] == ["launch", "process_ready"]  # in the phases' order


def test_status_timeline_prints_the_sums_and_json(tmp_path, monkeypatch):
    from localdet.ui.cli import cli

    db, experiment_id, _ = _search(tmp_path)
    db.close()
    monkeypatch.setenv("LOCALDET_HOME", str(tmp_path / "home"))
    assert Layout.from_environment().db.exists()
    runner = CliRunner()
    shown = runner.invoke(cli, ["status", str(experiment_id), "--timeline"])
    assert shown.exit_code == 0, shown.output
    assert "3 trial(s), 3 launch(es) (3 warm, 0 cold) on 2 slots over 20.5 s" in shown.output
    assert "idle slots" in shown.output and "25.6%" in shown.output  # 10.5 of 41
    assert "launch to first batch: mean 2.00 s" in shown.output
    as_json = runner.invoke(cli, ["status", str(experiment_id), "--timeline", "--json"])
    assert json.loads(as_json.output)["seconds"]["idle"] == 10.5
    missing = runner.invoke(cli, ["status", "--timeline"])
    assert missing.exit_code != 0 and "--timeline needs an experiment" in missing.output
    # An experiment none of whose trials recorded a timeline says so.
    db = StateDB.open(tmp_path / "home" / "localdet.db")
    db.db.execute("DELETE FROM launch_phases")
    db.close()
    empty = runner.invoke(cli, ["status", str(experiment_id), "--timeline"])
    assert "has no timeline" in empty.output
