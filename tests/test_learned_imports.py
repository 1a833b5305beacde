"""A warm process imports, before its next fork, the installed modules its last trial
imported (localdet/processes/learned_imports.py), never the trial's own code; one whose
installed paths changed since ends instead of forking, so the trial starts cold."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from localdet.config import engines
from localdet.paths import Layout
from localdet.processes.learned_imports import InstalledPaths, import_quietly
from localdet.processes.warm_pool import WarmPool, environment_kind

# Run twice from one warm process: says which modules were imported when it began.
TRIAL = """
import json, sys
seen = {name: name in sys.modules for name in ("wave", "netrc", "trial_helper")}
import wave, netrc, trial_helper
with open(sys.argv[1], "a") as out:
    out.write(json.dumps(seen) + "\\n")
"""


@dataclass
class Spec:
    """What the pool reads of a launch (localdet/processes/launcher.py's LaunchSpec)."""
    argv: list[str]
    cwd: Path
    env: dict = field(default_factory=lambda: {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    engine: str = engines.SINGLE


def test_the_second_trial_starts_with_what_the_first_imported_from_the_installed_paths(
        tmp_path):
    assert "wave" not in sys.modules and "netrc" not in sys.modules  # nor in a warm process
    folder = tmp_path / "trial"
    folder.mkdir()
    (folder / "trial.py").write_text(TRIAL)
    (folder / "trial_helper.py").write_text("VALUE = 1\n")  # the trial's own code
    seen = tmp_path / "seen.jsonl"
    spec = Spec([sys.executable, str(folder / "trial.py"), str(seen)], folder)
    pool = WarmPool(Layout(tmp_path / "home"), size=1)
    (tmp_path / "home").mkdir()
    pool.keep_for(environment_kind(spec.env))
    try:
        for _ in range(2):
            log = os.open(tmp_path / "trial.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            forked = pool.take(spec).hand_over(spec, log)
            os.close(log)
            assert forked is not None and forked.wait(timeout=120) == 0, \
                (tmp_path / "trial.log").read_text()
    finally:
        pool.close()
    first, second = (json.loads(line) for line in seen.read_text().splitlines())
    assert first == {"wave": False, "netrc": False, "trial_helper": False}
    # The standard library's modules were imported ahead; the trial's own module was not.
    assert second == {"wave": True, "netrc": True, "trial_helper": False}


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
