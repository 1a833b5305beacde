"""`core_context.profiler`: Determined's system-metrics sampler. Under localdet the daemon
samples every running trial's system metrics by itself (its process tree's CPU, memory and
disk, and its GPUs' utilisation, memory and power where NVML is present), unless the
experiment's config sets `profiling.enabled: false`; `localdet metrics EXPERIMENT --system`,
the trial's dashboard page and `Trial.iter_metrics("system")` show them. So `on()` asks for
what already happens, and `off()` changes nothing: the daemon's sampling is set by the
config and `localdet daemon --system-metrics-period`."""

from __future__ import annotations

import logging

logger = logging.getLogger("determined.core")


class ProfilerContext:
    def __init__(self) -> None:
        self._on = False

    def on(self, sampling_interval: int = 1, samples_per_report: int = 10) -> None:
        """Accepted: the daemon already samples this trial (Determined's checks of the
        arguments are kept)."""
        if sampling_interval < 0.1:
            raise ValueError(f"Sampling interval must be > 0.1, got {sampling_interval}.")
        if not isinstance(samples_per_report, int) or samples_per_report < 1:
            raise ValueError("samples_per_report must be an int >= 1, got "
                             f"{samples_per_report!r}.")
        if not self._on:
            logger.info("core_context.profiler.on(): localdet's daemon samples this trial's "
                        "system metrics by itself (unless profiling.enabled is false): "
                        "`localdet metrics EXPERIMENT --system`")
        self._on = True

    def off(self) -> None:
        """Accepted: the daemon's sampling is set by the config (`profiling.enabled`)."""
        self._on = False

    def _close(self) -> None:
        self._on = False


DummyProfilerContext = ProfilerContext
