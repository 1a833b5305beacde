"""A warm process imports, before its next fork, the installed modules its last trial
imported (localdet/processes/learned_imports.py), never the trial's own code; one whose
installed paths changed since ends instead of forking, so the trial starts cold."""

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
from localdet.processes.learned_imports import SETTLED_SECONDS, InstalledPaths, import_quietly
from localdet.processes.warm_pool import WarmPool, environment_kind

# Says which modules were imported when it began; imports `wave` and its own helper, waits
# (up to 60 s) for a file to appear if told to, then imports `netrc`.
TRIAL = """
import json, os, sys, time
out, wait_for = sys.argv[1], sys.argv[2]
seen = {name: name in sys.modules for name in ("wave", "netrc", "trial_helper")}
with open(out, "a") as file:
    file.write(json.dumps(seen) + "\\n")
import wave, trial_helper
deadline = time.monotonic() + 60
while wait_for != "-" and not os.path.exists(wait_for) and time.monotonic() < deadline:
    time.sleep(0.05)
import netrc
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
    seen, second_began = tmp_path / "seen.jsonl", tmp_path / "second-began"
    home = tmp_path / "home"
    home.mkdir()
    pool = WarmPool(Layout(home), size=1)
    pool.keep_for(environment_kind(Spec([], folder).env))

    def fork(wait_for: str):
        spec = Spec([sys.executable, str(folder / "trial.py"), str(seen), wait_for], folder)
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
        # The first waits, its imports settled, until the second has begun.
        first = fork(str(second_began))
        wait_for(lambda: seen.exists(), 120, "the first trial to begin")
        time.sleep(SETTLED_SECONDS * 2.5)
        ended(fork("-"))
        second_began.touch()
        ended(first)
        ended(fork("-"))
    finally:
        pool.close()
    first, second, third = (json.loads(line) for line in seen.read_text().splitlines())
    assert first == {"wave": False, "netrc": False, "trial_helper": False}
    # `wave` was told once the first trial's imports settled, while it still ran; `netrc`,
    # imported since, as it ended. The trials' own module was never imported ahead.
    assert second == {"wave": True, "netrc": False, "trial_helper": False}
    assert third == {"wave": True, "netrc": True, "trial_helper": False}


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
