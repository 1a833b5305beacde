"""The suite's own CPU accounting (tests/conftest.py, `_CpuClock`): a test's CPU counts the
processes it started that were never waited for, where a cgroup lets it."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time

import pytest
from conftest import _CPU_CLOCK, _cpu_seconds

SPIN = 0.6  # CPU seconds the orphaned grandchild spends

GRANDPARENT = f"""
import subprocess, sys
spin = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < {SPIN}: pass"
print(subprocess.Popen([sys.executable, "-c", spin]).pid)  # never waited for
"""


def test_a_process_never_waited_for_is_counted_in_its_tests_cpu():
    _cpu_seconds()
    if not _CPU_CLOCK[0].whole:
        pytest.skip("no cgroup v1 cpuacct group could be made here (root makes one, as in "
                    "CI): the clock counts reaped processes only")
    before, reaped_before = _cpu_seconds(), resource.getrusage(resource.RUSAGE_CHILDREN)
    orphan = int(subprocess.run([sys.executable, "-c", GRANDPARENT], capture_output=True,
                                text=True, check=True).stdout)
    deadline = time.monotonic() + 60
    while os.path.exists(f"/proc/{orphan}") and time.monotonic() < deadline:
        time.sleep(0.05)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert _cpu_seconds() - before >= SPIN
    # What the reaped children alone would have said: the orphan's CPU missing.
    assert (reaped.ru_utime + reaped.ru_stime
            - reaped_before.ru_utime - reaped_before.ru_stime) < SPIN
