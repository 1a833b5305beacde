"""localdet's image, built and run (issue 26, item 2): `scripts/cpu-image` builds the CPU
variant with podman from the Dockerfile the GPU image is built from (a Debian base made with
debootstrap once per machine; the dependencies' layers kept by podman), then this runs what it
built:

- as a container where the runtime can start one: the daemon (the image's own command) with
  the state folder mounted from the host, the digits example submitted with `podman exec`, the
  dashboard on the published port answering with its token and 401 without, the container
  restarted with the experiment still there;
- otherwise (on a kernel where the runtime refuses, e.g. `crun: setrlimit RLIMIT_NPROC:
  Operation not permitted`) inside the image's file system, mounted by podman, with `chroot`:
  the image's Python and `localdet` run the image's own command (the daemon and its
  dashboard, on the host's network), the digits example is submitted and trains to
  COMPLETED, and `localdet status` reads the state folder from the host.

It prints in one line which of the two it did. Where no engine can build, it is skipped
with the reason in one line.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser import free_port
from conftest import REPO

pytestmark = pytest.mark.slow

CANNOT_BUILD = 77  # scripts/cpu-image's status where this machine cannot build
EXAMPLE = ["examples/digits_trial/const.yaml", "examples/digits_trial"]  # in the image's WORKDIR


def podman(*argv: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    done = subprocess.run(["podman", *argv], capture_output=True, text=True, timeout=timeout)
    if check and done.returncode:
        raise AssertionError(f"podman {' '.join(argv)} failed ({done.returncode}): "
                             f"{done.stderr[-3000:]}")
    return done


def host_status(state: Path, *argv: str) -> str:
    """`localdet status` run on this machine against the state folder the image wrote."""
    done = subprocess.run([sys.executable, "-m", "localdet", "status", *argv],
                          env={**os.environ, "LOCALDET_HOME": str(state)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def ask(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code


def wait_for(what: str, check, seconds: float, log=lambda: ""):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}; log:\n{log()[-4000:]}")


def completed(state: Path) -> bool:
    if not (state / "localdet.db").exists():
        return False
    experiments = json.loads(host_status(state, "--json"))
    if experiments and experiments[0]["state"] in ("CANCELED", "ERROR"):
        raise AssertionError(f"the digits example ended {experiments[0]['state']}")
    return bool(experiments) and experiments[0]["state"] == "COMPLETED"


def check_dashboard(address: str) -> None:
    """The daemon's dashboard answers with the token it printed, and 401 without it."""
    base, token = address.split("?token=")
    assert ask(f"{base}api/experiments?token={token}") == 200
    assert ask(f"{base}api/experiments") == 401


# -- as a container ------------------------------------------------------------------------------

def container_refusal(image: str) -> str | None:
    """None where podman starts a container here; else the runtime's reason, in one line."""
    done = podman("run", "--rm", image, "true", check=False)
    if done.returncode == 0:
        return None
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else f"podman run exited {done.returncode}"


def run_as_container(image: str, state: Path) -> None:
    name, port = f"localdet-test-{uuid.uuid4().hex[:8]}", free_port()
    podman("run", "-d", "--name", name, "-p", f"127.0.0.1:{port}:8090",
           "-v", f"{state}:/localdet", image)
    try:
        def logs() -> str:
            done = podman("logs", name, check=False)
            return done.stdout + done.stderr

        def address() -> str | None:
            found = re.search(r"dashboard at http://[^/]+/(\?token=[\w-]+)", logs())
            return found and f"http://127.0.0.1:{port}/{found.group(1)}"

        url = wait_for("the daemon's dashboard address", address, 120, logs)
        wait_for("the dashboard", lambda: ask(url) == 200, 60, logs)
        podman("exec", name, "localdet", "submit", *EXAMPLE)
        wait_for("the digits example to complete", lambda: completed(state), 300, logs)
        check_dashboard(url)
        podman("restart", name)
        wait_for("the restarted daemon", lambda: "COMPLETED" in podman(
            "exec", name, "localdet", "status", check=False).stdout, 120, logs)
        assert "digits-const" in host_status(state)
    finally:
        podman("rm", "-f", "--volumes", name, check=False)


# -- inside the mounted image, with chroot ------------------------------------------------------

@contextlib.contextmanager
def mounted(image: str) -> Iterator[Path]:
    """The file system of a container made from `image` (never started), writable."""
    name = f"localdet-test-{uuid.uuid4().hex[:8]}"
    podman("create", "--name", name, image)
    try:
        yield Path(podman("mount", name).stdout.strip())
    finally:
        podman("umount", name, check=False)
        podman("rm", "-f", "--volumes", name, check=False)


