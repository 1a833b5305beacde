"""A warm process imports, before its next fork, the installed modules its last trial
imported (localdet/processes/learned_imports.py), never the trial's own code, and a later
daemon's warm process of its kind starts with them; one whose installed paths changed since
ends instead of forking, so the trial starts cold."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from conftest import wait_for

from localdet.config import engines
from localdet.paths import Layout
from localdet.processes.learned_imports import (
    TELL_PERIOD,
    InstalledPaths,
    RememberedImports,
    import_quietly,
)
from localdet.processes.warm_pool import WarmPool, environment_kind

# Says which modules were imported when it began; imports `wave` and its own helper, waits
# (up to 60 s each) for a first file to appear, imports `netrc`, waits for a second file, and
# imports `tabnanny` as it ends; told `look`, it only says what it found imported.
TRIAL = """
import json, os, sys, time
out, waits = sys.argv[1], sys.argv[2:]
seen = {name: name in sys.modules for name in ("wave", "netrc", "tabnanny", "trial_helper")}
with open(out, "a") as file:
    file.write(json.dumps(seen) + "\\n")
if waits == ["look"]:
    sys.exit(0)

def wait(path):
    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)

import wave, trial_helper
wait(waits[0])
import netrc
wait(waits[1])
import tabnanny
"""


@dataclass
class Spec:
    """What the pool reads of a launch (localdet/processes/launcher.py's LaunchSpec)."""
    argv: list[str]
    cwd: Path
    env: dict = field(default_factory=lambda: {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    engine: str = engines.SINGLE


def test_later_trials_start_with_what_earlier_ones_imported_from_the_installed_paths(
        tmp_path):
    folder = tmp_path / "trial"
    folder.mkdir()
    (folder / "trial.py").write_text(TRIAL)
    (folder / "trial_helper.py").write_text("VALUE = 1\n")  # the trial's own code
    seen, first_goes_on, first_ends = (tmp_path / "seen.jsonl", tmp_path / "first-goes-on",
                                       tmp_path / "first-ends")
    home = tmp_path / "home"
    home.mkdir()
    pool = WarmPool(Layout(home), size=1)
    pool.keep_for(environment_kind(Spec([], folder).env))

    def fork(*waits: str):
        spec = Spec([sys.executable, str(folder / "trial.py"), str(seen), *waits], folder)
        log = os.open(tmp_path / "trial.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            forked = pool.take(spec).hand_over(spec, log)
        finally:
            os.close(log)
        assert forked is not None
        return forked

    def ended(forked) -> None:
        assert forked.wait(timeout=120) == 0, (tmp_path / "trial.log").read_text()

    try:
        # The first trial runs beside the next three, importing in two bursts: the trials
        # forked after each start with what it had imported by then.
        first = fork(str(first_goes_on), str(first_ends))
        wait_for(lambda: seen.exists(), 120, "the first trial to begin")
        time.sleep(TELL_PERIOD * 6)
        ended(fork("look"))
        first_goes_on.touch()
        time.sleep(TELL_PERIOD * 6)
        ended(fork("look"))
        first_ends.touch()
        ended(first)
        ended(fork("look"))
    finally:
        pool.close()
    # A later daemon's warm process of the kind starts with them, kept in the state folder.
    (remembered,) = Layout(home).warm_imports.iterdir()
    names = json.loads(remembered.read_text())  # in the order told (with what they import)
    assert names.index("wave") < names.index("netrc") < names.index("tabnanny")
    assert "trial_helper" not in names
    pool = WarmPool(Layout(home), size=1)
    pool.keep_for(environment_kind(Spec([], folder).env))
    try:
        ended(fork("look"))
    finally:
        pool.close()
    first, second, third, fourth, later = (json.loads(line)
                                           for line in seen.read_text().splitlines())
    none = {"wave": False, "netrc": False, "tabnanny": False, "trial_helper": False}
    assert first == none
    # `wave` and `netrc` were told as the first trial imported them, while it ran;
    # `tabnanny`, imported as it ended, at its end. The trials' own module was never imported
    # ahead.
    assert second == {**none, "wave": True}
    assert third == {**none, "wave": True, "netrc": True}
    assert fourth == later == {**none, "wave": True, "netrc": True, "tabnanny": True}


def test_each_interpreter_keras_line_and_backend_remembers_its_own_imports(tmp_path,
                                                                          monkeypatch):
    monkeypatch.delenv("KERAS_BACKEND", raising=False)
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
    keras_2 = RememberedImports(tmp_path)
    keras_2.add(["sklearn", "scipy", "sklearn"])
    keras_2.add(["scipy"])
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "0")
    keras_3 = RememberedImports(tmp_path)
    assert keras_3.names == [] and keras_3.path != keras_2.path
    keras_3.add(["pandas"])
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
    assert RememberedImports(tmp_path).names == ["sklearn", "scipy"]
    # Two warm processes of the line: each writes what the other wrote too.
    other = RememberedImports(tmp_path)
    keras_2.add(["h5py"])
    other.add(["PIL"])
    assert RememberedImports(tmp_path).names == ["sklearn", "scipy", "h5py", "PIL"]
    keras_2.path.write_text("{not json")  # damaged: forgotten, not an error
    assert RememberedImports(tmp_path).names == []


def test_only_modules_of_the_installed_paths_are_learned_and_a_change_there_is_seen(
        tmp_path, monkeypatch):
    installed, elsewhere = tmp_path / "site-packages", tmp_path / "code"
    installed.mkdir()
    elsewhere.mkdir()
    (installed / "learned_lib.py").write_text("VALUE = 1\n")
    (installed / "broken_lib.py").write_text("raise RuntimeError('not on this machine')\n")
    (elsewhere / "own_code.py").write_text("VALUE = 2\n")
    for folder in (installed, elsewhere):
        monkeypatch.syspath_prepend(str(folder))
    paths = InstalledPaths([str(installed)])
    before = set(sys.modules)
    import learned_lib  # noqa: F401
    import own_code  # noqa: F401
    assert paths.modules_since(before) == ["learned_lib"]
    for name in ("learned_lib", "own_code"):
        monkeypatch.delitem(sys.modules, name)
    # A module that fails is left for the trial to import, and to fail in.
    assert import_quietly(["learned_lib", "broken_lib"]) == 1
    assert "learned_lib" in sys.modules and "broken_lib" not in sys.modules
    monkeypatch.delitem(sys.modules, "learned_lib")
    assert not paths.changed()
    (installed / "new_package.py").write_text("")  # a `pip install` into the environment
    assert paths.changed()
