"""determined.common.storage: where an off-cluster checkpoint context keeps its checkpoints.

    from determined import core
    from determined.common import storage

    manager = storage.SharedFSStorageManager("/data/checkpoints")
    checkpoint = core.DummyCheckpointContext(core.DummyDistributedContext(), manager)
    with checkpoint.store_path({"steps_completed": 10}) as (path, storage_id):
        ...                                  # written straight into /data/checkpoints/<id>

A storage manager names a checkpoint by its storage id under its base path. Determined's
Core API used these classes off its cluster (`core.DummyCheckpointContext(distributed,
storage_manager)`, `core.init(storage_manager=...)` in 0.18-0.2x), and its tests subclass
`SharedFSStorageManager` to watch `restore_path`; so they are served with Determined's
names and signatures. Under localdet a trial's checkpoints go to the experiment's
`checkpoint_storage` instead. The cloud managers (S3, GCS, Azure) are not served here: off
localdet a checkpoint goes to a folder.
"""

from __future__ import annotations

import abc
import contextlib
import glob
import logging
import os
import pathlib
import shutil
import urllib.parse
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Union

from determined import _refused

logger = logging.getLogger("determined.common.storage")

# The files of a checkpoint to upload, as paths relative to its root ("dir/" for a folder).
Paths = Set[str]
# Whether to download a file, given its path relative to the checkpoint's root.
Selector = Callable[[str], bool]

_SERVED = ("StorageManager, SharedFSStorageManager, DirectoryStorageManager, from_string and "
           "build")
_CLOUD = ("AzureStorageManager", "CloudStorageManager", "GCSStorageManager",
          "S3StorageManager")


class CheckpointNotFound(FileNotFoundError):
    """There is no checkpoint with that storage id in this storage."""


class StorageManager(metaclass=abc.ABCMeta):
    """A place checkpoints are stored, each under its storage id below `base_path`.

    `store_path(dst)` yields the folder to write checkpoint `dst` into; `restore_path(src,
    selector)` yields the folder checkpoint `src` can be read from; `upload`, `download`
    and `delete` copy or remove whole checkpoints.
    """

    def __init__(self, base_path: str) -> None:
        if not isinstance(base_path, str):
            raise ValueError(f"base_path must be a string, not {type(base_path).__name__}")
        if not base_path:
            raise ValueError("base_path must not be an empty string")
        self._base_path = base_path

    @classmethod
    def from_config(cls, config: Dict[str, Any],
                    container_path: Optional[str] = None) -> "StorageManager":
        return cls(**config)

    def pre_store_path(self, dst: str) -> pathlib.Path:
        """Make and return the folder checkpoint `dst` is written into."""
        path = pathlib.Path(self._base_path, dst)
        path.mkdir(parents=True, exist_ok=True)
        return path

    @abc.abstractmethod
    def post_store_path(self, src: Union[str, os.PathLike], dst: str,
                        paths: Optional[Paths] = None) -> None:
        """Finish storing what was written into `src` as checkpoint `dst`."""

    @contextlib.contextmanager
    def store_path(self, dst: str) -> Iterator[pathlib.Path]:
        path = self.pre_store_path(dst)
        yield path
        self.post_store_path(path, dst)

    @abc.abstractmethod
    def store_path_is_direct_access(self) -> bool:
        """Whether `store_path` writes straight into the storage (no upload after)."""

    @abc.abstractmethod
    @contextlib.contextmanager
    def restore_path(self, src: str, selector: Optional[Selector] = None
                     ) -> Iterator[pathlib.Path]:
        """The folder checkpoint `src` can be read from, for the block's duration."""
        yield pathlib.Path()  # pragma: no cover (abstract)

    @abc.abstractmethod
    def upload(self, src: Union[str, os.PathLike], dst: str,
               paths: Optional[Paths] = None) -> None:
        """Store folder `src` (only `paths` of it, if given) as checkpoint `dst`."""

    @abc.abstractmethod
    def download(self, src: str, dst: Union[str, os.PathLike],
                 selector: Optional[Selector] = None) -> None:
        """Copy checkpoint `src` (the files `selector` keeps) into folder `dst`."""

    @abc.abstractmethod
    def delete(self, tgt: str, globs: List[str]) -> Dict[str, int]:
        """Delete the files of checkpoint `tgt` the globs match; returns what is left
        (path -> size, folders ending in "/")."""

    @staticmethod
    def _list_directory(root: Union[str, os.PathLike]) -> Dict[str, int]:
        """Every file and folder under `root`: relative path -> size (folders end in "/"
        and count 0)."""
        base = pathlib.Path(root)
        if not base.exists():
            raise FileNotFoundError(str(base))
        if not base.is_dir():
            raise NotADirectoryError(str(base))
        listing: Dict[str, int] = {}
        for path in sorted(base.rglob("*")):
            name = path.relative_to(base).as_posix()
            listing[name + "/" if path.is_dir() else name] = \
                0 if path.is_dir() else path.stat().st_size
        return listing


def _copy_tree(src: pathlib.Path, dst: pathlib.Path,
               keep: Optional[Callable[[str], bool]]) -> None:
    for path in sorted(src.rglob("*")):
        if path.is_dir():
            continue
        name = path.relative_to(src).as_posix()
        if keep is not None and not keep(name):
            continue
        (dst / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dst / name)


