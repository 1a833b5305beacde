"""Checkpoint storage every node can reach: `checkpoint_storage.type` shared_fs and s3.

S3 is moto's server, started here on 127.0.0.1 as a local stand-in for the real service.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
import uuid as uuidlib
from pathlib import Path

import pytest
from conftest import EXAMPLE, Home, write_config
from s3_server import (
    BUCKET,
    CREDENTIALS,
    blob_keys,
    client,
    s3_config,
    s3_store,
    start_in_process,
)

from localdet.checkpoints.manifest import build_manifest
from localdet.checkpoints.store import CorruptBlobError, MissingBlobError, StoreError
from localdet.config.experiment import ConfigError, parse_config

WEIGHTS = "determined-keras-model.h5"


@pytest.fixture(scope="module")
def s3_endpoint():
    server, endpoint = start_in_process()
    yield endpoint
    server.stop()


def checkpoint_folder(folder: Path, weights: bytes) -> Path:
    (folder / "code").mkdir(parents=True)
    (folder / "code" / "model_def.py").write_text("import keras\n")
    (folder / WEIGHTS).write_bytes(weights)
    (folder / "metadata.json").write_text(json.dumps({"framework": "tensorflow"}))
    return folder


def tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in folder.rglob("*") if p.is_file()}


# -- the S3 store ------------------------------------------------------------------------------

def test_s3_round_trip_stores_identical_files_once(s3_endpoint, tmp_path):
    store = s3_store(s3_endpoint)
    first = checkpoint_folder(tmp_path / "a", b"\x89HDF" + os.urandom(1 << 20))
    second = checkpoint_folder(tmp_path / "b", b"other weights")
    files = store.put_directory(first)
    assert files[WEIGHTS].sha256 == hashlib.sha256((first / WEIGHTS).read_bytes()).hexdigest()
    chunks = files[WEIGHTS].chunks  # the weights are content-defined chunks, one object each
    assert len(chunks) > 1 and {f"{store.prefix}objects/{sha[:2]}/{sha}" for sha, _ in chunks} \
        <= set(blob_keys(store))
    store.put_directory(second)
    # code/model_def.py and metadata.json are the same bytes in both: stored once.
    assert len(blob_keys(store)) == len(chunks) + 3
    out = store.materialize(files, tmp_path / "export")
    assert tree(out) == tree(first)
    assert store.verify(files) == []


def test_s3_corrupted_object_is_refused_on_read(s3_endpoint, tmp_path):
    store = s3_store(s3_endpoint)
    files = store.put_directory(checkpoint_folder(tmp_path / "a", b"weights"))
    client(s3_endpoint).put_object(Bucket=BUCKET, Key=store.blob_key(files[WEIGHTS].sha256),
                                   Body=b"weightz")
    with pytest.raises(CorruptBlobError) as caught:
        store.materialize(files, tmp_path / "export")
    assert str(caught.value).startswith(f"checkpoint file '{WEIGHTS}' is corrupted in the store")
    assert str(caught.value).count(". ") == 0  # one sentence
    assert not (tmp_path / "export").exists()  # nothing half-written is left
    assert store.verify(files) == [WEIGHTS]


def test_s3_missing_object_names_the_file(s3_endpoint, tmp_path):
    store = s3_store(s3_endpoint)
    files = store.put_directory(checkpoint_folder(tmp_path / "a", b"weights"))
    client(s3_endpoint).delete_object(Bucket=BUCKET, Key=store.blob_key(files[WEIGHTS].sha256))
    with pytest.raises(MissingBlobError, match=f"checkpoint file '{WEIGHTS}' is missing"):
        store.materialize(files, tmp_path / "export")


def test_s3_gc_removes_unreferenced_objects_and_keeps_referenced_ones(s3_endpoint, tmp_path):
    store = s3_store(s3_endpoint)
    kept = store.put_directory(checkpoint_folder(tmp_path / "a", b"kept weights"))
    dropped = store.put_directory(checkpoint_folder(tmp_path / "b", b"dropped weights"))
    referenced = {entry.sha256 for entry in kept.values()}
    # Within the grace period nothing goes: it may belong to a checkpoint being written.
    careful = s3_store(s3_endpoint, store.prefix, grace_seconds=3600)
    assert careful.delete_unreferenced(referenced) == 0
    assert store.delete_unreferenced(referenced) == 1
    assert not store.has(dropped[WEIGHTS].sha256)
    assert all(store.has(sha) for sha in referenced)
    store.materialize(kept, tmp_path / "export")


def test_s3_a_reused_blob_deleted_during_the_write_is_uploaded_again(s3_endpoint, tmp_path):
    """The collector read an old LastModified just before the writer reused the blob, then
    deleted it: the writer's check after its commit puts it back."""
    store = s3_store(s3_endpoint)
    store.put_directory(checkpoint_folder(tmp_path / "a", b"weights"))
    with store.writing():
        files = store.put_directory(checkpoint_folder(tmp_path / "b", b"weights"))
        client(s3_endpoint).delete_object(Bucket=BUCKET,
                                          Key=store.blob_key(files[WEIGHTS].sha256))
    assert store.verify(files) == []


