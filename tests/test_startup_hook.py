"""A model folder's startup-hook.sh runs before the trial's processes, as Determined ran it:
sourced by bash in the trial's folder with the trial's environment (what it exports reaches
the trial), its output at the head of the trial's log; a failing hook is the trial's error,
one sentence with the hook's last output line, and fails fast as any failure before training
does. It runs in an environment of the experiment's own (a virtual environment under the
state folder): what its `pip install`s add lands there, never in the user's environment; pip
cannot replace the versions localdet runs on; lines that change the machine are skipped
unless allowed; an install line that cannot work is a warning and the trial goes on, naming
the line if the trial then misses what it was installing; `environment.startup_hook: strict`
ends the trial instead. The hooks here install only wheels built in the test, with no index
(they need no network).
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import zipfile
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

WARNING_HOOK = GOOD_HOOK + """\
pip install --no-index hooktest-missing==9.9
apt-get install -y libgl1
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


def run_wrapped(tmp_path, hook, command, train=TRAIN, path="/usr/bin:/bin", **options):
    model = tmp_path / "model"
    if not model.is_dir():
        folder(model, hook)
    (model / "train.py").write_text(train)
    (model / startup_hook.HOOK).write_text(hook)
    argv = startup_hook.wrapped(command, model, **options)
    # A state folder of the test's own (the hook's environment goes there), and no index:
    # pip finds only what the hook names.
    env = {"PATH": path, "CONFIG_VAR": "c", "LOCALDET_HOME": str(tmp_path / "home"),
           "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path / "no-wheels")}
    return subprocess.run(argv, cwd=model, capture_output=True, text=True, timeout=120,
                          env=env)


def wheel(where: Path, name: str, value: int) -> Path:
    """A pure-Python wheel of one module, `name`, whose VALUE is `value`."""
    distribution = name.replace("_", "-")
    files = {f"{name}/__init__.py": f"VALUE = {value}\n",
             f"{name}-1.0.dist-info/METADATA":
                 f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 1.0\n",
             f"{name}-1.0.dist-info/WHEEL":
                 "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},{len(text)}\n"
        for path, text in files.items()) + f"{name}-1.0.dist-info/RECORD,,\n"
    files[f"{name}-1.0.dist-info/RECORD"] = record
    where.mkdir(parents=True, exist_ok=True)
    path = where / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
    return path


def warnings_in(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("[localdet] warning: ")]


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
    # `python3` in the hook is the experiment's environment's, under the state folder.
    hook_python = Path((tmp_path / "model" / "hook-python.txt").read_text())
    assert hook_python.parent.parent.parent == tmp_path / "home" / "startup-hooks"


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


IMPORTS = """\
import sys
import {module}
print("trial imports {module}", {module}.VALUE, "from", {module}.__file__, flush=True)
print("trial python", sys.executable, flush=True)
"""


def test_what_the_hook_installs_reaches_the_trial_and_not_the_users_environment(tmp_path):
    made = wheel(tmp_path / "wheels", "hooktest_tiny", 7)
    # Two requirements, one of which cannot be had: the other is installed all the same.
    hook = f"pip install {made} hooktest-missing==9.9\n"
    result = run_wrapped(tmp_path, hook, [sys.executable, "train.py"],
                         train=IMPORTS.format(module="hooktest_tiny"))
    assert result.returncode == 0, result.stdout + result.stderr
    environments = tmp_path / "home" / "startup-hooks"
    assert "trial imports hooktest_tiny 7 from " + str(environments) in result.stdout
    assert f"trial python {environments}" in result.stdout
    assert warnings_in(result.stdout) == [
        "[localdet] warning: startup-hook.sh line 1: `pip install hooktest-missing==9.9` "
        "failed: No matching distribution found for hooktest-missing==9.9; the hook goes on"]
    # The user's own interpreter never got it.
    mine = subprocess.run([sys.executable, "-c", "import hooktest_tiny"], capture_output=True)
    assert mine.returncode != 0
    # The next launch of the same hook reuses the environment (made once per hook content).
    again = run_wrapped(tmp_path, hook, [sys.executable, "train.py"],
                        train=IMPORTS.format(module="hooktest_tiny"))
    assert again.returncode == 0, again.stdout + again.stderr
    assert len([p for p in environments.iterdir() if p.is_dir()]) == 1
    changed = run_wrapped(tmp_path, f"pip install {made}\n", [sys.executable, "train.py"],
                          train=IMPORTS.format(module="hooktest_tiny"))
    assert changed.returncode == 0, changed.stdout + changed.stderr
    assert len([p for p in environments.iterdir() if p.is_dir()]) == 2


def test_pip_cannot_replace_what_localdet_runs_on(tmp_path):
    import numpy

    hook = "pip install numpy==1.0.0\n"
    train = "import numpy\nprint('trial numpy', numpy.__version__)\n"
    result = run_wrapped(tmp_path, hook, [sys.executable, "train.py"], train=train)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"trial numpy {numpy.__version__}" in result.stdout
    assert warnings_in(result.stdout) == [
        "[localdet] warning: startup-hook.sh line 1: `pip install numpy==1.0.0` cannot be "
        f"installed: it conflicts with the versions localdet runs on (numpy=={numpy.__version__})"
        "; the hook goes on"]


def test_a_trial_missing_what_a_failed_line_was_installing_names_the_line(tmp_path):
    hook = "echo preparing\npip install hooktest-absent==1.2.3\n"
    result = run_wrapped(tmp_path, hook, [sys.executable, "train.py"],
                         train=IMPORTS.format(module="hooktest_absent"))
    assert result.returncode == 1
    log = tmp_path / "log"
    log.write_text(result.stdout + result.stderr)
    from localdet.processes import launcher

    failure = launcher.failure(log)
    assert failure is not None
    assert failure.signature == "ModuleNotFoundError: No module named 'hooktest_absent'"
    assert failure.told == (
        "ModuleNotFoundError: No module named 'hooktest_absent'; it was to come from "
        "startup-hook.sh line 2, `pip install hooktest-absent==1.2.3`, which failed: No "
        "matching distribution found for hooktest-absent==1.2.3")


def test_a_trial_class_missing_it_names_the_line_too(monkeypatch):
    from determined.exec import hook_failures, run_trial

    monkeypatch.setenv(hook_failures.VAR, json.dumps([{
        "line": 4, "command": "pip install opencv-python==4.1", "reason": "failed: no network",
        "packages": ["opencv-python"]}]))
    # What the trial class's module raised: its import name is not the distribution's.
    error = ModuleNotFoundError("No module named 'cv2'", name="cv2")
    assert hook_failures.named(error, run_trial.exception_line(error)) == (
        "ModuleNotFoundError: No module named 'cv2'; it was to come from startup-hook.sh line "
        "4, `pip install opencv-python==4.1`, which failed: no network")
    unrelated = ModuleNotFoundError("No module named 'yaml_free'", name="yaml_free")
    assert hook_failures.hint(unrelated) == ""
    from determined.core._reporting import FAILURE_MARK

    assert hook_failures.FAILURE_MARK == FAILURE_MARK  # a copy, kept equal


SYSTEM_HOOK = """\
echo start
apt-get update
sudo apt-get install -y libgl1
conda install -y -c conda-forge cudatoolkit
bash ./setup-machine.sh
export HOOK_VALUE=after
echo prepared > made-by-hook.txt
"""


def test_lines_that_change_the_machine_are_skipped_unless_allowed(tmp_path):
    model = folder(tmp_path / "model", SYSTEM_HOOK)
    (model / "setup-machine.sh").write_text("yum install -y gcc\necho script done\n")
    fake = tmp_path / "fake-bin"  # stand-ins for the machine's own commands
    fake.mkdir()
    for name in ("apt-get", "sudo", "conda", "yum"):
        (fake / name).write_text(f"#!/bin/sh\necho \"the machine's {name}: $*\"\n")
        (fake / name).chmod(0o755)
    path = f"{fake}:/usr/bin:/bin"
    result = run_wrapped(tmp_path, SYSTEM_HOOK, [sys.executable, "train.py"], path=path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "the machine's " not in result.stdout
    assert "script done" in result.stdout and "script sees HOOK_VALUE=after" in result.stdout
    told = ("was not run: it changes the machine, not the experiment (start the daemon with "
            "`localdet daemon --allow-system-hooks`, or `localdet run --allow-system-hooks`, "
            "to run such lines); the hook goes on")
    assert warnings_in(result.stdout) == [
        f"[localdet] warning: startup-hook.sh line 2: `apt-get update` {told}",
        f"[localdet] warning: startup-hook.sh line 3: `sudo apt-get install -y libgl1` {told}",
        "[localdet] warning: startup-hook.sh line 4: `conda install -y -c conda-forge "
        f"cudatoolkit` {told}",
        f"[localdet] warning: a script startup-hook.sh ran: `yum install -y gcc` {told}",
    ]
    allowed = run_wrapped(tmp_path, SYSTEM_HOOK, [sys.executable, "train.py"], path=path,
                          allow_system=True)
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert warnings_in(allowed.stdout) == []
    for ran in ("apt-get: update", "sudo: apt-get install -y libgl1",
                "conda: install -y -c conda-forge cudatoolkit", "yum: install -y gcc"):
        assert f"the machine's {ran}" in allowed.stdout


def test_strict_hooks_end_the_trial_at_a_failing_line(tmp_path):
    hook = "echo start\npip install hooktest-missing==9.9\necho never\n"
    result = run_wrapped(tmp_path, hook, [sys.executable, "train.py"], strict=True)
    assert result.returncode == 1
    assert "never" not in result.stdout and "script sees" not in result.stdout
    assert ("error: startup-hook.sh failed with exit code 1; its last output line: ERROR: No "
            "matching distribution found for hooktest-missing==9.9") in result.stdout
    refused = run_wrapped(tmp_path, "apt-get install -y x\necho never\n",
                          [sys.executable, "train.py"], strict=True)
    assert refused.returncode == 1 and "never" not in refused.stdout
    assert "error: startup-hook.sh failed with exit code 1" in refused.stdout


def _submit(home, tmp_path, name, hook, **environment):
    model = folder(tmp_path / name, hook)
    config = tmp_path / f"{name}.yaml"
    config.write_text(yaml.safe_dump({
        "name": name,
        "entrypoint": "python3 train.py",
        "searcher": {"name": "single", "metric": "val_loss"},  # no length: the script decides
        "max_restarts": 3,
        "environment": {"image": {"cpu": "determinedai/tensorflow-ngc:0.38.1"},
                        "environment_variables": ["CONFIG_VAR=from-config"], **environment},
    }))
    home.cli("submit", config, model)


@pytest.mark.slow
def test_a_hook_runs_before_the_trial_and_a_failing_one_is_its_error(home, tmp_path, daemons):
    daemons(home, "--slots", "1")
    _submit(home, tmp_path, "hook-ok", GOOD_HOOK)
    _submit(home, tmp_path, "hook-fails", BAD_HOOK)
    # Lines that cannot work here: warnings, and the trial goes on; strict, they end it.
    _submit(home, tmp_path, "hook-warns", WARNING_HOOK)
    _submit(home, tmp_path, "hook-strict", WARNING_HOOK, startup_hook="strict")
    names = ("hook-ok", "hook-fails", "hook-warns", "hook-strict")
    ids = {name: home.experiment_named(name)["id"] for name in names}
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

    warned = facts["hook-warns"]
    assert warned["state"] == "COMPLETED", warned
    told = [w for w in warned["warnings"] if w.startswith("startup-hook.sh")]
    assert told == [
        "startup-hook.sh line 5: `pip install --no-index hooktest-missing==9.9` failed: No "
        "matching distribution found for hooktest-missing==9.9",
        "startup-hook.sh line 6: `apt-get install -y libgl1` was not run: it changes the "
        "machine, not the experiment (start the daemon with `localdet daemon "
        "--allow-system-hooks`, or `localdet run --allow-system-hooks`, to run such lines)"]
    status = home.cli("status", ids["hook-warns"]).stdout
    assert "startup-hook.sh line 5" in status and "startup-hook.sh line 6" in status
    log = layout.trial_log(ids["hook-warns"], warned["trials"][0]["id"]).read_text()
    assert "script sees HOOK_VALUE=42" in log
    assert "[localdet] warning: startup-hook.sh line 6: `apt-get install -y libgl1`" in log

    strict = facts["hook-strict"]
    assert strict["state"] == "ERROR", strict
    assert strict["trials"][0]["error"].startswith(
        "startup-hook.sh failed with exit code 1; its last output line: ERROR: No matching "
        "distribution found for hooktest-missing==9.9")


def test_each_node_of_a_cluster_trial_runs_the_hook_with_the_daemons_options(tmp_path):
    from localdet.processes.launcher import supervised_argv, unsupervised_argv

    (tmp_path / startup_hook.HOOK).write_text("true\n")
    argv = [sys.executable, "train.py"]
    hooked = startup_hook.wrapped(supervised_argv(argv, "multi_worker_mirrored", 2), tmp_path,
                                  allow_system=True, strict=True)
    assert unsupervised_argv(hooked) == [sys.executable, "-P", "-m", startup_hook.MODULE,
                                         "--allow-system", "--strict", "--", *argv]
    assert startup_hook.unwrapped(argv) == ([], argv)
