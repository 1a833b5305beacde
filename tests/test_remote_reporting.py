"""Trials that report over the network: `HTTPReporter` against a real `ReportServer` on
127.0.0.1 in a temporary home (tokens, stale launches, batched and retried reports,
checkpoints uploaded as the store's chunks, only those it lacks, and whole from older trials),
and end to end, a daemon with `--report http` whose trials
end bit for bit as under `--report sqlite`, and whose trial survives the daemon's kill -9."""

from __future__ import annotations

import os
import signal
import socket
import stat
import struct
import threading
from collections import Counter
from pathlib import Path

import pytest
from conftest import SLOW_DIGITS, Home, start_trial, wait_for, write_config

from localdet.paths import Layout
from localdet.records import lifecycle
from localdet.records.db import StateDB, now
from localdet.reporting.http_reporter import HTTPReporter, ReportError, StaleLaunch
from localdet.reporting.report_server import (
    PORT_FILE,
    SECRET_FILE,
    ReportServer,
    ReportServerError,
    daemon_secret,
    launch_token,
    trial_environment,
)


class DroppingProxy:
    """A small HTTP/1.1 proxy on 127.0.0.1: it forwards each request to the server, and
    the first answer to a request whose line contains `drop` is read from the server and
    then lost, the client's connection reset, as when a daemon dies mid-reply."""

    def __init__(self, upstream: int, drop: str | None = None):
        self.upstream, self.drop = upstream, drop
        self.seen: Counter = Counter()  # request lines the server answered
        self.body_bytes: Counter = Counter()  # the bytes of their bodies, by request line
        self.dropped = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    @staticmethod
    def _message(reader) -> bytes:
        head = b""
        while (line := reader.readline()) not in (b"\r\n", b""):
            head += line
        if not head:
            return b""
        length = next((int(h.split(b":")[1]) for h in head.split(b"\r\n")
                       if h.lower().startswith(b"content-length:")), 0)
        return head + b"\r\n" + reader.read(length)

    def _serve(self, client: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.upstream))
        reader, answers = client.makefile("rb"), upstream.makefile("rb")
        try:
            while request := self._message(reader):
                upstream.sendall(request)
                answer = self._message(answers)
                line = request.split(b"\r\n")[0].decode()
                self.seen[line] += 1
                self.body_bytes[line] += len(request.split(b"\r\n\r\n", 1)[1])
                if self.drop and self.drop in line and not self.dropped:
                    self.dropped += 1
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                      struct.pack("ii", 1, 0))  # a reset, not a clean close
                    return
                client.sendall(answer)
        except OSError:
            pass
        finally:
            client.close()
            upstream.close()

    def count(self, fragment: str) -> int:
        return sum(n for line, n in self.seen.items() if fragment in line)

    def sent(self, fragment: str) -> int:
        """Bytes of the bodies of the requests whose line contains `fragment`."""
        return sum(n for line, n in self.body_bytes.items() if fragment in line)

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def served(tmp_path):
    """A recorded, running trial and a report server for it."""
    db, trial_id, _, _ = start_trial(tmp_path, target=100)
    db.update_trial(trial_id, state="RUNNING", started_at=now())
    layout = Layout(tmp_path / "home")
    server = ReportServer(layout, "127.0.0.1").start()
    yield db, trial_id, layout, server
    server.close()
    db.close()


def reporter_for(layout: Layout, trial_id: int, port: int, tmp_path: Path, launch: int = 1,
                 **kwargs) -> HTTPReporter:
    token = launch_token(daemon_secret(layout), trial_id, launch)
    return HTTPReporter(f"http://127.0.0.1:{port}", trial_id, launch, token,
                        trial_dir=tmp_path / "node", retry_seconds=10, **kwargs)


def test_wrong_token_is_refused_with_one_sentence(served, tmp_path):
    db, trial_id, layout, server = served
    reporter = HTTPReporter(server.url, trial_id, 1, "0" * 64, trial_dir=tmp_path / "n")
    with pytest.raises(ReportError, match=f"the report token is not trial {trial_id}'s"):
        reporter.start()
    # Another trial's token is just as wrong.
    other = HTTPReporter(server.url, trial_id, 1,
                         launch_token(daemon_secret(layout), trial_id + 1, 1))
    with pytest.raises(ReportError, match="token"):
        other.trial_info()


