"""The batch reader of the ``liftbridge`` data source: bounded offset ranges read from partition leaders.

On the driver, :func:`resolve_ranges` turns the options into one concrete ranges
document ("earliest"/"latest" become numbers, logged), checks it against the
cluster (partitions exist, ends are committed, starts still retained unless
the stream is ``compacted``; with ``checkRanges=false`` only that the
partitions exist), and :class:`LiftbridgeReader` plans input
partitions with :func:`plan_slices`. Planning never resumes a paused partition
for an empty range: its high watermark comes from the partition's metadata. On
the executors, each task reads its slice (:func:`read_slice`) from the
partition leader (which follows leader changes, resumes from the last offset +
1, and resumes a paused partition), failing only after ``readTimeout`` seconds
without a new message, and yields Arrow record batches within ``batchSize``
rows and ``batchBytes`` bytes whose schema matches :data:`SCHEMA` exactly. The
stream reader (:mod:`~liftbridge_provider.spark.stream`) plans and reads its
micro-batches with the same functions.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from liftbridge_provider import fault_points
from liftbridge_provider.client import BeyondHighWatermarkError, ClientConfig, LiftbridgeClient, LiftbridgeTimeoutError
from liftbridge_provider.client.watermarks import why_not_committed
from liftbridge_provider.core.errors import InvalidArgumentError
from liftbridge_provider.core.ranges import (
    OffsetRange,
    RangesDocument,
    check_chosen_partitions,
    check_partitions,
    check_retention,
    interval_start_may_be_lost,
    partition_offsets,
)
from liftbridge_provider.core.spark_planning import Slice, pack_slices, plan_slices
from liftbridge_provider.spark.batches import arrow_batch
from liftbridge_provider.spark.options import Bound, ReadOptions
from liftbridge_provider.version_compat import ARROW_SCHEMA_UTC

log = logging.getLogger(__name__)

SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("stream", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("subject", StringType()),
        StructField("headers", MapType(StringType(), BinaryType())),
    ]
)
"""key binary, value binary, stream string, partition int, offset bigint, timestamp timestamp,
subject string, headers map<string,binary> (all nullable)."""


def arrow_schema() -> pa.Schema:
    """The Arrow schema Spark expects for :data:`SCHEMA`, timestamps in UTC (4.3 compares it exactly)."""
    return to_arrow_schema(SCHEMA, **ARROW_SCHEMA_UTC)


@dataclass(frozen=True)
class LiftbridgeInputPartition(InputPartition):
    """One Spark task's work: a slice of one partition."""

    slice: Slice


@dataclass(frozen=True)
class PackedInputPartition(InputPartition):
    """One Spark task's work with ``maxPartitions``: whole slices, read one after the other."""

    slices: tuple[Slice, ...]


def start_offsets(client: LiftbridgeClient, stream: str, bound: Bound, partitions: list[int]) -> dict[int, int]:
    """Concrete ``{partition: offset}`` for a JSON spec, "earliest"/"latest", or times."""
    if bound.times is not None:
        times = {p: bound.time_of(p) for p in partitions}
        return {p: client.offset_at_time(stream, p, ms * 1_000_000) for p, ms in times.items() if ms is not None}
    assert bound.offsets is not None
    spec = bound.offsets.strip().lower()
    if spec == "earliest":
        return {p: _earliest(client, stream, p) for p in partitions}
    if spec == "latest":
        return {p: client.fetch_partition_metadata(stream, p).high_watermark + 1 for p in partitions}
    return partition_offsets(bound.offsets, bound.name)


def _earliest(client: LiftbridgeClient, stream: str, partition: int) -> int:
    """The oldest retained offset (0 for a partition that never held a message).

    An empty partition is answered from its metadata, so a paused one stays
    paused; otherwise the range that starts here will be read, so finding its
    start may resume the partition.
    """
    if client.fetch_partition_metadata(stream, partition).high_watermark < 0:
        return 0
    return client.earliest_offset(stream, partition, resume=True) or 0


