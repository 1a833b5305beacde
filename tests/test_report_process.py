"""The report server in a process of its own (localdet/reporting/report_process.py): the
same wire and token check from its child process, which writes the trial's reports into
SQLite, is started again on the same port if it dies, stops with the daemon's close, dies
with a daemon killed -9 (no orphan), and fails loudly when it cannot serve; its writes and
the daemon's take turns across the two processes."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from conftest import start_trial

from localdet.paths import Layout
from localdet.records.db import now
from localdet.reporting.launch_tokens import ReportServerError, daemon_secret, launch_token
from localdet.reporting.report_process import ProcessTurns, ReportProcess

REPO = Path(__file__).resolve().parents[1]


def ask(port: int, path: str, body: str, token: str) -> tuple[int, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("POST", path, body, {"Authorization": f"Bearer {token}",
                                                "X-Localdet-Launch": "1"})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def gone(pid: int, seconds: float = 30.0) -> bool:
    """Whether `pid` has ended (or is a zombie nobody has reaped yet) within `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def test_reports_through_the_child_restarted_when_it_dies_and_stopped_on_close(tmp_path):
    db, trial_id, _, _ = start_trial(tmp_path, target=100)
    db.update_trial(trial_id, state="RUNNING", started_at=now())
    layout = Layout(tmp_path / "home")
    logged: list[str] = []
    server = ReportProcess(layout, "127.0.0.1", log=logged.append).start()
    db.turns = server.turns  # as the daemon does
    try:
        assert server.pid != os.getpid() and psutil.Process(server.pid).ppid() == os.getpid()
        token = launch_token(daemon_secret(layout), trial_id, 1)
        path = f"/v1/trials/{trial_id}"
        assert ask(server.port, f"{path}/hello", "{}", "0" * 64)[0] == 403
        status, body = ask(server.port, f"{path}/report",
                           json.dumps({"metrics": [["training", 10, {"loss": 0.5}]]}), token)
        assert status == 200, body
        with db.atomic():  # the daemon's transaction, in turn with the child's writer
            db.update_trial(trial_id, stop_requested=None)
        assert [m.metrics for m in db.metrics(trial_id, "training")] == [{"loss": 0.5}]

        first, port = server.pid, server.port
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while server.pid == first and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.pid != first and server.port == port
        assert any(f"(pid {first}) exited with code -9; starting it again on port {port}"
                   in line for line in logged)
        while time.monotonic() < deadline:  # serving again, on the same port
            try:
                status, body = ask(port, f"{path}/report", json.dumps(
                    {"metrics": [["training", 20, {"loss": 0.25}]]}), token)
                break
            except ConnectionError:
                time.sleep(0.05)
        assert status == 200, body
        assert [m.batches_trained for m in db.metrics(trial_id, "training")] == [10, 20]
        # Another server cannot take its port: it says so, and why.
        with pytest.raises(ReportServerError, match="free the port or choose another"):
            ReportProcess(layout, port=port).start()
    finally:
        child = server.pid
        server.close()
        db.close()
    assert child is not None and gone(child, 0)  # reaped by close(): no orphan
    assert server.stats is not None and server.stats["pieces"] >= 1
    assert not server.failed


def test_the_child_dies_with_a_daemon_killed_9(tmp_path):
    layout = Layout(tmp_path / "home").ensure()
    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\nfrom pathlib import Path\n"
         "from localdet.paths import Layout\n"
         "from localdet.reporting.report_process import ReportProcess\n"
         f"server = ReportProcess(Layout(Path({str(layout.home)!r}))).start()\n"
         "print(server.pid, flush=True)\n"
         "time.sleep(600)\n"],
        stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        child = int(parent.stdout.readline())
        assert psutil.Process(child).ppid() == parent.pid
    finally:
        parent.kill()
        parent.wait()
    assert gone(child)


def test_process_turns_exclude_another_process(tmp_path):
    layout = Layout(tmp_path / "home").ensure()
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys\nfrom pathlib import Path\n"
         "from localdet.paths import Layout\n"
         "from localdet.reporting.report_process import ProcessTurns\n"
         f"with ProcessTurns(Layout(Path({str(layout.home)!r}))):\n"
         "    print('held', flush=True)\n"
         "    sys.stdin.readline()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
    turns = ProcessTurns(layout)
    entered = threading.Event()

    def take() -> None:
        with turns, turns:  # re-entrant within the thread
            entered.set()

    try:
        assert holder.stdout.readline() == "held\n"
        taker = threading.Thread(target=take)
        taker.start()
        assert not entered.wait(0.5)  # held by the other process
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert entered.wait(30)
        taker.join()
    finally:
        holder.kill()
        holder.wait()
        turns.close()
