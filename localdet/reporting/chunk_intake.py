"""The daemon's side of chunked checkpoint uploads: blobs a remote trial sends in batches,
each checked against its name on arrival, and a commit's file list checked against the store.

    listing = parse_listing(header, content_length)   # [(sha256, size), ...] of the body
    bad = receive(store, listing, body)               # stored those that hash right
    files = stored_files(store, payload["files"])     # FileEntry each, or refused

A commit names each file as ``[sha256, size]`` (one blob: a file of one chunk, or one sent
whole by a trial from before chunked uploads) or ``[sha256, size, [[chunk, size], ...]]``.
It is refused while any blob it names is missing (`Missing`: the trial uploads them and
commits again) or has another size than the commit says (`Refused`: a damaged store or a
confused trial, never committed). The caller holds the store's writing lease across
`stored_files` and the commit, so nothing checked present can be collected before the
manifest names it; uploaded blobs that no commit ever names are unreferenced, and `gc`
collects them like any other.
"""

from __future__ import annotations

import hashlib
import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterable, Mapping

from localdet.checkpoints.chunking import NewBlobs
from localdet.checkpoints.store import FileEntry, Store

MAX_CHUNK_BYTES = 64 << 20   # far above the chunker's largest (512 KiB): a bound on memory
IN_FLIGHT = 8                # requests to a remote store (S3) at once
_SHA256 = re.compile(r"[0-9a-f]{64}")


class Refused(ValueError):
    """An upload or commit the daemon will not take; one sentence for the trial's log."""


class Missing(Exception):
    """Blobs a commit names that the store lacks (sorted, each once)."""

    def __init__(self, hashes: Iterable[str]):
        self.hashes = sorted(set(hashes))
        super().__init__(f"{len(self.hashes)} checkpoint chunk(s) are not in the store; "
                         "upload them first")


def _sha256(value: Any) -> str:
    if not isinstance(value, str) or not _SHA256.fullmatch(value):
        raise Refused(f"{value!r} is not a sha256 digest (64 lowercase hex digits)")
    return value


def _size(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise Refused(f"{value!r} is not a size in bytes")
    return value


def parse_listing(header: str, length: int) -> list[tuple[str, int]]:
    """The chunk list of an upload (its header's JSON ``[[sha256, size], ...]``), checked
    against the body's length."""
    try:
        items = json.loads(header)
        listing = [(_sha256(sha256), _size(size)) for sha256, size in items]
    except (ValueError, TypeError):
        raise Refused("a chunk upload must name its chunks as a JSON list of [sha256, size] "
                      "in its X-Localdet-Chunks header") from None
    if sum(size for _, size in listing) != length:
        raise Refused(f"the chunks named add up to {sum(s for _, s in listing)} bytes, but "
                      f"the upload holds {length}")
    for sha256, size in listing:
        if size > MAX_CHUNK_BYTES:
            raise Refused(f"chunk {sha256} is {size} bytes; chunks are at most "
                          f"{MAX_CHUNK_BYTES} bytes")
    return listing


def _read_exactly(body: Any, size: int) -> bytearray:
    data = bytearray(size)
    view, got = memoryview(data), 0
    while got < size:
        n = body.readinto(view[got:])
        if not n:
            raise ConnectionError("the upload ended early")
        got += n
    return data


def receive(store: Any, listing: list[tuple[str, int]], body: Any) -> list[str]:
    """Read each listed chunk from `body` and store those whose bytes hash to their name;
    returns the names of those that did not (to be sent again). Durable on return, with
    one file-system flush for the whole batch on a local store."""
    bad: list[str] = []
    good: list[tuple[str, bytearray]] = []
    for sha256, size in listing:
        data = _read_exactly(body, size)
        if hashlib.sha256(data).hexdigest() != sha256:
            bad.append(sha256)
        else:
            good.append((sha256, data))
    if isinstance(store, Store):
        new = NewBlobs(store.root, store.tmp, store.blob_path)
        try:
            for sha256, data in good:
                new.add(sha256, memoryview(data))
            new.settle()
        except BaseException:
            new.discard()
            raise
    else:  # a remote store (s3): each chunk one object, a few requests at once
        with ThreadPoolExecutor(IN_FLIGHT, thread_name_prefix="chunk-intake") as pool:
            for _ in pool.map(lambda item: store.put_bytes(bytes(item[1])), good):
                pass
    return bad


def stored_sizes(store: Any, hashes: Iterable[str]) -> dict[str, int | None]:
    """``{sha256: its stored size}`` (None: missing; -1: present, size not known cheaply,
    as on s3)."""
    hashes = [_sha256(sha256) for sha256 in dict.fromkeys(hashes)]
    if isinstance(store, Store):
        found: dict[str, int | None] = {}
        for sha256 in hashes:
            try:
                found[sha256] = store.blob_path(sha256).stat().st_size
            except FileNotFoundError:
                found[sha256] = None
        return found
    with ThreadPoolExecutor(IN_FLIGHT, thread_name_prefix="chunk-intake") as pool:
        present = list(pool.map(store.has, hashes))
    return {sha256: -1 if there else None for sha256, there in zip(hashes, present, strict=True)}


def missing(store: Any, hashes: Iterable[str]) -> list[str]:
    """Those of `hashes` the store lacks, in the order asked."""
    return [sha256 for sha256, size in stored_sizes(store, hashes).items() if size is None]


def stored_files(store: Any, files: Any) -> dict[str, FileEntry]:
    """A commit's files as `FileEntry`s, once every blob they name is in the store at the
    size named (raises `Missing`, or `Refused` for a wrong size or a malformed entry). A
    whole file's size is the stored one, as before chunked uploads."""
    if not isinstance(files, Mapping):
        raise Refused("a checkpoint commit must list its files as {name: [sha256, size]}")
    parsed: dict[str, tuple[str, int, tuple[tuple[str, int], ...]]] = {}
    for name, entry in files.items():
        try:
            sha256, size, *rest = entry
            chunks = tuple((_sha256(c), _size(s)) for c, s in (rest[0] if rest else ()))
            parsed[name] = (_sha256(sha256), _size(size), chunks)
        except (ValueError, TypeError) as error:
            raise Refused(f"checkpoint file {name!r} is listed as {entry!r}, not as "
                          f"[sha256, size] or [sha256, size, chunks] ({error})") from None
    sizes = stored_sizes(store, [blob for sha256, _, chunks in parsed.values()
                                 for blob, _ in (chunks or ((sha256, 0),))])
    lacking = [sha256 for sha256, size in sizes.items() if size is None]
    if lacking:
        raise Missing(lacking)
    result: dict[str, FileEntry] = {}
    for name, (sha256, size, chunks) in parsed.items():
        for chunk, told in chunks:
            stored = sizes[chunk]
            if stored is not None and stored >= 0 and stored != told:
                raise Refused(f"chunk {chunk} of checkpoint file {name!r} is {stored} bytes "
                              f"in the store, not {told}; run `localdet doctor` to check "
                              "the store")
        if not chunks:
            stored = sizes[sha256]
            size = stored if stored is not None and stored >= 0 else size
        result[name] = FileEntry(sha256, size, chunks)
    return result