class SharedFSStorageManager(StorageManager):
    """Checkpoints as folders `<base_path>/<storage_id>` of a file system every process
    sees: written in place (`store_path`) and read in place (`restore_path`)."""

    @classmethod
    def from_config(cls, config: Dict[str, Any],
                    container_path: Optional[str] = None) -> "SharedFSStorageManager":
        """From a `checkpoint_storage` mapping of type shared_fs (`host_path`, optional
        `storage_path` below it; `container_path` replaces `host_path` when given)."""
        unknown = set(config) - {"type", "host_path", "storage_path", "container_path",
                                 "propagation"}
        if unknown:
            raise ValueError(f"shared_fs storage has no key {sorted(unknown)[0]!r}")
        if "host_path" not in config:
            raise ValueError("shared_fs storage needs host_path")
        base = container_path or config["host_path"]
        return cls(os.path.join(base, config.get("storage_path") or ""))

    def post_store_path(self, src: Union[str, os.PathLike], dst: str,
                        paths: Optional[Paths] = None) -> None:
        pass  # written in place: nothing to move

    def store_path_is_direct_access(self) -> bool:
        return True

    @contextlib.contextmanager
    def restore_path(self, src: str, selector: Optional[Selector] = None
                     ) -> Iterator[pathlib.Path]:
        """The checkpoint's own folder (every file is there, whatever `selector` says)."""
        if selector is not None:
            logger.warning("restore_path from shared_fs ignores the selector: every file "
                           "of the checkpoint is read in place")
        path = pathlib.Path(self._base_path, src)
        if not path.is_dir():
            raise CheckpointNotFound(f"there is no checkpoint {src} in {self._base_path}")
        yield path

    def upload(self, src: Union[str, os.PathLike], dst: str,
               paths: Optional[Paths] = None) -> None:
        _copy_tree(pathlib.Path(src), pathlib.Path(self._base_path, dst),
                   None if paths is None else paths.__contains__)

    def download(self, src: str, dst: Union[str, os.PathLike],
                 selector: Optional[Selector] = None) -> None:
        source = pathlib.Path(self._base_path, src)
        if not source.is_dir():
            raise CheckpointNotFound(f"there is no checkpoint {src} in {self._base_path}")
        pathlib.Path(dst).mkdir(parents=True, exist_ok=True)
        _copy_tree(source, pathlib.Path(dst), selector)

    def delete(self, tgt: str, globs: List[str]) -> Dict[str, int]:
        folder = pathlib.Path(self._base_path, tgt)
        if not folder.exists():
            return {}
        if "**/*" in globs:
            shutil.rmtree(folder)
            return {}
        for pattern in globs:
            for name in glob.glob(str(folder / pattern), recursive=True):
                path = pathlib.Path(name)
                if folder.resolve() not in path.resolve().parents:
                    continue  # a pattern reaching outside the checkpoint
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                elif path.exists() or path.is_symlink():
                    path.unlink()
        left = self._list_directory(folder)
        if not left:
            shutil.rmtree(folder)
        return left


class DirectoryStorageManager(SharedFSStorageManager):
    """Determined's `directory` storage (a folder inside the container): the same as
    shared_fs on one machine."""

    @classmethod
    def from_config(cls, config: Dict[str, Any],
                    container_path: Optional[str] = None) -> "DirectoryStorageManager":
        if "container_path" not in config:
            raise ValueError("directory storage needs container_path")
        return cls(os.path.join(config["container_path"], config.get("storage_path") or ""))


def from_string(shortcut: str) -> StorageManager:
    """A storage manager from a `checkpoint_storage` string: a folder path or file:// URL
    (s3:// and gs:// are not served off localdet)."""
    parsed = urllib.parse.urlparse(shortcut)
    if parsed.scheme.lower() not in ("", "file"):
        raise ValueError(f"checkpoint storage {shortcut!r}: only a folder (a path or file:// "
                         f"URL) is served off localdet; give a path")
    if parsed.netloc or parsed.params or parsed.query or parsed.fragment:
        raise ValueError(f"checkpoint storage {shortcut!r} is not a plain folder path")
    return SharedFSStorageManager(parsed.path)


def build(config: Dict[str, Any], container_path: Optional[str] = None) -> StorageManager:
    """A storage manager from a `checkpoint_storage` mapping (shared_fs or directory)."""
    managers = {"shared_fs": SharedFSStorageManager, "directory": DirectoryStorageManager}
    kind = config.get("type")
    if kind not in managers:
        raise ValueError(f"checkpoint storage type {kind!r} is not served off localdet; use "
                         f"shared_fs or directory")
    settings = {k: v for k, v in config.items()
                if k not in ("type", "save_experiment_best", "save_trial_best",
                             "save_trial_latest", "checkpoint_path", "tensorboard_path")}
    if kind == "shared_fs" and "storage_path" not in settings:
        legacy = config.get("tensorboard_path") or config.get("checkpoint_path")
        if legacy is not None:  # Determined's older name for storage_path
            settings["storage_path"] = legacy
    return managers[kind].from_config(settings, container_path)


def __getattr__(name: str) -> Any:
    if name in _CLOUD:
        raise _refused.refusal_of_name("common.storage", name, _SERVED)
    raise AttributeError(f"module 'determined.common.storage' has no attribute {name!r}")
