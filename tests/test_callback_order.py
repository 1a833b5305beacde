"""Determined's callback contract (the `determined.keras.callbacks.Callback` docstring),
checked by the order-checking callback in tests/trials/callback_order/: it raises at any
illegal transition and, at the trial's end, checks every count against the schedule."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from conftest import start_trial, wait_for

MODEL = Path(__file__).parent / "compat" / "callback_order"
sys.path.insert(0, str(MODEL))

from order_check import ContractBroken, OrderCheck, Schedule  # noqa: E402


def config(**overrides) -> dict:
    raw = yaml.safe_load((MODEL / "const.yaml").read_text())
    raw.update(overrides)
    return raw


def schedule() -> Schedule:
    raw = config()
    return Schedule(target=raw["searcher"]["max_length"]["batches"],
                    scheduling_unit=raw["scheduling_unit"],
                    validation_period=raw["min_validation_period"]["batches"],
                    checkpoint_period=raw["min_checkpoint_period"]["batches"],
                    batches_per_epoch=raw["records_per_epoch"]
                    // raw["hyperparameters"]["global_batch_size"])


def test_the_schedule_the_config_implies():
    s = schedule()
    assert s.boundaries == [5, 8, 10, 12, 15, 16, 20, 24]
    assert s.validations == {8, 16, 24} and s.periodic_checkpoints == {12, 24}
    assert (s.epochs_begun, s.epochs_ended) == (3, 2)


def test_the_checker_refuses_the_orders_determined_never_makes():
    resumed = OrderCheck(schedule())
    with pytest.raises(ContractBroken, match="right after on_train_begin"):
        resumed.load_state(OrderCheck(schedule()).saved)  # before on_train_begin

    early = OrderCheck(schedule())
    early.on_train_begin()
    with pytest.raises(ContractBroken, match="outside an epoch"):
        early.on_train_workload_begin(0, 5, {})  # the workload before its epoch

    idle = OrderCheck(schedule())
    idle.on_train_begin()
    idle.on_epoch_begin(0)
    idle.on_train_workload_begin(0, 5, {})
    with pytest.raises(ContractBroken, match="trained nothing"):
        idle.on_train_end()  # a workload began right before on_train_end


def run_in_process(tmp_path, pause_at=()):
    """The trial in this process, paused (and resumed in a fresh controller) at the given
    workload boundaries; returns the number of processes it took."""
    from test_exact_resume import PausingReporter

    import determined as det
    from determined.keras._trial_controller import TrialController

    with det.import_from_path(MODEL):  # other tests import other folders' model_def
        from model_def import CallbackOrderTrial

    raw = config()
    fields = {k: v for k, v in raw.items()
              if k not in ("name", "entrypoint", "searcher", "hyperparameters")}
    _, _, reporter, _ = start_trial(tmp_path, raw["searcher"]["max_length"]["batches"],
                                    hparams=raw["hyperparameters"], **fields)
    pausing = PausingReporter(reporter, set(pause_at))
    processes = 0
    while True:
        processes += 1
        controller = TrialController.for_trial_class(
            CallbackOrderTrial, reporter.trial_info(), pausing)
        controller.run()  # the checker raises out of here on any breach
        if not controller.paused:
            return processes


@pytest.mark.parametrize("pause_at", [(), (5, 12), (10, 20), (8, 15)],
                         ids=["straight", "mid-epoch-and-at-a-checkpoint",
                              "at-epoch-ends", "at-a-validation-and-mid-epoch"])
def test_the_contract_holds_in_process(tmp_path, pause_at):
    assert run_in_process(tmp_path, pause_at) == len(pause_at) + 1


# -- under the daemon, both Keras lines ------------------------------------------------------
# The paused experiments' length: the pauses land at a scheduling unit's end (5 batches)
# after the request, itself made once the records show a batch more (reported each unit): a
# first pause at 16 of 24 batches once left the second none to land in.
PAUSED_LENGTH = 40


def submit(home, tmp_path, name, keras2, batch_sleep=0.0):
    raw = config(name=name)
    raw["hyperparameters"]["batch_sleep"] = batch_sleep
    if batch_sleep:  # paused twice: room for the second pause wherever the first landed
        raw["searcher"]["max_length"]["batches"] = PAUSED_LENGTH
    # Each line asked for: a trial class would otherwise run under Keras 2.
    raw["environment"] = {"environment_variables": [f"TF_USE_LEGACY_KERAS={int(keras2)}"]}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    home.cli("submit", path, MODEL)
    return home.experiment_named(name)["id"]


def trial(home, experiment_id) -> dict:
    return home.experiment(experiment_id)["trials"][0]


def request(home, action: str, experiment_id: int) -> None:
    """`localdet pause|resume ID`'s request, recorded from this process: it lands at once,
    where a command's start takes seconds on a loaded machine."""
    from localdet.paths import Layout
    from localdet.records.actions import request as record
    from localdet.records.db import StateDB

    db = StateDB.open(home.path / "localdet.db")
    try:
        record(Layout(home.path), db, action, experiment_id=experiment_id)
    finally:
        db.close()


