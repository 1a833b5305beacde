"""Reading a Sequence's batches in order, in the three modes Keras and Determined offered:
the calling thread, worker threads, or worker processes (see `_sequence`)."""

from __future__ import annotations

import collections
import concurrent.futures
import multiprocessing
import os
import pickle
import queue
import threading
import time
import traceback
import weakref
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from determined.keras._sequence_batches import (
    THREAD_NAME,
    DataLoaderError,
    _hook,
    _overrides_hooks,
    normalise_batch,
)


# -- loaders ---------------------------------------------------------------------------------
class _Loader:
    """Reads `sequence[i]` for the indices of a plan, in order, up to `ahead` batches ahead,
    running the pass hooks in the calling thread when no read is in flight. This base class
    reads in the calling thread, one batch at a time (workers=0)."""

    ahead = 1

    def __init__(self, sequence: Any):
        self.sequence = sequence
        self.closed = False

    def submit(self, index: int) -> Any:
        return index

    def result(self, token: Any) -> Any:
        return self.sequence[token]

    def drain(self, tokens: list[Any]) -> None:
        """Wait until the reads of these tokens (all not yet collected) are done."""

    def sequence_changed(self) -> None:
        """The pass hooks ran; workers holding copies must see the new state."""

    def abandon(self, tokens: list[Any]) -> None:
        """The reader stopped early (evaluate with steps); these reads are not wanted."""

    def close(self) -> None:
        self.closed = True

    def read(self, plan: Iterable[Any]) -> Iterator[tuple]:
        pending: collections.deque[tuple[int, Any]] = collections.deque()
        plan = iter(plan)
        hooks = _overrides_hooks(self.sequence)
        exhausted = changed = False
        try:
            while True:
                while not exhausted and len(pending) < self.ahead:
                    item = next(plan, None)
                    if item is None:
                        exhausted = True
                    elif isinstance(item, str):  # a pass marker: no read may be in flight
                        self.drain([token for _, token in pending])
                        _hook(self.sequence, item)
                        changed = changed or hooks
                    else:
                        if changed:
                            self.sequence_changed()
                            changed = False
                        pending.append((item, self.submit(item)))
                if not pending:
                    return
                if self.closed:
                    raise RuntimeError("the Sequence's loader was closed while being read")
                index, token = pending.popleft()
                yield normalise_batch(self.result(token), index)
        finally:
            if pending:
                self.abandon([token for _, token in pending])


class _ThreadLoader(_Loader):
    """`workers` threads, up to `max_queue_size` batches ahead."""

    def __init__(self, sequence: Any, workers: int, max_queue_size: int):
        super().__init__(sequence)
        self.ahead = max_queue_size
        self.executor = concurrent.futures.ThreadPoolExecutor(workers,
                                                              thread_name_prefix=THREAD_NAME)
        self._finalizer = weakref.finalize(self, self.executor.shutdown, wait=True,
                                           cancel_futures=True)

    def submit(self, index: int) -> concurrent.futures.Future:
        return self.executor.submit(self.sequence.__getitem__, index)

    def result(self, token: concurrent.futures.Future) -> Any:
        return token.result()

    def drain(self, tokens: list[Any]) -> None:
        concurrent.futures.wait(tokens)

    def close(self) -> None:
        super().close()
        self._finalizer()


_FATAL = -1  # the order of a worker's message that it cannot go on


def _worker_main(payload: bytes, tasks: Any, results: Any) -> None:
    """A worker process: read `sequence[i]` for each task, until told to stop or the main
    process is gone."""
    parent = multiprocessing.parent_process()
    try:
        sequence = pickle.loads(payload)
    except BaseException as error:  # noqa: BLE001 - reported to the main process
        results.put((_FATAL, False, f"{type(error).__name__}: {error}"))
        results.close()
        results.join_thread()
        os._exit(1)
    while True:
        try:
            task = tasks.get(timeout=1.0)
        except queue.Empty:
            if parent is not None and not parent.is_alive():
                break
            continue
        if task is None:
            break
        kind, value = task
        if kind == "sequence":
            sequence = pickle.loads(value)
            continue
        order, index = value
        answer: tuple[Any, bool, Any]  # (order, ok, the pickled batch or (error, traceback))
        try:
            # Pickled here, so a batch that cannot be pickled is reported, not lost.
            answer = (order, True, pickle.dumps(sequence[index], pickle.HIGHEST_PROTOCOL))
        except BaseException as error:  # noqa: BLE001 - sent back to the main process
            text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
            try:
                pickle.dumps(error)
            except Exception:  # noqa: BLE001
                error = RuntimeError(str(error))
            answer = (order, False, (error, text))
        results.put(answer)
    # Flush what is sent, then leave without the interpreter's (TensorFlow's) slow teardown.
    results.close()
    results.join_thread()
    os._exit(0)


