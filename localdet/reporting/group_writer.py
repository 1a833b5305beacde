"""The report server's writes to SQLite: one thread commits them in groups.

Writes go through one thread (`GroupWriter`): the requests queue their work, the
writer runs everything queued in one transaction (each request in a savepoint of its own)
and commits, and only then are the requests answered. One connection writes instead of one
per trial connection, so hundreds of trials do not take turns at SQLite's write lock (and
sleep in its busy handler while it sits free); a report is still acknowledged only once it
is committed. `WriteTurns` lets this writer and the daemon's own connection alternate.
"""

from __future__ import annotations

import asyncio
import collections
import sqlite3
import threading
import traceback
from typing import Any, Callable

from localdet.records.db import StateDB


class WriteTurns:
    """Lets the write transactions of one process's connections to one database take turns,
    in the order they asked (re-entrant for the thread holding it); `StateDB.turns`.

    SQLite's lock alone serves threads badly: one that finds it taken sleeps in the busy
    handler (1, 2, 5 ... 100 ms a try) while the lock may sit free, and the thread that
    just committed can take it again at once. The daemon's loop lost most of its time that
    way to the report server's writer. Waiting here, the next writer is woken the moment the
    holder lets go. Other processes still meet at SQLite's lock. After `seconds` (SQLite's
    busy timeout) a waiter gives up as SQLite would: "database is locked"."""

    def __init__(self, seconds: float = 30.0):
        self.seconds = seconds
        self._changed = threading.Condition(threading.Lock())
        self._owner: int | None = None
        self._depth = 0
        self._asked: collections.deque = collections.deque()

    def __enter__(self) -> "WriteTurns":
        me = threading.get_ident()
        with self._changed:
            if self._owner == me:
                self._depth += 1
                return self
            self._asked.append(me)
            try:
                if not self._changed.wait_for(
                        lambda: self._owner is None and self._asked[0] == me, self.seconds):
                    raise sqlite3.OperationalError(
                        f"database is locked (another writer of this process held it for "
                        f"{self.seconds:g} s)")
            finally:
                self._asked.remove(me)
                self._changed.notify_all()  # the next in line may be free to go now
            self._owner, self._depth = me, 1
        return self

    def __exit__(self, *exc_info) -> None:
        with self._changed:
            self._depth -= 1
            if self._depth == 0:
                self._owner = None
                self._changed.notify_all()