def pause_and_resume(home, experiment_ids, after_batches):
    """Pause each experiment the moment it has trained `after_batches[id]` batches (all
    watched at once, so that one starting first cannot run to its end while another is
    awaited), then resume them; returns where each stopped."""
    asked: set[int] = set()

    def ask_when_due() -> bool:
        for experiment_id in experiment_ids:
            if experiment_id not in asked and home.first_trial(experiment_id).get(
                    "batches_trained", 0) >= after_batches[experiment_id]:
                request(home, "pause", experiment_id)
                asked.add(experiment_id)
        return len(asked) == len(experiment_ids)

    # (The waits read the database: polling `localdet status` would take a core.)
    wait_for(ask_when_due, 300, f"experiments {experiment_ids} to train {after_batches}", 0.05)
    stopped = {}
    for experiment_id in experiment_ids:
        try:
            wait_for(lambda experiment_id=experiment_id:
                     home.first_trial(experiment_id)["state"] == "PAUSED", 120,
                     f"experiment {experiment_id} to pause", 0.05)
        except AssertionError as error:  # what its trial and the daemon said, for CI's log
            raise AssertionError(f"{error}\n{home.ended_report(experiment_id)}") from None
        stopped[experiment_id] = trial(home, experiment_id)["batches_trained"]
        request(home, "resume", experiment_id)
    return stopped


@pytest.mark.slow
def test_the_contract_holds_under_the_daemon_straight_and_paused_twice(home, tmp_path, daemons):
    # A warm process per Keras line: the eight launches fork from a process that imported
    # TensorFlow once (the contract is the same in a forked process: test_warm.py).
    daemon = daemons(home, "--slots", "2", "--warm", "2")
    paused = {line: submit(home, tmp_path, f"paused-{line}", line == "keras2",
                           batch_sleep=0.3) for line in ("keras3", "keras2")}
    straight = {line: submit(home, tmp_path, f"straight-{line}", line == "keras2")
                for line in ("keras3", "keras2")}
    ids = list(paused.values())
    first = pause_and_resume(home, ids, {i: 1 for i in ids})
    second = pause_and_resume(home, ids, {i: first[i] + 1 for i in ids})
    ended = {f"{kind}-{line}": home.wait_until_ended(experiment_id)
             for kind, ids_by_line in (("paused", paused), ("straight", straight))
             for line, experiment_id in ids_by_line.items()}
    daemon.stop()
    for name, facts in ended.items():
        assert facts["state"] == "COMPLETED", (name, facts)
    for line, experiment_id in paused.items():
        assert 0 < first[experiment_id] < second[experiment_id] < PAUSED_LENGTH, line
        log = home.cli("logs", trial(home, experiment_id)["id"]).stdout
        assert "callback contract held: 3 processes" in log, log[-2000:]
