"""Tests of the content-addressed checkpoint store and checkpoint manifests."""
from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import threading
import uuid
from pathlib import Path

import pytest

from localdet.checkpoints.manifest import build_manifest, files_of, schema_path, validate_manifest
from localdet.checkpoints.store import (
    CorruptBlobError,
    FileEntry,
    MissingBlobError,
    Store,
    StoreError,
)

MODEL = "determined-keras-model.h5"


def make_checkpoint(folder: Path, model_bytes: bytes | None = None) -> Path:
    """A checkpoint folder shaped like Determined's Keras ones (fresh random model by default)."""
    if model_bytes is None:
        model_bytes = b"\x89HDF\r\n" + os.urandom(3 << 20)
    (folder / "code" / "sub").mkdir(parents=True)
    (folder / "empty").mkdir()
    (folder / MODEL).write_bytes(model_bytes)
    (folder / "code" / "model_def.py").write_text("import keras\n")
    (folder / "code" / "sub" / "util.py").write_text("X = 1\n")
    (folder / "metadata.json").write_text(json.dumps({"framework": "tensorflow"}))
    (folder / "empty.txt").write_bytes(b"")
    return folder


def objects(store: Store) -> list[Path]:
    return [p for p in (store.root / "objects").rglob("*") if p.is_file()]


def blobs(files: dict[str, FileEntry]) -> set[str]:
    """The blobs the files are stored as: their chunks, or themselves."""
    return {sha for entry in files.values() for sha, _ in entry.blobs}


def tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in folder.rglob("*") if p.is_file()}


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "store")


def test_round_trip_gives_identical_bytes(store: Store, tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "ckpt")
    os.symlink(src / "metadata.json", src / "link.json")  # symlinks to files are followed
    files = store.put_directory(src)
    assert sorted(files) == ["code/model_def.py", "code/sub/util.py", MODEL, "empty.txt",
                             "link.json", "metadata.json"]
    assert files[MODEL] == FileEntry(hashlib.sha256((src / MODEL).read_bytes()).hexdigest(),
                                     (src / MODEL).stat().st_size)
    out = store.materialize(files, tmp_path / "export")
    assert out == tmp_path / "export"
    assert tree(out) == tree(src)
    assert not (out / "empty").exists()
    assert store.verify(files) == []
    assert store.read_bytes(files["metadata.json"].sha256) == (src / "metadata.json").read_bytes()


def test_materialize_into_existing_empty_folder(store: Store, tmp_path: Path) -> None:
    files = store.put_directory(make_checkpoint(tmp_path / "ckpt"))
    (tmp_path / "export").mkdir()
    store.materialize(files, tmp_path / "export")
    assert (tmp_path / "export" / MODEL).is_file()


def test_identical_content_is_stored_once(store: Store, tmp_path: Path) -> None:
    model = os.urandom(1 << 20)
    a = store.put_directory(make_checkpoint(tmp_path / "a", model))
    b = store.put_directory(make_checkpoint(tmp_path / "b", model))
    assert a == b and a[MODEL].chunks == b[MODEL].chunks and len(a[MODEL].chunks) > 1
    # The model's chunks, model_def.py, util.py, metadata.json, the empty file: once each.
    assert {p.name for p in objects(store)} == blobs(a) and len(blobs(a)) > 5
    (tmp_path / "copy").write_bytes(model)
    assert store.put_file(tmp_path / "copy") == a[MODEL]  # put_file stores one whole blob
    assert store.put_bytes(model) == a[MODEL]
    assert {p.name for p in objects(store)} == blobs(a) | {a[MODEL].sha256}


def test_no_temporary_files_left_after_puts(store: Store, tmp_path: Path) -> None:
    store.put_directory(make_checkpoint(tmp_path / "ckpt"))
    store.put_directory(make_checkpoint(tmp_path / "ckpt2"))
    store.put_bytes(b"x")
    assert list((store.root / "tmp").iterdir()) == []


