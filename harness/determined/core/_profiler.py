"""`core_context.profiler`: Determined's system-metrics sampler (CPU, GPU, memory, network
and disk use, shown in its web UI). Accepted so that code calling it runs; nothing is
sampled here: use TensorBoard's profiler (`det.keras.TensorBoard(profile_batch=...)`)."""

from __future__ import annotations

import logging

logger = logging.getLogger("determined.core")


class ProfilerContext:
    def __init__(self) -> None:
        self._on = False

    def on(self, sampling_interval: int = 1, samples_per_report: int = 10) -> None:
        """Accepted: localdet samples no system metrics."""
        if not self._on:
            logger.info("core_context.profiler.on(): localdet samples no system metrics; "
                        "TensorBoard's profiler shows where time goes")
        self._on = True

    def off(self) -> None:
        self._on = False

    def _close(self) -> None:
        self._on = False


DummyProfilerContext = ProfilerContext
