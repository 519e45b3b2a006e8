"""A bounded read: the subscription to offsets ``[start, end)`` of one partition, decided against the committed
high watermark (refuse a range beyond it, wait for it, or truncate the range to it)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Literal, Protocol

from liftbridge_provider.client import watermarks
from liftbridge_provider.client.errors import BeyondHighWatermarkError, LiftbridgeTimeoutError
from liftbridge_provider.client.messages import Message, StartPosition, StopPosition
from liftbridge_provider.client.metadata import PartitionInfo
from liftbridge_provider.client.options import ClientConfig
from liftbridge_provider.client.retry import Deadline, left_of
from liftbridge_provider.client.subscription import Subscription
from liftbridge_provider.core import checks
from liftbridge_provider.core.checks import check_timeout
from liftbridge_provider.core.errors import InvalidArgumentError, LiftbridgeError

log = logging.getLogger(__name__)

BeyondHighWatermark = Literal["refuse", "wait", "truncate"]


class RangeReader(Protocol):
    """The parts of ``LiftbridgeClient`` a bounded read uses (a range, and the offset lookups of
    ``offset_lookup.py``)."""

    config: ClientConfig

    def fetch_partition_metadata(
        self, stream: str, partition: int = 0, *, timeout: float | None = None
    ) -> PartitionInfo:
        """Partition metadata from the leader."""
        ...

    def wait_for_commit(
        self, stream: str, partition: int, offset: int, *, timeout: float | None = None
    ) -> PartitionInfo:
        """Partition metadata once ``offset`` is committed, or when waiting cannot bring it."""
        ...

    def earliest_offset(
        self,
        stream: str,
        partition: int = 0,
        *,
        timeout: float | None = None,
        resume: bool = False,
        probe: float = 2.0,
    ) -> int | None:
        """The oldest retained offset (high watermark + 1 when retention removed every message)."""
        ...

    def subscribe(
        self,
        stream: str,
        *,
        partition: int = 0,
        start: StartPosition | None = None,
        stop: StopPosition | None = None,
        read_isr_replica: bool | None = None,
        resume: bool = False,
        timeout: float | None = None,
        idle_timeout: float | None = None,
        resubscribe_wait: float | None = None,
    ) -> Subscription:
        """A subscription to one partition."""
        ...


def range_subscription(
    client: RangeReader,
    stream: str,
    partition: int,
    start: int,
    end: int,
    *,
    beyond_high_watermark: BeyondHighWatermark,
    timeout: float | None,
    idle_timeout: float | None,
    read_isr_replica: bool | None,
    resume: bool,
) -> Subscription | None:
    """The subscription of :meth:`LiftbridgeClient.range_subscription` (its docstring says what each argument
    does), None for an empty range; the arguments are checked first, before anything is asked."""
    bounds = _bounds(
        client,
        stream,
        partition,
        start,
        end,
        beyond_high_watermark=beyond_high_watermark,
        timeout=timeout,
        idle_timeout=idle_timeout,
        read_isr_replica=read_isr_replica,
        resume=resume,
    )
    if bounds is None:
        return None
    last, deadline, _committed = bounds
    return client.subscribe(
        stream,
        partition=partition,
        start=StartPosition.at_offset(start),
        stop=StopPosition.at_offset(last),
        read_isr_replica=read_isr_replica,
        resume=resume,
        timeout=left_of(deadline, "read_range", stream=stream, partition=partition),
        idle_timeout=idle_timeout,
    )


RETENTION_PROBE = 5.0
"""Seconds a read of committed offsets may go without a message, its call confirmed by the leader, before it asks
what retention kept: the leader sends committed messages at once, and when retention removed every message
from the next wanted offset on, it sends nothing at all, ever (the server does not check a start offset
against its log)."""


def read_range(
    client: RangeReader,
    stream: str,
    partition: int,
    start: int,
    end: int,
    *,
    beyond_high_watermark: BeyondHighWatermark,
    timeout: float | None,
    idle_timeout: float | None,
    read_isr_replica: bool | None,
    resume: bool,
) -> Iterator[Message]:
    """The messages of :meth:`LiftbridgeClient.read_range`; the arguments and the high watermark are checked
    now, the messages read as they are iterated (:func:`_committed_or_waited`)."""
    bounds = _bounds(
        client,
        stream,
        partition,
        start,
        end,
        beyond_high_watermark=beyond_high_watermark,
        timeout=timeout,
        idle_timeout=idle_timeout,
        read_isr_replica=read_isr_replica,
        resume=resume,
    )
    if bounds is None:
        return iter(())
    last, deadline, committed = bounds
    return _committed_or_waited(
        client,
        stream,
        partition,
        start,
        last,
        deadline=deadline,
        committed=committed,
        idle_timeout=idle_timeout,
        read_isr_replica=read_isr_replica,
        resume=resume,
    )


def _committed_or_waited(
    client: RangeReader,
    stream: str,
    partition: int,
    start: int,
    last: int,
    *,
    deadline: Deadline | None,
    committed: bool,
    idle_timeout: float | None,
    read_isr_replica: bool | None,
    resume: bool,
) -> Iterator[Message]:
    """Offsets ``start..last``. When they are committed and the leader confirmed the read and then said nothing
    for :data:`RETENTION_PROBE` seconds, the oldest retained offset is asked for: what retention removed is
    skipped, as the server itself skips a removed head when something after it is retained, and the read ends
    when nothing of the range is left. Without that evidence (no answer, a leader that never confirmed) the
    read waits on as any subscription does."""
    silent = 0.0  # seconds without a message, over the subscriptions the probes ended
    while start <= last:
        probe = committed and (idle_timeout is None or idle_timeout - silent > RETENTION_PROBE)
        subscription = client.subscribe(
            stream,
            partition=partition,
            start=StartPosition.at_offset(start),
            stop=StopPosition.at_offset(last),
            read_isr_replica=read_isr_replica,
            resume=resume,
            timeout=left_of(deadline, "read_range", stream=stream, partition=partition),
            idle_timeout=RETENTION_PROBE if probe else (None if idle_timeout is None else idle_timeout - silent),
        )
        try:
            with subscription:
                yield from subscription
            return
        except LiftbridgeTimeoutError:
            if not probe or (deadline is not None and deadline.expired):
                raise
        if subscription.last_offset is not None:
            start, silent = subscription.last_offset + 1, 0.0
        silent += RETENTION_PROBE
        if subscription.established:
            start = _first_retained_from(client, stream, partition, start, resume)
        else:
            committed = False  # no leader confirmed it: wait on as any subscription does


def _first_retained_from(client: RangeReader, stream: str, partition: int, offset: int, resume: bool) -> int:
    """``offset``, or the oldest offset retention kept when that is later; ``offset`` without an answer."""
    try:
        earliest = client.earliest_offset(stream, partition, resume=resume)
    except LiftbridgeError as exc:
        log.info("%s/%d: a silent read could not learn what retention kept (%s); waiting on", stream, partition, exc)
        return offset
    if earliest is None or earliest <= offset:
        return offset
    log.info("%s/%d: retention removed offsets %d-%d while they were read", stream, partition, offset, earliest - 1)
    return earliest


def _bounds(
    client: RangeReader,
    stream: str,
    partition: int,
    start: int,
    end: int,
    *,
    beyond_high_watermark: BeyondHighWatermark,
    timeout: float | None,
    idle_timeout: float | None,
    read_isr_replica: bool | None,
    resume: bool,
) -> tuple[int, Deadline | None, bool] | None:
    """The checked arguments of a bounded read as (last offset to read, deadline, whether the range is
    committed), None for an empty range; the arguments are checked first, before anything is asked."""
    check_timeout("timeout", timeout)
    check_timeout("idle_timeout", idle_timeout)
    checks.check_flag(resume, "resume")
    if read_isr_replica is not None:
        checks.check_flag(read_isr_replica, "read_isr_replica")
    checks.check_stream_name(stream)
    checks.check_partition(partition, stream=stream)  # also for an empty range, which returns before any call
    checks.check_offset(start, "start")
    checks.check_offset(end, "end")
    if end < start:
        raise InvalidArgumentError(f"range end {end} is before start {start}", stream=stream, partition=partition)
    if beyond_high_watermark not in ("refuse", "wait", "truncate"):
        raise InvalidArgumentError(
            f"beyond_high_watermark must be 'refuse', 'wait' or 'truncate', got {beyond_high_watermark!r}"
        )
    if start == end:
        return None
    deadline = Deadline(timeout) if timeout is not None else None
    last = end - 1
    if beyond_high_watermark == "wait":
        return last, deadline, False
    wait = max(deadline.remaining(), 0.001) if deadline is not None else client.config.request_timeout
    if beyond_high_watermark == "refuse":
        info = client.wait_for_commit(stream, partition, last, timeout=wait)
    else:
        info = client.fetch_partition_metadata(stream, partition)
    high_watermark = info.high_watermark
    if last > high_watermark and beyond_high_watermark == "refuse":
        raise BeyondHighWatermarkError(
            f"range [{start}, {end}) goes beyond the committed high watermark {high_watermark}: "
            f"{watermarks.why_not_committed(info, last, wait)} (retry later, or read with "
            "beyond_high_watermark='wait')",
            stream=stream,
            partition=partition,
        )
    last = min(last, high_watermark)
    if start > last:
        return None
    return last, deadline, True
