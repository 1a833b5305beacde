"""Each epoch's wall time in a `fit`, for overhead.py's `--api fit|unchanged` (on any backend):
from one epoch's start to the next's, so that whatever runs between two epochs (validation,
localdet's metrics and checkpoints at the boundary) counts in the epoch before it.

    clock = epoch_clock(keras.callbacks.Callback)   # the Keras the script uses
    model.fit(..., callbacks=[clock])
    clock.middle()    # the epochs' times but the first (compiling) and the last (the end)

Imports no Keras itself: the callback's base class is given.
"""

from __future__ import annotations

import statistics
import time


def epoch_clock(base: type):
    class EpochClock(base):
        def __init__(self):
            super().__init__()
            self.marks: list[float] = []

        def on_epoch_begin(self, epoch, logs=None):
            self.marks.append(time.perf_counter())

        def on_train_end(self, logs=None):
            self.marks.append(time.perf_counter())

        def middle(self) -> list[float]:
            return [b - a for a, b in zip(self.marks[1:-2], self.marks[2:-1], strict=True)]

    return EpochClock()


def print_epoch_times(times: dict[str, list[float]], target: float) -> None:
    """The line comparing the sides' epoch times ("bare" and "localdet": their middle epochs)."""
    bare, localdet = times["bare"], times["localdet"]
    if not bare or not localdet:
        print("epoch time: no epoch but a first and a last to time (--epochs 3 or more)")
        return
    b, d = statistics.median(bare), statistics.median(localdet)
    print(f"epoch time: bare {b:.3f} s, localdet {d:.3f} s (medians of {len(bare)} epochs, "
          f"each run's but its first and last): ratio {d / b:.3f} (target <= {target})")
