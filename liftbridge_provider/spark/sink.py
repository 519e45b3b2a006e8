"""``df.write.format("liftbridge")`` and ``writeStream``: each task publishes its rows with ``publish_batch``.

Columns: ``value`` (binary or string, required), ``key`` (binary or string),
``headers`` (map of string to binary or string), ``partition`` (int: where the
row goes; else the ``partitioner`` option), ``offset`` (bigint: the expected
offset, with ``useOffsets``). The columns of the source's own schema that
make no sense to publish (``stream``, ``timestamp``, ``subject``) are ignored,
so a DataFrame read from Liftbridge can be written back; any other column is
refused on the driver.

Guarantee: at least once (as Spark's Kafka sink). A task publishes in
batches of ``batchSize`` rows and fails if any message failed, naming how
many were acked; Spark's retry publishes the task's rows again. With
``useOffsets`` on a stream created with optimistic concurrency control, each
row carries its expected offset: a message a failed attempt already stored is
refused as an incorrect offset, checked to be the same message, and counted as
written, so every row is stored once per partition (exactly once).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, IntegerType, LongType, MapType, StringType, StructType

from liftbridge_provider.client import (
    IncorrectOffsetError,
    InvalidArgumentError,
    LiftbridgeClient,
    LiftbridgeError,
    PublishMessage,
    partition_by_key,
    partition_by_round_robin,
)
from liftbridge_provider.client.partitioners import Partitioner
from liftbridge_provider.client.publish.batch_result import BatchResult
from liftbridge_provider.spark.options import WriteOptions
from liftbridge_provider.version_compat import DataSourceStreamArrowWriter

log = logging.getLogger(__name__)

TEXT_OR_BYTES = (BinaryType, StringType)
COLUMNS = {
    "value": TEXT_OR_BYTES,
    "key": TEXT_OR_BYTES,
    "partition": (IntegerType, LongType),
    "offset": (LongType, IntegerType),
    "headers": (MapType,),
}
IGNORED = ("stream", "timestamp", "subject")


def check_schema(schema: StructType, options: WriteOptions) -> None:
    """Refuse, on the driver, a DataFrame the sink cannot publish, naming the column and what is allowed."""
    fields = {f.name: f.dataType for f in schema.fields}
    if "value" not in fields:
        raise InvalidArgumentError(f"a DataFrame written to Liftbridge needs a value column; it has {sorted(fields)}")
    for name, kind in fields.items():
        if name in IGNORED:
            continue
        if name not in COLUMNS:
            raise InvalidArgumentError(
                f"column {name!r} cannot be written to Liftbridge: the columns are {sorted(COLUMNS)} "
                f"(and {', '.join(IGNORED)}, ignored)"
            )
        if not isinstance(kind, COLUMNS[name]):
            allowed = " or ".join(k.__name__ for k in COLUMNS[name])
            raise InvalidArgumentError(f"column {name!r} is {kind.simpleString()}; it must be {allowed}")
        if isinstance(kind, MapType) and not (
            isinstance(kind.keyType, StringType) and isinstance(kind.valueType, TEXT_OR_BYTES)
        ):
            raise InvalidArgumentError(
                f"column 'headers' must be map<string, binary or string>, got {kind.simpleString()}"
            )
    if options.use_offsets and not {"offset", "partition"} <= set(fields):
        raise InvalidArgumentError("option useOffsets needs an offset and a partition column")


@dataclass
class Published(WriterCommitMessage):
    """What a task published: messages acked (or sent, with ack policy NONE) per partition."""

    messages: int = 0
    already_stored: int = 0
    partitions: dict[int, int] = field(default_factory=dict)


def _bytes(value: bytes | str | None) -> bytes | None:
    return value.encode() if isinstance(value, str) else value


def messages_of(batch: pa.RecordBatch, use_offsets: bool) -> list[PublishMessage]:
    """The rows of an Arrow record batch as messages (a null value is an empty one)."""
    columns = batch.to_pydict()
    rows = batch.num_rows
    keys = columns.get("key", [None] * rows)
    headers = columns.get("headers", [None] * rows)
    partitions = columns.get("partition", [None] * rows)
    offsets = columns.get("offset", [None] * rows) if use_offsets else [None] * rows
    if use_offsets:  # a null would mean "the next offset": stored again by a retried task
        for index, (partition, offset) in enumerate(zip(partitions, offsets, strict=True)):
            if partition is None or offset is None:
                missing = "offset" if offset is None else "partition"
                raise InvalidArgumentError(
                    f"row #{index} has no {missing}: with useOffsets every row needs its partition and offset "
                    "(exactly once rests on them); nothing of this batch was sent"
                )
    return [
        PublishMessage(
            value=_bytes(value) or b"",
            key=_bytes(key),
            headers={name: _bytes(v) or b"" for name, v in header} if header else None,
            partition=partition,
            expected_offset=offset,
        )
        for value, key, header, partition, offset in zip(
            columns["value"], keys, headers, partitions, offsets, strict=True
        )
    ]


def publish_rows(options: WriteOptions, batches: Iterator[pa.RecordBatch]) -> Published:
    """Publish a task's rows in batches of ``batchSize``; raise on any failure, saying how many were acked."""
    published = Published()
    partitioner: Partitioner = partition_by_key if options.partitioner == "key" else partition_by_round_robin()
    pending: list[PublishMessage] = []
    with LiftbridgeClient(options.config) as client:
        count = len(client.stream_info(options.stream).partitions)

        def placed(message: PublishMessage) -> PublishMessage:
            """A row without a partition goes where the partitioner says."""
            if message.partition is not None:
                return message
            partition = partitioner(options.stream, message.key, message.value, count)
            return replace(message, partition=partition)

        for batch in batches:
            pending.extend(map(placed, messages_of(batch, options.use_offsets)))
            while len(pending) >= options.batch_size:
                _publish(client, options, pending[: options.batch_size], published)
                del pending[: options.batch_size]
        if pending:
            _publish(client, options, pending, published)
    log.info(
        "published %d messages to %s (%d already stored)", published.messages, options.stream, published.already_stored
    )
    return published


