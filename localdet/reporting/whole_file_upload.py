"""Checkpoint uploads of the wire before chunked uploads: each file sent whole, as one blob.

    upload_and_commit(transport, folder, batches_trained, metadata, uuid)

Used when a daemon's `begin` does not answer `{"chunks": true}` (it predates chunked
uploads), or when the reporter is told to speak the old protocol (`HTTPReporter.chunked =
False`, as a trial from before chunked uploads does). Each file is hashed on this node, the
daemon is asked once which blobs its store lacks, those are PUT one a request, and the
commit names each file by `[sha256, size]`.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any, Dict

from localdet.reporting.checkpoint_folder import files_under
from localdet.reporting.report_transport import MissingBlobs, ReportError, ReportTransport
from localdet.reporting.report_wire import CHUNK


def upload_and_commit(transport: ReportTransport, directory: Path, batches_trained: int,
                      metadata: Dict[str, Any], uuid: str) -> None:
    """Upload the files of `directory` the store lacks and commit checkpoint `uuid` (begun
    already); the folder is deleted in the end, stored or not."""
    try:
        paths = files_under(directory)
        files = {name: hash_file(path) for name, path in paths.items()}
        by_hash = {sha: paths[name] for name, (sha, _) in files.items()}
        missing = transport._call("POST", f"checkpoints/{uuid}/missing",
                                  {"hashes": sorted(by_hash)})["missing"]
        commit = {"batches_trained": int(batches_trained), "metadata": metadata,
                  "files": {name: list(entry) for name, entry in files.items()}}
        for _ in range(3):  # blobs lost meanwhile (a daemon restart) are sent again
            for sha in missing:
                upload_file(transport, sha, by_hash[sha])
            try:
                transport._call("POST", f"checkpoints/{uuid}/commit", commit)
                return
            except MissingBlobs as lacking:
                missing = lacking.missing
        raise ReportError(f"checkpoint {uuid}'s files kept going missing in the store; "
                          "check the daemon's log")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def upload_file(transport: ReportTransport, sha256: str, path: Path) -> None:
    """PUT one file as the blob `sha256`."""
    size = path.stat().st_size
    for _ in range(3):  # bytes that arrive changed (hashed differently) are sent again
        try:
            with open(path, "rb") as source:
                def body():
                    source.seek(0)
                    return source

                transport._exchange("PUT", f"blobs/{sha256}", body, transport._answer,
                                    {"Content-Type": "application/octet-stream",
                                     "Content-Length": str(size)})
            return
        except MissingBlobs:
            continue
    raise ReportError(f"checkpoint file '{path}' kept arriving corrupted at the daemon")


def hash_file(path: Path) -> tuple[str, int]:
    """The file's sha256 and size."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size
