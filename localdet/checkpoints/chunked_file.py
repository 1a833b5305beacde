"""A file stored as chunks, read where its chunks lie: a read-only, seekable binary file that
is never joined on disk.

    with ChunkedFile(store.blob_path, entry, "determined-keras-model.h5") as f:
        h5 = h5py.File(f, "r")       # h5py reads through `readinto`, straight from the chunks

A restore that loads a 70 MB `.h5` this way skips writing 70 MB and reading it back (a
restore's main cost past the load itself). Nothing here checks hashes: the caller verifies
the chunks (`Store.verify`, beside the load) and holds the checkpoint's reading lease until
it is done reading, so the collector deletes none of them meanwhile.
"""
from __future__ import annotations

import bisect
import io
import os
from pathlib import Path
from typing import Callable

from localdet.checkpoints.errors import MissingBlobError
from localdet.checkpoints.file_entry import FileEntry


class ChunkedFile(io.RawIOBase):
    """The bytes of `entry` (a chunked `FileEntry`), read through `blob_path(sha256)`.
    A chunk that is missing raises MissingBlobError; one shorter than the manifest says
    raises OSError (the hash check then names the file corrupt)."""

    def __init__(self, blob_path: Callable[[str], Path], entry: FileEntry, name: str) -> None:
        super().__init__()
        self.name = name
        self._paths = [blob_path(sha256) for sha256, _ in entry.blobs]
        self._starts: list[int] = []
        end = 0
        for _, size in entry.blobs:
            self._starts.append(end)
            end += size
        self._sizes = [size for _, size in entry.blobs]
        self._size, self._position = end, 0
        self._open_index, self._open_fd = -1, -1  # the last chunk read, kept open

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._position = base + offset
        return self._position

    def tell(self) -> int:
        return self._position

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        """Fill `buffer` from the current position (less only at the end of the file)."""
        view = memoryview(buffer).cast("B")
        wanted = max(0, min(len(view), self._size - self._position))
        done = 0
        index = bisect.bisect_right(self._starts, self._position) - 1
        while done < wanted:
            within = self._position - self._starts[index]
            take = min(wanted - done, self._sizes[index] - within)
            got = os.preadv(self._fd(index), [view[done:done + take]], within)
            if got == 0:
                raise OSError(f"chunk {self._paths[index].name} of {self.name} is shorter than "
                              "its checkpoint's manifest says")
            done += got
            self._position += got
            if got == take:
                index += 1
        return done

    def _fd(self, index: int) -> int:
        if index != self._open_index:
            self._close_fd()
            try:
                self._open_fd = os.open(self._paths[index], os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                sha256 = self._paths[index].name
                raise MissingBlobError(sha256, self._paths[index], self.name) from None
            self._open_index = index
        return self._open_fd

    def _close_fd(self) -> None:
        if self._open_fd >= 0:
            os.close(self._open_fd)
        self._open_index, self._open_fd = -1, -1

    def close(self) -> None:
        self._close_fd()
        super().close()
