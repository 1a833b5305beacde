"""What a manifest says of one stored file (re-exported by `localdet.checkpoints.store`)."""
from __future__ import annotations

from dataclasses import dataclass, field

Blob = tuple[str, int]  # (sha256, size) of one stored blob


@dataclass(frozen=True)
class FileEntry:
    """Identity of one stored file: ``FileEntry(sha256="ab12...", size=1024)``. `chunks`
    lists its content-defined chunks in order, ``(sha256, size)`` each; empty, the file is
    the one blob named by its own sha256 (stored whole, or one chunk long). Two entries are
    equal when their bytes are, however they are stored."""

    sha256: str
    size: int
    chunks: tuple[Blob, ...] = field(default=(), compare=False)

    @property
    def blobs(self) -> tuple[Blob, ...]:
        """The blobs that make up the file, in order."""
        return self.chunks or ((self.sha256, self.size),)
