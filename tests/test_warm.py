"""Warm trial processes keep every guarantee: the same search and a paused-and-resumed trial
run under a daemon with a warm process (`--warm 1`) and under one without (`--warm 0`) end
with the same weights, bit for bit; a daemon killed with -9 leaves no warm process behind,
and the trial forked from it goes on and is finished by the next daemon, never launched
twice."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from conftest import EXAMPLE, SLOW_DIGITS, Home, wait_for, write_config
from test_pause_resume_e2e import final_weights

pytestmark = pytest.mark.slow

DETERMINISTIC = {"environment_variables": ["TF_DETERMINISTIC_OPS=1"]}
GRID = dict(hyperparameters={"global_batch_size": 32, "dropout": 0.0, "learning_rate": 0.01,
                             "hidden_units": {"type": "categorical", "vals": [16, 32]}},
            searcher={"name": "grid", "metric": "val_accuracy", "smaller_is_better": False,
                      "max_length": {"batches": 20}, "max_concurrent_trials": 1},
            environment=DETERMINISTIC)
# Long enough to be paused after 40 batches (asked from this process, polling every 20 ms):
# the digits trial sleeping 10 ms a batch trains its 1,000 batches in 10 s at least (unslowed,
# 1,200 batches were once trained on a loaded machine before the pause landed), without the
# CPU of as many more batches trained.
# A variable of its own makes it a kind of its own: no warm process fits its first launch.
LONG = dict(entrypoint="model_def:SlowDigitsTrial",
            hyperparameters={"global_batch_size": 32, "hidden_units": 32, "learning_rate": 0.01,
                             "batch_sleep": 0.01},
            searcher={"name": "single", "metric": "val_accuracy", "smaller_is_better": False,
                      "max_length": {"batches": 1000}},
            scheduling_unit=10, environment={"environment_variables": [
                *DETERMINISTIC["environment_variables"], "LOCALDET_TEST_KIND=long"]})


def launches(home: Home, experiment_id: int) -> list[bool]:
    """Whether each launch of the experiment's trials ran in a warm process, in order."""
    return [json.loads(row["payload"])["warm"] for row in home.rows(
        "SELECT payload FROM events WHERE experiment_id = ? AND kind = 'trial_launched' "
        "ORDER BY id", experiment_id)]


def request(home: Home, action: str, experiment_id: int) -> None:
    from localdet.paths import Layout
    from localdet.records.actions import request as record
    from localdet.records.db import StateDB

    db = StateDB.open(home.path / "localdet.db")
    try:
        record(Layout(home.path), db, action, experiment_id=experiment_id)
    finally:
        db.close()


def run_both(home: Home, tmp_path: Path, warm: str, daemons) -> dict:
    daemon = daemons(home, "--warm", warm)
    home.cli("submit", write_config(tmp_path, f"grid-{warm}", **GRID), EXAMPLE)
    grid = home.experiment_named(f"grid-{warm}")["id"]
    assert home.wait_until_ended(grid)["state"] == "COMPLETED"
    home.cli("submit", write_config(tmp_path, f"long-{warm}", **LONG), SLOW_DIGITS)
    long = home.experiment_named(f"long-{warm}")["id"]
    wait_for(lambda: home.first_trial(long).get("batches_trained", 0) >= 40, 180,
             "40 batches", 0.02)
    if warm == "1":  # one warm process of its kind: the one its trial was forked from
        from conftest import _parent

        trial_pid = home.first_trial(long)["pid"]
        of_its_kind = {pid for pid in warm_processes(home, b"LOCALDET_TEST_KIND=long")
                       if _parent(pid) == daemon.process.pid}
        assert of_its_kind == {_parent(trial_pid)}, (of_its_kind, trial_pid)
    request(home, "pause", long)
    wait_for(lambda: home.first_trial(long)["state"] == "PAUSED", 120, "the pause", 0.05)
    trial = home.experiment(long)["trials"][0]
    assert trial["state"] == "PAUSED" and trial["batches_trained"] < 1000
    request(home, "resume", long)
    assert home.wait_until_ended(long)["state"] == "COMPLETED"
    daemon.stop()
    said = daemon.log_path.read_text()
    return {
        "said": said,
        "grid": [(t["hparams"], t["latest_validation"])
                 for t in home.experiment(grid)["trials"]],
        "grid_launches": launches(home, grid),
        "long_launches": launches(home, long),
        "weights": final_weights(home, long, tmp_path / warm),
    }


