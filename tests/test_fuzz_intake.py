"""Bad input at intake, counted (issue 14, item 5).

A real daemon (two CPU slots) trains a small deterministic experiment, held mid-training,
while a seeded generator (tests/fuzz/hostile.py) drops more than 200 hostile submissions into
its queue in three batches, and three more are written slowly, over seconds. Afterwards:

- the daemon is alive and never hit an unexpected error;
- each hostile submission was rejected with one sentence in queue/rejected/<name>/error.txt
  (one line, naming what to fix, no traceback) next to the user's files; names a user may
  well choose (spaces, newlines, other scripts) were accepted and recorded under the
  config's name; model code that raises, exits or allocates without end ended ERROR with
  its cause in `localdet status --json`;
- nothing outside the queue that its symbolic links point at was read or written (inotify
  on the sentinels, plus their content and mtimes);
- what was recorded before is unchanged, and the held experiment ended with exactly the
  weights of the same experiment run alone before it.
"""

from __future__ import annotations

import collections
import ctypes
import json
import os
import random
import shutil
import sqlite3
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import wait_for, write_config
from fuzz.hostile import (
    ACCEPTED,
    BASE,
    ERROR,
    REJECTED,
    Case,
    dump,
    generate,
    make,
    model_code_cases,
)

pytestmark = pytest.mark.slow

HELD = Path(__file__).parent / "fuzz" / "held_trial"
SEED = 14


class Inotify:
    """The kernel's own record of every access to some paths: open, read, write, attribute
    change, create, delete, move (watchdog's observer drops a folder's opens, so this asks
    inotify directly)."""

    ALL_EVENTS = 0xFFF

    def __init__(self, paths: list[Path]):
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        assert self.fd >= 0, os.strerror(ctypes.get_errno())
        self.paths = {}
        for path in paths:
            wd = self.libc.inotify_add_watch(self.fd, os.fsencode(path), self.ALL_EVENTS)
            assert wd >= 0, os.strerror(ctypes.get_errno())
            self.paths[wd] = path

    def events(self) -> list[str]:
        seen = []
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return seen
            offset = 0
            while offset < len(data):
                wd, mask, _cookie, length = struct.unpack_from("iIII", data, offset)
                name = data[offset + 16:offset + 16 + length].rstrip(b"\0").decode()
                seen.append(f"{self.paths[wd]}/{name} mask={mask:#x}")
                offset += 16 + length

    def close(self) -> None:
        os.close(self.fd)


def held_experiment(folder: Path, name: str, hold: Path) -> Path:
    return write_config(
        folder, name, entrypoint="model_def:HeldTrial", hyperparameters={"global_batch_size": 32},
        searcher={"name": "single", "metric": "val_accuracy", "smaller_is_better": False,
                  "max_length": {"batches": 60}},
        scheduling_unit=20, min_validation_period={"batches": 30},
        environment={"environment_variables": [f"FUZZ_HOLD={hold}", "TF_DETERMINISTIC_OPS=1"]})


def final_weights(home, facts: dict) -> list[tuple[str, np.ndarray]]:
    """(name, array) of every weight in the trial's final checkpoint's .h5, in file order."""
    from localdet.checkpoints.manifest import files_of
    from localdet.checkpoints.store import Store
    from localdet.records.db import StateDB

    db = StateDB.open(home.path / "localdet.db")
    manifest = db.checkpoint(facts["trials"][0]["latest_checkpoint"]).manifest
    db.close()
    entry = files_of(manifest)["determined-keras-model.h5"]
    folder = Path(tempfile.mkdtemp())  # the file is stored as chunks: joined here
    Store(home.path / "store").materialize({"model.h5": entry}, folder / "out")
    arrays = []
    with h5py.File(folder / "out" / "model.h5") as h5:
        h5["model_weights"].visititems(
            lambda name, obj: arrays.append((name, np.asarray(obj)))
            if isinstance(obj, h5py.Dataset) else None)
    shutil.rmtree(folder)
    return arrays


