"""Request building, shared by the sync and asyncio clients.

Every function here is pure: it checks its input (with the checks of
:mod:`liftbridge_provider.core.checks`) and returns a protobuf request, or
raises :class:`InvalidArgumentError` naming the bad value and what is allowed.
Nothing is sent from here.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client.errors import CursorsDisabledError, NoSuchStreamError
from liftbridge_provider.client.messages import AckPolicy, StartPosition, StopPosition
from liftbridge_provider.client.metadata import Metadata
from liftbridge_provider.core.checks import (
    INT32_MAX,
    check_bytes,
    check_cursor_id,
    check_flag,
    check_group,
    check_headers,
    check_offset,
    check_partition,
    check_partition_count,
    check_stream_name,
    check_subject,
    check_whole,
)
from liftbridge_provider.core.errors import InvalidArgumentError
from liftbridge_provider.core.stream_options import StreamOptions

ALL_BROKERS = -1
"""``replication_factor`` meaning "a replica on every broker"."""

RESERVED_STREAMS = frozenset({"__activity", "__cursors"})


def check_not_reserved_subject(subject: str, snapshot: Metadata, action: str) -> str:
    """``subject`` unless it is the subject of one of the server's own streams in ``snapshot``, or of one of
    their partitions (``<subject>.<n>``): a message published there lands in that stream, and one that is not
    of its kind breaks every reader of it (``activity()`` fails on it for good)."""
    for name in sorted(RESERVED_STREAMS):
        info = snapshot.streams.get(name)
        if info is None:
            continue
        rest = subject[len(info.subject) :] if subject.startswith(info.subject) else None
        if rest == "" or (rest is not None and rest.startswith(".") and rest[1:].isdigit()):
            raise InvalidArgumentError(
                f"cannot {action} subject {subject!r}: it is the subject of the server's own stream {name!r}, "
                "which only Liftbridge writes"
            )
    return subject


def check_not_reserved(name: str, action: str) -> str:
    """``name`` unless it is one of the server's own streams, which a client may read but not create,
    publish to, pause or make readonly (a stray message or a readonly ``__cursors`` breaks every cursor)."""
    if name in RESERVED_STREAMS:
        raise InvalidArgumentError(
            f"cannot {action} stream {name!r}: it is reserved by Liftbridge (streams {sorted(RESERVED_STREAMS)} "
            "are the server's own)",
            stream=name,
        )
    return name


CURSORS_STREAM = "__cursors"


def check_cursor_target(snapshot: Metadata, stream: str, partition: int) -> int:
    """The ``__cursors`` partition count, once sure that cursors are enabled and the partition exists.

    Raises CursorsDisabledError, NoSuchStreamError or NoSuchPartitionError: the server itself
    would store a cursor for any stream and partition, and answer -1 for one that does not exist.
    """
    cursors = snapshot.streams.get(CURSORS_STREAM)
    if cursors is None:
        raise CursorsDisabledError(
            "cursors are disabled on this server: set cursors.stream.partitions (the partitions of its "
            "__cursors stream, 0 by default) in the server's configuration",
            stream=stream,
            partition=partition,
        )
    if stream not in snapshot.streams:
        raise NoSuchStreamError(f"no stream named {stream!r}", stream=stream, partition=partition)
    snapshot.stream(stream).partition(partition)
    return len(cursors.partitions)


def knows_cursor_target(snapshot: Metadata, stream: str, partition: int) -> bool:
    """Whether ``snapshot`` can answer :func:`check_cursor_target` without a refresh."""
    known = snapshot.streams.get(stream)
    return CURSORS_STREAM in snapshot.streams and known is not None and partition in known.partitions


def create_stream_request(
    subject: str,
    name: str,
    *,
    partitions: int = 1,
    replication_factor: int = 1,
    options: StreamOptions | None = None,
    **settings: object,
) -> api.CreateStreamRequest:
    """A CreateStreamRequest; settings (:class:`StreamOptions`, or its fields as keyword arguments) left as
    None keep the server's defaults.

    The server subscribes to ``subject`` (partition 0) and ``subject.N`` (partition N) in
    queue group ``group``, so the highest partition's subject and the group must fit one
    NATS protocol line (see :func:`check_subject`).
    """
    if options is not None and not isinstance(options, StreamOptions):
        raise InvalidArgumentError(
            f"options must be a StreamOptions (or give its fields as keyword arguments), got {options!r:.80}"
        )
    chosen = StreamOptions.of({**(options.given() if options is not None else {}), **settings})
    check_not_reserved(check_stream_name(name), "create")
    check_partition_count(partitions)
    checked_group = check_group(chosen.group)
    check_subject(subject, suffix=f".{partitions - 1}" if partitions > 1 else "", group=checked_group)
    values = chosen.checked()
    if type(replication_factor) is not int or replication_factor != ALL_BROKERS:
        check_whole(replication_factor, "replication_factor (or -1 for every broker)", minimum=1, maximum=INT32_MAX)
        if int(values.get("minIsr", 1)) > replication_factor:
            raise InvalidArgumentError(
                f"min_isr {values['minIsr']} is more than replication_factor {replication_factor}: no message "
                "could ever commit (ack_policy 'all' would always time out, and readers would see nothing)",
                stream=name,
            )
    request = api.CreateStreamRequest(
        subject=subject, name=name, group=checked_group, partitions=partitions, replicationFactor=replication_factor
    )
    for field, value in values.items():
        getattr(request, field).value = value
    return request


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
    ack_inbox: str = "",
) -> api.PublishRequest:
    """A PublishRequest. ``expected_offset`` None means "next offset" (-1 on the wire); ``ack_inbox`` a NATS
    subject the server publishes the ack to (empty: its own)."""
    request = api.PublishRequest(
        stream=stream,
        partition=partition,
        value=check_bytes(value, "value"),
        ackPolicy=ack_policy.value,
        expectedOffset=-1 if expected_offset is None else check_offset(expected_offset, "expected_offset"),
        correlationId=correlation_id,
    )
    if ack_inbox:
        request.ackInbox = check_subject(ack_inbox)
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
    check_flag(read_isr_replica, "read_isr_replica")
    check_flag(resume, "resume")
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


def partition_metadata_request(
    stream: str, partition: int, *, settle: bool = True
) -> api.FetchPartitionMetadataRequest:
    """The request, its arguments checked (``settle`` is the caller's flag: see ``fetch_partition_metadata``)."""
    check_flag(settle, "settle")
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