def test_warm_and_cold_processes_train_alike(tmp_path, daemons):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as both:  # two homes, two daemons: side by side
        warm, cold = both.map(lambda args: run_both(Home(tmp_path / args[0]), tmp_path,
                                                    args[1], daemons),
                              [("warm", "1"), ("cold", "0")])
    assert "warm trial processes: 1 (--warm)" in warm["said"]
    assert "warm trial processes: 0 (off (--warm 0))" in cold["said"]
    # The search's first launch finds no warm process of its kind (the one the daemon
    # started with has no TF_DETERMINISTIC_OPS): one is started for it and it forks from
    # it, and so do the next trials. The one-trial experiment, of another kind, does the
    # same (one warm process of its kind, checked in run_both), and its resume forks from it.
    assert warm["grid_launches"] == [True, True]
    assert warm["long_launches"] == [True, True]
    assert cold["grid_launches"] == [False] * 2 and cold["long_launches"] == [False] * 2
    assert warm["grid"] == cold["grid"]
    for (name_a, a), (name_b, b) in zip(warm["weights"], cold["weights"], strict=True):
        assert name_a == name_b and (a == b).all()


def warm_processes(home: Home, variable: bytes = b"") -> set[int]:
    """The processes started as `localdet.processes.warm_process` for this home (warm ones, and the
    trials forked from them), those started with `variable` (NAME=value) if given."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes()
            environment = (entry / "environ").read_bytes()
        except OSError:
            continue
        if b"localdet.processes.warm_process" in command \
                and f"LOCALDET_HOME={home.path}".encode() in environment \
                and variable in environment:
            found.add(int(entry.name))
    return found


def test_a_daemon_killed_leaves_no_warm_process_and_its_forked_trial_is_adopted(tmp_path,
                                                                                daemons):
    home = Home(tmp_path / "home")
    config = dict(GRID, searcher=dict(GRID["searcher"], max_length={"batches": 300}),
                  scheduling_unit=10,
                  hyperparameters=dict(GRID["hyperparameters"],
                                       hidden_units={"type": "categorical", "vals": [16, 32]}))
    daemon = daemons(home, "--warm", "1")
    home.cli("submit", write_config(tmp_path, "killed", **config), EXAMPLE)
    experiment = home.experiment_named("killed")["id"]
    wait_for(lambda: launches(home, experiment) == [True, True], 300,
             "the second trial to start in a warm process", 0.1)
    trial = home.experiment(experiment)["trials"][1]
    from localdet.records.db import StateDB

    db = StateDB.open(home.path / "localdet.db")
    pid = db.trial(trial["id"]).pid
    db.close()
    warm = warm_processes(home) - {pid}
    assert warm, "no warm process was kept beside the running trial"
    daemon.process.send_signal(signal.SIGKILL)
    daemon.process.wait()
    wait_for(lambda: not warm & warm_processes(home), 30, "the warm process to end", 0.1)
    daemons(home, "--warm", "1")  # (the fixture ends both daemons, and the trials they left)
    facts = home.wait_until_ended(experiment, timeout=300)
    assert facts["state"] == "COMPLETED"
    # Finished by the process the first daemon forked (adopted, or judged from its
    # records if it ended before the new daemon looked): never launched again.
    assert launches(home, experiment) == [True, True]
    assert all(t["restarts"] == 0 for t in facts["trials"])


def _recorded_trial(layout, folder: str, launched: bool = False, paused: bool = False):
    """An experiment of tests/compat/keras_line/FOLDER with one trial, in the records only
    (and its launch's event, if `launched`; paused, if `paused`: no daemon launches it): the
    trial's launch spec."""
    import shutil

    import yaml

    from localdet.config.experiment import parse_config
    from localdet.processes import launcher
    from localdet.records.db import StateDB

    source = Path(__file__).parent / "compat" / "keras_line" / folder
    config = parse_config(yaml.safe_load((source / "const.yaml").read_text())).config
    db = StateDB.open(layout.db)
    try:
        experiment_id = db.create_experiment(
            name="x", description="", config=config, original_config="", searcher="single",
            metric="val_loss", smaller_is_better=True, experiment_seed=1, model_dir="")
        shutil.copytree(source, layout.model_dir(experiment_id))
        db.db["experiments"].update(experiment_id,
                                    {"model_dir": str(layout.model_dir(experiment_id))})
        trial = db.trial(db.create_trial(experiment_id=experiment_id, request_id=1,
                                         hparams={}, seed=1, target_batches=8))
        if launched:
            db.log_event("trial_launched", experiment_id=experiment_id, trial_id=trial.id)
        if paused:
            db.db["experiments"].update(experiment_id, {"state": "PAUSED"})
        return launcher.launch_spec(layout, db.experiment(experiment_id), trial, [0],
                                    visible_devices="")
    finally:
        db.close()


@pytest.mark.parametrize(("folder", "fits"), [("plain_trial", True), ("keras3_trial", False)])
def test_the_warm_process_ready_from_the_start_is_of_the_line_trial_classes_run_under(
        layout, folder, fits):
    """A plain trial class (Keras 2, by Determined's rule: the line most trials now run
    under) forks its first launch from the warm process the daemon starts with; a trial that
    needs Keras 3 starts cold, and leaves a warm process of its own kind behind."""
    from localdet.config import keras_choice
    from localdet.processes import launcher
    from localdet.processes.warm_pool import environment_kind, kind_of

    spec = _recorded_trial(layout, folder)
    at_start = environment_kind(launcher.experiment_environment(
        layout, {}, keras_choice.default()[0]))
    assert (kind_of(spec) == at_start) is fits
    assert spec.keras_line == ("keras2" if fits else "keras3")


def test_a_daemon_restarted_keeps_a_warm_process_of_the_kind_its_last_launch_wanted(
        tmp_path, daemons):
    """Where the last trial launched was a Keras 3 one, the warm process a daemon starts
    with is Keras 3's: a returning user's next experiment is most likely like their last.
    With no launch recorded, it is the default line's (Keras 2)."""
    from localdet.paths import Layout

    for launched, variable in ((False, b"TF_USE_LEGACY_KERAS=1"),
                               (True, b"TF_USE_LEGACY_KERAS=0")):
        home = Home(tmp_path / f"home-{launched}")
        # Paused: its launch would start a warm process of its own kind.
        _recorded_trial(Layout(home.path).ensure(), "keras3_trial", launched=launched,
                        paused=True)
        daemon = daemons(home, "--warm", "1")
        wait_for(lambda home=home: warm_processes(home), 60, "the daemon's warm process", 0.1)
        assert warm_processes(home, variable) == warm_processes(home), variable
        daemon.stop()


def test_a_warm_process_is_kept_where_a_launch_is_expected_and_one_still_importing_is_ended(
        layout):
    """After a launch no other is expected to use, no warm process is started; one is once
    the daemon is idle, once per idle spell; closed while still importing (no trial handed to
    it), it is ended rather than left to finish its imports."""
    import os
    import sys
    from types import SimpleNamespace

    from localdet.config import engines
    from localdet.processes.warm_pool import WarmPool

    spec = SimpleNamespace(argv=[sys.executable, "-m", "determined.exec.run_trial"],
                           engine=engines.SINGLE, env=dict(os.environ))
    pool = WarmPool(layout, size=1, log=lambda line: None)
    try:
        pool.keep(spec, expected=False)
        assert pool.describe().startswith("0 warm")
        pool.keep_when_idle()
        assert pool.describe() == "1 warm process(es), 0 ready"
        process = pool._warm[0].process
        pool.close()
        process.wait(timeout=3)  # ended at once, not after TensorFlow's import (6 s and more)
        pool.keep_when_idle()  # the idle spell's one was kept already
        assert pool.describe().startswith("0 warm")
    finally:
        pool.close()


def test_the_first_warm_process_waits_for_a_moment_with_nothing_launched(layout):
    """The daemon's guess of the kind its trials will want is imported only once nothing has
    been launched for a moment after its start: an experiment submitted with the start
    brings its own kind, and the guess is dropped (no import of it wasted)."""
    import os
    import sys
    from types import SimpleNamespace

    from localdet.config import engines
    from localdet.processes.warm_pool import WarmPool, environment_kind

    guess = environment_kind({**os.environ, "LOCALDET_TEST_KIND": "guess"})
    spec = SimpleNamespace(argv=[sys.executable, "-m", "determined.exec.run_trial"],
                           engine=engines.SINGLE, env=dict(os.environ))
    pool = WarmPool(layout, size=1, log=lambda line: None)
    try:
        pool.keep_at_start(guess, after=60)
        pool.keep_when_idle()  # idle, but not yet for long enough
        assert pool.describe().startswith("0 warm")
        pool.keep_at_start(guess, after=0)
        pool.keep_when_idle()  # its time has come
        assert [w.kind for w in pool._warm] == [guess]
        pool.close()

        pool.keep_at_start(guess, after=0)
        pool.keep(spec, expected=False)  # a launch came first: its kind, once idle
        pool.keep_when_idle()
        assert [w.kind for w in pool._warm] == [environment_kind(spec.env)]
        pool.close()

        pool.keep_at_start(guess, after=0)
        script = SimpleNamespace(argv=["/bin/sh", "train.sh"], engine=engines.SINGLE,
                                 env=dict(os.environ))
        pool.keep(script, expected=False)  # one that cannot run warm: no guess either
        pool.keep_when_idle()
        assert pool.describe().startswith("0 warm")
    finally:
        pool.close()


def test_with_no_spare_core_one_warm_process_starts_for_a_launch_never_beside_trials(
        layout, monkeypatch):
    """Where every core has a slot, a warm process started for a launch costs no more than
    the cold start it replaces, one importing beside running trials takes a core from them:
    the daemon keeps one, started for a launch or while idle, never because more launches
    are expected; and no trial starts ahead of its slot."""
    import os
    import sys
    from types import SimpleNamespace

    from localdet.config import engines
    from localdet.daemon.daemon import Daemon
    from localdet.processes.warm_pool import WarmPool
    from localdet.scheduling.slots import detect_slots

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    size, beside, reason = Daemon(layout)._warm_size(detect_slots(2))
    assert (size, beside) == (1, False) and "no spare core" in reason, reason
    assert Daemon(layout)._warm_size(detect_slots(1))[:2] == (1, True)
    assert Daemon(layout, warm=1)._warm_size(detect_slots(2))[:2] == (1, True)  # as asked

    spec = SimpleNamespace(argv=[sys.executable, "-m", "determined.exec.run_trial"],
                           engine=engines.SINGLE, env=dict(os.environ))
    pool = WarmPool(layout, size=1, log=lambda line: None, beside_trials=False)
    try:
        pool.keep(spec, expected=True)  # after a launch, beside its trial: not now
        assert pool.describe().startswith("0 warm")
        assert pool.for_launch(spec) is not None  # for the launch itself: yes
        assert pool.describe().startswith("1 warm")
    finally:
        pool.close()


def test_beside_running_trials_a_launch_of_a_new_kind_starts_cold(layout, tmp_path):
    """Handing a launch to a warm process still importing holds the daemon for the import
    (a pause, an exit unattended): beside running trials, a launch whose kind has no warm
    process starts cold, and none is started for it."""
    import os
    import sys

    from localdet.processes.launcher import LaunchSpec
    from localdet.processes.warm_pool import WarmPool
    from localdet.scheduling.local_machine import LocalMachine
    from localdet.scheduling.slots import detect_slots

    script = tmp_path / "train.py"
    script.write_text("print('trained')\n")
    spec = LaunchSpec(argv=[sys.executable, str(script)], env=dict(os.environ), cwd=tmp_path,
                      log_path=tmp_path / "trial.log", keras_line="keras3",
                      keras_line_reason="test")
    pool = WarmPool(layout, size=1, log=lambda line: None)
    try:
        process = LocalMachine(detect_slots(1), pool, idle=lambda: False).start(spec, None, [0])
        assert process.wait(timeout=60) == 0 and process.warm is False
        assert pool.describe().startswith("0 warm")
    finally:
        pool.close()
