"""Request building and input validation, shared by the sync and asyncio clients.

Every function here is pure: it checks its input and returns a protobuf
request, or raises :class:`InvalidArgumentError` naming the bad value and what
is allowed. Nothing is sent from here.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Mapping
from datetime import timedelta

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client.errors import InvalidArgumentError
from liftbridge_provider.client.messages import AckPolicy, StartPosition, StopPosition

ALL_BROKERS = -1
"""``replication_factor`` meaning "a replica on every broker"."""

RESERVED_STREAMS = frozenset({"__activity", "__cursors"})
CURSORS_STREAM = "__cursors"
_BAD_NAME = re.compile(r"[\s/\\\x00-\x1f]")
_BAD_SUBJECT_TOKEN = re.compile(r"[\s*>\x00-\x1f]")

Duration = timedelta | int | float
"""A duration: a timedelta, or a number of seconds."""


def check_stream_name(name: object) -> str:
    """A stream name: a non-empty string without white space, slashes or control characters."""
    if not isinstance(name, str) or not name or _BAD_NAME.search(name) or name in {".", ".."}:
        raise InvalidArgumentError(
            f"invalid stream name {name!r}: use a non-empty string without spaces, slashes or control characters"
        )
    return name


def check_subject(subject: object) -> str:
    """A NATS subject to publish on: dot-separated non-empty tokens, no wildcards or white space."""
    tokens = subject.split(".") if isinstance(subject, str) else []
    if not tokens or any(not t or _BAD_SUBJECT_TOKEN.search(t) for t in tokens):
        raise InvalidArgumentError(
            f"invalid subject {subject!r}: use dot-separated non-empty tokens without spaces or wildcards (* >)"
        )
    return subject  # type: ignore[return-value]


def check_partition(partition: object, partitions: int | None = None, stream: str | None = None) -> int:
    """A partition number >= 0, and below ``partitions`` when the count is known."""
    if not isinstance(partition, int) or isinstance(partition, bool) or partition < 0:
        raise InvalidArgumentError(f"partition must be a whole number >= 0, got {partition!r}", stream=stream)
    if partitions is not None and partition >= partitions:
        raise InvalidArgumentError(
            f"no partition {partition}: stream {stream!r} has partitions 0-{partitions - 1}",
            stream=stream,
            partition=partition,
        )
    return partition


def check_offset(offset: object, name: str = "offset", *, minimum: int = 0) -> int:
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < minimum:
        raise InvalidArgumentError(f"{name} must be a whole number >= {minimum}, got {offset!r}")
    return offset


def check_bytes(value: object, name: str) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise InvalidArgumentError(f"{name} must be bytes, got {type(value).__name__} {value!r:.60}")


def check_headers(headers: Mapping[str, bytes] | None) -> dict[str, bytes]:
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise InvalidArgumentError(f"headers must be a mapping of str to bytes, got {headers!r:.60}")
    checked = {}
    for key, value in headers.items():
        if not isinstance(key, str):
            raise InvalidArgumentError(f"header names must be str, got {key!r}")
        checked[key] = check_bytes(value, f"header {key!r}")
    return checked


def to_millis(value: Duration, name: str) -> int:
    """Milliseconds from a timedelta or seconds; refuses negative values."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise InvalidArgumentError(f"{name} must be a timedelta or a number of seconds, got {value!r}")
    if seconds < 0 or math.isnan(seconds):
        raise InvalidArgumentError(f"{name} must not be negative, got {value!r}")
    return round(seconds * 1000)


