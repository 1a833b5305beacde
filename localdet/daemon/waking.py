"""What wakes the daemon's loop before its poll is due: a change in the queue folder, or a
launched trial's process ending (its slots pass on without waiting for the next poll)."""

from __future__ import annotations

import queue
import threading

from watchdog.events import FileSystemEventHandler


class QueueChanged(FileSystemEventHandler):
    """A watchdog handler that wakes the loop on any change under the queue folder."""

    def __init__(self, event: threading.Event):
        self.event = event

    def on_any_event(self, event) -> None:
        self.event.set()


class Waiters:
    """Threads that each wait for a launched trial's process to end and then wake the
    loop. A thread whose trial ended takes the next launch's: starting a thread for each
    launch made the loop wait for the new thread to run (a GIL hand-over) every time."""

    def __init__(self, wake: threading.Event):
        self.wake = wake
        self._launches: queue.SimpleQueue = queue.SimpleQueue()
        self._idle = 0
        self._lock = threading.Lock()

    def watch(self, process) -> None:
        with self._lock:
            start = self._idle == 0
            if not start:
                self._idle -= 1
        self._launches.put(process)
        if start:
            threading.Thread(target=self._wait, daemon=True, name="wait-trials").start()

    def _wait(self) -> None:
        while True:
            process = self._launches.get()
            try:
                process.wait()
            except Exception:  # its end is found by the loop's poll all the same
                pass
            self.wake.set()
            with self._lock:
                self._idle += 1
