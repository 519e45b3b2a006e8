"""The ``liftbridge`` PySpark data source: bounded offset ranges read from partition leaders.

On the driver, ``reader()`` resolves the offsets to one concrete ranges
document ("earliest"/"latest" become numbers, logged), checks it against the
cluster (partitions exist, ends are committed, starts still retained) and
plans input partitions with :func:`plan_slices`. On the executors, each task
reads its slice with ``LiftbridgeClient.read_range`` from the partition leader
(which follows leader changes and resumes from the last offset + 1), and
yields Arrow record batches of at most ``batchSize`` rows whose schema matches
:data:`SCHEMA` exactly.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
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

from liftbridge_provider.client import LiftbridgeClient
from liftbridge_provider.client.errors import InvalidArgumentError
from liftbridge_provider.ranges import OffsetRange, RangesDocument, check_partitions, partition_offsets
from liftbridge_provider.spark.options import ReadOptions, parse_options
from liftbridge_provider.spark.planning import Slice, plan_slices

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
    """The Arrow schema Spark expects for :data:`SCHEMA` (4.3 compares it exactly)."""
    return to_arrow_schema(SCHEMA, timezone="UTC")


@dataclass(frozen=True)
class LiftbridgeInputPartition(InputPartition):
    """One Spark task's work: a slice of one partition."""

    slice: Slice


def _offsets(client: LiftbridgeClient, stream: str, spec: str, which: str, partitions: list[int]) -> dict[int, int]:
    """Concrete ``{partition: offset}`` for a JSON spec or "earliest"/"latest"."""
    if spec.strip().lower() == "earliest":
        return {p: client.earliest_offset(stream, p) or 0 for p in partitions}
    if spec.strip().lower() == "latest":
        return {p: client.fetch_partition_metadata(stream, p).high_watermark + 1 for p in partitions}
    return partition_offsets(spec, which)


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
        starts = _offsets(client, options.stream, options.starting_offsets, "startingOffsets", wanted)
        ends = _offsets(client, options.stream, options.ending_offsets, "endingOffsets", wanted)
        chosen = [p for p in wanted if p in starts or p in ends] if options.partitions is None else wanted
        missing = [p for p in chosen if p not in starts or p not in ends]
        if missing:
            raise InvalidArgumentError(f"startingOffsets and endingOffsets must both give partitions {missing}")
        document = RangesDocument(options.stream, tuple(OffsetRange(p, starts[p], ends[p]) for p in chosen))
    if options.partitions is not None:
        document = RangesDocument(
            document.stream, tuple(document.range_for(p) for p in options.partitions), document.cursor_id
        )
    count = len(client.stream_info(document.stream).partitions)
    check_partitions([r.partition for r in document.ranges], count, document.stream)
    checked = tuple(_check_range(client, document.stream, r, options.fail_on_data_loss) for r in document.ranges)
    resolved = RangesDocument(document.stream, checked, document.cursor_id)
    log.info("liftbridge source reads %s", resolved.dumps())
    return resolved


def _check_range(
    client: LiftbridgeClient, stream: str, offset_range: OffsetRange, fail_on_data_loss: bool
) -> OffsetRange:
    if offset_range.count == 0:
        return offset_range
    high_watermark = client.fetch_partition_metadata(stream, offset_range.partition).high_watermark
    if offset_range.end - 1 > high_watermark:
        raise InvalidArgumentError(
            f"partition {offset_range.partition}: range [{offset_range.start}, {offset_range.end}) goes beyond "
            f"the committed high watermark {high_watermark}"
        )
    earliest = client.earliest_offset(stream, offset_range.partition)
    if earliest is None or earliest <= offset_range.start:
        return offset_range
    message = (
        f"partition {offset_range.partition}: offsets {offset_range.start}-{earliest - 1} were removed by retention"
    )
    if fail_on_data_loss:
        raise InvalidArgumentError(message + " (failOnDataLoss=true; set it to false to skip them)")
    log.warning("%s; reading from %d (failOnDataLoss=false)", message, earliest)
    return OffsetRange(offset_range.partition, min(earliest, offset_range.end), offset_range.end)


def read_slice(options: ReadOptions, stream: str, work: Slice, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Arrow batches of the messages in ``work``, read from the partition leader (or an ISR replica)."""
    columns: dict[str, list[Any]] = {name: [] for name in schema.names}
    with LiftbridgeClient(options.config) as client:
        messages = client.read_range(
            stream,
            work.partition,
            work.start,
            work.end,
            timeout=options.read_timeout,
            read_isr_replica=options.read_from_replica,
        )
        for message in messages:
            raw = message.raw
            columns["key"].append(raw.key)
            columns["value"].append(raw.value)
            columns["offset"].append(raw.offset)
            columns["timestamp"].append(raw.timestamp // 1000)  # nanoseconds -> microseconds
            columns["subject"].append(raw.subject)
            columns["headers"].append(list(raw.headers.items()))
            if len(columns["offset"]) >= options.batch_size:
                yield _batch(columns, stream, work.partition, schema)
                columns = {name: [] for name in schema.names}
    if columns["offset"]:
        yield _batch(columns, stream, work.partition, schema)


def _batch(columns: dict[str, list[Any]], stream: str, partition: int, schema: pa.Schema) -> pa.RecordBatch:
    rows = len(columns["offset"])
    columns["stream"] = [stream] * rows
    columns["partition"] = [partition] * rows
    arrays = [pa.array(columns[field.name], type=field.type) for field in schema]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


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
    """``spark.read.format("liftbridge")``: see :mod:`liftbridge_provider.spark.options` for the options."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.read_options = parse_options(options)  # bad options fail here, before any task runs

    @classmethod
    def name(cls) -> str:
        return "liftbridge"

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        with LiftbridgeClient(self.read_options.config) as client:
            document = resolve_ranges(self.read_options, client)
        return LiftbridgeReader(self.read_options, document)
