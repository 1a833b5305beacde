"""The report server's one SQLite writer (`GroupWriter`) and the turns it takes with the
daemon's connection (`WriteTurns`): every write recorded exactly once whoever sends it, an
answer only after the commit (a report acknowledged survives a kill -9 right after), and a
failed write answered to its own request only."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import start_trial

from localdet.paths import Layout
from localdet.records.db import StateDB, now
from localdet.reporting.http_reporter import HTTPReporter
from localdet.reporting.report_server import (
    GroupWriter,
    ReportServer,
    WriteTurns,
    daemon_secret,
    launch_token,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def running(tmp_path):
    """A recorded, running trial: (db, trial id, layout)."""
    db, trial_id, _, _ = start_trial(tmp_path, target=100)
    db.update_trial(trial_id, state="RUNNING", started_at=now())
    yield db, trial_id, Layout(tmp_path / "home")
    db.close()


@pytest.fixture
def writer(running):
    db, trial_id, layout = running
    writer = GroupWriter(layout.db).start()
    yield writer
    writer.close()


def held_writer(writer: GroupWriter):
    """Keep the writer busy in a piece until the returned event is set, so that what is
    queued meanwhile runs as one group."""
    entered, release = threading.Event(), threading.Event()

    def block(db):
        entered.set()
        release.wait(30)

    thread = threading.Thread(target=writer.run, args=(block,))
    thread.start()
    assert entered.wait(30)
    return release, thread


def queue(writer: GroupWriter, work, results: dict, key) -> threading.Thread:
    def run():
        try:
            results[key] = ("ok", writer.run(work))
        except BaseException as error:  # noqa: BLE001 - the test looks at which
            results[key] = ("error", error)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def wait_queued(writer: GroupWriter, count: int) -> None:
    deadline = time.monotonic() + 30
    while len(writer._queue) < count:
        assert time.monotonic() < deadline, "the pieces never reached the writer's queue"
        time.sleep(0.01)


def test_many_threads_reporting_at_once_record_every_row_exactly_once(running, writer):
    db, trial_id, layout = running
    threads, errors = [], []

    def report(thread_index: int) -> None:
        try:
            for batches in range(1, 41):
                # Every row is sent by two threads (a retry, or two connections of a trial):
                # the second merges into the first, so each row is recorded once.
                key = (thread_index // 2) * 40 + batches
                writer.run(lambda w, k=key, i=thread_index: w.record_metrics(
                    trial_id, "training", k, {f"from_{i % 2}": float(k)}))
        except BaseException as error:  # noqa: BLE001
            errors.append(error)

    for index in range(16):
        threads.append(threading.Thread(target=report, args=(index,)))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors
    rows = db.metrics(trial_id, "training")
    assert [r.batches_trained for r in rows] == list(range(1, 8 * 40 + 1))
    assert all(r.metrics == {"from_0": float(r.batches_trained),
                             "from_1": float(r.batches_trained)} for r in rows)
    assert db.trial(trial_id).batches_trained == 8 * 40
    assert writer.pieces == 16 * 40  # every piece committed, most of them in shared groups
    assert writer.groups <= writer.pieces


def test_what_is_queued_while_the_writer_is_busy_commits_as_one_group(running, writer):
    db, trial_id, _ = running
    release, blocker = held_writer(writer)
    results: dict = {}
    threads = [queue(writer, lambda w, b=b: w.record_metrics(trial_id, "training", b,
                                                             {"loss": 1.0}), results, b)
               for b in range(1, 11)]
    wait_queued(writer, 10)
    groups = writer.groups
    assert db.metrics(trial_id) == []  # nothing is answered before its commit
    release.set()
    for thread in [blocker, *threads]:
        thread.join(30)
    assert all(outcome == "ok" for outcome, _ in results.values())
    assert writer.groups == groups + 2  # the blocker's, then the ten together
    assert len(db.metrics(trial_id)) == 10


def between_two_reports(writer, trial_id: int, failing, after_batches: int, results: dict,
                        release, blocker) -> None:
    """Queue a training row at batch 1, then `failing`, then a row at `after_batches`, all
    in one group behind the held writer; release it and wait for all three."""
    threads = [queue(writer, lambda w: w.record_metrics(trial_id, "training", 1,
                                                        {"loss": 1.0}), results, "before")]
    wait_queued(writer, 1)
    threads.append(queue(writer, failing, results, "failing"))
    wait_queued(writer, 2)
    threads.append(queue(writer, lambda w: w.record_metrics(
        trial_id, "training", after_batches, {"loss": float(after_batches)}), results, "after"))
    wait_queued(writer, 3)
    release.set()
    for thread in [blocker, *threads]:
        thread.join(30)


def test_an_error_in_one_write_is_that_requests_alone(running, writer):
    db, trial_id, _ = running
    release, blocker = held_writer(writer)
    results: dict = {}

    def failing(w):
        w.record_metrics(trial_id, "training", 2, {"loss": 2.0})  # rolled back with it
        raise ValueError("this report is refused")

    between_two_reports(writer, trial_id, failing, 3, results, release, blocker)
    assert results["before"][0] == "ok" and results["after"][0] == "ok"
    assert results["failing"][0] == "error"
    assert str(results["failing"][1]) == "this report is refused"
    assert [r.batches_trained for r in db.metrics(trial_id)] == [1, 3]


def test_an_error_that_ends_the_transaction_runs_the_others_again(running, writer):
    db, trial_id, _ = running
    release, blocker = held_writer(writer)
    results: dict = {}

    def destroys_the_transaction(w):
        w.db.conn.execute("ROLLBACK")  # as SQLite does on some errors (a full disk)
        raise sqlite3.OperationalError("database or disk is full")

    between_two_reports(writer, trial_id, destroys_the_transaction, 2, results, release,
                        blocker)
    assert results["failing"][0] == "error"
    assert results["before"] == ("ok", None) and results["after"] == ("ok", None)
    rows = db.metrics(trial_id)
    assert [(r.batches_trained, r.metrics) for r in rows] == [(1, {"loss": 1.0}),
                                                             (2, {"loss": 2.0})]


def test_a_closed_writer_commits_what_was_queued_and_refuses_the_rest(running):
    db, trial_id, layout = running
    writer = GroupWriter(layout.db).start()
    release, blocker = held_writer(writer)
    results: dict = {}
    thread = queue(writer, lambda w: w.record_metrics(trial_id, "training", 7, {"loss": 1.0}),
                   results, "queued")
    wait_queued(writer, 1)
    closing = threading.Thread(target=writer.close)
    closing.start()
    release.set()
    for t in (blocker, thread, closing):
        t.join(30)
    assert results["queued"] == ("ok", None)
    assert [r.batches_trained for r in db.metrics(trial_id)] == [7]
    with pytest.raises(sqlite3.OperationalError, match="stopping"):
        writer.run(lambda w: None)


def test_turns_are_taken_in_the_order_asked_and_reentrant():
    turns, order = WriteTurns(), []
    turns.__enter__()
    with turns:  # the holder again: no wait
        pass
    waiting = []
    for name in ("first", "second"):
        def take(name=name):
            with turns:
                order.append(name)
        thread = threading.Thread(target=take)
        thread.start()
        waiting.append(thread)
        deadline = time.monotonic() + 10
        while len(turns._asked) < len(waiting):  # queued before the next one asks
            assert time.monotonic() < deadline
            time.sleep(0.005)
    turns.__exit__(None, None, None)
    for thread in waiting:
        thread.join(10)
    assert order == ["first", "second"]


def test_a_turn_held_too_long_fails_as_a_busy_database_would():
    turns = WriteTurns(seconds=0.1)
    turns.__enter__()
    failure = []

    def take():
        try:
            with turns:
                pass
        except sqlite3.OperationalError as error:
            failure.append(error)

    thread = threading.Thread(target=take)
    thread.start()
    thread.join(10)
    turns.__exit__(None, None, None)
    assert failure and "database is locked" in str(failure[0])
    with turns:  # free again for the next
        pass


def test_the_daemons_transactions_and_the_writers_take_turns(running, writer):
    db, trial_id, layout = running
    release, blocker = held_writer(writer)  # the writer holds its transaction
    asked, done = threading.Event(), threading.Event()

    def daemon_write():  # as the daemon's connection does (Daemon.run shares the turns)
        daemon_db = StateDB.open(layout.db)
        daemon_db.turns = writer.turns
        asked.set()
        with daemon_db.atomic():
            daemon_db.update_trial(trial_id, heartbeat_at="then")
        daemon_db.close()
        done.set()

    thread = threading.Thread(target=daemon_write)
    thread.start()
    assert asked.wait(30)
    deadline = time.monotonic() + 30
    while not writer.turns._asked:  # it waits its turn, not in SQLite's busy handler
        assert time.monotonic() < deadline and not done.is_set()
        time.sleep(0.01)
    release.set()
    thread.join(30)
    blocker.join(30)
    assert done.is_set() and db.trial(trial_id).heartbeat_at == "then"


CRASHING_SERVER = r"""
import os, signal, sys
from pathlib import Path
from localdet.paths import Layout
from localdet.reporting import report_server

