"""Which checkpoint store an experiment uses, from its `checkpoint_storage`, as Determined
spells it:

    checkpoint_storage:            # absent type: localdet's own store, $LOCALDET_HOME/store
      type: shared_fs
      host_path: /mnt/shared       # a mount every node has
      storage_path: localdet       # optional, relative to host_path (or absolute inside it)

    checkpoint_storage:
      type: s3
      bucket: my-bucket
      prefix: experiments/         # optional
      endpoint_url: http://...     # optional: an S3-compatible server
      access_key: ...              # optional, with secret_key; else AWS's usual search
      secret_key: ...

Usage:

    store = open_store(layout, experiment.config)           # Store, or S3Store
    store = experiment_store(layout, db, experiment_id)
    store = checkpoint_store(layout, checkpoint)             # where that checkpoint lives

Where a checkpoint lives is recorded once, in its experiment's config in the database
(`experiments.config`, written at submission and never changed afterwards); a checkpoint row
names its experiment, so its uuid alone finds its store. `shared_fs` is the local `Store`
format at ``host_path[/storage_path]``, leases and all (flock works on a shared POSIX
mount); `s3` is `localdet.checkpoints.s3_store.S3Store`.
"""
from __future__ import annotations

import functools
import os
from pathlib import Path, PurePosixPath
from typing import Any, Mapping, Union

from localdet.checkpoints.s3_store import GRACE_SECONDS, S3Store
from localdet.checkpoints.store import Store, StoreError
from localdet.paths import Layout

CheckpointStore = Union[Store, S3Store]
TYPES = ("shared_fs", "s3")


def shared_fs_root(section: Mapping[str, Any]) -> Path:
    """``host_path[/storage_path]``; storage_path may also be absolute inside host_path, as
    Determined allows."""
    host = Path(section["host_path"])
    storage = section.get("storage_path")
    if not storage:
        return host
    path = PurePosixPath(storage)
    return Path(path) if path.is_absolute() else host / path


def storage_section(config: Mapping[str, Any]) -> Mapping[str, Any]:
    section = config.get("checkpoint_storage") if isinstance(config, Mapping) else None
    return section if isinstance(section, Mapping) else {}


def open_store(layout: Layout, config: Mapping[str, Any], *,
               grace_seconds: float = GRACE_SECONDS) -> CheckpointStore:
    """The store an experiment's checkpoints go to, from its (validated) config;
    `grace_seconds` applies to S3 only (see `localdet.checkpoints.s3_store`)."""
    section = storage_section(config)
    kind = section.get("type")
    if kind is None:
        return Store(layout.store)
    if kind == "shared_fs":
        # A mount missing here must not turn into a local folder of the same name.
        if not Path(section["host_path"]).is_dir():
            raise StoreError(f"checkpoint_storage.host_path '{section['host_path']}' is not a "
                             "folder on this machine; mount the shared folder there")
        return Store(shared_fs_root(section))
    if kind == "s3":
        return _s3_store(section["bucket"], section.get("prefix") or "",
                         section.get("endpoint_url"), section.get("access_key"),
                         section.get("secret_key"), grace_seconds)
    raise StoreError(f"checkpoint_storage.type {kind!r} is not supported; use one of "
                     f"{', '.join(TYPES)}, or leave it out for localdet's own store")


@functools.lru_cache(maxsize=16)
def _s3_store(bucket: str, prefix: str, endpoint_url: str | None, access_key: str | None,
              secret_key: str | None, grace_seconds: float) -> S3Store:
    # One client a process: building one costs ~0.1 s, and clients are thread-safe.
    return S3Store(bucket, prefix, endpoint_url=endpoint_url, access_key=access_key,
                   secret_key=secret_key, grace_seconds=grace_seconds)


# A forked child (a trial forked from a warm process) makes its own clients: the parent's
# connections are not safe to share across a fork.
os.register_at_fork(after_in_child=_s3_store.cache_clear)


def experiment_store(layout: Layout, db: Any, experiment_id: int, **kwargs: Any) -> CheckpointStore:
    """The store of experiment `experiment_id`, through an open `StateDB`."""
    return open_store(layout, db.experiment(experiment_id).config, **kwargs)


def checkpoint_store(layout: Layout, checkpoint: Any) -> CheckpointStore:
    """The store a checkpoint (a `localdet.records.db.Checkpoint`) lives in."""
    from localdet.records.db import StateDB

    db = StateDB.open(layout.db)
    try:
        return experiment_store(layout, db, checkpoint.experiment_id)
    finally:
        db.close()