class GroupWriter:
    """The report server's only SQLite writer: a thread that commits queued work in groups.

        writer = GroupWriter(layout.db).start()
        writer.run(lambda db: db.record_metrics(7, "training", 100, {"loss": 0.3}))

    `run(work)` queues `work(db)` (db: the writer's own StateDB) and returns its result once
    the transaction it ran in has committed, or raises its error. Everything queued while
    the writer was busy runs in the next transaction, each piece in a savepoint of its own:
    an error rolls back that piece only and is raised to its caller only; the others commit.
    A failed BEGIN or COMMIT (a database busy past its timeout, a full disk) is raised to
    every caller of the group, none of which was acknowledged, and each retries.
    `run(work, write=False)`: work that only reads (or writes in a transaction of its own,
    StateDB.atomic) runs before the group's transaction, outside it."""

    MAX_GROUP = 512  # a bound on one transaction's length, not a target

    def __init__(self, path, log: Callable[[str], None] = print,
                 turns: WriteTurns | None = None):
        self.path, self.log = path, log
        # Shared with the daemon's connection (Daemon.run): its transactions and ours alternate.
        self.turns = turns or WriteTurns()
        self._queue: collections.deque = collections.deque()
        self._ready = threading.Condition()
        self._closed = False
        self._opened = threading.Event()
        self._open_error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name="report-writer", daemon=True)
        # For benchmarks: transactions committed, the writes in them, the reads done.
        self.groups = self.pieces = self.reads = 0

    def start(self) -> "GroupWriter":
        self._thread.start()
        self._opened.wait()
        if self._open_error is not None:
            raise self._open_error
        return self

    def close(self) -> None:
        """Commit what is queued, then stop; work queued after this is refused (503: the
        trial retries, and finds the next daemon)."""
        with self._ready:
            self._closed = True
            self._ready.notify()
        self._thread.join()

    def run(self, work: Callable[[StateDB], Any], write: bool = True) -> Any:
        piece = _Piece(work, write)
        self._queue_piece(piece)
        piece.done.wait()
        return piece.outcome()

    async def run_async(self, work: Callable[[StateDB], Any], write: bool = True) -> Any:
        """`run`, awaited on an event loop (the report server's): no thread waits."""
        loop = asyncio.get_running_loop()
        settled = loop.create_future()

        def settle() -> None:
            if not settled.done():
                settled.set_result(None)

        def wake() -> None:  # in the writer's thread
            try:
                loop.call_soon_threadsafe(settle)
            except RuntimeError:
                pass  # the loop has closed: nobody waits for the answer

        piece = _Piece(work, write, wake)
        self._queue_piece(piece)
        await settled
        return piece.outcome()

    def _queue_piece(self, piece: "_Piece") -> None:
        with self._ready:
            if self._closed:
                raise sqlite3.OperationalError("the daemon's report server is stopping")
            self._queue.append(piece)
            self._ready.notify()

    def _serve(self) -> None:
        try:
            db = StateDB.open(self.path)  # SQLite connections stay in their thread
            db.turns = self.turns  # for a transaction of a piece's own (write=False)
        except BaseException as error:
            self._open_error = error
            self._opened.set()
            return
        self._opened.set()
        try:
            while True:
                with self._ready:
                    while not self._queue and not self._closed:
                        self._ready.wait()
                    if not self._queue:
                        return  # closed, and nothing left
                    group = [self._queue.popleft()
                             for _ in range(min(len(self._queue), self.MAX_GROUP))]
                try:
                    self._commit(db, group)
                except BaseException as error:  # a bug here must not leave callers waiting
                    self.log("report server: the writer failed:\n" + traceback.format_exc())
                    for piece in group:
                        piece.fail(error)
        finally:
            db.close()

    def _commit(self, db: StateDB, group: list["_Piece"]) -> None:
        # Reads first, answered at once: they were sent beside the writes, unanswered, so
        # either order is one the trials could have seen.
        for piece in group:
            if not piece.write:
                self._read(db, piece)
        pending = [piece for piece in group if piece.write]
        while pending:
            with self.turns:
                pending = self._transaction(db, pending)

    def _read(self, db: StateDB, piece: "_Piece") -> None:
        """Work that only reads: outside any transaction (no write lock, no turn)."""
        conn = db.db.conn
        try:
            piece.result = piece.work(db)
            if conn.in_transaction:  # it wrote after all: answered once that is committed
                conn.commit()
        except BaseException as error:
            if conn.in_transaction:
                conn.rollback()
            piece.fail(error)
            return
        self.reads += 1
        piece.finish()

    def _transaction(self, db: StateDB, pending: list["_Piece"]) -> list["_Piece"]:
        """Run and commit what it can of `pending` in one transaction; returns the pieces
        left to run again."""
        conn = db.db.conn
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as error:
            for piece in pending:
                piece.fail(error)
            return []
        ran: list[_Piece] = []
        rest: list[_Piece] = []
        for index, piece in enumerate(pending):
            conn.execute("SAVEPOINT report_piece")
            try:
                piece.result = piece.work(db)
            except BaseException as error:
                if conn.in_transaction:
                    conn.execute("ROLLBACK TO report_piece")
                    conn.execute("RELEASE report_piece")
                    piece.fail(error)
                    continue
                # The error ended the whole transaction (SQLite does so for some, a full
                # disk among them): the pieces before it were undone too, and run again.
                piece.fail(error)
                rest = ran + pending[index + 1:]
                ran = []
                break
            if not conn.in_transaction:  # the work committed by itself: so be it
                ran.append(piece)
                for done in ran:
                    done.finish()
                ran, rest = [], pending[index + 1:]
                break
            conn.execute("RELEASE report_piece")
            ran.append(piece)
        if conn.in_transaction:
            try:
                conn.commit()
            except sqlite3.Error as error:
                conn.rollback()
                for piece in ran:
                    piece.fail(error)
                ran = []
        for piece in ran:
            piece.finish()
        if ran:
            self.groups += 1
            self.pieces += len(ran)
        return rest


class _Piece:
    """One request's work for the writer, and how it went."""

    __slots__ = ("work", "write", "result", "error", "done", "wake")
    error: BaseException | None

    def __init__(self, work: Callable[[StateDB], Any], write: bool = True,
                 wake: Callable[[], None] | None = None):
        self.work, self.write, self.result, self.error = work, write, None, None
        self.done = threading.Event()
        self.wake = wake  # tells an awaiting event loop (run_async)

    def finish(self) -> None:
        self.done.set()
        if self.wake is not None:
            self.wake()

    def fail(self, error: BaseException) -> None:
        self.result, self.error = None, error
        self.finish()

    def outcome(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.result