def resolve_ranges(options: ReadOptions, client: LiftbridgeClient) -> RangesDocument:
    """The concrete ranges to read, checked against the cluster; raises InvalidArgumentError when they cannot be."""
    if options.ranges is not None:
        document = RangesDocument.parse(options.ranges)
        if options.stream is not None and options.stream != document.stream:
            raise InvalidArgumentError(f"option stream {options.stream!r} differs from the ranges' {document.stream!r}")
    else:
        assert options.stream is not None
        assert options.starting_offsets is not None
        assert options.ending_offsets is not None
        count = len(client.stream_info(options.stream).partitions)
        wanted = check_chosen_partitions(options.partitions, count, options.stream)
        for bound in (options.starting_offsets, options.ending_offsets):  # none dropped in silence
            check_partitions(bound.named_partitions(), count, options.stream)
        starts = start_offsets(client, options.stream, options.starting_offsets, wanted)
        ends = start_offsets(client, options.stream, options.ending_offsets, wanted)
        chosen = [p for p in wanted if p in starts or p in ends] if options.partitions is None else wanted
        missing = [p for p in chosen if p not in starts or p not in ends]
        if missing:
            raise InvalidArgumentError(
                f"{options.starting_offsets.name} and {options.ending_offsets.name} must both give partitions {missing}"
            )
        document = RangesDocument(options.stream, tuple(OffsetRange(p, starts[p], ends[p]) for p in chosen))
        if options.starting_offsets.times is not None:
            for offset_range in document.ranges:
                _check_time_start(client, options, offset_range)
    if options.partitions is not None:
        document = RangesDocument(
            document.stream, tuple(document.range_for(p) for p in options.partitions), document.cursor_id
        )
    count = len(client.stream_info(document.stream).partitions)
    check_partitions([r.partition for r in document.ranges], count, document.stream)
    checked = (
        tuple(each_range(lambda r: check_range(client, document.stream, r, options), document.ranges))
        if options.check_ranges
        else document.ranges  # the caller checked them (checkRanges=false): the tasks still see a lost head
    )
    resolved = RangesDocument(document.stream, checked, document.cursor_id)
    log.info("liftbridge source reads %s", resolved.dumps())
    return resolved


CHECK_THREADS = 16
"""Ranges checked at once when a read is planned or an ingest starts (two requests each when a read is planned:
256 partitions took 1.3 s one by one)."""

R = TypeVar("R")


def each_range(check: Callable[[OffsetRange], R], ranges: Sequence[OffsetRange]) -> list[R]:
    """``check`` of every range, in order, on up to :data:`CHECK_THREADS` threads (the client is thread-safe);
    the first range whose check raised, in ``ranges``' order, is the error raised, as one after the other."""
    if len(ranges) <= 1:
        return [check(r) for r in ranges]
    with ThreadPoolExecutor(min(CHECK_THREADS, len(ranges)), thread_name_prefix="liftbridge-plan") as pool:
        return list(pool.map(check, ranges))


def _check_time_start(client: LiftbridgeClient, options: ReadOptions, offset_range: OffsetRange) -> None:
    """A range started from a time at the oldest retained offset may have lost messages: failOnDataLoss."""
    assert options.stream is not None
    assert options.starting_offsets is not None
    milliseconds = options.starting_offsets.time_of(offset_range.partition)
    info = client.fetch_partition_metadata(options.stream, offset_range.partition)
    if milliseconds is None or info.high_watermark < 0:
        return
    earliest = client.earliest_offset(options.stream, offset_range.partition, resume=True)
    lost = interval_start_may_be_lost(
        offset_range,
        earliest,
        compacted=options.compacted,
        start_time=milliseconds * 1_000_000,
        latest_received=info.messages_received.latest,
    )
    if not lost:
        return
    message = (
        f"partition {offset_range.partition}: {options.starting_offsets.name} starts at offset "
        f"{offset_range.start}, the oldest one retention kept: messages received after that time may have "
        "been removed"
    )
    if options.fail_on_data_loss:
        raise InvalidArgumentError(message + " (failOnDataLoss=true; set it to false to read what is left)")
    log.warning("%s (failOnDataLoss=false)", message)


