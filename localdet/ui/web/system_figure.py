"""The trial page's system metrics chart: the daemon's samples of the trial
(localdet/records/system_metrics.py) against time, one panel a quantity: CPU, memory, disk,
and where NVML sampled them, GPU utilisation, memory and power.

    figure(db, trial_id)   # plotly JSON, or an empty figure that says why
"""

from __future__ import annotations

import math
from typing import Any

from localdet.records import system_metrics as records
from localdet.records.db import StateDB
from localdet.ui.web import downsample

POINTS = 400  # per series: the page draws ~1,500 rows of a long trial as their shape

# (panel title, [(metric, line name, scale)]): scale turns the value into the axis' unit.
PANELS: list[tuple[str, list[tuple[str, str, float]]]] = [
    ("CPU (% of one core)", [("cpu_util", "CPU", 1.0)]),
    ("memory (GB)", [("memory_rss", "resident", 1e-9)]),
    ("disk (MB/s)", [("disk_throughput_read", "read", 1e-6),
                     ("disk_throughput_write", "write", 1e-6)]),
    ("GPU utilisation (%)", [("gpu_util", "GPU", 1.0)]),
    ("GPU memory (GB)", [("gpu_memory_used", "used", 1e-9)]),
    ("GPU power (W)", [("gpu_power", "power", 1.0)]),
]


def figure(db: StateDB, trial_id: int) -> dict[str, Any]:
    rows = records.rows(db, trial_id)
    names = {name for row in rows for name in row["metrics"]}
    panels = [(title, lines) for title, lines in PANELS
              if any(name in names for name, _, _ in lines)]
    if not panels:
        return {"data": [], "layout": {
            "height": 80, "margin": {"l": 20, "r": 20, "t": 20, "b": 20},
            "xaxis": {"visible": False}, "yaxis": {"visible": False},
            "annotations": [{"text": "no system metrics sampled yet", "showarrow": False,
                             "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5}]}}
    columns = min(3, len(panels))
    rows_of_panels = math.ceil(len(panels) / columns)
    traces: list[dict[str, Any]] = []
    layout: dict[str, Any] = {
        "height": 240 * rows_of_panels + 60, "margin": {"l": 50, "r": 20, "t": 40, "b": 40},
        "showlegend": False, "uirevision": "keep", "annotations": []}
    gap_x, gap_y = 0.06, 0.12
    for index, (title, lines) in enumerate(panels):
        row, column = divmod(index, columns)
        axis = "" if index == 0 else str(index + 1)
        left = column / columns + (gap_x / 2 if column else 0)
        right = (column + 1) / columns - (gap_x / 2 if column < columns - 1 else 0)
        top = 1 - row / rows_of_panels - (gap_y / 2 if row else 0)
        bottom = 1 - (row + 1) / rows_of_panels + (gap_y / 2 if row < rows_of_panels - 1
                                                   else 0)
        layout[f"xaxis{axis}"] = {"domain": [left, right], "anchor": f"y{axis}",
                                  "type": "date"}
        layout[f"yaxis{axis}"] = {"domain": [bottom, top], "anchor": f"x{axis}",
                                  "rangemode": "tozero"}
        layout["annotations"].append({"text": title, "showarrow": False, "xref": "paper",
                                      "yref": "paper", "x": (left + right) / 2, "y": top,
                                      "xanchor": "center", "yanchor": "bottom"})
        for name, label, scale in lines:
            xs = [row["at"] for row in rows if name in row["metrics"]]
            ys = [row["metrics"][name] * scale for row in rows if name in row["metrics"]]
            xs, ys = downsample.min_max(xs, ys, POINTS)
            traces.append({"type": "scatter", "mode": "lines", "x": xs,
                           "y": [float(f"{y:.4g}") for y in ys], "name": label,
                           "xaxis": f"x{axis}", "yaxis": f"y{axis}",
                           "hovertemplate": f"{label} %{{y}}<extra></extra>"})
    return {"data": traces, "layout": layout}
