"""Offsets found by reading: the oldest offset still stored, and the offset at a time.

The server has no call for either: both are answered by short subscriptions
(the first message from the earliest position; the first message at a time,
checked by :mod:`~liftbridge_provider.core.time_search`, whose decisions
are pure). The sync client's ``earliest_offset`` and ``offset_at_time``
check their arguments and call these with one :class:`Deadline` for every
question asked.
"""

from __future__ import annotations

import logging

from liftbridge_provider.client.errors import BeyondHighWatermarkError, LiftbridgeTimeoutError
from liftbridge_provider.client.messages import Message, StartPosition, StopPosition
from liftbridge_provider.client.range_read import RangeReader
from liftbridge_provider.client.retry import Deadline
from liftbridge_provider.core.time_search import first_offset_at_or_after

log = logging.getLogger(__name__)

TO_THE_END = StopPosition.at_time(2**62)
"""A stop far in the future: the server looks it up in the log's time index, which fails at once when
the log's segment is empty, and the subscription ends empty (this is how an empty log is told apart from a
silent leader)."""
ENDED_EMPTY = -2  # first_retained: the subscription ended before any message (nothing up to its stop)


def earliest_offset(
    client: RangeReader, stream: str, partition: int, deadline: Deadline, *, resume: bool, probe: float
) -> int | None:
    """See ``LiftbridgeClient.earliest_offset``: None for a partition that never held a message, high
    watermark + 1 when retention removed every message, else the first retained offset."""

    def left() -> float:
        return deadline.left("earliest_offset", stream=stream, partition=partition)

    def first_up_to(stop: StopPosition, seconds: float) -> int | None:
        return first_retained(client, stream, partition, stop, seconds=seconds, resume=resume)

    high_watermark = client.fetch_partition_metadata(stream, partition, timeout=left()).high_watermark
    if high_watermark < 0:
        return None
    up_to_committed = StopPosition.at_offset(high_watermark)
    first = first_up_to(up_to_committed, min(probe, left()))
    if first == ENDED_EMPTY:  # the server's own answer: its log starts past the high watermark
        log.info("%s/%d: nothing retained up to the high watermark %d", stream, partition, high_watermark)
        return high_watermark + 1
    if first is not None:
        return first
    first = first_up_to(TO_THE_END, left())
    if first == ENDED_EMPTY:  # the server found no message to look the stop time up in: the log holds none
        first = first_up_to(up_to_committed, min(probe, left()))
        if first is not None and first != ENDED_EMPTY:
            return first
        log.info("%s/%d: retention removed every message up to offset %d", stream, partition, high_watermark)
        return high_watermark + 1
    if first is None:
        raise LiftbridgeTimeoutError(
            f"the leader delivered no retained message within {deadline.timeout:g}s",
            stream=stream,
            partition=partition,
        )
    return first


def offset_at_time(client: RangeReader, stream: str, partition: int, nanoseconds: int, deadline: Deadline) -> int:
    """See ``LiftbridgeClient.offset_at_time``: the offset from which every committed message was received
    at or after ``nanoseconds`` since the epoch."""
    high_watermark = committed_newest(client, stream, partition, deadline)
    earliest = earliest_offset(
        client, stream, partition, Deadline(max(deadline.remaining(), 0.001)), resume=True, probe=2.0
    )
    if earliest is None:
        return 0
    if earliest > high_watermark:
        return earliest  # nothing retained
    up_to_committed = StopPosition.at_offset(high_watermark)

    def read(offset: int) -> tuple[int, int] | None:
        message = first_message(
            client, stream, partition, start=StartPosition.at_offset(offset), stop=up_to_committed, deadline=deadline
        )
        return None if message is None else (message.offset, message.timestamp)

    hint = first_message(
        client, stream, partition, start=StartPosition.at_time(nanoseconds), stop=up_to_committed, deadline=deadline
    )
    return first_offset_at_or_after(
        nanoseconds,
        earliest=earliest,
        high_watermark=high_watermark,
        hint=high_watermark + 1 if hint is None else hint.offset,
        read=read,
    )


def committed_newest(client: RangeReader, stream: str, partition: int, deadline: Deadline) -> int:
    """The high watermark once it covers the newest offset the leader held when asked."""
    info = client.fetch_partition_metadata(
        stream, partition, timeout=deadline.left("offset_at_time", stream=stream, partition=partition)
    )
    if info.newest_offset <= info.high_watermark:
        return info.high_watermark
    newest = info.newest_offset
    info = client.wait_for_commit(stream, partition, newest, timeout=max(deadline.remaining(), 0.001))
    if info.high_watermark < newest:
        raise BeyondHighWatermarkError(
            f"offsets {info.high_watermark + 1}-{newest} are not committed yet and may be older "
            "than the time asked for; retry later",
            stream=stream,
            partition=partition,
        )
    return info.high_watermark


def first_message(
    client: RangeReader, stream: str, partition: int, *, start: StartPosition, stop: StopPosition, deadline: Deadline
) -> Message | None:
    """The first message from ``start`` up to ``stop``, None when there is none; a silent leader is a timeout."""
    seconds = deadline.left("reading the first message", stream=stream, partition=partition)
    subscription = client.subscribe(
        stream, partition=partition, start=start, stop=stop, timeout=seconds, resume=True, resubscribe_wait=seconds
    )
    with subscription:
        return next(subscription, None)


def first_retained(
    client: RangeReader, stream: str, partition: int, stop: StopPosition, *, seconds: float, resume: bool
) -> int | None:
    """The offset of the first message from the earliest position, None if none came within ``seconds``,
    or :data:`ENDED_EMPTY` if the subscription ended before any (nothing retained up to ``stop``)."""
    if seconds <= 0:
        return None
    subscription = client.subscribe(
        stream,
        partition=partition,
        start=StartPosition.earliest(),
        stop=stop,
        timeout=seconds,
        resume=resume,
        resubscribe_wait=seconds,
    )
    try:
        with subscription:
            first = next(subscription, None)
    except LiftbridgeTimeoutError:
        return None
    return ENDED_EMPTY if first is None else first.offset
