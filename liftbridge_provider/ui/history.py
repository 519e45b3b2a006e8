"""Lag over time for the Liftbridge page's chart: a bounded history in the API server's memory (pure).

Each time the page's data is gathered from the cluster (at most once per ``bounds.CACHE_TTL`` per connection,
and only while someone asks: no poller runs otherwise), every listed cursor's lag per partition is added to
:class:`LagHistory`: at most :data:`SAMPLES` samples per (connection, cursor, stream, partition), at most
:data:`SERIES` such series per API server process (the series not sampled the longest is dropped first). So
the history starts when the page is first opened, lives as long as the API server process, and each API
server process (with several workers, each one) keeps its own. :func:`polyline` turns a series into the
points of an SVG ``<polyline>``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

SAMPLES = 360
"""Samples kept per series: 30 minutes at the page's 5 s refresh."""
SERIES = 2_000
"""Series kept per API server process, for every connection together."""
CHART_WIDTH, CHART_HEIGHT = 600, 80
CHART_LINES = 8
"""Partitions drawn per cursor's chart: those with the highest lag now."""

SeriesKey = tuple[str, str, str, int]  # connection, cursor id, stream, partition
Sample = tuple[float, int]  # seconds since the epoch, lag


class LagHistory:
    """The last :data:`SAMPLES` lag samples of each series, for at most :data:`SERIES` series; thread-safe."""

    def __init__(self, *, samples: int = SAMPLES, series: int = SERIES) -> None:
        self.samples = samples
        self.series = series
        self._data: OrderedDict[SeriesKey, deque[Sample]] = OrderedDict()
        self._lock = threading.Lock()

    def record(self, conn_id: str, at: float, rows: Iterable[Mapping[str, Any]]) -> None:
        """Add a sample at ``at`` for each partition with a known lag of each cursor row (``views.cursor_rows``)."""
        with self._lock:
            for row in rows:
                for part in row["partitions"]:
                    if part.get("lag") is None:
                        continue
                    key = (conn_id, row["cursor_id"], row["stream"], int(part["partition"]))
                    ring = self._data.pop(key, None)
                    if ring is None:
                        ring = deque(maxlen=self.samples)
                    ring.append((at, int(part["lag"])))
                    self._data[key] = ring  # the newest sampled series last
                    while len(self._data) > self.series:
                        self._data.popitem(last=False)

    def of(self, conn_id: str, cursor_id: str, stream: str) -> dict[int, list[Sample]]:
        """The samples of each partition of one cursor on one stream, oldest first."""
        with self._lock:
            return {
                key[3]: list(ring)
                for key, ring in self._data.items()
                if key[0] == conn_id and key[1] == cursor_id and key[2] == stream
            }

    def __len__(self) -> int:
        return len(self._data)


def polyline(
    samples: Sequence[Sample], span: tuple[float, float], top: int, width: int = CHART_WIDTH, height: int = CHART_HEIGHT
) -> str:
    """The ``points`` of an SVG polyline of ``samples``: time ``span`` (first, last) across ``width``, lag 0
    at the bottom and ``top`` at the top (y grows downwards); one sample is a point at its place."""
    first, last = span
    wide = max(last - first, 1e-9)
    high = max(top, 1)
    points = []
    for at, value in samples:
        x = (at - first) / wide * width if last > first else width
        y = height - min(value, high) / high * height
        points.append(f"{x:.1f},{y:.1f}")
    return " ".join(points)


def chart(history: Mapping[int, Sequence[Sample]], lines: int = CHART_LINES) -> dict[str, Any] | None:
    """What the page draws for one cursor: a polyline per partition (the ``lines`` with the highest lag now),
    the time span and the top of the lag axis; None with fewer than two samples in all."""
    series = {p: s for p, s in history.items() if s}
    if sum(len(s) for s in series.values()) < 2:
        return None
    times = [at for s in series.values() for at, _ in s]
    span = (min(times), max(times))
    top = max(1, *(value for s in series.values() for _, value in s))
    shown = sorted(series, key=lambda p: (-series[p][-1][1], p))[:lines]
    return {
        "width": CHART_WIDTH,
        "height": CHART_HEIGHT,
        "from": span[0],
        "to": span[1],
        "top": top,
        "samples": max(len(s) for s in series.values()),
        "lines": [
            {"partition": p, "lag": series[p][-1][1], "points": polyline(series[p], span, top)} for p in sorted(shown)
        ],
        "hidden": len(series) - len(shown),
    }