def check_end_committed(client: LiftbridgeClient, stream: str, offset_range: OffsetRange) -> None:
    """BeyondHighWatermarkError when the last offset of a non-empty range is above the partition's committed
    high watermark (waiting, within ``request_timeout``, while the leader holds it uncommitted)."""
    last = offset_range.end - 1
    info = client.wait_for_commit(stream, offset_range.partition, last)
    if last > info.high_watermark:
        raise BeyondHighWatermarkError(  # transient when a new leader's high watermark lags after a failover
            f"partition {offset_range.partition}: range [{offset_range.start}, {offset_range.end}) goes beyond "
            f"the committed high watermark {info.high_watermark}: "
            f"{why_not_committed(info, last, client.config.request_timeout)}"
        )


def check_range(client: LiftbridgeClient, stream: str, offset_range: OffsetRange, options: ReadOptions) -> OffsetRange:
    """The part of a range to read: refuses an end beyond the high watermark, applies failOnDataLoss.

    An empty range needs no call at all. The high watermark comes from the
    partition's metadata, which a paused partition answers without resuming;
    the oldest retained offset is only asked for on a plain (not compacted)
    stream, where that probe resumes the partition the read will resume anyway.
    """
    if offset_range.count == 0:
        return offset_range
    check_end_committed(client, stream, offset_range)
    if options.compacted:
        return offset_range  # gaps are normal on a compacted stream: nothing is reported lost
    earliest = client.earliest_offset(stream, offset_range.partition, resume=True)
    checked = check_retention(offset_range, earliest, compacted=False)
    if checked.lost is None:
        return offset_range
    first, end = checked.lost
    message = f"partition {offset_range.partition}: offsets {first}-{end - 1} were removed by retention"
    if options.fail_on_data_loss:
        raise InvalidArgumentError(
            message + " (failOnDataLoss=true; set it to false to skip them, or compacted=true for a compacted stream)"
        )
    log.warning("%s; reading from %d (failOnDataLoss=false)", message, checked.readable.start)
    return checked.readable


_TASK_CLIENTS: dict[tuple[int, ClientConfig], LiftbridgeClient] = {}
_TASK_CLIENTS_LOCK = threading.Lock()


def task_client(config: ClientConfig) -> LiftbridgeClient:
    """This process's client for ``config``, made by its first task and kept for the next ones (Spark reuses
    a Python worker for many tasks). Each task used to make and close its own: closing grpc's channel took
    0.2 s, so 256 small pieces cost 25 s on two cores. Keyed by process id too: a worker forked from a
    process that had one makes its own."""
    key = (os.getpid(), config)
    with _TASK_CLIENTS_LOCK:
        client = _TASK_CLIENTS.get(key)
        if client is None:
            client = _TASK_CLIENTS[key] = LiftbridgeClient(config)
        return client


RETENTION_PROBE = 5.0
"""Seconds of silence after which a task asks whether retention removed what it still waits for."""


