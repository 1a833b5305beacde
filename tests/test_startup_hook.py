"""A model folder's startup-hook.sh runs before the trial's processes, as Determined ran it:
sourced by bash in the trial's folder with the trial's environment (what it exports reaches
the trial), its output at the head of the trial's log; a failing hook is the trial's error,
one sentence with the hook's last output line, and fails fast as any failure before training
does. The hooks here do local work only (Determined 0.38's iris hook runs `pip install`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from localdet.paths import Layout
from localdet.processes import startup_hook

TRAIN = """\
import os
import pathlib
print("script sees HOOK_VALUE=" + os.environ.get("HOOK_VALUE", "unset"), flush=True)
print("script reads " + pathlib.Path("made-by-hook.txt").read_text().strip(), flush=True)
if os.environ.get("LOCALDET_HOME"):  # under the daemon: a plain Core API loop reports
    import determined as det
    with det.core.init() as core_context:
        core_context.train.report_validation_metrics(steps_completed=1,
                                                     metrics={"val_loss": 0.5})
"""

GOOD_HOOK = """\
echo "hook starts; config says CONFIG_VAR=$CONFIG_VAR"
export HOOK_VALUE=42
echo prepared > made-by-hook.txt
python3 -c 'import sys; open("hook-python.txt", "w").write(sys.executable)'
"""

BAD_HOOK = """\
echo "hook starts"
echo "no data set at /data/iris.csv" >&2
exit 3
echo "never printed"
"""


def folder(path, hook):
    path.mkdir(parents=True)
    (path / "train.py").write_text(TRAIN)
    (path / startup_hook.HOOK).write_text(hook)
    return path


def run_wrapped(tmp_path, hook, command):
    model = folder(tmp_path / "model", hook)
    argv = startup_hook.wrapped(command, model)
    return subprocess.run(argv, cwd=model, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "CONFIG_VAR": "c"})


def test_a_folder_without_a_hook_runs_its_command_as_it_is(tmp_path):
    argv = [sys.executable, "train.py"]
    assert startup_hook.wrapped(argv, tmp_path) == argv
    assert startup_hook.unwrapped(argv) == ([], argv)


def test_the_hook_runs_first_and_what_it_exports_reaches_the_command(tmp_path):
    result = run_wrapped(tmp_path, GOOD_HOOK, [sys.executable, "train.py"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        "hook starts; config says CONFIG_VAR=c",
        "script sees HOOK_VALUE=42",
        "script reads prepared",
    ]
    # `python3` (and so `pip`) in the hook is the trial's own interpreter.
    hook_python = Path((tmp_path / "model" / "hook-python.txt").read_text())
    assert hook_python.parent == Path(sys.executable).parent


def test_a_failing_hook_stops_the_command_with_one_sentence(tmp_path):
    result = run_wrapped(tmp_path, BAD_HOOK, [sys.executable, "train.py"])
    assert result.returncode == 1
    assert "script sees" not in result.stdout and "never printed" not in result.stdout
    message = ("startup-hook.sh failed with exit code 3; its last output line: no data set at "
               "/data/iris.csv")
    assert f"error: {message}" in result.stdout
    log = tmp_path / "log"
    log.write_text(result.stdout)
    from localdet.processes import launcher
    failure = launcher.failure(log)
    assert failure is not None
    assert (failure.signature, failure.stage, failure.trained) == (message, "setup", False)


def _submit(home, tmp_path, name, hook):
    model = folder(tmp_path / name, hook)
    config = tmp_path / f"{name}.yaml"
    config.write_text(yaml.safe_dump({
        "name": name,
        "entrypoint": "python3 train.py",
        "searcher": {"name": "single", "metric": "val_loss"},  # no length: the script decides
        "max_restarts": 3,
        "environment": {"image": {"cpu": "determinedai/tensorflow-ngc:0.38.1"},
                        "environment_variables": ["CONFIG_VAR=from-config"]},
    }))
    home.cli("submit", config, model)


@pytest.mark.slow
def test_a_hook_runs_before_the_trial_and_a_failing_one_is_its_error(home, tmp_path, daemons):
    daemons(home, "--slots", "1")
    _submit(home, tmp_path, "hook-ok", GOOD_HOOK)
    _submit(home, tmp_path, "hook-fails", BAD_HOOK)
    ids = {name: home.experiment_named(name)["id"] for name in ("hook-ok", "hook-fails")}
    facts = {name: home.wait_until_ended(i, timeout=240) for name, i in ids.items()}
    layout = Layout(home.path)

    assert facts["hook-ok"]["state"] == "COMPLETED", facts["hook-ok"]
    ok = facts["hook-ok"]["trials"][0]
    lines = layout.trial_log(ids["hook-ok"], ok["id"]).read_text().splitlines()
    assert lines[0].startswith("[localdet] trial ")  # which Keras, which engine
    assert lines[1] == "hook starts; config says CONFIG_VAR=from-config"
    assert "script sees HOOK_VALUE=42" in lines and "script reads prepared" in lines
    assert any("environment.image" in w for w in facts["hook-ok"]["warnings"])

    failed = facts["hook-fails"]
    assert failed["state"] == "ERROR", failed
    trial = failed["trials"][0]
    assert trial["state"] == "ERROR"
    assert ("startup-hook.sh failed with exit code 3; its last output line: no data set at "
            "/data/iris.csv") in trial["error"]
    # A failure before training, the same on two launches in a row: no third launch.
    assert len(trial["launches"]) == 2
    log = layout.trial_log(ids["hook-fails"], trial["id"]).read_text()
    assert "script sees" not in log and log.splitlines()[1] == "hook starts"
