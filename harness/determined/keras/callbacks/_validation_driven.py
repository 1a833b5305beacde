"""What EarlyStopping and ReduceLROnPlateau share: Keras's logic, driven by validations."""

from __future__ import annotations

from typing import Dict, Optional


class ValidationDriven:
    """Put first among the bases of a Keras callback whose decisions Keras makes in
    `on_epoch_end`: Determined calls it on every validation (`on_test_end`, counted in
    `test_end_count`) instead, and a resumed trial keeps the state `load_state` restored.
    """

    def _start_counting(self) -> None:
        self.test_end_count = 0
        self._resumed = False

    def on_train_begin(self, logs: Optional[Dict] = None) -> None:
        # Keras resets here so an instance can be reused across `fit` calls; a resumed
        # trial must keep what `load_state` restored.
        if self._resumed:
            self._resumed = False
            return
        super().on_train_begin(logs)  # type: ignore[misc]  # the Keras callback mixed in after
        self.test_end_count = 0

    def on_epoch_end(self, epoch: int, logs: Optional[Dict] = None) -> None:
        """Does nothing: Determined's epochs carry no metrics; see `on_test_end`."""
