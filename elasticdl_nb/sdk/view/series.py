"""A bounded, downsampled (x, y) series: the loss curve of a job with any number of steps.

A long job reports a loss for every minibatch: hundreds of thousands of points, more
than a notebook should keep in memory or send to the browser every second. `Series`
keeps at most `capacity` buckets. While fewer points than that have arrived, every
bucket holds one point and the curve is exact. When the buckets are full, adjacent pairs
are merged (count, sums, the lowest and the highest point are kept) and the bucket width
doubles, so each point costs O(1) amortised and memory stays fixed.

For drawing, each bucket gives its lowest and its highest point in x order (`"minmax"`,
the default): spikes and the noise band survive downsampling, which a mean would smooth
away. `"mean"` gives one averaged point per bucket instead.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

# One bucket: [count, sum_x, sum_y, x_of_min, y_min, x_of_max, y_max]. A plain list rather
# than an object: cheap to create and to merge in place.
_N, _SX, _SY, _XMIN, _YMIN, _XMAX, _YMAX = range(7)


def _merge(a: list[float], b: list[float]) -> list[float]:
    """Fold bucket b (the later one) into bucket a."""
    a[_N] += b[_N]
    a[_SX] += b[_SX]
    a[_SY] += b[_SY]
    if b[_YMIN] < a[_YMIN]:
        a[_XMIN], a[_YMIN] = b[_XMIN], b[_YMIN]
    if b[_YMAX] > a[_YMAX]:
        a[_XMAX], a[_YMAX] = b[_XMAX], b[_YMAX]
    return a


class Series:
    """Points (x, y) in arrival order, kept in at most `capacity` buckets."""

    def __init__(self, capacity: int = 1024, mode: Literal["minmax", "mean"] = "minmax"):
        if capacity < 2:
            raise ValueError("capacity must be at least 2")
        self.capacity = capacity
        self.mode = mode
        self.width = 1  # raw points per full bucket; doubles at every compaction
        self.count = 0  # every point ever added
        self.version = 0  # bumped on every change: a renderer skips unchanged series
        self._buckets: list[list[float]] = []
        self._open: list[float] | None = None  # the bucket being filled, < width points

    def __len__(self) -> int:
        """Buckets held (the memory bound); `count` is the number of points added."""
        return len(self._buckets) + (1 if self._open else 0)

    def add(self, x: float, y: float) -> None:
        x, y = float(x), float(y)
        self.count += 1
        self.version += 1
        point = [1, x, y, x, y, x, y]
        if self._open is None:
            self._open = point
        else:
            _merge(self._open, point)
        if self._open[_N] >= self.width:
            self._buckets.append(self._open)
            self._open = None
            if len(self._buckets) >= self.capacity:
                self._compact()

    def extend(self, points: Iterable[tuple[float, float] | list[float]]) -> None:
        for x, y in points:
            self.add(x, y)

    def _compact(self) -> None:
        """Merge adjacent pairs of buckets: half as many, each twice as wide."""
        b = self._buckets
        merged = [_merge(b[i], b[i + 1]) for i in range(0, len(b) - 1, 2)]
        if len(b) % 2:  # an odd one out is a partly filled bucket of the new width
            self._open = b[-1]
        self._buckets = merged
        self.width *= 2

    def _all(self) -> list[list[float]]:
        return self._buckets + ([self._open] if self._open else [])

    def xy(self) -> tuple[list[float], list[float]]:
        """The points to draw, as (xs, ys)."""
        xs: list[float] = []
        ys: list[float] = []
        for b in self._all():
            if self.mode == "mean":
                xs.append(b[_SX] / b[_N])
                ys.append(b[_SY] / b[_N])
                continue
            lo, hi = (b[_XMIN], b[_YMIN]), (b[_XMAX], b[_YMAX])
            first, second = (lo, hi) if lo[0] <= hi[0] else (hi, lo)
            xs.append(first[0])
            ys.append(first[1])
            if second != first:
                xs.append(second[0])
                ys.append(second[1])
        return xs, ys