def test_a_stale_launch_exits_and_a_new_one_waits_for_its_launch_record(served, tmp_path):
    db, trial_id, layout, server = served
    db.update_trial(trial_id, restarts=1)  # the trial is on its second launch now
    stale = reporter_for(layout, trial_id, server.port, tmp_path, launch=1)
    with pytest.raises(StaleLaunch, match="launch 1 of trial .* is over") as refused:
        stale.start()
    assert refused.value.status == 410
    # A process started before the daemon recorded its launch waits for the record...
    db.update_trial(trial_id, state="QUEUED")
    fresh = reporter_for(layout, trial_id, server.port, tmp_path, launch=2)
    with pytest.raises(StaleLaunch, match="is not running launch 2"):
        fresh.start(seconds=0.3)
    def record() -> None:  # as the daemon does, on its own connection
        daemon_db = StateDB.open(layout.db)
        daemon_db.update_trial(trial_id, state="RUNNING")
        daemon_db.close()

    threading.Timer(0.3, record).start()
    fresh.start(seconds=30)
    assert fresh.trial_info().trial_id == trial_id
    # ...and one of a local launch must be the recorded process group.
    local = reporter_for(layout, trial_id, server.port, tmp_path, launch=2, pgrp=os.getpgrp())
    with pytest.raises(StaleLaunch, match="recorded as running in process"):
        local.start(seconds=0.2)
    db.update_trial(trial_id, pid=os.getpgrp())
    local.start(seconds=0.2)


def test_metrics_are_batched_and_a_retried_batch_records_nothing_twice(served, tmp_path):
    db, trial_id, layout, server = served
    proxy = DroppingProxy(server.port, drop="/report")
    try:
        reporter = reporter_for(layout, trial_id, proxy.port, tmp_path)
        for batches in range(1, 51):
            reporter.report_training_metrics(batches, {"loss": 1.0 / batches})
        reporter.report_validation_metrics(50, {"val_loss": 0.25})
        reporter.heartbeat()
        reporter.flush()
        assert proxy.dropped == 1  # one answer was lost, so its batch was sent twice
        sent = proxy.count("/report")
        assert sent < 51 + 1, f"{sent} requests for 51 reports: they were not batched"
    finally:
        proxy.close()
    rows = [(m.kind, m.batches_trained, m.metrics) for m in db.metrics(trial_id)]
    assert len(rows) == 51
    assert rows[0] == ("training", 1, {"loss": 1.0})
    assert ("validation", 50, {"val_loss": 0.25}) in rows
    trial = db.trial(trial_id)
    assert trial.batches_trained == 50 and trial.heartbeat_at is not None


def checkpoint_folder(folder: Path, weights: bytes) -> Path:
    (folder / "code").mkdir(parents=True)
    (folder / "determined-keras-model.h5").write_bytes(weights)
    (folder / "code" / "model_def.py").write_text("# the model\n")
    (folder / "metadata.json").write_text("{}")
    return folder


