"""Curves thinned for drawing: a bounded number of points per series that keeps its shape.

    xs, ys = min_max(xs, ys, points=200)   # at most 200 points: first, last, each bucket's
                                           # lowest and highest

The series (sorted by x) is cut into equal runs of points ("buckets"); each keeps its lowest
and its highest point, in x order, so every spike and the extremes of the whole series stay
drawn, and the first and last points are kept where the line starts and ends. A series of at
most `points` points is returned as it is. Determined's web UI asked its API for a bounded
number of points per trial too (1,000 to 1,500 for a trial's charts); its server sampled rows
at random, which can drop a spike; this keeps them.
"""

from __future__ import annotations

from collections.abc import Sequence

MIN_POINTS = 4  # first, last and one bucket's two


def min_max(xs: Sequence, ys: Sequence[float], points: int) -> tuple[list, list]:
    """At most max(points, MIN_POINTS) of the points (xs[i], ys[i]), in their order."""
    count = len(xs)
    points = max(points, MIN_POINTS)
    if count <= points:
        return list(xs), list(ys)
    buckets = (points - 2) // 2
    inner = count - 2  # the first and last points are kept apart from the buckets
    keep = [0]
    for bucket in range(buckets):
        start = 1 + bucket * inner // buckets
        end = 1 + (bucket + 1) * inner // buckets
        if start >= end:
            continue
        low = high = start
        for index in range(start + 1, end):
            if ys[index] < ys[low]:
                low = index
            elif ys[index] > ys[high]:
                high = index
        keep.extend(sorted({low, high}))
    keep.append(count - 1)
    return [xs[i] for i in keep], [ys[i] for i in keep]
