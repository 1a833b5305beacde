"""Underscore names Determined's `determined.keras.callbacks` module exported for its own
trial runner: `_DeterminedHistory` (validation metrics as a stateful History) works; the
runner's plumbing (`_MultiplexerBase`, `_PolyLogs`, the profiler callback, the state helpers
for Keras's own callbacks) refuses with one sentence at use, since localdet's runner drives
the callbacks itself."""

from __future__ import annotations

from typing import Any, Dict, List

from determined import _runner_internals
from determined.keras.callbacks.callback import Callback


class _DeterminedHistory(Callback):
    """Every validation's metrics, in order, as `history[name] = [value, ...]`, kept across
    pause and resume (`get_state`/`load_state`); it becomes `model.history`."""

    def __init__(self) -> None:
        super().__init__()
        self.history: Dict[str, List[Any]] = {}

    def on_test_end(self, logs: Any = None) -> None:
        for name, value in (logs or {}).items():
            self.history.setdefault(name, []).append(value)
        if self.model is not None:
            self.model.history = self

    def get_state(self) -> Any:
        return self.history

    def load_state(self, state: Any) -> None:
        self.history = state


_OWNER = "determined.keras.callbacks"


def _refusing_class(name: str, instead: str) -> type:
    return _runner_internals._refusing_class(name, instead, owner=_OWNER, module=__name__)


def _refusing_function(name: str, instead: str) -> Any:
    return _runner_internals._refusing_function(name, instead, owner=_OWNER)


_RUNNER = "localdet's runner calls the trial's callbacks itself"
_MultiplexerBase = _refusing_class("_MultiplexerBase", _RUNNER)
_PolyLogs = _refusing_class("_PolyLogs", _RUNNER)
_DeterminedProfiler = _refusing_class(
    "_DeterminedProfiler", "profile with determined.keras.callbacks.TensorBoard(profile_batch=...) "
    "and `localdet tensorboard`")
_tf_keras_callback_get_state = _refusing_function(
    "_tf_keras_callback_get_state", "call get_state() on determined.keras.callbacks' "
    "EarlyStopping, ReduceLROnPlateau or TensorBoard")
_tf_keras_callback_load_state = _refusing_function(
    "_tf_keras_callback_load_state", "call load_state(state) on determined.keras.callbacks' "
    "EarlyStopping, ReduceLROnPlateau or TensorBoard")
