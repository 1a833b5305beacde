"""The transport under DistributedContext's collectives: a trial's processes joined through
the chief (rank 0).

    group = ProcessGroup(rank, size, ("127.0.0.1", port), authkey)
    group.allgather("allgather", x)   # every rank: [rank 0's x, rank 1's x, ...]
    group.gather("gather", x)         # rank 0: that list; the other ranks: None
    group.broadcast("broadcast", x)   # every rank: rank 0's x
    group.allreduce_mean("grads", [a, b])  # every rank: [mean of the ranks' a, ... of b]
    group.close()

On its first collective rank 0 listens at the address and every other rank connects to it
(retrying while rank 0 is still starting) and says which rank it is. The connections are
`multiprocessing.connection` ones over TCP: both ends prove they hold the trial's key (an
HMAC challenge) before anything is unpickled; then objects travel pickled.

Each collective is one round through the chief: every other rank sends (collective number,
name, object); the chief checks that all ranks are at the same collective, then answers
(allgather: the list; broadcast: its object; gather: nothing, so the other ranks go on at
once; allreduce_mean: the mean of the ranks' arrays, computed by the chief alone, so every
rank gets the same bits and receives one set of arrays, not one per rank). So every rank
must call the same collectives in the same order. A rank that goes away, calls a different
collective, or is silent past the timeout fails the round on every rank with an error naming
it, and the group stays failed: the others never wait forever.
"""

from __future__ import annotations

import atexit
import os
import socket
import struct
import time
import weakref
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge, wait
from multiprocessing.reduction import ForkingPickler
from typing import Any, Dict, List, Optional, Sequence, Tuple, Type, cast

# Module constants rather than arguments so that tests can shorten them.
CONNECT_TIMEOUT_S = 600.0      # ranks reach their first collective minutes apart (imports, data)
COLLECTIVE_TIMEOUT_S = 1800.0  # a rank may validate or checkpoint while the others wait
HANDSHAKE_TIMEOUT_S = 10.0     # a genuine rank answers the key challenge at once
_RETRY_S = 0.05

Address = Tuple[str, int]

# Groups with connections open, closed at exit (weakly held: a dropped group closes with its
# connections' finalizers anyway).
_open_groups: "weakref.WeakSet[ProcessGroup]" = weakref.WeakSet()


@atexit.register
def _close_open_groups() -> None:
    for group in list(_open_groups):
        group.close()


