"""A checkpoint folder cut into content-defined chunks on the trial's node, for the report
wire: what `HTTPReporter` asks the daemon about, sends and commits.

    cut = cut_checkpoint({"model.h5": folder / "model.h5"})   # hashes, sizes, chunk lists
    missing = ask_server(sorted(cut.blobs))   # one request for the whole checkpoint
    for listing, body in cut.batches(missing):
        send(listing, body)                   # several chunks a request
    commit({"files": cut.files, ...})

The chunks are the store's own (`localdet.checkpoints.chunking` is a pure function of the
bytes), so the daemon already holds every chunk of a frozen base that an earlier checkpoint
of any trial stored, and only the chunks that changed travel. A file of one chunk is one
blob named by its own hash, as the store keeps it. Imports no more of localdet than the
chunking module: it runs on nodes without the daemon's state.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

from localdet.checkpoints.chunking import HASH_BESIDE_BYTES, cut_file, sha256_beside

# One upload request carries chunks up to about this many bytes, or this many chunks: few
# requests (and one durable flush on the daemon for each), bounded memory on both sides.
BATCH_BYTES = 8 << 20
BATCH_CHUNKS = 128
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


@dataclass(frozen=True)
class Piece:
    """Where a blob's bytes lie: `size` bytes at `offset` of the file at `path`."""

    path: Path
    offset: int
    size: int


@dataclass
class CheckpointCut:
    """A checkpoint folder's files as the wire commits them, and where each blob lies.

    `files`: ``{name: [sha256, size]}`` for a file that is one blob, ``{name: [sha256,
    size, [[chunk_sha256, chunk_size], ...]]}`` for one of several chunks.
    `blobs`: ``{sha256: Piece}``, one place for each distinct blob."""

    files: Dict[str, List[Any]] = field(default_factory=dict)
    blobs: Dict[str, Piece] = field(default_factory=dict)

    def read(self, sha256: str) -> bytes:
        """The bytes of one blob of this cut, read again from its file."""
        return _read(self.blobs[sha256])

    def batches(self, hashes: List[str]) -> Iterator[Tuple[List[List[Any]], bytes]]:
        """The blobs `hashes` (each named by this cut) read back from their files, in
        requests of at most BATCH_BYTES (or one blob) and BATCH_CHUNKS: ``(listing, body)``,
        `listing` ``[[sha256, size], ...]`` in the order of their bytes in `body`."""
        listing: List[List[Any]] = []
        parts: List[bytes] = []
        held = 0
        for sha256 in dict.fromkeys(hashes):  # each once, in the order asked
            piece = self.blobs[sha256]
            if listing and (held + piece.size > BATCH_BYTES or len(listing) >= BATCH_CHUNKS):
                yield listing, b"".join(parts)
                listing, parts, held = [], [], 0
            parts.append(_read(piece))
            listing.append([sha256, piece.size])
            held += piece.size
        if listing:
            yield listing, b"".join(parts)


def _read(piece: Piece) -> bytes:
    with open(piece.path, "rb", buffering=0) as f:
        data = os.pread(f.fileno(), piece.size, piece.offset)
    if len(data) != piece.size:
        raise OSError(f"checkpoint file '{piece.path}' shrank while it was being uploaded")
    return data


def cut_file_entry(path: Path, blobs: Dict[str, Piece]) -> List[Any]:
    """Cut one file, adding its blobs' places to `blobs`; returns its wire entry."""
    beside = sha256_beside(path) if path.stat().st_size >= HASH_BESIDE_BYTES else None
    whole, chunks, offset = hashlib.sha256(), [], 0
    for piece in cut_file(path):
        sha256 = hashlib.sha256(piece).hexdigest()
        blobs.setdefault(sha256, Piece(path, offset, len(piece)))
        if beside is None:
            whole.update(piece)
        chunks.append([sha256, len(piece)])
        offset += len(piece)
    digest = beside.result() if beside is not None else whole.hexdigest()
    if not chunks:  # an empty file: the blob of no bytes
        blobs.setdefault(EMPTY_SHA256, Piece(path, 0, 0))
        return [EMPTY_SHA256, 0]
    if len(chunks) == 1:
        if digest != chunks[0][0]:
            raise OSError(f"checkpoint file '{path}' changed while it was being cut")
        return [digest, offset]
    return [digest, offset, chunks]


def cut_checkpoint(paths: Dict[str, Path]) -> CheckpointCut:
    """Cut every file of a checkpoint (``{relative name: path}``)."""
    cut = CheckpointCut()
    for name, path in paths.items():
        cut.files[name] = cut_file_entry(path, cut.blobs)
    return cut
