"""A bounded read: the subscription to offsets ``[start, end)`` of one partition, decided against the committed
high watermark (refuse a range beyond it, wait for it, or truncate the range to it)."""

from __future__ import annotations

from typing import Literal, Protocol

from liftbridge_provider.client import watermarks
from liftbridge_provider.client.errors import BeyondHighWatermarkError
from liftbridge_provider.client.messages import StartPosition, StopPosition
from liftbridge_provider.client.metadata import PartitionInfo
from liftbridge_provider.client.options import ClientConfig
from liftbridge_provider.client.retry import Deadline
from liftbridge_provider.client.subscription import Subscription
from liftbridge_provider.core import checks
from liftbridge_provider.core.checks import check_timeout
from liftbridge_provider.core.errors import InvalidArgumentError

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
    if beyond_high_watermark != "wait":
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
    return client.subscribe(
        stream,
        partition=partition,
        start=StartPosition.at_offset(start),
        stop=StopPosition.at_offset(last),
        read_isr_replica=read_isr_replica,
        resume=resume,
        timeout=deadline.left("read_range") if deadline is not None else None,
        idle_timeout=idle_timeout,
    )
