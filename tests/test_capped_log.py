"""Bounded logs: a log never grows past its cap, keeps its head and its most recent lines
with one line saying exactly how much was dropped, and followers reading by stream offset
still get every line in order (or, fallen behind into the dropped part, that line). Then a
real daemon with `--max-log-bytes` runs a trial that floods its log, and `localdet logs -f`
follows it to its end."""

from __future__ import annotations

import random
import re
import subprocess
import sys
import threading
import time

import pytest
import yaml
from conftest import TEST_TRIALS, wait_for

from localdet.processes.capped_log import CappedLog, read_from, stream_size

DROPPED = re.compile(rb"^\[localdet\] +(\d+) bytes of this log were dropped here", re.M)
MARKER_LINE = re.compile(rb"\[localdet\] +\d+ bytes of this log were dropped here[^\n]*\n")


def stream(seed: int, count: int) -> list[bytes]:
    rng = random.Random(seed)
    return [f"line {i} {'x' * rng.choice([0, 5, 40, 300, 3000])}\n".encode()
            for i in range(count)]


def assert_head_marker_tail(content: bytes, written: bytes) -> int:
    """The file is a prefix of what was written, one marker line, and a suffix of it; the
    marker counts exactly the bytes between. Returns that count."""
    (match,) = list(DROPPED.finditer(content))
    head, tail = content[:match.start()], content[content.index(b"\n", match.end()) + 1:]
    dropped = int(match.group(1))
    assert written.startswith(head) and written.endswith(tail)
    assert head.endswith(b"\n") and len(head) + dropped + len(tail) == len(written)
    return dropped


def test_a_flooded_log_stays_under_its_cap_and_keeps_head_and_tail(tmp_path):
    path, cap = tmp_path / "trial.log", 20_000
    log, written = CappedLog(path, cap), b""
    for line in stream(1, 3000):
        log.write(line)
        written += line
        assert path.stat().st_size <= cap
    log.close()
    content = path.read_bytes()
    assert content.startswith(b"line 0 ") and content.endswith(written.splitlines(True)[-1])
    assert assert_head_marker_tail(content, written) > len(written) - cap
    assert stream_size(path) == len(written)


def test_a_follower_gets_every_line_in_order_or_the_line_saying_what_it_missed(tmp_path):
    path, cap = tmp_path / "trial.log", 20_000
    log, written, close = CappedLog(path, cap), b"", b""
    rng = random.Random(2)
    slow_offset, slow = 0, b""
    for line in stream(2, 2000):
        log.write(line)
        written += line
        data, offset = read_from(path, len(close))  # a follower that keeps up
        close += data
        assert offset == len(written)
        if rng.random() < 0.01:  # one that falls far behind now and then
            data, slow_offset = read_from(path, slow_offset)
            slow += data
    log.close()
    data, slow_offset = read_from(path, slow_offset)
    slow += data
    assert close == written  # kept up: nothing dropped from its view
    assert slow_offset == len(written) and slow.endswith(written.splitlines(True)[-1])
    # What the slow one got is the stream in order, with the marker line where it fell
    # into a dropped part.
    pieces = MARKER_LINE.split(slow)
    assert len(pieces) > 1
    position = 0
    for piece in pieces:
        found = written.find(piece, position)
        assert found >= position
        position = found + len(piece)


def test_the_writer_process_caps_a_pipe_and_a_second_writer_waits_for_the_first(tmp_path):
    path = tmp_path / "trial.log"
    first = subprocess.Popen([sys.executable, "-m", "localdet.processes.capped_log", str(path),
                               "50000"],
                             stdin=subprocess.PIPE)
    wait_for(lambda: path.exists(), 30, "the first writer to open the log", 0.02)
    second = subprocess.Popen([sys.executable, "-m", "localdet.processes.capped_log", str(path),
                               "50000"],
                              stdin=subprocess.PIPE)
    second.stdin.write(b"second writer's line\n")
    second.stdin.close()
    written = b"".join(stream(3, 4000))
    threading.Thread(target=lambda: (first.stdin.write(written), first.stdin.close())).start()
    assert first.wait(timeout=60) == 0 and second.wait(timeout=60) == 0
    content = path.read_bytes()
    assert len(content) <= 50_000
    # The second writer's line came after all of the first's: it waited its turn.
    assert content.endswith(written.splitlines(True)[-1] + b"second writer's line\n")
    assert assert_head_marker_tail(content, written + b"second writer's line\n") > 0


@pytest.mark.slow
def test_a_trial_that_floods_its_log_is_capped_and_followed(home, tmp_path, daemons,
                                                             processes):
    config = tmp_path / "flood.yaml"
    config.write_text(yaml.safe_dump({
        "name": "flood", "entrypoint_script": "python3 train.py",
        "hyperparameters": {"variant": 0, "batch_seconds": 0.2, "checkpoint_seconds": 0,
                            "crash_at": 0, "print_lines": 1500},
        "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 12}},
        "scheduling_unit": 2, "min_checkpoint_period": {"batches": 4}}))
    daemon = daemons(home, "--max-log-bytes", "100KB")
    home.cli("submit", config, TEST_TRIALS / "counter")
    experiment = home.experiment_named("flood")
    trial_id = wait_for(lambda: home.first_trial(experiment["id"]).get("id"), 60, "the trial",
                        0.05)
    follower = processes([home.python, "-m", "localdet", "logs", trial_id, "-f"], env=home.env,
                         stdout=subprocess.PIPE)
    log = home.path / "experiments" / str(experiment["id"]) / "trials" / str(trial_id) \
        / "trial.log"
    from localdet.records.db import StateDB

    db, sizes = StateDB.open(home.path / "localdet.db"), []
    while db.experiment(experiment["id"]).state == "ACTIVE":  # its size as it floods
        sizes.append(log.stat().st_size if log.exists() else 0)
        time.sleep(0.01)
    db.close()
    followed, _ = follower.communicate(timeout=60)
    assert home.experiment(experiment["id"])["state"] == "COMPLETED"
    daemon.stop()
    content = log.read_bytes()
    assert len(sizes) > 10 and max(sizes) <= 100_000 and len(content) <= 100_000
    assert content.startswith(f"[localdet] trial {trial_id} launch 1".encode())
    last = b"batch 12 line 1499: "
    assert last in content.splitlines()[-1] or last in content[-2000:]
    (match,) = list(DROPPED.finditer(content))
    assert int(match.group(1)) > 12 * 1500 * 40 - 100_000  # the flood was over 700 KB
    # `localdet logs -f` followed it to its end: its first line and its last ones.
    assert followed.startswith(content[:200]) and followed.endswith(content[-2000:])
    assert (home.path / "daemon.log").read_text().count("watching") == 1
