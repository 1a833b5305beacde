"""`DeterminedProgress`: progress lines for a trial's log, instead of Keras's progress bar
(which a log file renders as one very long line)."""

from __future__ import annotations

from typing import Any, Dict, Optional

from determined.keras.callbacks.callback import Callback


class DeterminedProgress(Callback):
    """Prints how far the current workload and each validation are, at most every 10%:

        total batches trained: 40, workload 50% complete (10/20): {'loss': 0.41}

    It remembers the length of the last validation across pauses."""

    def __init__(self) -> None:
        super().__init__()
        self.trained_total = 0
        self.validation_len: Optional[int] = None
        self._workload_len: Optional[int] = None
        self._batches = 0
        self._last_tenth = -1

    def _report(self, phase: str, logs: Optional[Dict[str, Any]],
                total: Optional[int]) -> None:
        if not total:
            return
        tenth = self._batches * 10 // total
        if tenth <= self._last_tenth:
            return
        self._last_tenth = tenth
        percent = self._batches * 100 // total
        if phase == "training":
            line = (f"total batches trained: {self.trained_total}, workload {percent}% "
                    f"complete ({self._batches}/{total})")
        else:
            line = (f"validation after batch: {self.trained_total}, validation {percent}% "
                    f"complete ({self._batches}/{total})")
        metrics = {k: _plain(v) for k, v in (logs or {}).items() if k not in ("batch", "size")}
        print(f"{line}: {metrics}" if metrics else line, flush=True)

    def on_train_workload_begin(self, total_batches_trained: int,
                                batches_requested: Optional[int], logs: Dict) -> None:
        self.trained_total = total_batches_trained
        self._workload_len = batches_requested
        self._batches = 0
        self._last_tenth = -1

    def on_train_batch_end(self, batch: int, logs: Optional[Dict] = None) -> None:
        self._batches += 1
        self.trained_total += 1
        self._report("training", logs, self._workload_len)

    def on_test_begin(self, logs: Optional[Dict] = None) -> None:
        self._batches = 0
        self._last_tenth = -1

    def on_test_batch_end(self, batch: int, logs: Optional[Dict] = None) -> None:
        self._batches += 1
        self._report("validation", logs, self.validation_len)

    def on_test_end(self, logs: Optional[Dict] = None) -> None:
        self.validation_len = self._batches

    def get_state(self) -> Any:
        return {"trained_total": self.trained_total, "validation_len": self.validation_len}

    def load_state(self, state: Any) -> None:
        self.trained_total = state["trained_total"]
        self.validation_len = state["validation_len"]


def _plain(value: Any) -> Any:
    return round(float(value), 4) if hasattr(value, "__float__") else value
