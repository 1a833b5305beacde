"""Tests of localdet.processes.launcher: the argv, environment and folder a trial (or job)
starts with."""

from __future__ import annotations

import dataclasses
import sys

import pytest

from localdet.config.experiment import parse_config, parse_job_config
from localdet.paths import Layout
from localdet.processes import launcher
from localdet.records.db import StateDB


def recorded(layout: Layout, config: dict, kind: str = "experiment"):
    """An experiment (or job) and one trial in a real database, its model folder made."""
    db = StateDB.open(layout.db)
    experiment_id = db.create_experiment(
        name="x", description="", config=config, original_config="", searcher="single",
        metric="val_loss", smaller_is_better=True, experiment_seed=1, model_dir="", kind=kind)
    model_dir = layout.model_dir(experiment_id)
    model_dir.mkdir(parents=True)
    db.db["experiments"].update(experiment_id, {"model_dir": str(model_dir)})
    trial_id = db.create_trial(experiment_id=experiment_id, request_id=1, hparams={}, seed=1,
                               target_batches=0)
    experiment, trial = db.experiment(experiment_id), db.trial(trial_id)
    db.close()
    return experiment, trial


@pytest.mark.parametrize(("command", "argv"), [
    ("python3 train.py --epochs 3", [sys.executable, "train.py", "--epochs", "3"]),
    ("python train.py", [sys.executable, "train.py"]),
    ("python3.11 -u train.py", [sys.executable, "-u", "train.py"]),
    ("python3 train.py --name 'a b'", [sys.executable, "train.py", "--name", "a b"]),
    ("./run.sh python3", ["./run.sh", "python3"]),          # only a leading interpreter
    ("pythonista train.py", ["pythonista", "train.py"]),    # not an interpreter name
    ("/usr/bin/python3 train.py", ["/usr/bin/python3", "train.py"]),  # a path is the user's
])
def test_a_script_runs_in_localdets_own_python(command, argv):
    assert launcher.argv_for(parse_config({"entrypoint": command}).config) == argv


def test_a_bare_script_path_runs_under_localdets_python():
    config = parse_config({"entrypoint_script": "train.py"}).config
    assert launcher.argv_for(config) == [sys.executable, "train.py"]


def test_a_trial_class_runs_the_trial_runner():
    config = parse_config({"entrypoint": "model_def:Trial", "searcher": {
        "name": "single", "metric": "val_loss", "max_length": 10}}).config
    assert launcher.argv_for(config) == [sys.executable, "-m", "determined.exec.run_trial"]


def test_scripts_and_trial_classes_get_the_same_environment_and_folder(layout):
    script, script_trial = recorded(layout, parse_config({
        "entrypoint": "python3 train.py",
        "environment": {"environment_variables": ["MY_FLAG=1"]}}).config)
    trial_class, class_trial = recorded(layout, parse_config({
        "entrypoint": "model_def:Trial",
        "searcher": {"name": "single", "metric": "val_loss", "max_length": 10},
        "environment": {"environment_variables": ["MY_FLAG=1"]}}).config)
    specs = [launcher.launch_spec(layout, script, script_trial, [0, 1]),
             launcher.launch_spec(layout, trial_class, class_trial, [0, 1])]
    for spec, experiment, trial in zip(specs, (script, trial_class), (script_trial, class_trial),
                                       strict=True):
        assert spec.env["LOCALDET_HOME"] == str(layout.home)
        assert spec.env["LOCALDET_TRIAL_ID"] == str(trial.id)
        assert spec.env["LOCALDET_SLOTS"] == "0,1"
        assert spec.env["TF_USE_LEGACY_KERAS"] in ("0", "1")
        assert spec.env["MY_FLAG"] == "1" and spec.env["PYTHONUNBUFFERED"] == "1"
        assert spec.cwd == layout.model_dir(experiment.id)
        assert spec.log_path == layout.trial_log(experiment.id, trial.id)
    assert specs[0].argv == [sys.executable, "train.py"]
    assert set(specs[0].env) == set(specs[1].env)


