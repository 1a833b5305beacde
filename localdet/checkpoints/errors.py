"""What the checkpoint store raises (re-exported by `localdet.checkpoints.store`): one
sentence each, meant for the user."""
from __future__ import annotations

from pathlib import Path


class StoreError(Exception):
    """Any failure of the checkpoint store; the message is meant for the user."""


class CorruptBlobError(StoreError):
    """A blob's bytes no longer hash to its name."""

    def __init__(self, sha256: str, actual: str, name: str = "") -> None:
        self.sha256, self.actual, self.name = sha256, actual, name
        what = f"checkpoint file {name!r}" if name else f"blob {sha256}"
        super().__init__(f"{what} is corrupted in the store: expected sha256 {sha256}, "
                         f"found {actual}; the checkpoint cannot be exported")


class MissingBlobError(StoreError):
    """A blob that a checkpoint refers to is no longer in the store."""

    def __init__(self, sha256: str, path: Path | str, name: str = "") -> None:
        self.sha256, self.path, self.name = sha256, path, name  # path: or an S3 URL
        what = f"checkpoint file {name!r}" if name else "a checkpoint file"
        super().__init__(f"{what} is missing from the store (blob {sha256} not found at "
                         f"{path}); the checkpoint cannot be exported")