def outcomes(home) -> dict[str, list[dict]]:
    """What the intake made of each queue entry, by name, in order."""
    with sqlite3.connect(f"file:{home.path / 'localdet.db'}?mode=ro", uri=True,
                         timeout=30) as db:
        rows = db.execute("SELECT kind, experiment_id, payload FROM events WHERE kind IN "
                          "('submission_ingested', 'submission_rejected') ORDER BY id").fetchall()
    found = collections.defaultdict(list)
    for kind, experiment_id, payload in rows:
        payload = json.loads(payload)
        found[payload["source"]].append({"kind": kind, "experiment_id": experiment_id, **payload})
    return found


def one_sentence(text: str, says: str) -> bool:
    """One line that names what to fix (`says`): no traceback, short enough to read."""
    line = text.removesuffix("\n")
    return (text.endswith("\n") and "\n" not in line and says in line and len(line) <= 300
            and "Traceback" not in line and 'File "' not in line)


def snapshot(paths: list[Path]) -> dict:
    """Content (files) or listing (folders) and mtime of each path, without following links."""
    return {str(p): (p.read_bytes() if p.is_file() else sorted(os.listdir(p)),
                     p.lstat().st_mtime_ns) for p in paths}


SLOW_WRITER = """
import sys, time
path, chunks, pause = sys.argv[1], sys.argv[2:], 1.5
with open(path, "w") as f:
    for chunk in chunks:
        f.write(chunk)
        f.flush()
        time.sleep(pause)  # longer than the intake's settle time
"""