def test_s3_reader_lease_and_collector_exclude_each_other(s3_endpoint):
    store = s3_store(s3_endpoint)
    with store.reading("ckpt-1"):
        assert store.try_exclusive("ckpt-1") is None
        assert store.try_exclusive("ckpt-2") is not None
    collector = store.try_exclusive("ckpt-1")
    assert collector is not None
    entered = threading.Event()

    def read() -> None:
        with store.reading("ckpt-1"):
            entered.set()

    reader = threading.Thread(target=read)
    reader.start()
    assert not entered.wait(0.5)  # waits while the collector decides
    collector.release(remove=True)
    reader.join(timeout=30)
    assert entered.is_set()


def test_s3_writers_and_the_sweeping_collector_exclude_each_other(s3_endpoint, monkeypatch):
    """As the local store's writers lock: no blob deletion while a checkpoint is written, no
    writer while blobs are deleted; a crashed writer's mark holds only until it is stale."""
    from conftest import wait_for

    from localdet.checkpoints import s3_leases

    store = s3_store(s3_endpoint)
    with store.writing():
        assert store.try_sweeping() is None
    sweep = store.try_sweeping()
    assert sweep is not None
    entered = threading.Event()

    def write() -> None:
        with store.writing():
            entered.set()

    writer = threading.Thread(target=write)
    writer.start()
    assert not entered.wait(0.3)  # waits while the collector deletes blobs
    sweep.release()
    writer.join(timeout=30)
    assert entered.is_set()
    assert store._list_keys(f"{store.prefix}sweeping/") == []

    crashed = f"{store.prefix}writing/crashed"
    client(s3_endpoint).put_object(Bucket=BUCKET, Key=crashed, Body=b"")
    assert store.try_sweeping() is None
    monkeypatch.setattr(s3_leases, "MARK_SECONDS", 1.0)  # stale in a second, not a minute
    wait_for(lambda: store.try_sweeping(), 10, "the crashed writer's mark to go stale", 0.2)
    assert crashed not in store._list_keys(f"{store.prefix}writing/")  # and it is removed


class Sending:
    """A botocore before-send handler that counts the requests being sent at once, each
    held 10 ms as a round trip would hold it."""

    def __init__(self) -> None:
        self.now = self.most = 0
        self.lock = threading.Lock()

    def __call__(self, **_) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        time.sleep(0.01)
        with self.lock:
            self.now -= 1


def test_s3_chunk_requests_go_out_several_at_once(s3_endpoint, tmp_path):
    """`requests_in_flight` requests at a time, 1 meaning one after another, the same files
    either way."""
    from localdet.checkpoints.s3_store import S3Store

    folder = checkpoint_folder(tmp_path / "a", os.urandom(600_000))  # some 5 chunks
    most = {}
    for in_flight in (1, 8):
        store = S3Store(BUCKET, f"t-{uuidlib.uuid4().hex[:8]}/", endpoint_url=s3_endpoint,
                        access_key="testing", secret_key="testing",
                        requests_in_flight=in_flight)
        sending = Sending()
        store.client.meta.events.register("before-send.s3.*", sending)
        files = store.put_directory(folder)
        assert tree(store.materialize(files, tmp_path / f"out{in_flight}")) == tree(folder)
        most[in_flight] = sending.most
        assert store.verify(files) == []  # each chunk was checked while materialising
    assert most[1] == 1 and most[8] > 1, most