def read_slice(options: ReadOptions, stream: str, work: Slice, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Arrow batches of the messages in ``work``, read from the partition leader (or an ISR replica).

    The read resumes a paused partition, and fails with LiftbridgeTimeoutError
    only when ``options.read_timeout`` seconds pass without a new message: a
    long backlog that keeps arriving is never cut short. Retention may remove
    what is left of the slice after the driver checked it: the server then
    sends nothing at all, so after :data:`RETENTION_PROBE` seconds of silence
    the task asks for the oldest retained offset, and skips what retention
    removed (``failOnDataLoss=false``; a compacted stream, where gaps are
    normal) or fails naming it (InvalidArgumentError), instead of waiting out
    ``readTimeout``.

    The task does not ask the leader's high watermark before it reads (a request per slice): the planner, or
    the caller with ``checkRanges=false``, checked the ends committed, and the server sends only committed
    messages. After :data:`RETENTION_PROBE` seconds of silence the task checks the slice's end as the planner
    does (:func:`check_end_committed`: BeyondHighWatermarkError within ``requestTimeout`` when it is not
    committed, as after a restarted leader's high watermark moved back), then what retention kept. A read
    that starts past the slice's first offset on a plain stream (the server began at the oldest offset it
    kept) is a loss too, reported the same way.
    """
    fault_points.reached("source.read_slice")
    client = task_client(options.config)
    start, quiet_since = work.start, time.monotonic()
    while start < work.end:
        silent = time.monotonic() - quiet_since
        subscription = client.range_subscription(
            stream,
            work.partition,
            start,
            work.end,
            beyond_high_watermark="wait",  # the end was checked committed before (above); again on silence
            idle_timeout=max(min(RETENTION_PROBE, options.read_timeout - silent), 0.001),
            read_isr_replica=options.read_from_replica,
            resume=True,
        )
        if subscription is None:
            return
        head = True  # the subscription's first row: where the server began, past a head retention removed
        try:
            with subscription:
                batches = subscription.column_batches(max_rows=options.batch_size, max_bytes=options.batch_bytes)
                for columns in batches:
                    batch = arrow_batch(columns, schema, stream, work.partition)
                    if batch.num_rows:
                        offsets = batch.column("offset")
                        if head and not options.compacted and offsets[0].as_py() > start:
                            _lost(options, work.partition, start, offsets[0].as_py())
                        head = False
                        start, quiet_since = offsets[-1].as_py() + 1, time.monotonic()
                    yield batch
            return  # the subscription reached the slice's last offset
        except LiftbridgeTimeoutError:
            if time.monotonic() - quiet_since >= options.read_timeout:
                raise
        check_end_committed(client, stream, OffsetRange(work.partition, start, work.end))
        start = _after_retention(client, stream, OffsetRange(work.partition, start, work.end), options)


def _after_retention(client: LiftbridgeClient, stream: str, rest: OffsetRange, options: ReadOptions) -> int:
    """Where a silent read goes on: ``rest.start`` when retention kept it (the read waits on), else past
    what retention removed (logged), or InvalidArgumentError naming it with failOnDataLoss."""
    earliest = client.earliest_offset(stream, rest.partition, resume=True)
    if earliest is None or earliest <= rest.start:
        return rest.start
    if options.compacted:
        return earliest  # gaps are normal on a compacted stream: nothing is reported lost
    first, end = check_retention(rest, earliest, compacted=False).lost or (rest.start, rest.start)
    _lost(options, rest.partition, first, end)
    return end


def _lost(options: ReadOptions, partition: int, first: int, end: int) -> None:
    """Offsets ``first..end-1`` were removed by retention before the task read them (the server sends from the
    oldest one it kept): InvalidArgumentError naming them with ``failOnDataLoss``, else a warning."""
    message = f"partition {partition}: offsets {first}-{end - 1} were removed by retention while they were read"
    if options.fail_on_data_loss:
        raise InvalidArgumentError(message + " (failOnDataLoss=true; set it to false to skip them)")
    log.warning("%s; skipped (failOnDataLoss=false)", message)


class LiftbridgeReader(DataSourceReader):
    """Plans slices on the driver; reads one slice per task on the executors."""

    def __init__(self, options: ReadOptions, document: RangesDocument) -> None:
        self.options = options
        self.document = document

    def partitions(self) -> list[InputPartition]:
        slices = plan_slices(
            self.document.ranges,
            min_partitions=self.options.min_partitions,
            max_records_per_partition=self.options.max_records_per_partition,
        )
        if self.options.max_partitions is None:
            return [LiftbridgeInputPartition(s) for s in slices]
        return [PackedInputPartition(task) for task in pack_slices(slices, self.options.max_partitions)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, LiftbridgeInputPartition):
            yield from read_slice(self.options, self.document.stream, partition.slice, arrow_schema())
        elif isinstance(partition, PackedInputPartition):
            for piece in partition.slices:
                yield from read_slice(self.options, self.document.stream, piece, arrow_schema())
        # else no slices were planned (every range empty): Spark still runs one task with its own partition
