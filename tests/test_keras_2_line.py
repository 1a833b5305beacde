"""Every test marked `keras2` runs a second time under the Keras 2 line (tf_keras), here.

    @pytest.mark.keras2          # a test, a parameter (pytest.param(..., marks=...)) or a
    def test_...():              # file (pytestmark): it also runs under Keras 2

A process holds one Keras line, chosen before TensorFlow is imported (TF_USE_LEGACY_KERAS=1),
so the marked tests run again in a pytest session of their own. One session for all of them,
not one per file: each session pays pytest's and TensorFlow's start-up again, some 7 s of CPU
on a machine the suite keeps busy.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from collections import Counter

import pytest
from conftest import REPO

pytestmark = pytest.mark.slow

TESTS = REPO / "tests"
# A file takes part where it marks something: the session imports only those files.
MARKED = re.compile(r"pytest\.mark\.keras2\b")


def marked_files() -> list[str]:
    return sorted(str(path.relative_to(REPO)) for path in TESTS.rglob("test_*.py")
                  if MARKED.search(path.read_text()))


@pytest.mark.keras2
def test_the_session_runs_the_line_its_environment_names():
    import tensorflow as tf

    legacy = os.environ.get("TF_USE_LEGACY_KERAS") == "1"
    assert tf.keras.__name__.startswith("tf_keras") == legacy, tf.keras.__name__


@pytest.mark.skipif(os.environ.get("TF_USE_LEGACY_KERAS") == "1",
                    reason="already running under Keras 2")
# Some 860 tests in one session: 4.5 to 6 minutes here, over the suite's 600 s per test on a
# machine loaded by other work (it once timed out there); the session's own limit holds it.
@pytest.mark.timeout(1500)
def test_the_marked_tests_pass_under_keras_2(tmp_path):
    files = marked_files()
    assert "tests/test_keras_2_line.py" in files and len(files) > 1, files
    report = tmp_path / "keras2.xml"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-m",
         "keras2", "--junitxml", str(report), "--basetemp", str(tmp_path / "keras2"), *files],
        env={**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"},
        capture_output=True, text=True, timeout=1500, cwd=REPO)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    passed: Counter = Counter()
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        if not any(child.tag in ("skipped", "failure", "error") for child in case):
            module = next(part for part in case.get("classname", "").split(".")
                          if part.startswith("test_"))
            passed[module] += 1
    # Each file ran some of its tests under Keras 2, this one's check of the line among them.
    assert passed["test_keras_2_line"] == 1, result.stdout[-3000:]
    assert all(passed[os.path.basename(f)[:-3]] for f in files), (passed, files)