def test_checkpoints_upload_as_chunks_only_new_ones_commit_once_and_restore_bit_identical(
        served, tmp_path):
    """A checkpoint's files travel as the store's chunks, several to a request; a second
    checkpoint whose weights differ in 4 KiB sends only the chunks around the change."""
    from localdet.checkpoints.manifest import files_of
    from localdet.checkpoints.rechunk import stored_bytes
    from localdet.checkpoints.store import Store

    db, trial_id, layout, server = served
    first_weights = os.urandom(3 << 20)
    middle = 1 << 20
    second_weights = first_weights[:middle] + os.urandom(4096) + first_weights[middle + 4096:]
    proxy = DroppingProxy(server.port, drop="/commit")
    try:
        reporter = reporter_for(layout, trial_id, proxy.port, tmp_path)
        reporter.report_training_metrics(10, {"loss": 0.5})
        first = reporter.save_checkpoint(checkpoint_folder(tmp_path / "c1", first_weights), 10,
                                         {"n": 1})
        reporter.wait_for_checkpoints()
        first_sent, first_puts = proxy.sent("PUT"), proxy.count("PUT")
        # The same code and metadata, weights equal but for 4 KiB: only new chunks travel.
        second = reporter.save_checkpoint(checkpoint_folder(tmp_path / "c2", second_weights),
                                          20, {"n": 2})
        reporter.wait_for_checkpoints()
        assert not (tmp_path / "c1").exists() and not (tmp_path / "c2").exists()
        assert proxy.dropped == 1 and proxy.count("/commit") == 3  # one commit retried
        assert proxy.count("/missing") == 2  # one question a checkpoint, not one a chunk
        assert proxy.count("PUT") == proxy.count("/chunks") == first_puts + 1 == 2
        second_sent = proxy.sent("PUT") - first_sent
        restored = reporter.restore_checkpoint(first, tmp_path / "restored")
        reporter.verify_restored_checkpoint()
    finally:
        proxy.close()
    checkpoints = db.db.execute("SELECT uuid FROM checkpoints WHERE trial_id = ?",
                                [trial_id]).fetchall()
    assert sorted(uuid for (uuid,) in checkpoints) == sorted([first, second])
    assert db.trial(trial_id).latest_checkpoint == second
    assert (restored / "determined-keras-model.h5").read_bytes() == first_weights
    assert (restored / "code" / "model_def.py").read_text() == "# the model\n"
    assert db.checkpoint(second).metadata == {"n": 2}
    # Each manifest lists the weights' chunks; the store holds chunks, not the whole file.
    model_a, model_b = (files_of(db.checkpoint(uuid).manifest)["determined-keras-model.h5"]
                        for uuid in (first, second))
    store = Store(layout.store)
    assert len(model_a.chunks) > 4 and not store.has(model_a.sha256)
    assert store.verify(files_of(db.checkpoint(second).manifest)) == []
    new_chunks = set(model_b.chunks) - set(model_a.chunks)
    assert 1 <= len(new_chunks) <= 3
    assert second_sent == sum(size for _, size in new_chunks) < len(second_weights) // 4
    assert first_sent >= len(first_weights)
    assert stored_bytes(store) == first_sent + second_sent


def test_a_commit_naming_a_missing_or_missized_chunk_is_refused_and_gc_collects_the_rest(
        served, tmp_path):
    """The commit is the guard against a trial killed mid-upload: it names every chunk, and
    is refused unless each is stored at its size; chunks uploaded for a checkpoint never
    committed are collected like any unreferenced blob."""
    from localdet.checkpoints import gc
    from localdet.checkpoints.store import Store
    from localdet.reporting.checkpoint_chunks import cut_checkpoint
    from localdet.reporting.chunk_upload import send_chunks

    db, trial_id, layout, server = served
    reporter = reporter_for(layout, trial_id, server.port, tmp_path)
    model = checkpoint_folder(tmp_path / "c", os.urandom(1 << 20)) / "determined-keras-model.h5"
    cut = cut_checkpoint({"determined-keras-model.h5": model})
    sha256, size, chunks = cut.files["determined-keras-model.h5"]
    uuid = "0b6f0c55-0000-4000-8000-0000000000aa"
    assert reporter._call("POST", f"checkpoints/{uuid}/begin", {}) == {"chunks": True}
    send_chunks(reporter, cut, [chunk for chunk, _ in chunks[:-1]])  # killed before the last
    commit = {"batches_trained": 10, "metadata": {}, "files": cut.files}
    with pytest.raises(ReportError, match=r"^1 checkpoint chunk\(s\) are not in the store; "
                                          "upload them first$") as refused:
        reporter._call("POST", f"checkpoints/{uuid}/commit", commit)
    assert refused.value.missing == [chunks[-1][0]]
    lying = [sha256, size + 1, [*chunks[:-2], [chunks[-2][0], chunks[-2][1] + 1]]]
    with pytest.raises(ReportError, match=rf"^chunk {chunks[-2][0]} of checkpoint file "
                                          rf"'m.h5' is {chunks[-2][1]} bytes in the store, "
                                          rf"not {chunks[-2][1] + 1}; run `localdet doctor`"):
        reporter._call("POST", f"checkpoints/{uuid}/commit",
                       {**commit, "files": {"m.h5": lying}})
    with pytest.raises(ReportError, match="is listed as 'x', not as .sha256, size. or"):
        reporter._call("POST", f"checkpoints/{uuid}/commit", {**commit, "files": {"m.h5": "x"}})
    assert db.checkpoints() == []
    store = Store(layout.store)
    assert all(store.has(chunk) for chunk, _ in chunks[:-1])
    server.end(uuid)  # the trial never commits: its hold ends (as after BEGUN_SECONDS)
    report = gc.collect(layout, db, grace_seconds=0)
    assert sorted(report.blobs) == sorted(chunk for chunk, _ in chunks[:-1])
    assert not any(store.objects.glob("??/*"))