# The moment an answer to a report has been sent, the process dies (kill -9): nothing after
# the acknowledgement runs, so what the trial was told is recorded must already be committed.
made = report_server.create_app
def create_app(server):
    app = made(server)
    async def answer_then_die(scope, receive, send):
        async def sending(message):
            await send(message)
            if (message["type"] == "http.response.body" and not message.get("more_body")
                    and scope["path"].endswith("/report")):
                os.kill(os.getpid(), signal.SIGKILL)
        await app(scope, receive, sending)
    return answer_then_die
report_server.create_app = create_app

server = report_server.ReportServer(Layout(Path(sys.argv[1])), "127.0.0.1").start()
print(server.port, flush=True)
signal.pause()
"""


def test_an_acknowledged_report_survives_a_kill_right_after_the_answer(running, tmp_path,
                                                                        processes):
    db, trial_id, layout = running
    server = processes([sys.executable, "-c", CRASHING_SERVER, layout.home],
                       stdout=subprocess.PIPE, text=True,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    port = int(server.stdout.readline())
    reporter = HTTPReporter(f"http://127.0.0.1:{port}", trial_id, 1,
                            launch_token(daemon_secret(layout), trial_id, 1),
                            trial_dir=tmp_path / "node", retry_seconds=5)
    reporter.report_training_metrics(10, {"loss": 0.5})
    reporter.flush()  # returns once acknowledged; the server dies as it answers
    assert server.wait(30) == -signal.SIGKILL
    rows = [(m.kind, m.batches_trained, m.metrics) for m in db.metrics(trial_id)]
    assert rows == [("training", 10, {"loss": 0.5})]
    assert db.trial(trial_id).batches_trained == 10


def test_a_first_batch_retried_after_its_answer_was_lost_is_recorded_once(running, tmp_path):
    db, trial_id, layout = running
    experiment_id = db.trial(trial_id).experiment_id
    # The trial's previous launch had its first batch too; this launch has not yet.
    db.log_event("trial_first_batch", experiment_id=experiment_id, trial_id=trial_id)
    time.sleep(0.01)
    db.update_trial(trial_id, started_at=now(), restarts=0)
    db.log_event("trial_launched", experiment_id=experiment_id, trial_id=trial_id)
    server = ReportServer(layout, "127.0.0.1").start()
    try:
        import http.client

        token = launch_token(daemon_secret(layout), trial_id, 1)
        for _ in range(3):  # the same report, sent again each time its answer was lost
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
            conn.request("POST", f"/v1/trials/{trial_id}/report",
                         json.dumps({"metrics": [["training", 1, {"loss": 1.0}]],
                                     "first_batch": True}),
                         {"Authorization": f"Bearer {token}", "X-Localdet-Launch": "1",
                          "Content-Type": "application/json"})
            assert conn.getresponse().status == 200
            conn.close()
    finally:
        server.close()
    kinds = [e["kind"] for e in db.events() if e["trial_id"] == trial_id]
    assert kinds.count("trial_first_batch") == 2  # the previous launch's, and this one's
    assert kinds[-1] == "trial_first_batch"
    assert len(db.metrics(trial_id)) == 1


def test_a_read_that_writes_in_a_transaction_of_its_own_is_committed_before_its_answer(
        running, writer):
    db, trial_id, layout = running
    release, blocker = held_writer(writer)
    results: dict = {}

    def acknowledge(w):  # as should_pause does when a pause is asked: read, then write
        if w.trial(trial_id).stop_requested is None:
            with w.atomic():
                w.update_trial(trial_id, stop_requested="PAUSING")  # a stop SQLite takes
        return w.trial(trial_id).stop_requested

    def read_then_look():
        results["answer"] = writer.run(acknowledge, write=False)
        other = StateDB.open(layout.db)
        results["seen"] = other.trial(trial_id).stop_requested  # from another connection
        other.close()

    threads = [queue(writer, lambda w: w.record_metrics(trial_id, "training", 1,
                                                        {"loss": 1.0}), results, "write"),
               threading.Thread(target=read_then_look)]
    threads[1].start()
    wait_queued(writer, 2)
    release.set()
    for thread in [blocker, *threads]:
        thread.join(30)
    assert results["answer"] == results["seen"] == "PAUSING"
    assert results["write"] == ("ok", None) and writer.reads == 1
