"""A log file that never grows past its cap: past it, the file keeps its head and its most
recent lines, with one line between them saying how much was dropped.

    log = CappedLog(path, max_bytes=100_000_000)
    log.write(b"epoch 1 ...\\n")                 # the daemon's own log, in process
    python -m localdet.processes.capped_log PATH MAX_BYTES   # a trial's log writer:
                                                 # its output on stdin

    data, offset = read_from(path, offset)       # `localdet logs -f`: what came since offset

Readers address the log by stream offsets (the count of bytes the writer was ever given),
which stay valid when the middle is dropped; a follower that fell behind into the dropped
part gets the line saying so, then the tail. Once capped, the file is rewritten whole (a new
inode, renamed over the old) each time it reaches the cap again, down to half of it: its
first quarter and its last quarter; `PATH.capped` records the head's length.

A write the disk has no room for is dropped, not raised: a trial must not die, or block,
because its log cannot grow. The next write that fits says how much was lost.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import sys
import time
from pathlib import Path

MARKER_WIDTH = 16  # digits of the dropped count: the marker line has one length forever
_MARKER = ("[localdet] {dropped:>%d} bytes of this log were dropped here to keep it under "
           "its cap (localdet daemon --max-log-bytes)\n" % MARKER_WIDTH)
MARKER_LENGTH = len(_MARKER.format(dropped=0).encode())
_DROPPED = re.compile(rb"^\[localdet\] +(\d+) bytes of this log were dropped here")
DEFAULT_MAX_BYTES = 100_000_000  # 100 MB
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def marker(dropped: int) -> bytes:
    return _MARKER.format(dropped=dropped).encode()


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".capped")


def _head_length(path: Path) -> int | None:
    try:
        return int(json.loads(_sidecar(path).read_text())["head_bytes"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _layout(path: Path, fd: int) -> tuple[int, int] | None:
    """(head length, bytes dropped) of a capped log open at `fd`; None when it is whole."""
    head = _head_length(path)
    if head is None:
        return None
    match = _DROPPED.match(os.pread(fd, MARKER_LENGTH, head))
    # A sidecar beside a file not yet renamed over (or a stranger's): read it as whole.
    return (head, int(match.group(1))) if match else None


class _View:
    """One open version of the log, and its mapping between file and stream offsets."""

    def __init__(self, path: Path, fd: int):
        self.fd = fd
        self.size = os.fstat(fd).st_size
        self.layout = _layout(path, fd)

    def stream_offset(self, position: int) -> int:
        if self.layout is None:
            return position
        head, dropped = self.layout
        if position <= head:
            return position
        return head + dropped + max(0, position - head - MARKER_LENGTH)

    @property
    def stream_size(self) -> int:
        return self.stream_offset(self.size)

    def position(self, offset: int) -> tuple[int, bool]:
        """The file position of a stream offset, and whether the offset was dropped (the
        position is then the marker's)."""
        if self.layout is None:
            return min(offset, self.size), False
        head, dropped = self.layout
        if offset < head:
            return offset, False
        if offset < head + dropped:
            return head, True
        return head + MARKER_LENGTH + offset - head - dropped, False


def read_from(path: Path, offset: int, limit: int | None = None) -> tuple[bytes, int]:
    """What the log holds from stream offset `offset` (at most `limit` bytes), and the
    offset after it. Past a drop, the marker line is included once."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return b"", offset
    try:
        view = _View(path, fd)
        start, _ = view.position(offset)
        length = view.size - start if limit is None else min(limit, view.size - start)
        data = os.pread(fd, max(0, length), start)
        return data, view.stream_offset(start + len(data))
    finally:
        os.close(fd)


def stream_size(path: Path) -> int:
    """How many bytes were ever written to the log (0 if it does not exist)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return 0
    try:
        return _View(path, fd).stream_size
    finally:
        os.close(fd)


def file_position(path: Path, offset: int) -> int:
    """Where stream offset `offset` is in the file now (the marker's position if dropped)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return 0
    try:
        return _View(path, fd).position(offset)[0]
    finally:
        os.close(fd)


def wait_for_writer(path: Path, seconds: float = 5.0) -> bool:
    """Wait until no writer holds the log, so everything its trial printed is in it; False
    if one still does after `seconds` (a process the trial left behind keeps its pipe)."""
    lock = path.with_name(path.name + ".lock")
    if not lock.exists():
        return True
    deadline = time.monotonic() + seconds
    with open(lock, "a") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
                fcntl.flock(handle, fcntl.LOCK_UN)
                return True
            except BlockingIOError:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.01)


class CappedLog:
    """Appends to `path`, keeping it under `max_bytes` (see the module docstring). One
    writer at a time: a second one waits (up to `wait_seconds`) for the first to finish,
    since two would each rewrite the file under the other."""

    def __init__(self, path: Path, max_bytes: int = DEFAULT_MAX_BYTES,
                 wait_seconds: float = 10.0):
        if max_bytes < 4 * MARKER_LENGTH:
            raise ValueError(f"a log cap of {max_bytes} bytes is too small; give at least "
                             f"{4 * MARKER_LENGTH} bytes")
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = open(self.path.with_name(self.path.name + ".lock"), "a")
        deadline = time.monotonic() + wait_seconds
        while True:
            try:
                fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    break  # a writer stuck behind an orphaned process: go on without it
                time.sleep(0.02)
        self._open()
        self.lost = 0  # bytes the disk had no room for, not yet told

    def _open(self) -> None:
        self.fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        self.view = _View(self.path, self.fd)

    def write(self, data: bytes) -> None:
        if self.lost:
            note = f"[localdet] {self.lost} bytes of output lost: the disk was full\n".encode()
            if not self._append(note):
                self.lost += len(data)
                return
            self.lost = 0
        # Room is made before a piece is appended, so that no reader ever sees the file
        # past its cap; pieces of a quarter of the cap always fit once the middle is gone.
        quarter = self.max_bytes // 4
        for start in range(0, len(data), quarter):
            piece = data[start:start + quarter]
            if self.view.size + len(piece) > self.max_bytes:
                try:
                    self._compact()
                except OSError as error:  # no room for the rewrite: keep the file for now
                    if error.errno not in _NO_ROOM:
                        raise
            if not self._append(piece):
                self.lost += len(data) - start
                return

    def _append(self, data: bytes) -> bool:
        try:
            written = os.write(self.fd, data)
            while written < len(data):
                written += os.write(self.fd, data[written:])
        except OSError as error:
            if error.errno in _NO_ROOM:
                return False
            raise
        self.view.size += len(data)
        return True

    def _compact(self) -> None:
        view, quarter = self.view, self.max_bytes // 4
        reader = os.open(self.path, os.O_RDONLY)  # the fd we write is append-only
        try:
            if view.layout is None:  # the head: the first quarter, to its last whole line
                first = os.pread(reader, quarter, 0)
                head = first.rfind(b"\n") + 1 or len(first)
            else:
                head = view.layout[0]
            tail_start = max(view.size - quarter, head + (MARKER_LENGTH if view.layout else 0))
            window = os.pread(reader, min(view.size - tail_start, 65536), tail_start)
            newline = window.find(b"\n")
            if 0 <= newline < len(window) - 1:
                tail_start += newline + 1  # the tail begins at a line's start
            dropped = view.stream_offset(tail_start) - head
            temporary = self.path.with_name(self.path.name + ".compacting")
            with open(temporary, "wb") as out:
                _copy(reader, out, 0, head)
                out.write(marker(dropped))
                _copy(reader, out, tail_start, view.size - tail_start)
            if view.layout is None:  # before the rename: a reader then finds the marker
                _sidecar(self.path).write_text(json.dumps({"head_bytes": head}))
            os.replace(temporary, self.path)
        finally:
            os.close(reader)
        os.close(self.fd)
        self._open()

    def close(self) -> None:
        os.close(self.fd)
        self._lock.close()


def _copy(fd: int, out, start: int, length: int) -> None:
    while length > 0:
        chunk = os.pread(fd, min(length, 1 << 20), start)
        if not chunk:
            return
        out.write(chunk)
        start += len(chunk)
        length -= len(chunk)


def main(argv: list[str]) -> int:
    """Copy standard input into the capped log until every writer of the pipe is gone."""
    log = CappedLog(Path(argv[0]), int(argv[1]))
    try:
        while True:
            try:
                data = os.read(0, 1 << 16)
            except InterruptedError:
                continue
            if not data:
                return 0
            log.write(data)
    finally:
        log.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
