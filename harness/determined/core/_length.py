"""How long a Core API trial trains: the searcher's length, or the script's own.

With a length (`searcher.max_length`, `max_time`, an ASHA rung) the trial is told to stop,
through `preempt.should_preempt()`, once it has reported a validation at that many batches:
that is how Determined 0.38 stopped a trial at its searcher's length (the master preempted
it), and it works for any loop that validates and asks.

Without one (a `single` searcher with no length) the script's own loop decides. The daemon
judges a clean exit by whether the trial reached its target, so while the script runs the
target is kept ahead of what it has trained (its own `report_progress` estimate, or one
batch past its last report): a paused trial is then not mistaken for a finished one. When
the script ends without being preempted, the target becomes what it trained.

    length = TrialLength(reporter, info.target_batches, searched=True)
    length.steps(200); length.validated(200)
    length.reached()          # True once a validation at the target was reported
    length.finished()         # the script ended on its own: its length is what it trained
"""

from __future__ import annotations

import threading
from typing import Dict, Optional

from determined.core._reporting import TrialReporter


class TrialLength:
    def __init__(self, reporter: Optional[TrialReporter], target_batches: int,
                 searched: Optional[bool] = None, time_metric: Optional[str] = None):
        """`searched`: whether the searcher sets the length (default: a target is given);
        False where the target is only what an earlier launch of the script recorded.
        `time_metric`: Determined 0.38's `searcher.time_metric`; other than "batches", the
        target counts in that validation metric (DeterminedCallback reports `epochs`)."""
        self._reporter = reporter
        self.time_metric = None if time_metric in (None, "batches") else time_metric
        self.validated_time = float("-inf")  # the most `time_metric` a validation reported
        self.searched = target_batches > 0 if searched is None else searched
        self.target = target_batches if self.searched else 0
        self.last_steps = 0            # the most batches reported so far (metrics, checkpoints)
        self.validated_steps = -1      # the most batches a validation was reported at
        self._estimate = 0             # what the script's progress says its length is
        # The target last written for an unsearched run (an earlier launch's, at first).
        self._recorded = 0 if self.searched else target_batches
        self._lock = threading.Lock()

    def steps(self, steps_completed: int) -> None:
        with self._lock:
            self.last_steps = max(self.last_steps, int(steps_completed))
        self._keep_ahead()

    def validated(self, steps_completed: int, metrics: Optional[Dict[str, float]] = None
                  ) -> None:
        with self._lock:
            self.validated_steps = max(self.validated_steps, int(steps_completed))
            if self.time_metric is not None and self.time_metric in (metrics or {}):
                self.validated_time = max(self.validated_time,
                                          float((metrics or {})[self.time_metric]))
        self.steps(steps_completed)

    def progress(self, fraction: float) -> None:
        """`report_progress(fraction)` after `last_steps` batches: an estimate of the
        script's length, while the searcher sets none."""
        if self.searched or fraction <= 0 or self.last_steps <= 0:
            return
        with self._lock:
            self._estimate = int(round(self.last_steps / min(1.0, fraction)))
        self._keep_ahead()

    def reached(self) -> bool:
        """Whether the searcher's length was reached: a validation at or past it (in
        batches, or in the configured time metric)."""
        if not self.searched:
            return False
        if self.time_metric is not None:
            return self.validated_time >= self.target
        return self.validated_steps >= self.target

    def finished(self) -> None:
        """The script ended on its own (not preempted): its length is what it trained."""
        if self.searched or self._reporter is None:
            return
        self._record(self.last_steps)

    def _keep_ahead(self) -> None:
        if self.searched or self._reporter is None:
            return
        wanted = max(self._estimate, self.last_steps + 1)
        if wanted > self._recorded:
            self._record(wanted)

    def _record(self, batches: int) -> None:
        with self._lock:
            if batches == self._recorded:
                return
            self._recorded = batches
        if self._reporter is not None:
            self._reporter.set_target_batches(batches)
