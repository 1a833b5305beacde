"""How overhead.py times its two sides, bare and localdet, on any backend (this imports no
Keras: the callback's base class is given).

    times, epochs = alternate(timed, repeats, length)  # timed(side, length): (s, acc, epochs)
    clock = epoch_clock(keras.callbacks.Callback)      # the Keras the script uses
    model.fit(..., callbacks=[clock])
    clock.middle()    # the epochs' times but the first (compiling) and the last (the end)

An epoch's time runs from its start to the next's, so that whatever runs between two epochs
(validation, localdet's metrics and checkpoints at the boundary) counts in the epoch before it.
"""

from __future__ import annotations

import statistics
import sys
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


def alternate(timed, repeats: int, length: int) -> tuple[dict, dict]:
    """Run each side `repeats` times, alternating which goes first; each run's line to
    stderr. Returns each side's run times and its middle epochs' times."""
    times: dict[str, list[float]] = {"bare": [], "localdet": []}
    epoch_times: dict[str, list[float]] = {"bare": [], "localdet": []}
    for i in range(repeats):
        order = ("bare", "localdet") if i % 2 == 0 else ("localdet", "bare")
        accuracy = {}
        for side in order:
            seconds, accuracy[side], epochs = timed(side, length)
            times[side].append(seconds)
            epoch_times[side] += epochs
        print(f"run {i + 1}: bare {times['bare'][-1]:.2f} s (val_accuracy "
              f"{accuracy['bare']:.4f}), localdet {times['localdet'][-1]:.2f} s "
              f"(val_accuracy {accuracy['localdet']:.4f})", file=sys.stderr, flush=True)
    return times, epoch_times