def s3_experiment(db, endpoint: str, prefix: str) -> tuple[dict, int, int]:
    """An experiment of one trial whose checkpoints go to a fresh prefix of the bucket."""
    config = parse_config({
        "entrypoint": "model_def:Trial", "hyperparameters": {"global_batch_size": 8},
        "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 300}},
        "checkpoint_storage": s3_config(endpoint, f"{prefix}-{uuidlib.uuid4().hex[:8]}"),
    }).config
    experiment_id = db.create_experiment(
        name="s3", description="", config=config, original_config="", searcher="single",
        metric="val_loss", smaller_is_better=True, experiment_seed=1, model_dir="/nowhere")
    trial_id = db.create_trial(experiment_id=experiment_id, request_id=1,
                               hparams={"global_batch_size": 8}, seed=1, target_batches=300)
    return config, experiment_id, trial_id


def test_gc_collect_applies_retention_to_an_s3_experiment(s3_endpoint, layout, db, tmp_path):
    from localdet.checkpoints.gc import collect
    from localdet.checkpoints.storage import open_store

    config, experiment_id, trial_id = s3_experiment(db, s3_endpoint, "gc")
    store = open_store(layout, config, grace_seconds=0)
    saved = {}
    for batches, loss in ((100, 0.5), (200, 0.2), (300, 0.4)):
        db.record_metrics(trial_id, "validation", batches, {"val_loss": loss})
        uuid = str(uuidlib.uuid4())
        with store.writing():
            files = store.put_directory(
                checkpoint_folder(tmp_path / uuid, f"weights at {batches}".encode()))
            db.add_checkpoint(build_manifest(uuid=uuid, experiment_id=experiment_id,
                                             trial_id=trial_id, batches_trained=batches,
                                             files=files, metadata={}))
        saved[batches] = (uuid, files)
    db.update_trial(trial_id, state="COMPLETED")

    report = collect(layout, db, experiment_id, grace_seconds=0)
    # Defaults keep the best (200) and the latest (300); 100's own weights go.
    assert [d.uuid for d in report.deleted] == [saved[100][0]]
    assert report.blobs == [saved[100][1][WEIGHTS].sha256]
    assert not store.has(saved[100][1][WEIGHTS].sha256)
    assert store.has(saved[100][1]["code/model_def.py"].sha256)  # shared with the kept ones
    assert not [p for p in (layout.store / "objects").rglob("*") if p.is_file()]  # untouched


def test_a_whole_file_in_s3_is_rechunked_and_read(s3_endpoint, layout, db, tmp_path):
    """`localdet gc --rechunk` on an S3 experiment: the file stored whole (as a remote trial
    uploads it) gets chunks and reads back; the whole object waits out the grace period."""
    from localdet.checkpoints.manifest import files_of
    from localdet.checkpoints.rechunk import rechunk
    from localdet.checkpoints.storage import open_store

    config, experiment_id, trial_id = s3_experiment(db, s3_endpoint, "rc")
    store = open_store(layout, config)
    folder = checkpoint_folder(tmp_path / "c", os.urandom(700_000))
    uuid = str(uuidlib.uuid4())
    with store.writing():
        files = {name: store.put_file(folder / name) for name in tree(folder)}
        db.add_checkpoint(build_manifest(uuid=uuid, experiment_id=experiment_id,
                                         trial_id=trial_id, batches_trained=100, files=files,
                                         metadata={}))
    report = rechunk(layout, db)
    assert (report.files, report.checkpoints) == (1, 1)
    entry = files_of(db.checkpoint(uuid).manifest)[WEIGHTS]
    assert len(entry.chunks) > 1 and all(store.has(sha) for sha, _ in entry.chunks)
    assert store.has(entry.sha256)  # younger than the grace period: kept for now
    out = store.materialize(files_of(db.checkpoint(uuid).manifest), tmp_path / "export")
    assert tree(out) == tree(folder)


def test_without_boto3_s3_asks_for_the_extra(monkeypatch):
    from localdet.checkpoints.s3_store import S3Store

    monkeypatch.setitem(sys.modules, "boto3", None)  # `import boto3` now fails
    with pytest.raises(StoreError, match=r"pip install localdet\[s3\]"):
        S3Store(BUCKET)
    with pytest.raises(ConfigError, match=r"pip install localdet\[s3\]"):
        parse_config(experiment(checkpoint_storage={"type": "s3", "bucket": BUCKET}))


