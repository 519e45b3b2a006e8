"""Closing a consumer group member, and taking partitions from it, while its readers hold a backlog.

A member hands messages from its partitions' readers to ``messages()`` through
a bounded queue (10,000). With a backlog bigger than that and a caller that
stops reading, every reader waits for room in the queue. These tests guard that
such a member still closes promptly (checkpoint stored, group left by the
member itself rather than by timing out, no thread or task left behind) and
that a rebalance still stops the readers of the partitions it takes away.
Promptly is within 5 s: the readers look every 0.2 s whether they were stopped,
and the defect these tests guard against took 15 s or never ended; the rest of
the bound is room for the RPCs of close() on a loaded machine.

One node with a 3 s consumer timeout: a member whose heartbeat stops is dropped
quickly, which the activity stream reports as an expired leave.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid

import pytest

from liftbridge_provider.client import (
    ActivityEvent,
    AsyncLiftbridgeClient,
    LiftbridgeClient,
    PublishMessage,
    StopPosition,
)
from liftbridge_provider.client.groups import group_cursor
from liftbridge_provider.devserver import DevServer
from tests.waiting import wait_until

BACKLOG = 5_000  # per partition; three partitions hold more than the member's queue (10,000)


@pytest.fixture(scope="module")
def node(group_node: DevServer) -> DevServer:
    """This module's client and tests use the node with short group timeouts."""
    return group_node


def stream_with_backlog(client: LiftbridgeClient, partitions: int = 3) -> str:
    name = f"cc-{uuid.uuid4().hex[:8]}"
    client.create_stream(name, name, partitions=partitions)
    batch = [PublishMessage(b"x" * 16, partition=n % partitions) for n in range(BACKLOG * partitions)]
    client.publish_batch(name, batch, ack_policy="all")
    return name


def member_threads(group: str) -> list[str]:
    """The names of the live threads a sync member of ``group`` runs (heartbeat and readers)."""
    return sorted(t.name for t in threading.enumerate() if t.name.startswith(f"liftbridge-group-{group}"))


def leaves_of(client: LiftbridgeClient, group: str, consumer_id: str) -> list[ActivityEvent]:
    """The member's leave events in the activity stream, once there is one (within 20 s)."""
    deadline = time.monotonic() + 20
    while True:
        events = client.activity(stop=StopPosition.latest(), timeout=20)
        leaves = [
            e for e in events if e.op == "leave_consumer_group" and (e.group_id, e.consumer_id) == (group, consumer_id)
        ]
        if leaves or time.monotonic() > deadline:
            return leaves
        time.sleep(0.2)


def test_a_member_with_a_full_backlog_closes_within_5s_checkpoints_and_leaves_itself(client: LiftbridgeClient) -> None:
    """A member of a three-partition stream whose readers all wait for room in its full queue is closed
    after one message was read: close() returns within 5 s, the group's cursor holds that message's
    offset, the member left the group itself (its leave is not an expiry: the heartbeat went on until it
    left), and none of its threads is still running."""
    stream, group = stream_with_backlog(client), f"g-{uuid.uuid4().hex[:6]}"
    consumer = client.consumer(group, auto_offset="earliest", fetch_assignments_interval=0.5)
    consumer.subscribe([stream])
    first = next(consumer.messages(timeout=30))
    wait_until(consumer._arrivals.full, 30, "the member's queue to fill with the backlog")
    started = time.monotonic()
    consumer.close()
    took = time.monotonic() - started
    left_running = member_threads(group)
    assert took < 5, f"close() took {took:.1f}s"
    assert not left_running, f"threads still running after close(): {left_running}"
    assert client.fetch_cursor(group_cursor(group), stream, first.partition) == first.offset
    leaves = leaves_of(client, group, consumer.consumer_id)
    assert [leave.expired for leave in leaves] == [False], f"the member left by timing out: {leaves}"


