"""`core_context.checkpoint`: save and load checkpoints of a Core API trial.

    with core_context.checkpoint.store_path({"steps_completed": 100}) as (path, storage_id):
        save_my_model(path)                 # stored and recorded when the block ends
    with core_context.checkpoint.restore_path(info.latest_checkpoint) as path:
        load_my_model(path)
    storage_id = core_context.checkpoint.upload("ckpt_dir", {"steps_completed": 100})
    core_context.checkpoint.download(storage_id, "somewhere")

A checkpoint goes into the experiment's checkpoint storage (localdet's content-addressed
store, `shared_fs` or `s3`) and is recorded as any trial's: `localdet checkpoints`,
retention, `latest_checkpoint` on resume. Its `metadata.json` holds the metadata, as in
Determined; `steps_completed` says how far the trial had trained (without it, the most
batches reported so far). `shard=True` lets every rank write into the same folder (the
ranks share this machine's disk), and merges their metadata.

Off-cluster (`det.core.init()` outside localdet) checkpoints are plain folders named by
their storage id under `checkpoint_storage` (a path), by default Determined's own place,
the user data folder `determined` (~/.local/share/determined on Linux), or go to the
storage manager given (`core.init(storage_manager=...)`,
`core.DummyCheckpointContext(distributed, storage_manager)`; determined.common.storage).
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import os
import pathlib
import shutil
import tempfile
import uuid as uuidlib
from typing import Any, Callable, ContextManager, Dict, Iterator, List, Optional, Tuple, Union

from determined.common import storage
from determined.core._distributed import DistributedContext
from determined.core._length import TrialLength
from determined.core._reporting import TrialReporter, reporter_factory

logger = logging.getLogger("determined.core")

METADATA_FILE = "metadata.json"


class DownloadMode(enum.Enum):
    """LocalWorkersShareDownload (the default): the ranks call restore_path()/download() in
    step and share one copy. NoSharedDownload: each caller gets its own, no coordination."""

    LocalWorkersShareDownload = "LOCAL_WORKERS_SHARE_DOWNLOAD"
    NoSharedDownload = "NO_SHARED_DOWNLOAD"


def merge_metadata(all_metadata: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The ranks' metadata as one dict; a key two ranks set to different values is an
    error naming it."""
    merged: Dict[str, Any] = {}
    for rank, metadata in enumerate(all_metadata):
        for key, value in (metadata or {}).items():
            if key in merged and merged[key] != value:
                raise RuntimeError(f"checkpoint metadata {key!r} differs between ranks "
                                   f"(rank {rank} has {value!r}, an earlier rank "
                                   f"{merged[key]!r}); give it on one rank only")
            merged[key] = value
    return merged


def _copy_selected(source: pathlib.Path, destination: pathlib.Path,
                   selector: Optional[Callable[[str], bool]]) -> None:
    """Copy the files under `source` (relative POSIX names for `selector`) into
    `destination`, as new files."""
    for path in sorted(source.rglob("*")):
        if path.is_dir():
            continue
        name = path.relative_to(source).as_posix()
        if selector is not None and not selector(name):
            continue
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)