def test_an_older_trial_uploading_whole_files_still_commits(served, tmp_path):
    """A trial from before chunked uploads sends each file whole, as one blob; the store
    reads such a file as it is."""
    from localdet.checkpoints.manifest import files_of

    db, trial_id, layout, server = served
    weights = os.urandom(1 << 20)
    proxy = DroppingProxy(server.port)
    try:
        reporter = reporter_for(layout, trial_id, proxy.port, tmp_path)
        reporter.chunked = False  # what an older trial process does
        uuid = reporter.save_checkpoint(checkpoint_folder(tmp_path / "c", weights), 10, {})
        reporter.wait_for_checkpoints()
        assert proxy.count("PUT") == proxy.count("/blobs/") == 3 and not proxy.count("/chunks")
        restored = reporter.restore_checkpoint(uuid, tmp_path / "restored")
    finally:
        proxy.close()
    files = files_of(db.checkpoint(uuid).manifest)
    assert not any(entry.chunks for entry in files.values())
    assert (restored / "determined-keras-model.h5").read_bytes() == weights


def test_chunks_go_to_an_s3_experiments_store_and_restore(tmp_path):
    """The report server stores a remote trial's chunks where its experiment's
    `checkpoint_storage` says, S3 here (moto's server), and restores them."""
    from s3_server import s3_config, start_in_process

    from localdet.checkpoints.manifest import files_of
    from localdet.checkpoints.storage import checkpoint_store

    s3, endpoint = start_in_process()
    db, trial_id, _, _ = start_trial(tmp_path, target=100,
                                     checkpoint_storage=s3_config(endpoint, "remote"))
    db.update_trial(trial_id, state="RUNNING", started_at=now())
    layout = Layout(tmp_path / "home")
    server = ReportServer(layout, "127.0.0.1").start()
    try:
        reporter = reporter_for(layout, trial_id, server.port, tmp_path)
        weights = os.urandom(1 << 20)
        folder = checkpoint_folder(tmp_path / "c", weights)
        (folder / "empty").write_bytes(b"")
        uuid = reporter.save_checkpoint(folder, 10, {})
        reporter.wait_for_checkpoints()
        restored = reporter.restore_checkpoint(uuid, tmp_path / "restored")
        checkpoint = db.checkpoint(uuid)
        files = files_of(checkpoint.manifest)
        assert len(files["determined-keras-model.h5"].chunks) > 1
        assert checkpoint_store(layout, checkpoint).verify(files) == []
        assert not any((layout.store / "objects").glob("??/*"))  # all in the bucket
        assert (restored / "determined-keras-model.h5").read_bytes() == weights
        assert (restored / "empty").read_bytes() == b""
    finally:
        server.close()
        db.close()
        s3.stop()


def test_a_checkpoint_stored_in_chunks_restores_over_http(served, tmp_path):
    """A checkpoint the daemon's store holds as content-defined chunks is sent to a remote
    trial as its files, each chunk checked."""
    from localdet.checkpoints.manifest import build_manifest
    from localdet.checkpoints.store import Store

    db, trial_id, layout, server = served
    weights = os.urandom(1 << 20)
    store = Store(layout.store)
    with store.writing():
        files = store.put_directory(checkpoint_folder(tmp_path / "c", weights))
        db.add_checkpoint(build_manifest(uuid="0b6f0c55-0000-4000-8000-000000000001",
                                         experiment_id=db.trial(trial_id).experiment_id,
                                         trial_id=trial_id, batches_trained=10, files=files,
                                         metadata={}))
    assert len(files["determined-keras-model.h5"].chunks) > 1
    reporter = reporter_for(layout, trial_id, server.port, tmp_path)
    restored = reporter.restore_checkpoint("0b6f0c55-0000-4000-8000-000000000001",
                                           tmp_path / "restored")
    reporter.verify_restored_checkpoint()
    assert (restored / "determined-keras-model.h5").read_bytes() == weights