def test_a_rebalance_of_a_member_with_a_full_backlog_stops_its_readers_at_once_and_it_stays_a_member(
    client: LiftbridgeClient,
) -> None:
    """A second member joins while the first member's readers all wait for room in its full queue. The new
    epoch stops the first member's readers (subscriptions carry the epoch): they end within 5 s of its
    assignments changing, the two members settle at two partitions each, and the first member's heartbeat
    goes on meanwhile (the group never drops it for a missed heartbeat)."""
    stream, group = stream_with_backlog(client, partitions=4), f"g-{uuid.uuid4().hex[:6]}"
    first = client.consumer(group, auto_offset="earliest", fetch_assignments_interval=0.5)
    second = client.consumer(group, auto_offset="earliest", fetch_assignments_interval=0.5)
    try:
        first.subscribe([stream])
        wait_until(lambda: len(first.assignments) == 4, 20, "the first member to hold all 4 partitions")
        wait_until(first._arrivals.full, 30, "the first member's queue to fill with the backlog")
        readers = [t for t in threading.enumerate() if t.name.startswith(f"liftbridge-group-{group}-{stream}-")]
        assert len(readers) == 4, [t.name for t in readers]
        second.subscribe([stream])
        wait_until(lambda: len(first.assignments) < 4, 20, "the first member's assignments to change")
        changed_at = time.monotonic()
        wait_until(lambda: not any(t.is_alive() for t in readers), 10, "the first member's old readers to end")
        took = time.monotonic() - changed_at
        assert took < 5, f"the old readers ended {took:.1f}s after the assignments changed"
        wait_until(lambda: len(first.assignments) == len(second.assignments) == 2, 20, "a 2 + 2 split")
    finally:
        first.close()
        second.close()
    expired = [leave for leave in leaves_of(client, group, first.consumer_id) if leave.expired]
    assert not expired, f"the first member was dropped for a missed heartbeat: {expired}"


def test_an_asyncio_member_with_a_full_backlog_closes_within_5s_checkpoints_and_leaves_itself(
    node: DevServer, client: LiftbridgeClient
) -> None:
    """The asyncio member in the same state as the sync one above: close() returns within 5 s, the
    group's cursor holds the offset of the message read, the member left the group itself, and none of
    its tasks is still running."""
    stream, group = stream_with_backlog(client), f"g-{uuid.uuid4().hex[:6]}"

    async def scenario() -> tuple[float, list[str], tuple[int, int], str]:
        async with AsyncLiftbridgeClient(node.brokers) as aio:
            consumer = aio.consumer(group, auto_offset="earliest", fetch_assignments_interval=0.5)
            await consumer.subscribe([stream])
            messages = consumer.messages(timeout=30)
            first = await anext(messages)
            ends = time.monotonic() + 30
            while not consumer._arrivals.full():
                assert time.monotonic() < ends, "the member's queue never filled with the backlog"
                await asyncio.sleep(0.05)
            started = time.monotonic()
            await consumer.close()
            took = time.monotonic() - started
            running = sorted(
                t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith(f"liftbridge-group-{group}")
            )
            return took, running, (first.partition, first.offset), consumer.consumer_id

    took, running, (partition, offset), consumer_id = asyncio.run(scenario())
    assert took < 5, f"close() took {took:.1f}s"
    assert not running, f"tasks still running after close(): {running}"
    assert client.fetch_cursor(group_cursor(group), stream, partition) == offset
    leaves = leaves_of(client, group, consumer_id)
    assert [leave.expired for leave in leaves] == [False], f"the member left by timing out: {leaves}"


def test_cancelling_an_asyncio_members_close_cancels_it(node: DevServer, client: LiftbridgeClient) -> None:
    """close() swallowed the cancellation of the task running it (it suppressed every CancelledError while it
    awaited its own heartbeat task): task.cancel() was lost and close() went on to checkpoint and leave, so
    asyncio.timeout() around it never fired. Cancelling close() now cancels it."""
    stream, group = stream_with_backlog(client), f"g-{uuid.uuid4().hex[:6]}"

    async def scenario() -> bool:
        async with AsyncLiftbridgeClient(node.brokers) as aio:
            consumer = aio.consumer(group, auto_offset="earliest", fetch_assignments_interval=0.5)
            await consumer.subscribe([stream])
            await consumer.wait_for_assignments(settle=0.5, timeout=10)
            closing = asyncio.create_task(consumer.close())
            await asyncio.sleep(0)  # close() now awaits the member's heartbeat task
            closing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await closing
            cancelled = closing.cancelled()
            await consumer.close()  # a second close ends what the first one left
            return cancelled

    assert asyncio.run(scenario()), "the cancellation of close() was swallowed"