def test_a_job_launches_its_script(layout):
    job, trial = recorded(layout, parse_job_config({
        "entrypoint_script": "python3 batch_inference.py", "resources": {"slots": 2}}).config,
        kind="job")
    spec = launcher.launch_spec(layout, job, trial, [0, 1])
    assert spec.argv == [sys.executable, "batch_inference.py"]
    assert spec.env["LOCALDET_SLOTS"] == "0,1"


def test_a_script_process_starts_in_the_model_folder_and_logs(layout):
    experiment, trial = recorded(layout, parse_config({
        "entrypoint": "python3 -c \"import os, sys; print(os.getcwd(), sys.executable, "
                      "os.environ['LOCALDET_TRIAL_ID'])\""}).config)
    process = launcher.start(launcher.launch_spec(layout, experiment, trial, [0]))
    assert process.wait(timeout=30) == 0
    launcher.wait_for_log(process, layout.trial_log(experiment.id, trial.id))
    header, log = launcher.log_tail(layout.trial_log(experiment.id, trial.id)).splitlines()
    assert log == f"{layout.model_dir(experiment.id)} {sys.executable} {trial.id}"
    assert header == (f"[localdet] trial {trial.id} launch 1 on slots [0]: keras3 (rule default: "
                      "nothing the entrypoint reaches uses Determined's APIs or what only one "
                      "Keras line has); engine single")


def test_a_missing_program_is_one_sentence_in_the_log_not_a_crash(layout):
    experiment, trial = recorded(layout,
                                 parse_config({"entrypoint": "no-such-program-x --y"}).config)
    spec = launcher.launch_spec(layout, experiment, trial, [0])
    with pytest.raises(launcher.LaunchError) as error:
        launcher.start(spec)
    message = str(error.value)
    assert "'no-such-program-x'" in message and "no such program" in message
    assert launcher.log_tail(spec.log_path, 1) == f"error: {message}"