def test_should_pause_acknowledges_a_pause_once_even_when_retried(served, tmp_path):
    db, trial_id, layout, server = served
    proxy = DroppingProxy(server.port, drop="/should_pause")
    try:
        reporter = reporter_for(layout, trial_id, proxy.port, tmp_path)
        assert reporter.should_pause() is False  # this answer is lost, and asked again
        db.update_trial(trial_id, stop_requested=lifecycle.PAUSE)
        reporter.report_training_metrics(30, {"loss": 0.1})
        assert reporter.should_pause() is True
        assert reporter.should_pause() is True
    finally:
        proxy.close()
    assert db.trial(trial_id).stop_requested == lifecycle.PAUSING
    assert [m.batches_trained for m in db.metrics(trial_id)] == [30]  # flushed before


def test_a_daemon_that_never_comes_back_ends_the_trial_with_one_sentence(served, tmp_path):
    db, trial_id, layout, server = served
    reporter = reporter_for(layout, trial_id, server.port, tmp_path)
    reporter.retry_seconds = 0.5
    server.close()
    with pytest.raises(ReportError, match="could not report to the localdet daemon .* for 0 s"):
        reporter.should_pause()


def test_a_launch_over_http_still_fits_a_warm_process(served):
    from localdet.config import keras_choice
    from localdet.processes import launcher
    from localdet.processes.warm_pool import environment_kind, kind_of

    db, trial_id, layout, server = served
    trial = db.trial(trial_id)
    spec = launcher.launch_spec(layout, db.experiment(trial.experiment_id), trial, [0],
                                visible_devices="", report_url=server.url)
    assert spec.env["LOCALDET_REPORT_URL"] == server.url and spec.env["LOCALDET_LAUNCH"] == "1"
    # What differs from trial to trial is the trial's own: the daemon's warm process fits.
    assert kind_of(spec) == environment_kind(launcher.experiment_environment(
        layout, {}, keras_choice.default()[0]))


def test_port_and_secret_survive_a_restart(tmp_path):
    layout = Layout(tmp_path / "home").ensure()
    first = ReportServer(layout).start()
    port = first.port
    first.close()
    again = ReportServer(layout).start()
    try:
        assert again.port == port
        assert (layout.home / PORT_FILE).read_text().strip() == str(port)
        assert stat.S_IMODE((layout.home / SECRET_FILE).stat().st_mode) == 0o600
        env = trial_environment(layout, 3, 2, again.url, local=True)
        assert env["LOCALDET_REPORT_TOKEN"] == launch_token(daemon_secret(layout), 3, 2)
        assert env["LOCALDET_LAUNCH"] == "2" and env["LOCALDET_REPORT_URL"] == again.url
        with pytest.raises(ReportServerError, match="free the port or choose another"):
            ReportServer(layout, port=port).start()
    finally:
        again.close()


# -- end to end: a real daemon with `--report http` ---------------------------------------
PAUSED = dict(entrypoint="model_def:SlowDigitsTrial",
              hyperparameters={"global_batch_size": 32, "hidden_units": 32,
                               "learning_rate": 0.05, "batch_sleep": 0.03},
              searcher={"name": "single", "metric": "val_accuracy", "smaller_is_better": False,
                        "max_length": {"batches": 100}},
              scheduling_unit=10, environment={"environment_variables": ["TF_DETERMINISTIC_OPS=1"]})


def trial_row(home: Home, experiment_id: int):
    from localdet.records.db import StateDB

    db = StateDB.open(home.path / "localdet.db")
    try:
        trials = db.trials(experiment_id)
        return trials[0] if trials else None
    finally:
        db.close()


