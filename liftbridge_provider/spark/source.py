"""The ``liftbridge`` PySpark data source: bounded offset ranges read from partition leaders.

On the driver, ``reader()`` resolves the offsets to one concrete ranges
document ("earliest"/"latest" become numbers, logged), checks it against the
cluster (partitions exist, ends are committed, starts still retained unless
the stream is ``compacted``) and plans input partitions with
:func:`plan_slices`. Planning never resumes a paused partition for an empty
range: its high watermark comes from the partition's metadata. On the
executors, each task reads its slice with ``LiftbridgeClient.read_range`` from
the partition leader (which follows leader changes, resumes from the last
offset + 1, and resumes a paused partition), failing only after
``readTimeout`` seconds without a new message, and yields Arrow record batches
within ``batchSize`` rows and ``batchBytes`` bytes whose schema matches
:data:`SCHEMA` exactly.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
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
from liftbridge_provider.client import BeyondHighWatermarkError, LiftbridgeClient
from liftbridge_provider.client.errors import InvalidArgumentError
from liftbridge_provider.client.watermarks import why_not_committed
from liftbridge_provider.ranges import (
    OffsetRange,
    RangesDocument,
    check_partitions,
    check_retention,
    interval_start_may_be_lost,
    partition_offsets,
)
from liftbridge_provider.spark.batches import arrow_batch
from liftbridge_provider.spark.options import Bound, ReadOptions, parse_options, parse_write_options
from liftbridge_provider.spark.planning import Slice, plan_slices
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
        wanted = check_partitions(options.partitions, count, options.stream)
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
    checked = tuple(check_range(client, document.stream, r, options) for r in document.ranges)
    resolved = RangesDocument(document.stream, checked, document.cursor_id)
    log.info("liftbridge source reads %s", resolved.dumps())
    return resolved


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


def check_range(client: LiftbridgeClient, stream: str, offset_range: OffsetRange, options: ReadOptions) -> OffsetRange:
    """The part of a range to read: refuses an end beyond the high watermark, applies failOnDataLoss.

    An empty range needs no call at all. The high watermark comes from the
    partition's metadata, which a paused partition answers without resuming;
    the oldest retained offset is only asked for on a plain (not compacted)
    stream, where that probe resumes the partition the read will resume anyway.
    """
    if offset_range.count == 0:
        return offset_range
    last = offset_range.end - 1
    info = client.wait_for_commit(stream, offset_range.partition, last)
    if last > info.high_watermark:
        raise BeyondHighWatermarkError(  # transient when a new leader's high watermark lags after a failover
            f"partition {offset_range.partition}: range [{offset_range.start}, {offset_range.end}) goes beyond "
            f"the committed high watermark {info.high_watermark}: "
            f"{why_not_committed(info, last, client.config.request_timeout)}"
        )
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


def read_slice(options: ReadOptions, stream: str, work: Slice, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Arrow batches of the messages in ``work``, read from the partition leader (or an ISR replica).

    The read resumes a paused partition, and fails with LiftbridgeTimeoutError
    only when ``options.read_timeout`` seconds pass without a new message: a
    long backlog that keeps arriving is never cut short.
    """
    fault_points.reached("source.read_slice")
    with LiftbridgeClient(options.config) as client:
        subscription = client.range_subscription(
            stream,
            work.partition,
            work.start,
            work.end,
            idle_timeout=options.read_timeout,
            read_isr_replica=options.read_from_replica,
            resume=True,
        )
        if subscription is None:
            return
        with subscription:
            for columns in subscription.column_batches(max_rows=options.batch_size, max_bytes=options.batch_bytes):
                yield arrow_batch(columns, schema, stream, work.partition)


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
        return [LiftbridgeInputPartition(s) for s in slices]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, LiftbridgeInputPartition):
            return  # no slices planned (every range empty): Spark still runs one task with its own partition
        yield from read_slice(self.options, self.document.stream, partition.slice, arrow_schema())


class LiftbridgeDataSource(DataSource):
    """``spark.read`` / ``readStream`` / ``write`` / ``writeStream`` ``.format("liftbridge")``: see
    :mod:`liftbridge_provider.spark.options` for the options. Bad options fail on the driver, when Spark
    asks for a reader or writer, before any task runs."""

    @classmethod
    def name(cls) -> str:
        return "liftbridge"

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        read_options = parse_options(self.options)
        with LiftbridgeClient(read_options.config) as client:
            document = resolve_ranges(read_options, client)
        return LiftbridgeReader(read_options, document)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from liftbridge_provider.spark.stream import LiftbridgeStreamReader  # noqa: PLC0415 - imports this module

        return LiftbridgeStreamReader(parse_options(self.options, mode="stream"))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from liftbridge_provider.spark.sink import LiftbridgeWriter  # noqa: PLC0415 - imports this module

        return LiftbridgeWriter(parse_write_options(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from liftbridge_provider.spark.sink import LiftbridgeStreamWriter  # noqa: PLC0415

        return LiftbridgeStreamWriter(parse_write_options(self.options), schema)