def _publish(
    client: LiftbridgeClient, options: WriteOptions, messages: Sequence[PublishMessage], published: Published
) -> None:
    result = client.publish_batch(options.stream, messages, ack_policy=options.ack_policy, raise_on_error=False)
    failed = {f.index: f.error for f in result.failures}
    if options.use_offsets and failed:
        for index in _already_stored(client, options.stream, messages, failed):
            del failed[index]
            published.already_stored += 1
    for index, ack in enumerate(result.acks):
        if index not in failed and ack is not None:
            published.partitions[ack.partition] = published.partitions.get(ack.partition, 0) + 1
    published.messages += len(messages) - len(failed)
    if failed:
        raise _failed(options.stream, result, failed, published)


def _already_stored(
    client: LiftbridgeClient, stream: str, messages: Sequence[PublishMessage], failed: dict[int, LiftbridgeError]
) -> list[int]:
    """Messages refused for their expected offset that the partition holds already, identical (an earlier
    attempt of the task stored them): read back and compared, key and value."""
    wanted: dict[tuple[int, int], int] = {}
    for index, error in failed.items():
        message = messages[index]
        if (
            isinstance(error, IncorrectOffsetError)
            and message.partition is not None
            and message.expected_offset is not None
        ):
            wanted[(message.partition, message.expected_offset)] = index
    stored = []
    for partition in sorted({p for p, _ in wanted}):
        offsets = [o for p, o in wanted if p == partition]
        high_watermark = client.fetch_partition_metadata(stream, partition).high_watermark
        end = min(max(offsets) + 1, high_watermark + 1)
        for held in client.read_range(stream, partition, min(offsets), max(end, min(offsets))):
            found = wanted.get((partition, held.offset))
            if found is not None and (held.key or None, held.value) == (
                messages[found].key or None,
                messages[found].value,
            ):
                stored.append(found)
    return stored


def _failed(
    stream: str, result: BatchResult, failed: dict[int, LiftbridgeError], published: Published
) -> LiftbridgeError:
    shown = "; ".join(f"#{i}: {e}" for i, e in sorted(failed.items())[:5])
    maybe = sum(e.may_be_stored for e in failed.values())
    return LiftbridgeError(
        f"{len(failed)} of {len(result.acks)} messages of this batch failed ({maybe} may be stored): {shown}; "
        f"{published.messages} message(s) of this task were acked before it failed; Spark's retry publishes them "
        "again unless useOffsets is on",
        stream=stream,
    )


class LiftbridgeWriter(DataSourceArrowWriter):
    """The batch sink: each task publishes its rows (see the module docstring)."""

    def __init__(self, options: WriteOptions, schema: StructType) -> None:
        check_schema(schema, options)
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Published:
        return publish_rows(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        total = sum(m.messages for m in messages if isinstance(m, Published))
        log.info("liftbridge sink: %d messages published to %s", total, self.options.stream)


class LiftbridgeStreamWriter(DataSourceStreamArrowWriter):
    """The streaming sink: each micro-batch's tasks publish their rows; at least once across retries."""

    def __init__(self, options: WriteOptions, schema: StructType) -> None:
        check_schema(schema, options)
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Published:
        return publish_rows(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        total = sum(m.messages for m in messages if isinstance(m, Published))
        log.info("liftbridge sink: micro-batch %d published %d messages to %s", batchId, total, self.options.stream)
