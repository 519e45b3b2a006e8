"""``spark.readStream.format("liftbridge")``: micro-batches of offset ranges, checkpointed by Spark.

An offset is ``{"<partition>": next offset}`` (JSON, as Spark checkpoints it).
The driver (this reader) says where each micro-batch ends: the committed high
watermark + 1 of every partition, cut by ``maxOffsetsPerTrigger`` in
proportion to each partition's backlog
(:func:`~liftbridge_provider.core.spark_planning.rate_limit`), and never past
what was there when an ``availableNow`` query started.

PySpark 4.2+ hands ``latestOffset`` the micro-batch's start and read limit
(admission control) and supports ``availableNow`` through
``prepareForTriggerAvailableNow``. PySpark 4.0 and 4.1 ask ``latestOffset()``
with neither: the reader then keeps the start itself (the initial offsets,
then the end of each micro-batch Spark plans) and applies
``maxOffsetsPerTrigger`` on its own. Those versions run an ``availableNow``
query as one micro-batch up to what ``latestOffset`` first answered, so with
``maxOffsetsPerTrigger`` such a query reads at most that many offsets and
ends (the next run goes on from its checkpoint); the reader logs this once. Each
micro-batch's ranges are checked (``failOnDataLoss``) and planned into tasks
with the batch reader's planner; the tasks read them as the batch reader's
tasks do. Spark writes a micro-batch's offsets to its checkpoint before
running it and re-runs the same offsets after a restart, so a sink that is
exactly-once with the checkpoint (the file sink, Delta) gets every offset once.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from liftbridge_provider.client import CursorMovedError, InvalidArgumentError, LiftbridgeClient
from liftbridge_provider.core.ranges import OffsetRange, check_chosen_partitions, check_partitions, partition_offsets
from liftbridge_provider.core.spark_planning import plan_slices, rate_limit
from liftbridge_provider.spark.options import ReadOptions
from liftbridge_provider.spark.reader import (
    LiftbridgeInputPartition,
    arrow_schema,
    check_range,
    read_slice,
    start_offsets,
)
from liftbridge_provider.version_compat import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

log = logging.getLogger(__name__)

Offsets = dict[str, int]


def _offsets(value: dict[str, Any]) -> dict[int, int]:
    return partition_offsets(value, "streaming offset")


def _json(offsets: dict[int, int]) -> Offsets:
    return {str(p): o for p, o in sorted(offsets.items())}


class LiftbridgeStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The driver's side of a streaming read; ``read`` runs on the executors. See the module docstring."""

    def __init__(self, options: ReadOptions) -> None:
        assert options.stream is not None
        self.options = options
        self.stream: str = options.stream
        self._target: dict[int, int] | None = None  # availableNow: where the query stops
        self._planned = False  # latestOffset was called before by this reader: its start is a committed end
        self._next_start: dict[str, Any] | None = None  # without admission control: where the next batch starts
        self._initial: Offsets | None = None  # the first answer of initialOffset: Spark asks more than once
        self._told_no_admission = False

    def _client(self) -> LiftbridgeClient:
        return LiftbridgeClient(self.options.config)

    def _partitions(self, client: LiftbridgeClient) -> list[int]:
        count = len(client.stream_info(self.stream).partitions)
        return check_chosen_partitions(self.options.partitions, count, self.stream)

    def _available(self, client: LiftbridgeClient, partitions: list[int]) -> dict[int, int]:
        """The high watermark + 1 of each partition (committed offsets only; a paused one is not resumed)."""
        return {p: client.fetch_partition_metadata(self.stream, p).high_watermark + 1 for p in partitions}

    def initialOffset(self) -> Offsets:
        """Where the query starts (``startingOffsets`` or ``startingTimestamp``), resolved once per query run:
        Spark asks again for the same first micro-batch, and "latest" of a later moment would start it
        after the end Spark had already checkpointed for it."""
        if self._initial is not None:
            return dict(self._initial)
        with self._client() as client:
            partitions = self._partitions(client)
            assert self.options.starting_offsets is not None
            count = len(client.stream_info(self.stream).partitions)  # a partition the stream lacks is an error
            check_partitions(self.options.starting_offsets.named_partitions(), count, self.stream)
            starts = start_offsets(client, self.stream, self.options.starting_offsets, partitions)
        missing = [p for p in partitions if p not in starts]
        if missing:  # read from 0 before, in silence (the batch reader refuses the same)
            raise InvalidArgumentError(
                f"{self.options.starting_offsets.name} gives no start for partitions {missing} of stream "
                f"{self.stream!r}, which this query reads ({partitions}): name each of them, set partitions to "
                "the ones named, or use earliest / latest"
            )
        log.info("liftbridge stream %s starts at %s", self.stream, starts)
        initial = self._initial = _json({p: starts[p] for p in partitions})
        if self._next_start is None:
            self._next_start = dict(initial)
        return dict(initial)

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        with self._client() as client:
            self._target = self._available(client, self._partitions(client))
        log.info("liftbridge stream %s: availableNow reads up to %s", self.stream, self._target)

    def latestOffset(self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None) -> Offsets:
        """Where the next micro-batch ends. PySpark 4.2+ gives its ``start`` and ``limit``; without them
        (PySpark 4.0, 4.1) the start is the one this reader kept and the limit ``maxOffsetsPerTrigger``."""
        if start is None:
            start, limit = self._own_start_and_limit()
        begin = _offsets(start)
        with self._client() as client:
            if self._planned:  # Spark plans a micro-batch only after the one before it was committed
                self._move_cursor(client, begin)
            self._planned = True
            available = self._available(client, list(begin))
        if self._target is not None:
            available = {p: min(end, self._target.get(p, end)) for p, end in available.items()}
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return _json(rate_limit(begin, available, max_rows))

    def _own_start_and_limit(self) -> tuple[dict[str, Any], ReadLimit]:
        """Without admission control: the start kept by this reader (the initial offsets when Spark has not
        planned a micro-batch yet), and ``maxOffsetsPerTrigger`` as the limit."""
        if self._next_start is None:
            self._next_start = dict(self.initialOffset())
        if self.options.max_offsets_per_trigger is not None and not self._told_no_admission:
            self._told_no_admission = True
            log.warning(
                "liftbridge stream %s: this PySpark has no admission control for Python sources (PySpark 4.2+): "
                "the reader applies maxOffsetsPerTrigger=%d itself; an availableNow query reads one micro-batch "
                "of at most that many offsets and ends (docs/spark.md, 'Versions')",
                self.stream,
                self.options.max_offsets_per_trigger,
            )
        return self._next_start, self.getDefaultReadLimit()

    def reportLatestOffset(self) -> Offsets | None:
        with self._client() as client:
            return _json(self._available(client, self._partitions(client)))

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        begin, finish = _offsets(start), _offsets(end)
        self._next_start = dict(end)  # the next micro-batch starts where this one ends
        for p in sorted(begin):
            if p in finish and begin[p] > finish[p]:
                # Only the first micro-batch of a query restarted before it committed: its start was
                # resolved again (a later "latest" or timestamp), after its end had been checkpointed.
                log.warning(
                    "liftbridge stream %s partition %d: the first micro-batch ends at %d, but its start was "
                    "resolved again after a restart as %d; it starts at its end, and what was published "
                    "before %d since the query first started is not read (give startingOffsets as offsets "
                    "to start at a fixed place)",
                    self.stream,
                    p,
                    finish[p],
                    begin[p],
                    finish[p],
                )
                begin[p] = finish[p]
        ranges = [OffsetRange(p, begin[p], finish.get(p, begin[p])) for p in sorted(begin)]
        with self._client() as client:
            checked = [check_range(client, self.stream, r, self.options) for r in ranges]
        slices = plan_slices(
            checked,
            min_partitions=self.options.min_partitions,
            max_records_per_partition=self.options.max_records_per_partition,
        )
        return [LiftbridgeInputPartition(s) for s in slices]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, LiftbridgeInputPartition)
        yield from read_slice(self.options, self.stream, partition.slice, arrow_schema())

    def commit(self, end: dict[str, Any]) -> None:
        """Spark committed the micro-batch that ends at ``end``: move ``commitCursorId`` (if given) to it."""
        with self._client() as client:
            self._move_cursor(client, _offsets(end))

    def _move_cursor(self, client: LiftbridgeClient, ends: dict[int, int]) -> None:
        """``commitCursorId`` to ``end - 1`` per partition (the last offset committed), never backwards.

        Spark tells a source that a micro-batch was committed when it plans the next
        one (``commit``), so the last micro-batch of a query would only be told at
        the next start; ``latestOffset`` is asked once more after it, with its end.
        """
        cursor_id = self.options.commit_cursor_id
        if cursor_id is None:
            return
        for partition, end in ends.items():
            if end <= 0:
                continue
            try:
                client.advance_cursor(cursor_id, self.stream, partition, end - 1)  # the cursor-advance rule
            except CursorMovedError as moved:  # already past: never moved back
                log.debug("%s", moved)