def chrooted(root: Path, state: Path, image: str, argv: list[str]) -> list[str]:
    """`argv` run as the image would run it, in a mount namespace of its own: the image's
    environment and working folder, /proc, /sys, /dev and a fresh /tmp, and the state
    folder mounted at the image's volume (/localdet)."""
    config = json.loads(podman("image", "inspect", image).stdout)[0]["Config"]
    (volume,) = config["Volumes"]  # the Dockerfile's one VOLUME
    q = shlex.quote
    mounts = " && ".join([
        f"mount --rbind /dev {q(f'{root}/dev')}", f"mount --rbind /sys {q(f'{root}/sys')}",
        f"mount -t proc proc {q(f'{root}/proc')}", f"mount -t tmpfs tmpfs {q(f'{root}/tmp')}",
        f"mkdir -p {q(f'{root}{volume}')}", f"mount --bind {q(str(state))} {q(f'{root}{volume}')}"])
    inside = f"cd {q(config.get('WorkingDir') or '/')} && exec \"$@\""
    environment = " ".join(q(variable) for variable in config["Env"])
    return ["unshare", "--mount", "--fork", "sh", "-c",
            f"{mounts} && exec chroot {q(str(root))} env -i {environment} "
            f"sh -c {q(inside)} sh \"$@\"", "sh", *argv]


def stop(process: subprocess.Popen) -> None:
    """SIGTERM to the daemon's session (it stops its trials), SIGKILL after a minute."""
    for sig, wait in ((signal.SIGTERM, 60), (signal.SIGKILL, None)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_chrooted(image: str, state: Path, tmp_path: Path) -> None:
    assert shutil.which("unshare") and shutil.which("chroot"), "util-linux and coreutils"
    config = json.loads(podman("image", "inspect", image).stdout)[0]["Config"]
    command = list(config["Cmd"])
    port = free_port()  # the host's network: the image's port may be taken
    command[command.index("--port") + 1] = str(port)
    with mounted(image) as root:
        log_path = tmp_path / "daemon.log"
        with open(log_path, "w") as log:
            daemon = subprocess.Popen(chrooted(root, state, image, command), stdout=log,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        try:
            def address() -> str | None:
                found = re.search(r"dashboard at http://[^/]+/(\?token=[\w-]+)",
                                  log_path.read_text())
                if daemon.poll() is not None:
                    raise AssertionError(f"the daemon exited:\n{log_path.read_text()[-4000:]}")
                return found and f"http://127.0.0.1:{port}/{found.group(1)}"

            logs = log_path.read_text
            url = wait_for("the daemon's dashboard address", address, 120, logs)
            wait_for("the daemon to watch its queue", lambda: "watching" in logs(), 60, logs)
            submitted = subprocess.run(chrooted(root, state, image, ["localdet", "submit",
                                                                     *EXAMPLE]),
                                       capture_output=True, text=True, timeout=120)
            assert submitted.returncode == 0, submitted.stderr
            wait_for("the digits example to complete", lambda: completed(state), 300, logs)
            check_dashboard(url)
        finally:
            stop(daemon)
    table = host_status(state)
    assert "digits-const" in table and "COMPLETED" in table, table


def test_the_cpu_image_builds_and_runs_the_digits_example(tmp_path, record_property):
    start = time.monotonic()
    build = subprocess.run([str(REPO / "scripts" / "cpu-image")], capture_output=True,
                           text=True, timeout=1800)
    if build.returncode == CANNOT_BUILD:
        pytest.skip(build.stderr.strip().splitlines()[-1])
    assert build.returncode == 0, f"scripts/cpu-image failed:\n{build.stderr[-6000:]}"
    image = build.stdout.split()[-1]
    built = f"{image} (built in {time.monotonic() - start:.0f} s)"
    state = tmp_path / "state"
    state.mkdir()
    refusal = container_refusal(image)
    # `said` properties are printed at the end of the run (tests/conftest.py), xdist or not.
    if refusal is None:
        record_property("said", f"{built}: ran as a container (podman run, exec, restart)")
        run_as_container(image, state)
    else:
        record_property("said", f"{built}: ran inside its mounted image with chroot, since "
                                f"podman could not start a container here ({refusal})")
        run_chrooted(image, state, tmp_path)