def _positive(value: int, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidArgumentError(f"{name} must be a whole number >= 1, got {value!r}")
    return value


def create_stream_request(
    subject: str,
    name: str,
    *,
    group: str | None = None,
    partitions: int = 1,
    replication_factor: int = 1,
    retention_max_bytes: int | None = None,
    retention_max_messages: int | None = None,
    retention_max_age: Duration | None = None,
    cleaner_interval: Duration | None = None,
    segment_max_bytes: int | None = None,
    segment_max_age: Duration | None = None,
    compact_enabled: bool | None = None,
    compact_max_goroutines: int | None = None,
    auto_pause_time: Duration | None = None,
    auto_pause_disable_if_subscribers: bool | None = None,
    min_isr: int | None = None,
    optimistic_concurrency_control: bool | None = None,
    encryption: bool | None = None,
) -> api.CreateStreamRequest:
    """A CreateStreamRequest; options left as None keep the server's defaults."""
    check_subject(subject)
    check_stream_name(name)
    if name in RESERVED_STREAMS:
        raise InvalidArgumentError(f"stream name {name!r} is reserved by Liftbridge", stream=name)
    _positive(partitions, "partitions")
    if replication_factor != ALL_BROKERS:
        _positive(replication_factor, "replication_factor (or -1 for every broker)")
    request = api.CreateStreamRequest(
        subject=subject, name=name, group=group or "", partitions=partitions, replicationFactor=replication_factor
    )
    for field, count in (
        ("retentionMaxBytes", retention_max_bytes),
        ("retentionMaxMessages", retention_max_messages),
        ("segmentMaxBytes", segment_max_bytes),
    ):
        if count is not None:
            getattr(request, field).value = check_offset(count, _snake(field))
    for field, duration in (
        ("retentionMaxAge", retention_max_age),
        ("cleanerInterval", cleaner_interval),
        ("segmentMaxAge", segment_max_age),
        ("autoPauseTime", auto_pause_time),
    ):
        if duration is not None:
            getattr(request, field).value = to_millis(duration, _snake(field))
    for field, count in (("compactMaxGoroutines", compact_max_goroutines), ("minIsr", min_isr)):
        if count is not None:
            getattr(request, field).value = _positive(count, _snake(field))
    for field, flag in (
        ("compactEnabled", compact_enabled),
        ("autoPauseDisableIfSubscribers", auto_pause_disable_if_subscribers),
        ("optimisticConcurrencyControl", optimistic_concurrency_control),
        ("encryption", encryption),
    ):
        if flag is not None:
            if not isinstance(flag, bool):
                raise InvalidArgumentError(f"{_snake(field)} must be True or False, got {flag!r}")
            getattr(request, field).value = flag
    return request


def _snake(camel: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", camel).lower()


def publish_request(
    stream: str,
    value: bytes,
    *,
    partition: int,
    key: bytes | None = None,
    headers: Mapping[str, bytes] | None = None,
    ack_policy: AckPolicy = AckPolicy.LEADER,
    expected_offset: int | None = None,
    correlation_id: str = "",
) -> api.PublishRequest:
    """A PublishRequest. ``expected_offset`` None means "next offset" (-1 on the wire)."""
    request = api.PublishRequest(
        stream=stream,
        partition=partition,
        value=check_bytes(value, "value"),
        ackPolicy=ack_policy.value,
        expectedOffset=-1 if expected_offset is None else check_offset(expected_offset, "expected_offset"),
        correlationId=correlation_id,
    )
    if key is not None:
        request.key = check_bytes(key, "key")
    if headers:
        request.headers.update(check_headers(headers))
    elif headers is not None:
        check_headers(headers)
    return request


def subscribe_request(
    stream: str,
    partition: int,
    start: StartPosition,
    stop: StopPosition | None,
    *,
    read_isr_replica: bool = False,
    resume: bool = False,
) -> api.SubscribeRequest:
    if not isinstance(start, StartPosition):
        raise InvalidArgumentError(f"start must be a StartPosition, got {start!r}")
    if stop is not None and not isinstance(stop, StopPosition):
        raise InvalidArgumentError(f"stop must be a StopPosition or None, got {stop!r}")
    if stop is not None and stop.kind == api.STOP_OFFSET and start.kind == api.OFFSET and stop.offset < start.offset:
        raise InvalidArgumentError(f"stop offset {stop.offset} is before start offset {start.offset}", stream=stream)
    request = api.SubscribeRequest(
        stream=check_stream_name(stream),
        partition=check_partition(partition, stream=stream),
        startPosition=start.kind,  # type: ignore[arg-type]
        startOffset=start.offset,
        startTimestamp=start.timestamp,
        readISRReplica=read_isr_replica,
        resume=resume,
    )
    if stop is not None:
        request.stopPosition = stop.kind  # type: ignore[assignment]
        request.stopOffset = stop.offset
        request.stopTimestamp = stop.timestamp
    return request


def cursor_partition(cursor_id: str, stream: str, partition: int, cursor_partitions: int) -> int:
    """The ``__cursors`` partition that stores a cursor: CRC-32 IEEE of ``"id,stream,partition"`` mod count."""
    key = f"{cursor_id},{stream},{partition}".encode()
    return zlib.crc32(key) % cursor_partitions


def partition_metadata_request(stream: str, partition: int) -> api.FetchPartitionMetadataRequest:
    return api.FetchPartitionMetadataRequest(
        stream=check_stream_name(stream), partition=check_partition(partition, stream=stream)
    )


def set_cursor_request(cursor_id: str, stream: str, partition: int, offset: int) -> api.SetCursorRequest:
    """A SetCursorRequest; ``offset`` is the last processed offset (-1: none)."""
    return api.SetCursorRequest(
        cursorId=check_cursor_id(cursor_id),
        stream=check_stream_name(stream),
        partition=check_partition(partition, stream=stream),
        offset=check_offset(offset, "cursor offset", minimum=-1),
    )


def fetch_cursor_request(cursor_id: str, stream: str, partition: int) -> api.FetchCursorRequest:
    return api.FetchCursorRequest(
        cursorId=check_cursor_id(cursor_id),
        stream=check_stream_name(stream),
        partition=check_partition(partition, stream=stream),
    )


def check_cursor_id(cursor_id: object) -> str:
    if not isinstance(cursor_id, str) or not cursor_id or "," in cursor_id:
        raise InvalidArgumentError(f"cursor_id must be a non-empty string without commas, got {cursor_id!r}")
    return cursor_id
