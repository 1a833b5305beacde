"""A helper process that checks blobs against their hashes, off the restoring process's GIL.

    worker = HashWorker.start()           # early: its interpreter starts beside the caller's
    bad = worker.check([(path, sha256, size), ...])   # indices of the blobs that fail
    worker.close()

A restore hashes its checkpoint's blobs while the caller loads them. In a thread of the
caller's process the two fight over the GIL: h5py and TensorFlow hold it through long copies,
and the hashing thread, which needs it between chunks, stalls (for a 70 MB model a restore
then takes the sum of the two, not the longer). This process has a GIL of its own. It runs
this file as a script under `python -I -S` (standard library only, about 10 ms to start) and
answers one JSON line per request; it ends when its stdin closes, that is with the process
that started it. Anything wrong with it (it cannot start, it died) makes `check` return None,
and the caller hashes in its own process instead.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from typing import IO, Sequence

BUFFER_SIZE = 1 << 20

BlobToCheck = tuple[str, str, int]  # (path, sha256, size): not file_entry.Blob


def blob_is_sound(path: str, sha256: str, size: int, buffer: bytearray) -> bool:
    """Whether the file at `path` is `size` bytes that hash to `sha256`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    view = memoryview(buffer)
    try:
        if size < len(buffer):
            # A chunk in one read (one byte more: a longer file shows), hashed in one call.
            got = os.readv(fd, [view[:size + 1]])
            while 0 < got < size and (more := os.readv(fd, [view[got:size + 1]])):
                got += more
            return got == size and hashlib.sha256(view[:size]).hexdigest() == sha256
        digest, total = hashlib.sha256(), 0
        while n := os.readv(fd, [buffer]):
            digest.update(view[:n])  # hashlib lets go of the GIL for large updates
            total += n
        return total == size and digest.hexdigest() == sha256
    except OSError:
        return False
    finally:
        os.close(fd)


class HashWorker:
    def __init__(self, process: subprocess.Popen) -> None:
        self._process = process
        self._lock = threading.Lock()  # one request at a time

    @classmethod
    def start(cls) -> "HashWorker | None":
        """The worker, starting (None where no process can be started)."""
        try:
            process = subprocess.Popen(
                [sys.executable, "-I", "-S", os.path.abspath(__file__)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                text=True, close_fds=True)
        except OSError:
            return None
        return cls(process)

    def check(self, blobs: Sequence[BlobToCheck]) -> list[int] | None:
        """Indices of the blobs that are missing, of another size or corrupt; None if the
        worker could not answer (the caller checks them itself)."""
        stdin, stdout = self._process.stdin, self._process.stdout
        if stdin is None or stdout is None:
            return None
        with self._lock:
            try:
                stdin.write(json.dumps(blobs) + "\n")
                stdin.flush()
                answer = stdout.readline()
            except (OSError, ValueError):  # a broken pipe, or closed
                return None
        try:
            bad = json.loads(answer)
        except ValueError:  # it died before answering
            return None
        return bad if isinstance(bad, list) else None

    def close(self) -> None:
        if self._process.stdin is not None:
            try:
                self._process.stdin.close()
            except OSError:
                pass
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        if self._process.stdout is not None:
            self._process.stdout.close()


def _serve(requests: IO[str], answers: IO[str]) -> None:
    buffer = bytearray(BUFFER_SIZE)
    for line in requests:
        blobs = json.loads(line)
        bad = [index for index, (path, sha256, size) in enumerate(blobs)
               if not blob_is_sound(path, sha256, size, buffer)]
        answers.write(json.dumps(bad) + "\n")
        answers.flush()


if __name__ == "__main__":
    _serve(sys.stdin, sys.stdout)
