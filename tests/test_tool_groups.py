"""A contributor without root runs the tests it can: scripts/test-tools names each group of
tests whose tool it could not provision, with the command that would, and tests/conftest.py
skips that group's tests saying so (scripts/test then lists the groups at the end)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from conftest import REPO, TOOL_GROUPS

NOBODY = 65534


def as_a_user_without_tools(home: Path, argv: list[str]) -> subprocess.CompletedProcess:
    """`argv` run as a user other than root, on a PATH of the bare tools a shell script needs
    (no Chromium, podman or compiler), with no writable cache for the Horovod environment."""
    bare = home / "bin"
    bare.mkdir()
    for tool in ("bash", "env", "id", "cat", "rm", "mkdir", "dirname", "awk", "paste"):
        (bare / tool).symlink_to(shutil.which(tool))
    env = {"PATH": str(bare), "HOME": str(home), "LOCALDET_CACHE": "/proc/no-cache"}
    prefix = [] if os.geteuid() != 0 else [
        shutil.which("setpriv"), f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    return subprocess.run([*prefix, *argv], env=env, capture_output=True, text=True,
                          timeout=60)


def test_without_root_the_tools_script_names_each_group_and_its_command():
    # (pytest's temporary folders are root's alone)
    home = Path(tempfile.mkdtemp(prefix="localdet-no-root-"))
    try:
        home.chmod(0o755)
        done = as_a_user_without_tools(home, [str(REPO / "scripts" / "test-tools")])
    finally:
        shutil.rmtree(home)
    assert done.returncode == 0, done.stderr
    missing = {line.split()[1]: line.split(None, 2)[2] for line in done.stdout.splitlines()
               if line.startswith("missing ")}
    assert set(missing) == set(TOOL_GROUPS)
    assert missing["browser"] == "sudo apt-get install chromium"
    assert missing["image"].endswith("scripts/test tests/test_container_image.py")
    assert "scripts/horovod-env" in missing["horovod"]
    assert missing["jax"] == "scripts/jax-env"
    assert "LOCALDET_HOROVOD_PYTHON" not in done.stdout and "LOCALDET_JAX_PYTHON" not in done.stdout


def run_pytest(missing: str, *targets: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "LOCALDET_TEST_MISSING": missing}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0",
                           "-rs", "-q", *targets], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


def test_a_missing_group_is_skipped_by_name_and_the_rest_runs():
    done = run_pytest("browser horovod",
                      "tests/test_records_scale.py", "tests/test_horovod_e2e.py",
                      "-k", "chromium or short_series or horovod_ranks_end_like_one_slot")
    assert done.returncode == 0, done.stdout[-3000:]
    # The chromium test and the Horovod one skipped, saying which tool; the other ran.
    assert "1 passed, 2 skipped" in done.stdout, done.stdout[-3000:]
    assert "needs Chromium, which scripts/test could not provision here (group 'browser'" \
        in done.stdout
    assert "needs the Horovod environment" in done.stdout


def test_an_unknown_group_is_a_usage_error():
    done = run_pytest("browsers", "tests/test_tool_groups.py", "--collect-only")
    assert done.returncode == 4
    assert "LOCALDET_TEST_MISSING names ['browsers']; the groups are" in done.stderr