class CheckpointContext:
    """`core_context.checkpoint` of a trial localdet runs; see the module docstring."""

    def __init__(self, reporter: TrialReporter, distributed: DistributedContext,
                 length: TrialLength, scratch: Optional[pathlib.Path] = None) -> None:
        self._reporter = reporter
        self._dist = distributed
        self._length = length
        # Folders being written or restored: beside the store where possible, so that
        # files move and link into it rather than being copied.
        self._scratch = scratch

    def _folder(self, prefix: str) -> pathlib.Path:
        if self._scratch is not None:
            self._scratch.mkdir(parents=True, exist_ok=True)
        return pathlib.Path(tempfile.mkdtemp(prefix=prefix, dir=self._scratch))

    # -- saving ---------------------------------------------------------------------
    @contextlib.contextmanager
    def store_path(self, metadata: Optional[Dict[str, Any]] = None, *, shard: bool = False
                   ) -> Iterator[Tuple[pathlib.Path, str]]:
        """A fresh folder to save the checkpoint into, and its storage id; stored and
        recorded when the block ends. With shard=False only the chief may call it; with
        shard=True every rank must, and all write into the same folder."""
        if not shard and self._dist.rank != 0:
            raise RuntimeError(f"cannot call CheckpointContext.store_path(shard=False) from "
                               f"rank {self._dist.rank}; only the chief (rank 0) may")
        folder: Optional[str] = None
        storage_id: Optional[str] = None
        if self._dist.rank == 0:
            folder = str(self._folder(".checkpoint-"))
            storage_id = str(uuidlib.uuid4())
        if shard:
            folder, storage_id = self._dist.broadcast((folder, storage_id))
        if folder is None or storage_id is None:  # every rank has the chief's by now
            raise RuntimeError("store_path() got no folder from the chief")
        path = pathlib.Path(folder)
        try:
            yield path, storage_id
        except BaseException:
            if self._dist.rank == 0:
                shutil.rmtree(path, ignore_errors=True)
            raise
        merged = merge_metadata(self._dist.allgather(metadata or {})) if shard \
            else dict(metadata or {})
        if self._dist.rank == 0:
            self._save(path, merged, storage_id)
        if shard:
            self._dist.allgather(None)  # no rank goes on before the checkpoint is handed over

    def upload(self, ckpt_dir: Optional[Union[str, os.PathLike]],
               metadata: Optional[Dict[str, Any]] = None, *, shard: bool = False,
               selector: Optional[Callable[[str], bool]] = None) -> str:
        """Store a copy of `ckpt_dir`'s files (those `selector` keeps) as a checkpoint;
        returns its storage id. shard=True: every rank calls it, ckpt_dir None where a rank
        has nothing to add."""
        if not shard:
            if self._dist.rank != 0:
                raise RuntimeError(f"cannot call .upload(shard=False) from rank "
                                   f"{self._dist.rank}; only the chief (rank 0) may")
            if ckpt_dir is None:
                raise RuntimeError("cannot call .upload(ckpt_dir=None, shard=False), which "
                                   "would store nothing")
        with self.store_path(metadata, shard=shard) as (path, storage_id):
            if ckpt_dir is not None:
                _copy_selected(pathlib.Path(ckpt_dir), path, selector)
        return storage_id

    def _save(self, path: pathlib.Path, metadata: Dict[str, Any], storage_id: str) -> None:
        steps = metadata.get("steps_completed")
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
            if steps is not None:
                shutil.rmtree(path, ignore_errors=True)
                raise ValueError(f"checkpoint metadata 'steps_completed' must be a whole "
                                 f"number of batches, got {steps!r}")
            steps = self._length.last_steps
        (path / METADATA_FILE).write_text(json.dumps(metadata, indent=2, default=str))
        self._length.steps(steps)
        self._reporter.save_checkpoint(path, steps, metadata, uuid=storage_id)
        logger.info("checkpoint %s saved at %d batches", storage_id, steps)

    # -- loading --------------------------------------------------------------------
    @contextlib.contextmanager
    def restore_path(self, storage_id: str,
                     download_mode: DownloadMode = DownloadMode.LocalWorkersShareDownload, *,
                     selector: Optional[Callable[[str], bool]] = None) -> Iterator[pathlib.Path]:
        """The checkpoint as a folder for the block's duration (deleted after). With the
        default download mode every rank calls it in step and they share the chief's copy.
        Every file is checked against its hash: a corrupt one raises when the block ends."""
        with _shared_restore(self._dist, download_mode,
                             lambda: self._restored(storage_id, selector)) as path:
            yield path

    @contextlib.contextmanager
    def _restored(self, storage_id: str,
                  selector: Optional[Callable[[str], bool]]) -> Iterator[pathlib.Path]:
        scratch = self._folder(".restore-")
        try:
            path = self._reporter.restore_checkpoint(storage_id, scratch / "checkpoint")
            if selector is not None:  # the files it does not keep are not there
                for file in [p for p in path.rglob("*") if p.is_file()]:
                    if not selector(file.relative_to(path).as_posix()):
                        file.unlink()
            yield path
            self._reporter.verify_restored_checkpoint()
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def download(self, storage_id: str, ckpt_dir: Union[str, os.PathLike],
                 download_mode: DownloadMode = DownloadMode.LocalWorkersShareDownload, *,
                 selector: Optional[Callable[[str], bool]] = None) -> None:
        """Copy the checkpoint's files (those `selector` keeps) into `ckpt_dir`, created if
        missing. With the default mode every rank calls it in step and the chief copies."""
        shared = DownloadMode(download_mode) == DownloadMode.LocalWorkersShareDownload \
            and self._dist.size > 1
        if not shared or self._dist.rank == 0:
            with self.restore_path(storage_id, DownloadMode.NoSharedDownload) as path:
                _copy_selected(path, pathlib.Path(ckpt_dir), selector)
        if shared:
            self._dist.allgather(None)

    def get_metadata(self, storage_id: str) -> Dict[str, Any]:
        """The metadata the checkpoint was saved with."""
        try:
            return reporter_factory().checkpoint_metadata(storage_id)
        except OSError:
            # The database is not on this machine (a trial on a cluster's node): the
            # checkpoint's own metadata.json, fetched through the reporter.
            with self.restore_path(storage_id, DownloadMode.NoSharedDownload,
                                   selector=lambda name: name == METADATA_FILE) as path:
                file = path / METADATA_FILE
                return json.loads(file.read_text()) if file.exists() else {}

    def delete(self, storage_id: str) -> None:
        """Delete the checkpoint: its record stays, marked deleted (`localdet checkpoints
        --all`), and its files are freed once nothing else uses them."""
        self._reporter.wait_for_checkpoints()
        reporter_factory().delete_checkpoint(storage_id)