def write_slowly(path: Path, chunks: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", SLOW_WRITER, str(path), *chunks])


def test_hostile_submissions_while_an_experiment_trains(home, tmp_path, daemons):
    # Sentinels outside the queue, which symbolic links in the submissions point at.
    outside = tmp_path / "outside"
    (outside / "folder" / "sub").mkdir(parents=True)
    (outside / "secret.yaml").write_bytes(dump({**BASE, "name": "secret"}))
    (outside / "folder" / "const.yaml").write_bytes(dump({**BASE, "name": "secret folder"}))
    (outside / "folder" / "model_def.py").write_text("SECRET = 1\n")
    (outside / "folder" / "sub" / "data.txt").write_text("secret data\n")
    sentinels = [outside, outside / "secret.yaml", outside / "folder", outside / "folder" / "sub",
                 outside / "folder" / "const.yaml", outside / "folder" / "model_def.py",
                 outside / "folder" / "sub" / "data.txt"]
    before = snapshot(sentinels)

    cases = generate(random.Random(SEED), outside)
    cases += model_code_cases(len(cases))
    drops = tmp_path / "drops"
    for case in cases:
        make(case, drops / (case.name + (".again" if case.later else "")))

    hold = tmp_path / "hold"
    daemon = daemons(home, "--slots", "2")
    # The reference: the experiment alone.
    home.cli("submit", held_experiment(tmp_path / "reference", "reference", hold), HELD)
    reference = home.wait_until_ended(home.experiment_named("reference")["id"])
    assert reference["state"] == "COMPLETED", reference
    reference_checkpoints = home.json("checkpoints", reference["id"], "--all")

    # The same experiment again, held after its fifth batch while the storm passes.
    hold.touch()
    home.cli("submit", held_experiment(tmp_path / "real", "real", hold), HELD)
    real_id = home.experiment_named("real")["id"]
    wait_for(Path(f"{hold}.held").exists, 180, "the experiment to be training")

    control = tmp_path / "control"
    control.write_text("read me\n")
    watch = Inotify([*(p for p in sentinels if p.is_dir()), control])
    control.read_text()  # the watch sees a read, or it proves nothing
    assert any(str(control) in event for event in watch.events())

    queue, jobs = home.path / "queue", home.path / "queue" / "jobs"
    slow = [
        ("slow-accepted.yaml", [dump({**BASE, "name": "slow accepted"}).decode(),
                                "description: the whole file\n", "labels: [complete]\n"]),
        ("slow-rejected.yaml", [dump(BASE).decode(), "description: nearly\n",
                                "max_restarts: -1\n"]),
    ]
    writers = [write_slowly(queue / name, chunks) for name, chunks in slow]
    (queue / "slow-folder").mkdir()
    (queue / "slow-folder" / "const.yaml").write_bytes(
        dump({**BASE, "name": "slow folder"}))
    slow_code = ["class Trial:\n", "    pass\n", "COMPLETE = True\n"]
    writers.append(write_slowly(queue / "slow-folder" / "model_def.py", slow_code))

    def resolved(batch: list[Case]) -> bool:
        found = outcomes(home)
        wanted = collections.Counter(case.name for case in batch)
        return all(len(found.get(name, [])) >= count for name, count in wanted.items())

    first = [c for c in cases if c.category == "model code"]
    rest = [c for c in cases if c.category != "model code" and not c.later]
    random.Random(SEED).shuffle(rest)
    # A name used again comes in a batch of its own, after the one holding its first use
    # (in the same batch both would be renamed onto the one queue entry).
    batches = [first + rest[0::3], rest[1::3], rest[2::3], [c for c in cases if c.later]]
    done: list[Case] = []
    for batch in batches:
        for case in batch:
            os.rename(drops / (case.name + (".again" if case.later else "")),
                      (jobs if case.job else queue) / case.name)
        done.extend(batch)  # the same list: the lambda below reads it now, within this pass
        wait_for(lambda: resolved(done), 180, "the batch to be ingested or rejected")
    for writer in writers:
        assert writer.wait(timeout=120) == 0
    wait_for(lambda: {"slow-accepted.yaml", "slow-rejected.yaml", "slow-folder"}
             <= set(outcomes(home)), 120, "the slow submissions")

    errors = [c for c in cases if c.expect == ERROR]
    found = outcomes(home)
    ids = {case.name: found[case.name][0]["experiment_id"] for case in errors}
    wait_for(lambda: all(home.rows("SELECT 1 FROM experiments WHERE id = ? AND state = "
                                   "'ERROR'", ids[c.name]) for c in errors),
             300, "the failing model code to end", 0.1)
    assert all(home.experiment(ids[c.name])["state"] == "ERROR" for c in errors)
    assert home.experiment(real_id)["trials"][0]["state"] == "RUNNING"  # held all along

    events = watch.events()
    watch.close()
    hold.unlink()
    real = home.wait_until_ended(real_id)
    assert daemon.process.poll() is None, "the daemon died"
    daemon.stop()
    log = daemon.log_path.read_text(errors="replace")
    assert "unexpected error" not in log and "Traceback" not in log, log[-3000:]

    # Each case became what it should.
    found = outcomes(home)
    statuses = {facts["id"]: facts for facts in home.json("status")}
    home.cli("status")  # the table shows the odd names too
    counts = collections.Counter()
    by_category = collections.defaultdict(collections.Counter)
    failures = []
    seen_names = collections.Counter()
    for case in cases:
        outcome = found[case.name][seen_names[case.name]]
        seen_names[case.name] += 1
        by_category[case.category][case.expect] += 1
        counts[case.expect] += 1
        if "detail" in outcome:  # the intake's catch-all: a case it does not handle yet
            failures.append(f"{case.name!r}: unexpected error\n{outcome['detail']}")
        if case.expect == REJECTED:
            moved_to = Path(outcome.get("moved_to", ""))
            error = (moved_to / "error.txt").read_text() if outcome["kind"] == \
                "submission_rejected" else ""
            kept = sorted(os.listdir(moved_to)) if error else []
            expected_kept = sorted({"error.txt", *(
                {p.split("/")[0] for p in case.entry} if isinstance(case.entry, dict)
                else {case.name})})
            first_of_name = seen_names[case.name] == 1
            if not (error and one_sentence(error, case.says) and kept == expected_kept
                    and (moved_to == queue / "rejected" / case.name) == first_of_name):
                failures.append(f"{case.name!r} ({case.category}): expected a rejection naming "
                                f"{case.says!r}, got {outcome['kind']}: {error!r}, kept {kept}")
        else:
            facts = statuses.get(outcome["experiment_id"])
            if outcome["kind"] != "submission_ingested" or facts is None:
                failures.append(f"{case.name!r} ({case.category}): expected {case.expect}, got "
                                f"{outcome.get('reason')!r}")
            elif case.expect == ACCEPTED and not (
                    facts["name"] == case.says and facts["state"] == "ACTIVE"
                    and [t["state"] for t in facts["trials"]] == ["QUEUED"]):
                failures.append(f"{case.name!r}: accepted as {facts['name']!r}, {facts['state']}")
            elif case.expect == ERROR and not (
                    facts["state"] == "ERROR" and facts["trials"][0]["state"] == "ERROR"
                    and case.says in facts["trials"][0]["error"]):
                failures.append(f"{case.name!r}: {facts['state']}, trial error "
                                f"{facts['trials'][0]['error']!r}")
    assert not failures, "\n".join(failures)

    # Accepted means the snapshot holds what was dropped, under the names given.
    from localdet.records.db import StateDB

    db = StateDB.open(home.path / "localdet.db")
    for case in cases:
        if case.expect == ACCEPTED:
            model_dir = Path(db.experiment(found[case.name][0]["experiment_id"]).model_dir)
            files = case.entry if isinstance(case.entry, dict) else {case.name: case.entry}
            for relative, content in files.items():
                if isinstance(content, bytes):
                    assert (model_dir / relative).read_bytes() == content, relative
    # The slow ones were taken whole.
    accepted_slow = db.experiment(found["slow-accepted.yaml"][0]["experiment_id"])
    assert accepted_slow.config["labels"] == ["complete"]
    reason = (queue / "rejected" / "slow-rejected.yaml" / "error.txt").read_text()
    assert one_sentence(reason, "max_restarts"), reason
    slow_folder = Path(db.experiment(found["slow-folder"][0]["experiment_id"]).model_dir)
    assert (slow_folder / "model_def.py").read_text() == "".join(slow_code)
    db.close()

    # Nothing was left half-taken.
    assert sorted(p.name for p in queue.iterdir()) == ["jobs", "rejected"]
    assert list(jobs.iterdir()) == []
    for staging in (".incoming", ".incoming-jobs"):
        assert not any((home.path / "experiments" / staging).glob("*")), staging

    # Nothing outside the queue was read or written.
    assert events == [], events
    assert snapshot(sentinels) == before

    # What was recorded before is intact, and the held experiment trained as if alone.
    assert home.experiment(reference["id"]) == reference
    assert home.json("checkpoints", reference["id"], "--all") == reference_checkpoints
    assert real["state"] == "COMPLETED", real
    for (name_a, a), (name_b, b) in zip(final_weights(home, reference), final_weights(home, real),
                                        strict=True):
        assert name_a == name_b
        np.testing.assert_array_equal(a, b)
    assert real["trials"][0]["latest_validation"] == reference["trials"][0]["latest_validation"]

    slow_counts = {"accepted": 2, "rejected": 1}
    print(f"\nfuzzed intake (seed {SEED}): {len(cases)} generated + 3 written slowly; "
          f"rejected {counts[REJECTED] + slow_counts['rejected']}, "
          f"accepted {counts[ACCEPTED] + slow_counts['accepted']}, errored {counts[ERROR]}")
    for category, tally in by_category.items():
        tallies = ", ".join(f"{kind} {count}" for kind, count in tally.items())
        print(f"  {category}: {sum(tally.values())} ({tallies})")
    print("  written slowly: 3 (accepted 2, rejected 1)")