# -- config validation --------------------------------------------------------------------------

def experiment(**overrides) -> dict:
    return {"entrypoint": "model_def:Trial", "hyperparameters": {"global_batch_size": 4},
            "searcher": {"name": "single", "metric": "loss", "max_length": 10}, **overrides}


@pytest.mark.parametrize("storage, message", [
    ({"type": "s3"}, "missing required key 'checkpoint_storage.bucket'"),
    ({"type": "s3", "bucket": ""}, "checkpoint_storage.bucket: must not be empty"),
    ({"type": "shared_fs"}, "missing required key 'checkpoint_storage.host_path'"),
    ({"type": "shared_fs", "host_path": "mnt/shared"},
     "checkpoint_storage.host_path: expected an absolute path"),
    ({"type": "shared_fs", "host_path": "/mnt/shared", "storage_path": "../elsewhere"},
     "checkpoint_storage.storage_path: expected a folder inside host_path '/mnt/shared'"),
    ({"type": "ftp"}, "checkpoint_storage.type: expected 'shared_fs', 's3' or 'directory'"),
    ({"type": "shared_fs", "host_path": "/mnt/shared", "bucket": "b"},
     "checkpoint_storage.bucket: only used with checkpoint_storage.type 's3'"),
    ({"host_path": "/mnt/shared"},
     "checkpoint_storage.host_path: only used with checkpoint_storage.type 'shared_fs'"),
    ({"type": "s3", "bucket": "b", "endpoint_url": "127.0.0.1:9000"},
     "checkpoint_storage.endpoint_url: expected a URL"),
    ({"type": "s3", "bucket": "b", "access_key": "k"},
     "checkpoint_storage.secret_key: needed with access_key"),
])
def test_bad_storage_keys_are_rejected_in_one_sentence(storage, message):
    with pytest.raises(ConfigError) as caught:
        parse_config(experiment(checkpoint_storage=storage))
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


def test_good_storage_keys_are_kept_and_open_their_store(layout):
    from localdet.checkpoints.storage import open_store

    (layout.home.parent / "shared").mkdir()
    config = parse_config(experiment(checkpoint_storage={
        "type": "shared_fs", "host_path": str(layout.home.parent / "shared"),
        "storage_path": "determined-checkpoint", "save_trial_latest": 2})).config
    assert config["checkpoint_storage"]["host_path"] == str(layout.home.parent / "shared")
    store = open_store(layout, config)
    assert store.root == layout.home.parent / "shared" / "determined-checkpoint"
    assert open_store(layout, parse_config(experiment()).config).root == layout.store
    unmounted = parse_config(experiment(checkpoint_storage={
        "type": "shared_fs", "host_path": str(layout.home.parent / "not-mounted")})).config
    with pytest.raises(StoreError, match="is not a folder on this machine; mount the shared"):
        open_store(layout, unmounted)
    assert not (layout.home.parent / "not-mounted").exists()


# -- end to end: a real daemon, a real trial -----------------------------------------------------

@pytest.fixture(scope="module")
def finished(s3_endpoint, tmp_path_factory, module_daemons):
    """One daemon runs a tiny digits trial to a shared_fs store and one to S3; the daemon
    (and so the trials it starts) has the S3 credentials in its environment."""
    root = tmp_path_factory.mktemp("storage")
    home = Home(root / "home")
    home.env.update(CREDENTIALS)
    shared = root / "shared"
    shared.mkdir()
    s3 = {"type": "s3", "bucket": BUCKET, "prefix": "e2e/", "endpoint_url": s3_endpoint}
    daemon = module_daemons(home)
    for name, storage in (("on-shared-fs", {"type": "shared_fs", "host_path": str(shared)}),
                          ("on-s3", s3)):
        home.cli("submit", write_config(root / name, name, checkpoint_storage=storage),
                 EXAMPLE)
    facts = {name: home.wait_until_ended(home.experiment_named(name)["id"])
             for name in ("on-shared-fs", "on-s3")}
    daemon.stop()
    return home, shared, facts