def reports_over_http(pid: int) -> bool:
    environment = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return any(v.startswith(b"LOCALDET_REPORT_URL=http://127.0.0.1:") for v in environment)


def paused_and_resumed(tmp_path: Path, report: str, daemons, kill: bool = False) -> dict:
    """Run the PAUSED experiment under a daemon with `--report REPORT`: pause it at 30
    batches, resume it, and with `kill`, kill the daemon with -9 once the resumed launch has
    trained to 50 and start another."""
    from test_pause_resume_e2e import final_weights
    from test_warm import launches, request

    home = Home(tmp_path / report)
    # No warm process: on two cores its start-up slows the trial it would not serve (the
    # experiment sets environment variables); launches over HTTP fitting one is tested above.
    daemon = daemons(home, "--report", report, "--warm", "0")
    home.cli("submit", write_config(tmp_path, f"paused-{report}", **PAUSED), SLOW_DIGITS)
    experiment = home.experiment_named(f"paused-{report}")["id"]
    trial = wait_for(lambda: (t := trial_row(home, experiment)) and t.batches_trained >= 30
                     and t, 180, "30 batches", 0.05)
    over_http = reports_over_http(trial.pid)
    request(home, "pause", experiment)
    wait_for(lambda: trial_row(home, experiment).state == "PAUSED", 120, "the pause", 0.1)
    request(home, "resume", experiment)
    if kill:
        resumed = wait_for(lambda: (t := trial_row(home, experiment)).state == "RUNNING"
                           and t.batches_trained >= 50 and t, 180, "50 batches", 0.05)
        port = (home.path / PORT_FILE).read_text().strip()
        daemon.process.send_signal(signal.SIGKILL)  # no chance to tidy up
        daemon.process.wait()
        daemon.log.close()
        daemon = daemons(home, "--report", report, "--warm", "0")
    wait_for(lambda: trial_row(home, experiment).state in ("COMPLETED", "ERROR"), 180,
             "the trial to end", 0.2)
    facts = home.wait_until_ended(experiment)
    daemon.stop()
    found = {"facts": facts, "over_http": over_http, "launches": launches(home, experiment),
             "said": daemon.log_path.read_text(),
             "metrics": [(m.kind, m.batches_trained, m.metrics)
                         for m in metrics(home, experiment)],
             "weights": final_weights(home, experiment, tmp_path / report)}
    if kill:
        found.update(port=port, pid_before=resumed.pid, pid_after=trial_row(home, experiment).pid)
    return found


def metrics(home: Home, experiment_id: int):
    from localdet.records.db import StateDB

    db = StateDB.open(home.path / "localdet.db")
    try:
        return db.metrics(trial_row(home, experiment_id).id)
    finally:
        db.close()


@pytest.mark.slow
def test_over_http_a_trial_paused_resumed_and_outliving_its_daemon_ends_as_over_sqlite(
        tmp_path, daemons):
    """Over HTTP the daemon is also killed with -9 after the resume: the resumed process
    keeps reporting to the next daemon, on the same port, and completes once."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as both:  # two homes, two daemons: side by side
        http, sqlite = both.map(lambda report: paused_and_resumed(tmp_path, report, daemons,
                                                                  kill=report == "http"),
                                ["http", "sqlite"])
    assert http["facts"]["state"] == sqlite["facts"]["state"] == "COMPLETED"
    assert http["over_http"] and not sqlite["over_http"]
    # The restarted daemon serves on the first one's port, and never launched the trial
    # again: the process it adopted finished it.
    assert f"trials report over HTTP to http://127.0.0.1:{http['port']}" in http["said"]
    assert "adopted trial" in http["said"]
    assert len(http["launches"]) == len(sqlite["launches"]) == 2
    assert http["facts"]["trials"][0]["restarts"] == 0
    assert http["pid_before"] == http["pid_after"]
    # Every workload's metrics once, the same as over SQLite; the same weights, bit for bit.
    assert http["metrics"] == sqlite["metrics"]
    assert [b for kind, b, _ in http["metrics"] if kind == "training"] == list(range(10, 101, 10))
    for (name_a, a), (name_b, b) in zip(http["weights"], sqlite["weights"], strict=True):
        assert name_a == name_b and (a == b).all()