def test_a_trial_sees_only_its_slots_devices(layout, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")  # the daemon's own: not inherited
    experiment, trial = recorded(layout, parse_config({
        "entrypoint": "python3 -c \"import os; print(repr(os.environ['CUDA_VISIBLE_DEVICES']),"
                      " os.environ.get('CUDA_DEVICE_ORDER'))\""}).config)
    for devices, order in (("", None), ("1,3", "PCI_BUS_ID")):
        spec = launcher.launch_spec(layout, experiment, trial, [1, 3], visible_devices=devices)
        process = launcher.start(spec)
        assert process.wait(timeout=30) == 0
        launcher.wait_for_log(process, spec.log_path)
        log = launcher.log_tail(layout.trial_log(experiment.id, trial.id), lines=1)
        assert log == f"{devices!r} {order}"


def test_the_daemon_gives_a_cpu_slot_trial_no_gpu(layout, monkeypatch):
    from localdet.daemon.daemon import Daemon

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # CPU slots, on a machine with GPUs too

    experiment, trial = recorded(layout, parse_config({
        "entrypoint": "python3 -c \"import os; print('devices=' + "
                      "repr(os.environ['CUDA_VISIBLE_DEVICES']))\""}).config)
    daemon = Daemon(layout, slots=2, log=lambda message: None).open()
    try:
        assert [slot.kind for slot in daemon.machine] == ["cpu", "cpu"]
        daemon.scheduler.schedule()
        assert daemon.running() == {trial.id}
        process = daemon._processes[trial.id]
        process.wait(timeout=30)
        # Its output reaches the log through a writer process of its own: wait for it, as
        # the daemon does when a trial ends (it was once read before it was written).
        launcher.wait_for_log(process, layout.trial_log(experiment.id, trial.id))
    finally:
        daemon.db.close()
    assert "devices=''" in launcher.log_tail(layout.trial_log(experiment.id, trial.id))


def test_a_multi_process_engine_starts_the_rank_supervisor(layout, monkeypatch):
    from localdet.config import engines
    monkeypatch.setattr(engines, "horovod_installed", lambda: False)
    experiment, trial = recorded(layout, parse_config({
        "entrypoint": "model_def:Trial", "resources": {"slots_per_trial": 2},
        "searcher": {"name": "single", "metric": "val_loss", "max_length": 10},
        "environment": {"environment_variables": ["TF_USE_LEGACY_KERAS=1"]}}).config)
    spec = launcher.launch_spec(layout, experiment, trial, [0, 1], visible_devices="")
    assert spec.engine == spec.env["LOCALDET_ENGINE"] == "gradient_allreduce"
    assert spec.argv == [sys.executable, "-P", "-m", "localdet.processes.ranks", "--size", "2",
                         "--tf-config", "--", sys.executable, "-m", "determined.exec.run_trial"]
    monkeypatch.setattr(engines, "horovod_installed", lambda: True)
    spec = launcher.launch_spec(layout, experiment, trial, [0, 1], visible_devices="")
    assert spec.engine == "horovod" and spec.argv[6] == "--horovod"
    # One slot: the trial's own command, as before.
    single = launcher.launch_spec(layout, experiment, trial, [0], visible_devices="")
    assert single.argv[:3] == [sys.executable, "-m", "determined.exec.run_trial"]


def test_each_launch_begins_its_log_with_the_keras_line_and_why(layout):
    experiment, trial = recorded(layout, parse_config({"entrypoint": "python3 train.py"}).config)
    model = layout.model_dir(experiment.id)
    (model / "train.py").write_text("import tensorflow as tf\n"
                                    "opt = tf.keras.optimizers.legacy.SGD()\n")
    spec = launcher.launch_spec(layout, experiment, trial, [0])
    assert (spec.keras_line, spec.keras_line_reason) == (
        "keras2", "rule keras2_api, decided by train.py:2: it uses "
                  "tf.keras.optimizers.legacy.SGD, which only Keras 2 has")
    spec = dataclasses.replace(spec, argv=[sys.executable, "-c", "print('trained')"])
    for _ in range(2):
        process = launcher.start(spec)
        assert process.wait(timeout=30) == 0
        launcher.wait_for_log(process, spec.log_path)
    lines = spec.log_path.read_text().splitlines()
    assert lines[0] == lines[2] == (f"[localdet] trial {trial.id} launch 1 on slots [0]: keras2 "
                                    f"({spec.keras_line_reason}); engine single")
    assert lines[1] == lines[3] == "trained"


def test_a_launch_failure_is_read_from_its_own_part_of_the_log(tmp_path):
    log = tmp_path / "trial.log"
    log.write_text("Traceback (most recent call last):\n  File \"x\", line 1\n"
                   "OldError: from the launch before\n")
    offset = launcher.log_size(log)
    assert launcher.failure(log, offset) is None
    assert launcher.failure(log).signature == "OldError: from the launch before"
    with open(log, "a") as out:  # a script's own traceback, chained
        out.write("Traceback (most recent call last):\n  File \"train.py\", line 2, in <module>\n"
                  "    import not_a_module\nModuleNotFoundError: No module named 'x'\n\n"
                  "During handling of the above exception, another exception occurred:\n\n"
                  "Traceback (most recent call last):\n  File \"train.py\", line 4\n"
                  "    raise SystemError('y')\n    ^^^^^^\nSystemError: y\n  more detail\n")
    assert launcher.failure(log, offset) == launcher.Failure("SystemError: y", None, None)
    with open(log, "a") as out:  # the trial runner's own report wins
        out.write('error: ImportError: z\n[localdet] failure: {"signature": "ImportError: z", '
                  '"stage": "import", "trained": false}\n')
    assert launcher.failure(log, offset) == launcher.Failure("ImportError: z", "import", False)