def manifest_hashes(home: Home, uuid: str) -> set[str]:
    from localdet.records.db import StateDB

    db = StateDB.open(home.path / "localdet.db")
    try:
        return {f["sha256"] for f in db.checkpoint(uuid).manifest["files"].values()}
    finally:
        db.close()


@pytest.mark.slow
def test_shared_fs_checkpoint_lands_under_host_path_and_exports(finished, tmp_path):
    from determined.keras import load_model_from_checkpoint_path

    home, shared, facts = finished
    experiment = facts["on-shared-fs"]
    assert experiment["state"] == "COMPLETED", experiment
    uuid = experiment["trials"][0]["latest_checkpoint"]
    blobs = {p.name for p in (shared / "objects").rglob("*") if p.is_file()}
    assert manifest_hashes(home, uuid) <= blobs
    assert not [p for p in (home.path / "store" / "objects").rglob("*") if p.is_file()]
    home.cli("checkpoint", "export", uuid[:8], tmp_path / "out")
    model = load_model_from_checkpoint_path(str(tmp_path / "out"))
    assert model.predict(__import__("numpy").zeros((2, 64)), verbose=0).shape == (2, 10)


@pytest.mark.slow
def test_s3_checkpoint_lands_in_the_bucket_and_exports(finished, s3_endpoint, tmp_path):
    home, _, facts = finished
    experiment = facts["on-s3"]
    assert experiment["state"] == "COMPLETED", experiment
    uuid = experiment["trials"][0]["latest_checkpoint"]
    listed = client(s3_endpoint).list_objects_v2(Bucket=BUCKET, Prefix="e2e/objects/")
    keys = {item["Key"].rsplit("/", 1)[-1] for item in listed["Contents"]}
    assert manifest_hashes(home, uuid) <= keys
    home.cli("checkpoint", "export", uuid, tmp_path / "out")
    exported = tmp_path / "out"
    assert (exported / WEIGHTS).is_file()
    assert {hashlib.sha256(p.read_bytes()).hexdigest()
            for p in exported.rglob("*") if p.is_file()} == manifest_hashes(home, uuid)


def test_a_trial_saves_to_and_resumes_from_s3(s3_endpoint, tmp_path):
    """The reporter a trial process uses: its checkpoint goes to the experiment's bucket and
    comes back from it, verified, when the trial resumes."""
    from conftest import start_trial

    prefix = f"trial-{uuidlib.uuid4().hex[:8]}"
    db, _, reporter, _ = start_trial(tmp_path, 10,
                                     checkpoint_storage=s3_config(s3_endpoint, prefix))
    saved = tree(checkpoint_folder(tmp_path / "ckpt", b"trained weights"))
    uuid = reporter.save_checkpoint(tmp_path / "ckpt", 10, {"note": "s3"})
    reporter.wait_for_checkpoints()
    assert not (tmp_path / "ckpt").exists()  # uploaded, then the folder is gone
    assert not [p for p in (tmp_path / "home" / "store" / "objects").rglob("*") if p.is_file()]
    restored = reporter.restore_checkpoint(uuid, tmp_path / "restored")
    reporter.verify_restored_checkpoint()
    assert tree(restored) == saved
    db.close()


def test_s3_without_credentials_is_one_sentence(s3_endpoint, tmp_path, monkeypatch):
    from localdet.checkpoints.s3_store import S3Store

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                 "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # never ask 169.254.169.254
    store = S3Store(BUCKET, "nocreds", endpoint_url=s3_endpoint)
    with pytest.raises(StoreError) as caught:
        store.put_directory(checkpoint_folder(tmp_path / "a", b"weights"))
    assert "set checkpoint_storage.access_key and secret_key" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_checkpoints_config_hides_the_storage_credentials():
    from determined.keras._trial_checkpoints import without_secrets

    config = {"name": "x", "checkpoint_storage": {"type": "s3", "bucket": "b",
                                                  "access_key": "AKIA", "secret_key": "s3cr3t"}}
    kept = without_secrets(config)
    assert kept["checkpoint_storage"] == {"type": "s3", "bucket": "b",
                                          "access_key": "<hidden>", "secret_key": "<hidden>"}
    assert config["checkpoint_storage"]["secret_key"] == "s3cr3t"  # the record is untouched
    plain = {"checkpoint_storage": {"type": "shared_fs", "host_path": "/mnt"}}
    assert without_secrets(plain) is plain
