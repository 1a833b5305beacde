"""How readers, writers and the collector of an S3 checkpoint store (`S3Store`) keep out of
each other's way without locks: S3 has no flock, but it has strong read-after-write and
list-after-write consistency. Each side puts a mark of its own (an empty object) *before*
listing the other side's marks, so of two that start together at least one sees the other.

- Readers and the collector, per checkpoint. A reader puts ``leases/<uuid>/r-<random>`` and
  waits while the checkpoint has a collector's mark; the collector puts
  ``leases/<uuid>/c-<random>`` and skips the checkpoint while it has a reader's: a
  checkpoint is never marked DELETED while a reader that found it live is reading it.
- Writers and the collector, per store (what the local store's writers lock does). A writer
  keeps ``writing/<random>`` from its first blob to its commit and waits while a collector's
  ``sweeping/<random>`` is there; a collector keeps ``sweeping/<random>`` while it deletes
  blobs, and defers deleting while a writer's mark is there. So a blob a writer uploaded or
  reused is not deleted before its manifest names it, wherever the writer is killed.
- A crashed process's marks go stale: a reader's after `STALE_READER_SECONDS`, a
  collector's on a checkpoint after `STALE_COLLECTOR_SECONDS`, and a writer's or a sweeping
  collector's after `MARK_SECONDS`, since a live one puts its mark again every third of that
  (and a collector deletes nothing once its mark may have gone stale).

Ages are judged on the server's clock (`LastModified` against the Date of the same listing).
Beside the marks, the collector never deletes an object younger than the store's grace
period, and a writer refreshes a blob it reuses (copying it onto itself) and, leaving
`writing()` after its commit, uploads again any reused blob that went missing.
"""
from __future__ import annotations

import secrets
import threading
import time
from typing import Any, Callable

# An S3Store, named loosely: s3_store imports this module, and this one reaches into it.
S3Store = Any

STALE_READER_SECONDS = 24 * 3600  # a reader lease this old was left by a crashed reader
STALE_COLLECTOR_SECONDS = 300     # a collector marks a checkpoint only inside one transaction
MARK_SECONDS = 60.0  # a writing or sweeping mark not put again for this long: a crashed one


class S3Lease:
    """A lease object; `release()` (or leaving its `with` block) deletes it. Same surface as
    `localdet.checkpoints.store.Lease`; `release(remove=True)` also deletes every lease of the
    checkpoint, for one no one can read any more."""

    def __init__(self, store: S3Store, key: str | None, uuid: str = "") -> None:
        self._store, self._key, self._uuid, self._held = store, key, uuid, True

    @property
    def held(self) -> bool:
        return self._held

    def release(self, *, remove: bool = False) -> None:
        if not self._held:
            return
        self._held = False
        if remove and self._uuid:
            for key in self._store._list_keys(self._store._lease_prefix(self._uuid)):
                self._store._delete(key)
        elif self._key is not None:
            self._store._delete(self._key)

    def __enter__(self) -> S3Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class KeptMark(S3Lease):
    """A mark under ``<prefix><kind>/`` that a thread puts again every third of
    `MARK_SECONDS` until it is released, so that it goes stale only if its process dies."""

    def __init__(self, store: S3Store, kind: str) -> None:
        self.period = MARK_SECONDS
        super().__init__(store, f"{store.prefix}{kind}/{secrets.token_hex(8)}")
        self._put()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep, name="localdet-s3-mark",
                                        daemon=True)
        self._thread.start()

    def _put(self) -> None:
        before = time.monotonic()
        self._store._call("hold", "put_object", Key=self._key, Body=b"")
        self._put_at = before

    def _keep(self) -> None:
        while not self._stop.wait(self.period / 3):
            try:
                self._put()
            except Exception:  # `fresh` turns False: the collector then stops deleting
                pass

    @property
    def fresh(self) -> bool:
        """Whether every other process still takes the mark for a live one (with a margin)."""
        return time.monotonic() - self._put_at < self.period / 2

    def release(self, *, remove: bool = False) -> None:
        if self._held:
            self._stop.set()
            self._thread.join()  # no put after the delete
        super().release(remove=remove)


class WriteSession(KeptMark):
    """`S3Store.writing()`: the writer's mark; on a clean exit (the manifest committed), also
    checks the blobs the session reused and uploads any that went missing meanwhile."""

    def __init__(self, store: S3Store) -> None:
        super().__init__(store, "writing")
        self.thread = threading.get_ident()
        self.reused: dict[str, Callable[[], None]] = {}  # sha256 -> uploads it again

    def __exit__(self, exc_type: object = None, *exc: object) -> None:
        try:
            if exc_type is None:
                store = self._store

                def check(item: tuple[str, Callable[[], None]]) -> None:
                    if store._head(item[0]) is None:
                        item[1]()

                for _ in store._each(check, self.reused.items()):
                    pass
        finally:
            self.release()

    def release(self, *, remove: bool = False) -> None:
        if self._store._sessions.get(self.thread) is self:
            del self._store._sessions[self.thread]
        super().release(remove=remove)


class SweepLease(KeptMark):
    """`S3Store.try_sweeping()`: the collector's mark while it deletes blobs; the store
    deletes none once the mark may have gone stale (`fresh` False)."""

    def __init__(self, store: S3Store) -> None:
        super().__init__(store, "sweeping")
        self.thread = threading.get_ident()

    def release(self, *, remove: bool = False) -> None:
        if self._store._sweeps.get(self.thread) is self:
            del self._store._sweeps[self.thread]
        super().release(remove=remove)


def _fresh_marks(store: S3Store, prefix: str, stale_after: float) -> list[str]:
    return [item["Key"] for item, now in store._list(prefix)
            if now - item["LastModified"].timestamp() < stale_after]


def _mark(store: S3Store, uuid: str, kind: str) -> str:
    key = f"{store._lease_prefix(uuid)}{kind}-{secrets.token_hex(8)}"
    store._call("hold", "put_object", Key=key, Body=b"")
    return key


def reading(store: S3Store, uuid: str) -> S3Lease:
    lease = S3Lease(store, _mark(store, uuid, "r"))
    try:
        while _fresh_marks(store, f"{store._lease_prefix(uuid)}c-", STALE_COLLECTOR_SECONDS):
            time.sleep(0.05)  # a collector is deciding about this checkpoint
    except BaseException:
        lease.release()
        raise
    return lease


def try_exclusive(store: S3Store, uuid: str) -> S3Lease | None:
    lease = S3Lease(store, _mark(store, uuid, "c"), uuid)
    if _fresh_marks(store, f"{store._lease_prefix(uuid)}r-", STALE_READER_SECONDS):
        lease.release()
        return None
    return lease


def writing(store: S3Store) -> WriteSession:
    session = WriteSession(store)
    try:
        while _fresh_marks(store, f"{store.prefix}sweeping/", MARK_SECONDS):
            time.sleep(0.05)  # a collector is deleting blobs
    except BaseException:
        session.release()
        raise
    store._sessions[session.thread] = session
    return session


def try_sweeping(store: S3Store) -> SweepLease | None:
    lease = SweepLease(store)
    try:
        fresh, stale = False, []
        for item, now in store._list(f"{store.prefix}writing/"):
            if now - item["LastModified"].timestamp() < MARK_SECONDS:
                fresh = True
            else:
                stale.append(item["Key"])
        if fresh:
            lease.release()
            return None
        for key in stale:  # left by writers that crashed
            store._delete(key)
    except BaseException:
        lease.release()
        raise
    store._sweeps[lease.thread] = lease
    return lease
