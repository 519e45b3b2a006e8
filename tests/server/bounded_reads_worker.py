"""Run as a script by test_read_memory: many bounded reads of a small range in a fresh interpreter, and the
process's resident memory before and after them.

Arguments: the broker address, the stream (offsets 0-4 at least), the way of reading (one of :data:`READS`
or :data:`AIO_READS`), the warm-up reads (not counted: the allocators and caches grow to their working size)
and the counted reads. Prints one JSON line: ``rss_before`` and ``rss_after`` in bytes (``/proc/self/statm``,
after a garbage collection), ``reads`` and ``seconds`` (of the counted reads).
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable

from liftbridge_provider.client import LiftbridgeClient, StartPosition, StopPosition
from liftbridge_provider.client.aio import AsyncLiftbridgeClient

END = 5  # each read is offsets [0, END)


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def read_range(client: LiftbridgeClient, stream: str) -> int:
    return sum(1 for _ in client.read_range(stream, 0, 0, END))


def bounded_subscribe(client: LiftbridgeClient, stream: str) -> int:
    start, stop = StartPosition.at_offset(0), StopPosition.at_offset(END - 1)
    with client.subscribe(stream, start=start, stop=stop) as subscription:
        return sum(1 for _ in subscription)


def stop_at_last_offset(client: LiftbridgeClient, stream: str) -> int:
    """The caller leaves at the range's last message, without asking for the end after it."""
    subscription = client.range_subscription(stream, 0, 0, END)
    assert subscription is not None
    taken = 0
    with subscription:
        for message in subscription:
            taken += 1
            if message.offset == END - 1:
                break
    return taken


def column_batches(client: LiftbridgeClient, stream: str) -> int:
    """The Spark task's read (``read_slice`` reads each slice this way)."""
    subscription = client.range_subscription(stream, 0, 0, END)
    assert subscription is not None
    with subscription:
        return sum(len(batch.offsets_list()) for batch in subscription.column_batches(max_rows=100, max_bytes=1 << 20))


def earliest_offset(client: LiftbridgeClient, stream: str) -> int:
    """A short read: ``earliest_offset`` subscribes from the earliest position and leaves after the first
    message (its call is cancelled before the server ends it)."""
    assert client.earliest_offset(stream, 0) == 0
    return END


def read_range_broken_off(client: LiftbridgeClient, stream: str) -> int:
    """The caller breaks off a bounded read after its first message, before the stop offset."""
    for _ in client.read_range(stream, 0, 0, END):
        break
    return END


def cancelled_unbounded(client: LiftbridgeClient, stream: str) -> int:
    """A subscription without a stop, cancelled after its first message (from the reading thread)."""
    with client.subscribe(stream, start=StartPosition.at_offset(0)) as subscription:
        next(subscription)
        subscription.cancel()
    return END


async def aio_bounded_subscribe(client: AsyncLiftbridgeClient, stream: str) -> int:
    messages = client.subscribe(stream, 0, 0, stop=StopPosition.at_offset(END - 1))
    try:
        return len([message async for message in messages])
    finally:
        await messages.aclose()


async def aio_left_early(client: AsyncLiftbridgeClient, stream: str) -> int:
    """The caller leaves after the first message of a subscription without a stop (its call is cancelled)."""
    messages = client.subscribe(stream, 0, 0)
    try:
        async for _ in messages:
            return END
        return 0
    finally:
        await messages.aclose()


READS: dict[str, Callable[[LiftbridgeClient, str], int]] = {
    "read_range": read_range,
    "bounded_subscribe": bounded_subscribe,
    "stop_at_last_offset": stop_at_last_offset,
    "column_batches": column_batches,
    "earliest_offset": earliest_offset,
    "read_range_broken_off": read_range_broken_off,
    "cancelled_unbounded": cancelled_unbounded,
}
AIO_READS: dict[str, Callable[[AsyncLiftbridgeClient, str], Awaitable[int]]] = {
    "aio_bounded_subscribe": aio_bounded_subscribe,
    "aio_left_early": aio_left_early,
}


def measured(read: Callable[[], int], warm_up: int, reads: int) -> dict[str, float]:
    for _ in range(warm_up):
        assert read() == END
    gc.collect()
    before, started = resident_bytes(), time.perf_counter()
    for _ in range(reads):
        assert read() == END
    seconds = time.perf_counter() - started
    gc.collect()
    return {"rss_before": before, "rss_after": resident_bytes(), "reads": reads, "seconds": seconds}


async def measured_async(
    read: Callable[[AsyncLiftbridgeClient, str], Awaitable[int]], broker: str, stream: str, warm_up: int, reads: int
) -> dict[str, float]:
    async with AsyncLiftbridgeClient([broker]) as client:
        for _ in range(warm_up):
            assert await read(client, stream) == END
        gc.collect()
        before, started = resident_bytes(), time.perf_counter()
        for _ in range(reads):
            assert await read(client, stream) == END
        seconds = time.perf_counter() - started
        gc.collect()
        return {"rss_before": before, "rss_after": resident_bytes(), "reads": reads, "seconds": seconds}


def main(broker: str, stream: str, way: str, warm_up: int, reads: int) -> None:
    if way in AIO_READS:
        outcome = asyncio.run(measured_async(AIO_READS[way], broker, stream, warm_up, reads))
    else:
        with LiftbridgeClient([broker]) as client:
            read = READS[way]
            outcome = measured(lambda: read(client, stream), warm_up, reads)
    print(json.dumps(outcome))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