def _stop_processes(processes: list, task_queues: list, results: Any) -> None:
    for tasks in task_queues:
        try:
            tasks.put(None)
        except (ValueError, OSError):
            pass
    deadline = time.monotonic() + 5.0
    while any(p.is_alive() for p in processes) and time.monotonic() < deadline:
        try:  # keep the result pipe empty, so no worker blocks flushing into it
            results.get(timeout=0.02)
        except (queue.Empty, OSError, ValueError, EOFError):
            pass
    for process in processes:
        if process.is_alive():
            process.terminate()
        process.join(5)
    for q in [*task_queues, results]:
        q.cancel_join_thread()
        q.close()


class _ProcessLoader(_Loader):
    """`workers` processes ('spawn'), up to `max_queue_size` batches ahead. Task i goes to
    worker i % workers, through that worker's own queue, so a new copy of the sequence
    (after the pass hooks) reaches every worker before its next task."""

    def __init__(self, sequence: Any, workers: int, max_queue_size: int):
        super().__init__(sequence)
        self.ahead = max_queue_size
        payload = pickled(sequence)
        context = multiprocessing.get_context("spawn")
        self.results = context.Queue()
        self.task_queues = [context.Queue() for _ in range(workers)]
        self.processes = [context.Process(target=_worker_main, args=(payload, tasks, self.results),
                                          name=f"{THREAD_NAME}-{i}", daemon=True)
                          for i, tasks in enumerate(self.task_queues)]
        self._finalizer = weakref.finalize(self, _stop_processes, self.processes,
                                           self.task_queues, self.results)
        for process in self.processes:
            process.start()
        self.order = 0
        self.outstanding: set = set()  # orders sent and not yet answered
        self.received: dict = {}  # answers not yet collected, by order
        self.discarded: set = set()  # orders whose answers nobody will collect

    def submit(self, index: int) -> int:
        order = self.order
        self.order += 1
        self.task_queues[order % len(self.task_queues)].put(("task", (order, index)))
        self.outstanding.add(order)
        return order

    def _receive(self) -> None:
        while True:
            try:
                order, ok, value = self.results.get(timeout=1.0)
                break
            except queue.Empty:
                dead = [p for p in self.processes if not p.is_alive()]
                if dead:
                    raise RuntimeError(
                        f"a data-loading worker process ({dead[0].name}) exited unexpectedly "
                        f"with exit code {dead[0].exitcode}; see its error above (a script "
                        "that starts worker processes must keep its top-level code under "
                        "`if __name__ == '__main__':`)") from None
        if order == _FATAL:
            raise DataLoaderError(
                f"a data-loading worker process could not load the "
                f"{type(self.sequence).__name__} ({value}); its class must be importable by "
                "name (defined at the top level of a module, not inside a function)")
        self.outstanding.discard(order)
        if order in self.discarded:
            self.discarded.discard(order)
        else:
            self.received[order] = (ok, value)

    def result(self, token: int) -> Any:
        while token not in self.received:
            self._receive()
        ok, value = self.received.pop(token)
        if ok:
            return pickle.loads(value)
        error, text = value
        raise error from RuntimeError(f"in a data-loading worker process:\n{text}")

    def drain(self, tokens: list[Any]) -> None:
        while self.outstanding:
            self._receive()

    def abandon(self, tokens: list[Any]) -> None:
        for order in tokens:
            if self.received.pop(order, None) is None and order in self.outstanding:
                self.discarded.add(order)

    def sequence_changed(self) -> None:
        payload = pickled(self.sequence)
        for tasks in self.task_queues:
            tasks.put(("sequence", payload))

    def close(self) -> None:
        super().close()
        self._finalizer()


def pickled(sequence: Any) -> bytes:
    try:
        return pickle.dumps(sequence, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as error:
        raise DataLoaderError(
            f"the {type(sequence).__name__} cannot be pickled ({error}), and "
            "use_multiprocessing=True sends a copy of it to each worker process; make it "
            "picklable (no open files, locks, lambdas or local classes) or read it in threads "
            "with use_multiprocessing=False") from error


class _ReadSettings(Protocol):
    """How to read a Sequence: what `_sequence.SequenceAdapter` holds (named here by shape,
    as that module imports this one)."""

    sequence: Any
    use_multiprocessing: bool
    workers: int
    max_queue_size: int


def make_loader(adapter: _ReadSettings) -> _Loader:
    if adapter.workers == 0:
        return _Loader(adapter.sequence)
    if adapter.use_multiprocessing:
        return _ProcessLoader(adapter.sequence, adapter.workers, adapter.max_queue_size)
    return _ThreadLoader(adapter.sequence, adapter.workers, adapter.max_queue_size)


# -- the registry of open loaders, so none outlives its stream or the process ----------------
_open_loaders: weakref.WeakSet[_Loader] = weakref.WeakSet()
_lock = threading.Lock()


def _register(loader: _Loader) -> _Loader:
    with _lock:
        _open_loaders.add(loader)
    return loader


def close_all() -> None:
    with _lock:
        loaders = list(_open_loaders)
    for loader in loaders:
        loader.close()

