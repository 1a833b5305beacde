"""The trial's side of chunked checkpoint uploads (the daemon's is `chunk_intake`).

    upload_and_commit(transport, folder, batches_trained, metadata, uuid)

The folder's files are cut into the store's content-defined chunks on this node
(`checkpoint_chunks`), the daemon is asked once which of them its store lacks, only those
are uploaded, many to a request and UPLOADS_IN_FLIGHT requests at once, and the commit lists
each file's chunks. Chunks that go missing before the commit (a daemon restart) or arrive
changed are sent again.
"""

from __future__ import annotations

import json
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Dict

from localdet.reporting.checkpoint_chunks import CheckpointCut, cut_checkpoint
from localdet.reporting.checkpoint_folder import files_under
from localdet.reporting.report_transport import MissingBlobs, ReportError, ReportTransport
from localdet.reporting.report_wire import CHUNKS_HEADER

UPLOADS_IN_FLIGHT = 2     # chunk uploads of one checkpoint sent at once


def upload_and_commit(transport: ReportTransport, directory: Path, batches_trained: int,
                      metadata: Dict[str, Any], uuid: str) -> None:
    """Upload the chunks of `directory` the store lacks and commit checkpoint `uuid` (begun
    already); the folder is deleted in the end, stored or not."""
    try:
        cut = cut_checkpoint(files_under(directory))
        missing = transport._call("POST", f"checkpoints/{uuid}/missing",
                                  {"hashes": sorted(cut.blobs)})["missing"]
        commit = {"batches_trained": int(batches_trained), "metadata": metadata,
                  "files": cut.files}
        for _ in range(3):  # chunks lost meanwhile (a daemon restart) are sent again
            send_chunks(transport, cut, missing)
            try:
                transport._call("POST", f"checkpoints/{uuid}/commit", commit)
                return
            except MissingBlobs as lacking:
                missing = [sha for sha in lacking.missing if sha in cut.blobs]
                if len(missing) != len(lacking.missing):
                    raise
        raise ReportError(f"checkpoint {uuid}'s chunks kept going missing in the store; "
                          "check the daemon's log")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def send_chunks(transport: ReportTransport, cut: CheckpointCut, hashes: list) -> None:
    """Upload these blobs of the cut, many to a request, UPLOADS_IN_FLIGHT requests at
    once (the daemon hashes and writes one batch while the next arrives)."""
    sending: list[Future] = []
    with ThreadPoolExecutor(UPLOADS_IN_FLIGHT, thread_name_prefix="upload") as uploads:
        try:
            for listing, body in cut.batches(hashes):
                if len(sending) >= UPLOADS_IN_FLIGHT:  # a bound on the batches in memory
                    sending.pop(0).result()
                sending.append(uploads.submit(send_batch, transport, cut, listing, body))
            for sent in sending:
                sent.result()
        finally:
            for sent in sending:
                sent.cancel()


def send_batch(transport: ReportTransport, cut: CheckpointCut, listing: list,
               body: bytes) -> None:
    """One upload of chunks; those that arrive changed (hashed differently) are sent
    again."""
    for _ in range(3):  # its keep-alive connection closes when the thread ends
        try:
            transport._exchange("PUT", "chunks", _always(body), transport._answer,
                                {"Content-Type": "application/octet-stream",
                                 "Content-Length": str(len(body)),
                                 CHUNKS_HEADER: json.dumps(listing, separators=(",", ":"))})
            return
        except MissingBlobs as bad:
            resend = set(bad.missing)
            listing = [item for item in listing if item[0] in resend]
            body = b"".join(cut.read(sha) for sha, _ in listing)
    raise ReportError(f"checkpoint chunks of '{cut.blobs[listing[0][0]].path}' kept "
                      "arriving corrupted at the daemon")


def _always(value: Any) -> Callable[[], Any]:
    return lambda: value