class ProcessGroup:
    def __init__(self, rank: int, size: int, address: Address, authkey: bytes):
        if size < 2 or not 0 <= rank < size:
            raise ValueError(f"a process group needs size >= 2 and rank in [0, size), "
                             f"got rank {rank} of {size}")
        self.rank, self.size = rank, size
        self._address, self._authkey = address, authkey
        self._connections: Dict[int, Connection] = {}  # rank 0: every other rank's; else {0: ..}
        self._done = 0             # collectives finished; numbers them for the order check
        self._connected = False
        self._failure: Optional[str] = None
        self._pid = os.getpid()    # sockets inherited by a forked child are not its own

    def gather(self, name: str, obj: Any) -> Optional[List]:
        return self._round(name, obj, "gather")

    def allgather(self, name: str, obj: Any) -> List:
        return self._round(name, obj, "allgather")

    def broadcast(self, name: str, obj: Any) -> Any:
        return self._round(name, obj, "broadcast")

    def allreduce_mean(self, name: str, arrays: Sequence[Any]) -> List[Any]:
        """The element-wise mean over the ranks of each of `arrays` (NumPy arrays, the same
        shapes on every rank), in each array's dtype: summed in float64 (complex128 for
        complex) by the chief and divided by the size, so two ranks get the correctly rounded
        (a + b) / 2."""
        import numpy as np  # only the ranks that average arrays need it

        return self._round(name, [np.asarray(array) for array in arrays], "mean")

    def close(self) -> None:
        for connection in self._connections.values():
            connection.close()
        self._connections.clear()
        if self._failure is None:
            self._failure = "the distributed context was closed"
        _open_groups.discard(self)

    # -- one round --------------------------------------------------------------------------

    def _round(self, name: str, obj: Any, kind: str) -> Any:
        if self._failure is not None:
            raise RuntimeError(f"collectives can no longer run: {self._failure}")
        if os.getpid() != self._pid:
            raise RuntimeError(f"{name}() was called in process {os.getpid()}, a child of "
                               f"rank {self.rank}'s process {self._pid}; call collectives "
                               "in the trial's own processes only")
        number = self._done + 1
        what = f"{name} (collective #{number})"
        try:
            if not self._connected:
                self._accept_ranks(what) if self.rank == 0 else self._join_chief(what)
                self._connected = True
                _open_groups.add(self)
            if self.rank == 0:
                result = self._chief_round(name, number, what, obj, kind)
            else:
                result = self._worker_round(name, number, what, obj, kind)
        except BaseException as error:
            # Anything else (Ctrl-C, an unpicklable object) must not leave the other ranks
            # waiting either: tell them, close, and raise it as it is.
            if self._failure is None:
                self._fail(f"rank {self.rank} stopped in {what}: {type(error).__name__}: "
                           f"{error}")
            raise
        self._done = number
        return result

    def _chief_round(self, name: str, number: int, what: str, obj: Any, kind: str) -> Any:
        values: List[Any] = [obj] + [None] * (self.size - 1)
        pending = {connection: rank for rank, connection in self._connections.items()}
        deadline = time.monotonic() + COLLECTIVE_TIMEOUT_S
        while pending:
            ready = wait(list(pending), timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                raise self._fail(
                    f"rank 0 waited {COLLECTIVE_TIMEOUT_S:.0f} s in {what} for rank(s) "
                    f"{sorted(pending.values())}; every rank must call the same collectives "
                    "in the same order", TimeoutError)
            for connection in cast(List[Connection], ready):  # wait() gives what it was given
                rank = pending.pop(connection)
                try:
                    message = connection.recv()
                except (EOFError, OSError):
                    raise self._fail(_went_away(rank, self.size, what)) from None
                if message[0] == "error":  # that rank failed; its account says why
                    raise self._fail(message[1])
                their_number, their_name, value = message
                if (their_number, their_name) != (number, name):
                    raise self._fail(
                        f"the ranks called different collectives: rank 0 is at {what}, rank "
                        f"{rank} at {their_name} (collective #{their_number}); every rank "
                        "must call the same collectives in the same order")
                values[rank] = value
        if kind == "mean":
            values = _mean(values, what, self._fail)
        if kind != "gather":
            data = ForkingPickler.dumps(("ok", obj if kind == "broadcast" else values))
            for rank, connection in self._connections.items():
                try:
                    connection.send_bytes(data)
                except OSError:
                    raise self._fail(_went_away(rank, self.size, what)) from None
        return obj if kind == "broadcast" else values

    def _worker_round(self, name: str, number: int, what: str, obj: Any, kind: str) -> Any:
        chief = self._connections[0]
        if chief.poll(0):  # nothing is due now: the chief failed an earlier gather, or left
            self._receive(chief, what)
            raise self._fail(f"rank 0 sent an answer no collective asked for, at {what}")
        data = ForkingPickler.dumps((number, name, obj))
        try:
            chief.send_bytes(data)
        except OSError:
            raise self._fail(_went_away(0, self.size, what)) from None
        if kind == "gather":
            return None
        if not chief.poll(COLLECTIVE_TIMEOUT_S):
            raise self._fail(f"rank {self.rank} waited {COLLECTIVE_TIMEOUT_S:.0f} s in {what} "
                             "for the chief (rank 0); every rank must call the same "
                             "collectives in the same order", TimeoutError)
        return self._receive(chief, what)

    def _receive(self, chief: Connection, what: str) -> Any:
        try:
            status, payload = chief.recv()
        except (EOFError, OSError):
            raise self._fail(_went_away(0, self.size, what)) from None
        if status == "error":  # the chief's account of what failed, naming the rank
            raise self._fail(payload)
        return payload

    def _fail(self, message: str, error: Type[Exception] = RuntimeError) -> Exception:
        """Remember the failure, tell the other ranks (rank 0 tells all, the others tell
        rank 0, which tells the rest), close; returns the error to raise."""
        self._failure = message
        notice = ForkingPickler.dumps(("error", message))
        for connection in self._connections.values():
            try:
                connection.send_bytes(notice)
            except OSError:
                pass  # that end is gone already
        self.close()
        return error(message)

    # -- connecting -------------------------------------------------------------------------

    def _accept_ranks(self, what: str) -> None:
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        try:
            server = socket.create_server(self._address, backlog=max(16, self.size))
        except OSError as error:
            raise self._fail(f"rank 0 could not listen at {_text(self._address)} for the "
                             f"trial's other ranks: {error}") from None
        with server:  # closed once all ranks are in: no one joins later
            while len(self._connections) < self.size - 1:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    missing = [r for r in range(1, self.size) if r not in self._connections]
                    raise self._fail(
                        f"rank 0 waited {CONNECT_TIMEOUT_S:.0f} s at {_text(self._address)} "
                        f"for rank(s) {missing} to connect, in {what}; did they start, and "
                        "do they call the same collectives?", TimeoutError)
                server.settimeout(remaining)
                try:
                    sock, _ = server.accept()
                except TimeoutError:
                    continue
                self._admit(sock)

    def _admit(self, sock: socket.socket) -> None:
        try:
            connection = _authenticated(sock, self._authkey, chief=True,
                                        timeout=HANDSHAKE_TIMEOUT_S)
        except (AuthenticationError, EOFError, OSError):
            return  # a wrong key, or gone mid-handshake: not one of ours; wait for the others
        try:
            hello = connection.recv()
            _set_recv_timeout(connection, None)
        except (EOFError, OSError):
            connection.close()
            return
        if not (isinstance(hello, tuple) and len(hello) == 3 and hello[0] == "hello"):
            connection.close()
            return
        _, rank, size = hello
        problem = None
        if size != self.size:
            problem = (f"rank {rank} says the trial has {size} processes and rank 0 says "
                       f"{self.size}; every process needs the same LOCALDET_SIZE")
        elif not (isinstance(rank, int) and 1 <= rank < self.size):
            problem = f"a process says it is rank {rank!r} of {size}"
        elif rank in self._connections:
            problem = f"two processes say they are rank {rank}"
        if problem:
            try:
                connection.send(("error", problem))
            except OSError:
                pass
            connection.close()
            raise self._fail(problem)
        self._connections[rank] = connection

    def _join_chief(self, what: str) -> None:
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        where = _text(self._address)
        last_error: Optional[OSError] = None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._fail(
                    f"rank {self.rank} could not reach the chief (rank 0) at {where} within "
                    f"{CONNECT_TIMEOUT_S:.0f} s, in {what} ({last_error}); is rank 0 running, "
                    "and does it call the same collectives?", TimeoutError)
            try:
                sock = socket.create_connection(self._address, timeout=min(remaining, 5.0))
                break
            except OSError as error:  # not listening yet: rank 0 starts at its own pace
                last_error = error
                time.sleep(min(_RETRY_S, remaining))
        try:
            # Rank 0 answers once it reaches its first collective: wait as long as for a
            # connection.
            connection = _authenticated(sock, self._authkey, chief=False,
                                        timeout=max(HANDSHAKE_TIMEOUT_S, remaining))
            connection.send(("hello", self.rank, self.size))
            _set_recv_timeout(connection, None)
        except AuthenticationError:
            raise self._fail(f"rank {self.rank} could not join the trial's processes at "
                             f"{where}: rank 0 rejected its key; every process of the trial "
                             "needs the same LOCALDET_DIST_AUTHKEY") from None
        except (EOFError, OSError) as error:
            raise self._fail(f"rank {self.rank} reached {where} but could not complete the "
                             f"handshake with the chief (rank 0), in {what}: "
                             f"{type(error).__name__}: {error}") from None
        self._connections[0] = connection


def _authenticated(sock: socket.socket, authkey: bytes, *, chief: bool,
                   timeout: float) -> Connection:
    sock.setblocking(True)  # Connection reads the descriptor directly
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # small messages, no Nagle wait
    _set_recv_timeout(sock, timeout)  # a silent peer must not stall the handshake
    connection = Connection(sock.detach())
    try:
        # What Listener.accept() and Client() do, on sockets whose waits we bound.
        if chief:
            deliver_challenge(connection, authkey)
            answer_challenge(connection, authkey)
        else:
            answer_challenge(connection, authkey)
            deliver_challenge(connection, authkey)
    except BaseException:
        connection.close()
        raise
    return connection


def _set_recv_timeout(target: Any, seconds: Optional[float]) -> None:
    """SO_RCVTIMEO: a blocking read gives up (BlockingIOError) after `seconds`; None: never."""
    whole = int(seconds or 0)
    value = struct.pack("ll", whole, int(((seconds or 0) - whole) * 1e6))
    if isinstance(target, socket.socket):
        target.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
        return
    sock = socket.socket(fileno=target.fileno())
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
    finally:
        sock.detach()  # the descriptor stays the connection's


def _mean(values: List[Any], what: str, fail: Any) -> List[Any]:
    """Each array's mean over the ranks' lists (`values[r]` is rank r's); `fail(message)`
    gives the error to raise when the ranks' arrays do not pair up."""
    import numpy as np

    first = values[0]
    for rank, arrays in enumerate(values[1:], 1):
        shapes = [np.shape(a) for a in arrays]
        if shapes != [np.shape(a) for a in first]:
            raise fail(f"the ranks averaged different arrays in {what}: rank 0 gave shapes "
                       f"{[np.shape(a) for a in first]}, rank {rank} {shapes}; every rank "
                       "must train the same model")
    means = []
    for index, array in enumerate(first):
        wide = np.complex128 if np.iscomplexobj(array) else np.float64
        total = np.array(array, dtype=wide)
        for arrays in values[1:]:
            total += arrays[index]
        total /= len(values)
        means.append(total.astype(array.dtype, copy=False))
    return means


def _went_away(rank: int, size: int, what: str) -> str:
    who = f"rank 0 of {size} (the chief)" if rank == 0 else f"rank {rank} of {size}"
    return f"{who} went away in {what}: its process exited or closed its connection"


def _text(address: Address) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