class DummyCheckpointContext(CheckpointContext):
    """Off-cluster checkpoints, recorded nowhere: in a storage manager (Determined's
    signature, `DummyCheckpointContext(distributed, storage_manager)`) or, given a folder,
    as plain folders `<folder>/<storage_id>` (see the module docstring). A shared_fs
    manager is written and read in place, as in Determined; another manager's
    `post_store_path` stores what was written, and its `restore_path` gives it back."""

    def __init__(self, dist: DistributedContext,
                 storage_manager: Union[storage.StorageManager, str, os.PathLike]) -> None:
        self._dist = dist
        if isinstance(storage_manager, (str, os.PathLike)):
            storage_manager = storage.SharedFSStorageManager(os.fspath(storage_manager))
        if not isinstance(storage_manager, storage.StorageManager):
            raise TypeError(f"DummyCheckpointContext needs a folder or a "
                            f"determined.common.storage.StorageManager, got "
                            f"{type(storage_manager).__name__}")
        self._storage_manager = storage_manager
        self._length = TrialLength(None, 0)
        self._scratch = None

    @contextlib.contextmanager
    def store_path(self, metadata: Optional[Dict[str, Any]] = None, *, shard: bool = False
                   ) -> Iterator[Tuple[pathlib.Path, str]]:
        if not shard and self._dist.rank != 0:
            raise RuntimeError(f"cannot call CheckpointContext.store_path(shard=False) from "
                               f"rank {self._dist.rank}; only the chief (rank 0) may")
        folder: Optional[str] = None
        storage_id: Optional[str] = None
        if self._dist.rank == 0:
            storage_id = str(uuidlib.uuid4())
            folder = str(self._storage_manager.pre_store_path(storage_id))
        if shard:
            folder, storage_id = self._dist.broadcast((folder, storage_id))
        if folder is None or storage_id is None:  # every rank has the chief's by now
            raise RuntimeError("store_path() got no folder from the chief")
        path = pathlib.Path(folder)
        try:
            yield path, storage_id
        except BaseException:
            if self._dist.rank == 0:  # no half-written checkpoint is left to be found
                shutil.rmtree(path, ignore_errors=True)
            raise
        merged = merge_metadata(self._dist.allgather(metadata or {})) if shard \
            else dict(metadata or {})
        if self._dist.rank == 0:
            (path / METADATA_FILE).write_text(json.dumps(merged, indent=2, default=str))
            self._storage_manager.post_store_path(path, storage_id)
            logger.info("saved checkpoint %s", storage_id)
        if shard:
            self._dist.allgather(None)  # no rank goes on before the checkpoint is stored

    @contextlib.contextmanager
    def restore_path(self, storage_id: str,
                     download_mode: DownloadMode = DownloadMode.LocalWorkersShareDownload, *,
                     selector: Optional[Callable[[str], bool]] = None) -> Iterator[pathlib.Path]:
        with _shared_restore(self._dist, download_mode, lambda: self._storage_manager
                             .restore_path(storage_id, selector)) as path:
            yield path

    def get_metadata(self, storage_id: str) -> Dict[str, Any]:
        with self.restore_path(storage_id, DownloadMode.NoSharedDownload,
                               selector=lambda name: name == METADATA_FILE) as path:
            file = path / METADATA_FILE
            return json.loads(file.read_text()) if file.exists() else {}

    def delete(self, storage_id: str) -> None:
        self._storage_manager.delete(storage_id, ["**/*"])
        logger.info("deleted checkpoint %s", storage_id)


@contextlib.contextmanager
def _shared_restore(dist: Any, download_mode: DownloadMode,
                    restore: Callable[[], ContextManager[Any]]) -> Iterator[pathlib.Path]:
    """The folder `restore` gives, for the block. In the shared download mode on several
    ranks only the chief restores and hands its folder to the others, and every rank keeps
    it until all of them are done with it."""
    shared = DownloadMode(download_mode) == DownloadMode.LocalWorkersShareDownload \
        and dist.size > 1
    if shared and dist.rank != 0:
        folder = dist.broadcast(None)
        try:
            yield pathlib.Path(folder)
        finally:
            dist.allgather(None)
        return
    with restore() as path:
        if shared:
            dist.broadcast(str(path))
        try:
            yield pathlib.Path(path)
        finally:
            if shared:
                dist.allgather(None)  # every rank is done with the folder
