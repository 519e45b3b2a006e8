"""Split frozen offset ranges into Spark input partitions: a pure function, like Spark's
KafkaOffsetRangeCalculator.

Every range is cut into slices of at most ``max_records_per_partition``
offsets; if that gives fewer than ``min_partitions`` slices, the largest
slices are halved until there are enough (or every slice holds one offset).
Slices of one range are contiguous, in order, and cover it exactly; empty
ranges produce no slice. With ``max_partitions``, :func:`pack_slices` puts
more slices than that into that many tasks, each slice whole: a Spark task
costs tens of milliseconds of its own (a Python worker round trip), which
256 small pieces paid 256 times.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from liftbridge_provider.core.errors import InvalidArgumentError
from liftbridge_provider.core.ranges import OffsetRange


@dataclass(frozen=True, order=True)
class Slice:
    """Offsets ``start <= offset < end`` of one partition, read by one Spark task."""

    partition: int
    start: int
    end: int

    @property
    def count(self) -> int:
        return self.end - self.start


def _split(offset_range: OffsetRange | Slice, size: int) -> list[Slice]:
    return [
        Slice(offset_range.partition, start, min(start + size, offset_range.end))
        for start in range(offset_range.start, offset_range.end, size)
    ]


def plan_slices(
    ranges: Iterable[OffsetRange], *, min_partitions: int | None = None, max_records_per_partition: int | None = None
) -> list[Slice]:
    """The slices that cover ``ranges`` exactly, ordered by partition then offset."""
    for name, value in (("minPartitions", min_partitions), ("maxRecordsPerPartition", max_records_per_partition)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise InvalidArgumentError(f"{name} must be a whole number >= 1, got {value!r}")
    slices = []
    for offset_range in ranges:
        if offset_range.end > offset_range.start:
            slices.extend(_split(offset_range, max_records_per_partition or offset_range.count))
    if min_partitions is not None and len(slices) < min_partitions:
        # halve the largest slice until there are enough, or one offset each: a heap, so a huge
        # minPartitions costs O(n log n) in the slices made (a list scan per split took hours for 10^6)
        heap = [(-piece.count, piece) for piece in slices]
        heapq.heapify(heap)
        while heap and len(heap) < min_partitions and -heap[0][0] >= 2:
            _, largest = heapq.heappop(heap)
            for half in _split(largest, (largest.count + 1) // 2):
                heapq.heappush(heap, (-half.count, half))
        slices = [piece for _, piece in heap]
    return sorted(slices)


def pack_slices(slices: Iterable[Slice], max_partitions: int | None) -> list[tuple[Slice, ...]]:
    """The slices grouped into at most ``max_partitions`` tasks (None: one each), each slice whole: the largest
    first into the task with the fewest offsets so far; a task's slices in partition and offset order."""
    ordered = sorted(slices)
    if max_partitions is not None and (not isinstance(max_partitions, int) or max_partitions < 1):
        raise InvalidArgumentError(f"maxPartitions must be a whole number >= 1, got {max_partitions!r}")
    if max_partitions is None or len(ordered) <= max_partitions:
        return [(piece,) for piece in ordered]
    tasks: list[list[Slice]] = [[] for _ in range(max_partitions)]
    loads = [(0, index) for index in range(max_partitions)]
    for piece in sorted(ordered, key=lambda s: (-s.count, s)):
        load, index = heapq.heappop(loads)
        tasks[index].append(piece)
        heapq.heappush(loads, (load + piece.count, index))
    return sorted(tuple(sorted(task)) for task in tasks if task)


def rate_limit(start: Mapping[int, int], available: Mapping[int, int], max_rows: int | None) -> dict[int, int]:
    """Where a micro-batch ends on each partition: ``available`` (exclusive ends), or, with ``max_rows``,
    at most that many offsets in all, shared in proportion to each partition's backlog (largest remainders
    first, so the shares add up exactly and a partition with any backlog is not starved forever) (pure)."""
    backlog = {p: max(available.get(p, start[p]) - start[p], 0) for p in start}
    total = sum(backlog.values())
    if max_rows is None or total <= max_rows:
        return {p: start[p] + backlog[p] for p in start}
    if max_rows < 1:
        raise InvalidArgumentError(f"maxOffsetsPerTrigger must be a whole number >= 1, got {max_rows!r}")
    shares = {p: max_rows * backlog[p] // total for p in start}
    remainders = sorted(start, key=lambda p: (-(max_rows * backlog[p] % total), p))
    for p in remainders[: max_rows - sum(shares.values())]:
        shares[p] += 1
    return {p: start[p] + shares[p] for p in start}