def test_corrupt_blob_is_refused_and_leaves_no_partial_file(store: Store, tmp_path: Path) -> None:
    files = store.put_directory(make_checkpoint(tmp_path / "ckpt"))
    chunk = files[MODEL].chunks[len(files[MODEL].chunks) // 2][0]
    blob = store.blob_path(chunk)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte deep inside the file
    blob.chmod(0o644)
    blob.write_bytes(bytes(data))

    dest = tmp_path / "export"
    with pytest.raises(CorruptBlobError) as info:
        store.materialize(files, dest)
    message = str(info.value)
    assert f"checkpoint file '{MODEL}' is corrupted in the store" in message
    assert f"expected sha256 {chunk}" in message
    assert f"found {hashlib.sha256(data).hexdigest()}" in message
    assert not (dest / MODEL).exists()
    assert not dest.exists() or not any(dest.rglob("*"))
    assert store.verify(files) == [MODEL]
    with pytest.raises(CorruptBlobError):
        store.read_bytes(chunk, MODEL)


def test_missing_blob(store: Store, tmp_path: Path) -> None:
    files = store.put_directory(make_checkpoint(tmp_path / "ckpt"))
    sha = files["code/model_def.py"].sha256
    store.blob_path(sha).unlink()
    with pytest.raises(MissingBlobError) as info:
        store.materialize(files, tmp_path / "export")
    assert "'code/model_def.py'" in str(info.value) and sha in str(info.value)
    assert store.verify(files) == ["code/model_def.py"]
    with pytest.raises(MissingBlobError):
        store.read_bytes(sha)


def test_non_empty_destination_refused(store: Store, tmp_path: Path) -> None:
    files = store.put_directory(make_checkpoint(tmp_path / "ckpt"))
    dest = tmp_path / "export"
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")
    with pytest.raises(StoreError, match="already exists and is not empty; choose another folder"):
        store.materialize(files, dest)
    assert tree(dest) == {"keep.txt": b"mine"}


def test_unsafe_names_and_bad_digests_refused(store: Store, tmp_path: Path) -> None:
    entry = store.put_bytes(b"evil")
    with pytest.raises(StoreError, match="unsafe"):
        store.materialize({"../escape.txt": entry}, tmp_path / "export")
    assert not (tmp_path / "escape.txt").exists()
    with pytest.raises(StoreError):
        store.blob_path("../../etc/passwd")


def test_folder_symlinks_and_broken_links_refused(store: Store, tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "ckpt")
    os.symlink(src / "code", src / "code_link")
    with pytest.raises(StoreError, match="code_link"):
        store.put_directory(src)
    os.unlink(src / "code_link")
    os.symlink(src / "nowhere", src / "dangling")
    with pytest.raises(StoreError, match="dangling"):
        store.put_directory(src)
    with pytest.raises(StoreError, match="does not exist"):
        store.put_directory(tmp_path / "missing")


def _put_same(root: str, data_path: str, queue: "multiprocessing.Queue[object]",
              barrier: "multiprocessing.synchronize.Barrier") -> None:
    try:
        store = Store(root)
        barrier.wait(timeout=60)  # start both puts together so they really overlap
        queue.put(store.put_file(data_path))
    except BaseException as e:  # report, so the parent sees why
        queue.put(e)


def test_concurrent_puts_of_same_content(tmp_path: Path) -> None:
    data = tmp_path / "big.bin"
    data.write_bytes(os.urandom(5 << 20))
    root = str(tmp_path / "store")
    ctx = multiprocessing.get_context("spawn")
    queue, barrier = ctx.Queue(), ctx.Barrier(2)
    procs = [ctx.Process(target=_put_same, args=(root, str(data), queue, barrier))
             for _ in range(2)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    expected = FileEntry(hashlib.sha256(data.read_bytes()).hexdigest(), 5 << 20)
    assert results == [expected, expected]
    store = Store(root)
    assert objects(store) == [store.blob_path(expected.sha256)]
    assert list(store.tmp.iterdir()) == []
    assert store.read_bytes(expected.sha256) == data.read_bytes()


def test_delete_unreferenced(store: Store, tmp_path: Path) -> None:
    keep = store.put_directory(make_checkpoint(tmp_path / "keep"))
    drop = store.put_directory(make_checkpoint(tmp_path / "drop"))
    referenced = blobs(keep)
    only_dropped = blobs(drop) - referenced
    (store.tmp / "put-stale.tmp").write_bytes(b"half")

    # Too young to delete: an in-flight checkpoint's blobs are not referenced yet.
    assert store.delete_unreferenced(referenced, min_age_seconds=3600) == 0
    assert (store.tmp / "put-stale.tmp").exists()

    assert store.delete_unreferenced(referenced) == len(only_dropped) > 0
    assert all(not store.has(sha) for sha in only_dropped)
    assert store.verify(keep) == []
    assert list(store.tmp.iterdir()) == []
    assert store.delete_unreferenced(referenced) == 0


# -- manifests --------------------------------------------------------------------------

def test_schema_is_found() -> None:
    assert schema_path().is_file()


def test_manifest_round_trip(store: Store, tmp_path: Path) -> None:
    files = store.put_directory(make_checkpoint(tmp_path / "ckpt"))
    ckpt_uuid = str(uuid.uuid4())
    manifest = build_manifest(uuid=ckpt_uuid, experiment_id=1, trial_id=7, batches_trained=640,
                              files=files, metadata={"framework": "tensorflow", "steps": [1, 2]})
    assert manifest["format"] == 1 and manifest["uuid"] == ckpt_uuid
    assert manifest["size_bytes"] == sum(e.size for e in files.values())
    assert manifest["created_at"].endswith("Z")
    reloaded = json.loads(json.dumps(manifest))  # as stored in SQLite
    validate_manifest(reloaded)
    assert files_of(reloaded) == files
    out = store.materialize(files_of(reloaded), tmp_path / "export")
    assert tree(out) == tree(tmp_path / "ckpt")


def _manifest() -> dict:
    return build_manifest(uuid=str(uuid.uuid4()), experiment_id=1, trial_id=2, batches_trained=3,
                          files={MODEL: FileEntry("a" * 64, 10)}, metadata={},
                          created_at="2024-05-01T12:00:00Z")


def test_manifest_with_bad_sha256_names_the_path() -> None:
    manifest = _manifest()
    manifest["files"][MODEL]["sha256"] = "xyz"
    with pytest.raises(ValueError, match=rf"files\.{MODEL}\.sha256"):
        validate_manifest(manifest)
    manifest["files"][MODEL]["sha256"] = "A" * 64  # 64 chars but not lowercase hex
    with pytest.raises(ValueError, match=r"\.sha256"):
        validate_manifest(manifest)


@pytest.mark.parametrize("change, where", [
    ({"size_bytes": 11}, "size_bytes"),
    ({"files": {"../x": {"sha256": "a" * 64, "size": 10}}}, "files"),
    ({"batches_trained": -1}, "batches_trained"),
    ({"format": 2}, "format"),
])
def test_invalid_manifests(change: dict, where: str) -> None:
    with pytest.raises(ValueError, match=where):
        validate_manifest({**_manifest(), **change})


def test_metadata_must_be_json() -> None:
    with pytest.raises(ValueError, match="metadata"):
        build_manifest(uuid=str(uuid.uuid4()), experiment_id=1, trial_id=2, batches_trained=3,
                       files={MODEL: FileEntry("a" * 64, 10)}, metadata={"x": object()})


def test_linked_restore_shares_blobs_and_a_corrupt_blob_is_still_caught(tmp_path):
    store = Store(tmp_path / "store")
    source = tmp_path / "ckpt"
    source.mkdir()
    (source / "weights.h5").write_bytes(b"w" * 5000)
    files = store.put_directory(source, consume=True)
    assert not (source / "weights.h5").exists(), "consumed: moved into the store, not copied"
    restored = store.materialize(files, tmp_path / "restored", link=True)
    blob = store.blob_path(files["weights.h5"].sha256)
    assert (restored / "weights.h5").stat().st_ino == blob.stat().st_ino
    assert (restored / "weights.h5").read_bytes() == b"w" * 5000

    blob.chmod(0o644)
    blob.write_bytes(b"x" * 5000)
    with pytest.raises(CorruptBlobError, match="weights.h5"):
        store.materialize(files, tmp_path / "again", link=True)
    store.materialize(files, tmp_path / "unverified", link=True, verify=False)
    assert store.verify(files) == ["weights.h5"]


def _chunked(store: Store, tmp_path: Path, data: bytes, name: str = MODEL) -> FileEntry:
    folder = tmp_path / "chunked"
    folder.mkdir(parents=True)
    (folder / name).write_bytes(data)
    entry = store.put_directory(folder)[name]
    assert len(entry.chunks) > 8
    return entry


def test_a_chunked_file_reads_as_the_file_wherever_it_is_read(store: Store, tmp_path: Path
                                                              ) -> None:
    import random

    import h5py
    import numpy as np

    values = np.random.default_rng(0).random((600, 1000))  # 4.8 MB: many chunks
    with h5py.File(tmp_path / "model.h5", "w") as h5:
        h5.create_dataset("model_weights/dense/kernel", data=values)
        h5.attrs["note"] = "read through a ChunkedFile"
    data = (tmp_path / "model.h5").read_bytes()
    entry = _chunked(store, tmp_path, data)
    rng = random.Random(1)
    with store.open_file(entry, MODEL) as f:
        for _ in range(200):  # across chunk boundaries, and past the end
            start, length = rng.randrange(len(data) + 10), rng.randrange(1, 400_000)
            assert f.seek(start) == start
            assert f.read(length) == data[start:start + length]
        assert f.seek(-10, os.SEEK_END) == len(data) - 10 and f.read() == data[-10:]
        f.seek(0)
        with h5py.File(f, "r") as h5:
            assert h5.attrs["note"] == "read through a ChunkedFile"
            assert np.array_equal(h5["model_weights/dense/kernel"][()], values)


def test_a_chunked_file_with_a_missing_or_short_chunk_fails_to_read(store: Store,
                                                                   tmp_path: Path) -> None:
    data = os.urandom(3 << 20)
    entry = _chunked(store, tmp_path, data)
    missing, short = entry.chunks[2][0], entry.chunks[5][0]
    store.blob_path(missing).unlink()
    store.blob_path(short).chmod(0o644)
    store.blob_path(short).write_bytes(b"cut")
    with store.open_file(entry, MODEL) as f:
        assert f.read(entry.chunks[0][1]) == data[:entry.chunks[0][1]]
        with pytest.raises(MissingBlobError, match=f"checkpoint file '{MODEL}' is missing"):
            f.read()
        f.seek(sum(size for _, size in entry.chunks[:5]))
        with pytest.raises(OSError, match="shorter than its checkpoint's manifest says"):
            f.read()


def test_a_check_shared_by_threads_finds_every_bad_file_once(store: Store, tmp_path: Path
                                                              ) -> None:
    entry = _chunked(store, tmp_path, os.urandom(4 << 20))
    src = make_checkpoint(tmp_path / "ckpt")
    files = {**store.put_directory(src), "big.h5": entry}
    corrupt, gone = entry.chunks[1][0], files["code/model_def.py"].sha256
    store.blob_path(corrupt).chmod(0o644)
    store.blob_path(corrupt).write_bytes(b"x" * entry.chunks[1][1])
    store.blob_path(gone).unlink()
    checked: set[str] = set()
    check = store.verification(files, checked)
    runners = [threading.Thread(target=check.run) for _ in range(3)]
    for runner in runners:
        runner.start()
    check.run()
    for runner in runners:
        runner.join()
    assert check.bad == [name for name in files if name in ("code/model_def.py", "big.h5")]
    assert corrupt not in checked and gone not in checked
    assert blobs({MODEL: files[MODEL]}) <= checked
    assert store.verify(files) == check.bad  # one runner finds the same


@pytest.mark.parametrize("change", [b"x", None], ids=["longer", "shorter"])
def test_a_chunk_of_another_length_than_its_manifest_says_is_bad(store: Store, tmp_path: Path,
                                                                  change: bytes | None) -> None:
    entry = _chunked(store, tmp_path, os.urandom(3 << 20))
    blob = store.blob_path(entry.chunks[4][0])
    data = blob.read_bytes()
    blob.chmod(0o644)
    blob.write_bytes(data + change if change else data[:-1])
    assert store.verify({MODEL: entry}) == [MODEL]
    blob.write_bytes(data)
    assert store.verify({MODEL: entry}) == []


def test_a_hash_worker_process_finds_the_bad_blobs_and_a_dead_one_is_stood_in_for(
        store: Store, tmp_path: Path) -> None:
    from localdet.checkpoints.hash_worker import HashWorker

    entry = _chunked(store, tmp_path, os.urandom(4 << 20))
    corrupt, gone = entry.chunks[2][0], entry.chunks[6][0]
    store.blob_path(corrupt).chmod(0o644)
    store.blob_path(corrupt).write_bytes(b"x" * entry.chunks[2][1])
    store.blob_path(gone).unlink()
    listed = [(str(store.blob_path(sha)), sha, size) for sha, size in entry.chunks]
    worker = HashWorker.start()
    assert worker is not None
    try:
        assert worker.check(listed) == [2, 6]
        assert worker.check(listed[:2]) == []
        # Run by a worker a batch at a time, with a thread of this process beside it.
        other = _chunked(store, tmp_path / "other", os.urandom(3 << 20))
        files = {MODEL: entry, "other.h5": other}
        checked: set[str] = set()
        check = store.verification(files, checked)
        helper = threading.Thread(target=check.run)
        helper.start()
        check.run(worker, batch=4)
        helper.join()
        assert check.bad == [MODEL]
        assert blobs({"other.h5": other}) <= checked
    finally:
        worker.close()
    assert worker._process.returncode == 0, "it ends when its input closes"
    assert worker.check(listed) is None  # gone: the caller checks the blobs itself
    check = store.verification({MODEL: entry})
    assert check.run(worker) == [MODEL]
