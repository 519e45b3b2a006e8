"""Bounded reads release their Subscribe calls: a long-lived process (an Airflow worker, the triggerer, a
Spark executor) that reads many small ranges keeps a flat resident memory; and a read whose stop offset was
compacted away does not wait for an end the server never sends."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from liftbridge_provider.client import LiftbridgeClient, PublishMessage
from liftbridge_provider.devserver import DevServer
from tests.waiting import wait_until

WORKER = Path(__file__).with_name("bounded_reads_worker.py")
WARM_UP = 300
READS = 3_000
# Measured on 2026-12-06 with grpcio 1.85 (issue 47), growth over the 3,000 counted reads: before the fix each
# call that was cancelled at its stop offset kept its core call and completion queue, about 18 KB a read:
# +54.6 MB (read_range), +54.5 MB (bounded subscribe), +54.4 MB (stop at the last offset), +54.5 MB
# (column_batches). After it: -0.7 MB each (the warm-up had grown the heap a little past its need).
GROWTH_LIMIT = 6 * 1024 * 1024  # bytes; 2 KB a read, a ninth of what one unreleased call costs


@pytest.fixture(scope="module")
def small_stream(client: LiftbridgeClient) -> str:
    name = f"rss-{uuid.uuid4().hex[:8]}"
    client.create_stream(name, name)
    client.publish_batch(name, [b"v" * 100 for _ in range(20)], ack_policy="all")
    return name


def growth_over_reads(node: DevServer, stream: str, way: str) -> tuple[int, dict[str, float]]:
    """Bytes of resident memory a fresh interpreter gained over :data:`READS` reads of ``way`` (after
    :data:`WARM_UP`), and the worker's whole outcome."""
    done = subprocess.run(
        [sys.executable, str(WORKER), node.brokers[0], stream, way, str(WARM_UP), str(READS)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    return int(outcome["rss_after"] - outcome["rss_before"]), outcome


def growth_message(way: str, growth: int, outcome: dict[str, float]) -> str:
    return (
        f"{way}: resident memory grew by {growth / 1e6:.1f} MB over {READS} reads "
        f"({growth / READS / 1024:.1f} KB a read; {outcome['rss_before'] / 1e6:.1f} MB before)"
    )


@pytest.mark.parametrize("way", ["read_range", "bounded_subscribe", "stop_at_last_offset", "column_batches"])
def test_bounded_reads_keep_memory_flat(node: DevServer, small_stream: str, way: str) -> None:
    """3,000 bounded reads of five messages in a fresh interpreter, after 300 that warm its allocators up,
    grow its resident memory by less than 2 KB a read: every read releases its gRPC call, whether it is
    iterated to its end (read_range, a subscription with a stop offset, the Spark task's column batches) or
    its caller leaves at the range's last message. grpc's core keeps a call and its completion queue until
    the call's status is taken: a call cancelled at the stop offset and never read to its end was kept for
    the life of the process (closing the client did not free it)."""
    growth, outcome = growth_over_reads(node, small_stream, way)
    assert growth < GROWTH_LIMIT, growth_message(way, growth, outcome)


@pytest.mark.parametrize("way", ["earliest_offset", "read_range_broken_off", "cancelled_unbounded"])
def test_reads_left_early_keep_memory_flat(node: DevServer, small_stream: str, way: str) -> None:
    """A call left before the server ends it is released too: 3,000 ``earliest_offset`` calls (a short
    subscription left after its first message), bounded reads broken off after their first message, and
    subscriptions without a stop cancelled after their first message grow a fresh interpreter by less than
    2 KB each. On grpc's single-threaded calls a cancelled call was never released (nothing takes its end):
    about 19 KB each, for the life of the process (+58.1, +55.7 and +57.9 MB measured on 2026-12-07 before
    Subscribe moved onto the client's own HTTP/2 call)."""
    growth, outcome = growth_over_reads(node, small_stream, way)
    assert growth < GROWTH_LIMIT, growth_message(way, growth, outcome)


@pytest.mark.parametrize("way", ["aio_bounded_subscribe", "aio_left_early"])
def test_async_subscriptions_keep_memory_flat(node: DevServer, small_stream: str, way: str) -> None:
    """The asyncio client's Subscribe calls are released too: 3,000 subscriptions read to their stop offset,
    or left after their first message (the call cancelled), grow a fresh interpreter by less than 2 KB
    each (on grpc.aio, which takes a call's end itself: +0.1 and +0.2 MB measured on 2026-12-06; now on the
    data plane's asyncio driver, whose call is closed on every exit); a change of how the client ends its calls
    that kept them would show here."""
    growth, outcome = growth_over_reads(node, small_stream, way)
    assert growth < GROWTH_LIMIT, growth_message(way, growth, outcome)


@pytest.mark.timeout(120)
def test_a_read_whose_stop_offset_was_compacted_away_does_not_wait_for_the_calls_end(node: DevServer) -> None:
    """The server ends a Subscribe call only right after the stop offset itself; when compaction removed it, it
    sends the next message and goes on. The read ends at that message without delivering it and cancels the
    call; waiting for the call's end there would wait for its deadline, an hour here (liveness_interval), and
    pytest-timeout would fail this test. Both read paths: messages and column batches."""
    with LiftbridgeClient(node.brokers, liveness_interval=3600) as client:
        name = f"rss-compacted-{uuid.uuid4().hex[:8]}"
        client.create_stream(name, name, compact_enabled=True, segment_max_bytes=1024, cleaner_interval=0.5)
        messages = [PublishMessage(b"v%d-" % i + b"x" * 40, key=b"k%d" % (i % 3)) for i in range(600)]
        client.publish_batch(name, messages, ack_policy="all")
        wait_until(lambda: len(list(client.read_range(name, 0, 0, 600))) < 100, 60, "compaction")
        survivors = [m.offset for m in client.read_range(name, 0, 0, 600)]
        end = survivors[0]  # [0, end) was compacted away; the server sends survivors[0] next
        assert end > 0, f"compaction kept offset 0: {survivors}"
        subscription = client.range_subscription(name, 0, 0, end)
        assert subscription is not None
        with subscription:
            assert list(subscription) == []
        subscription = client.range_subscription(name, 0, 0, end)
        assert subscription is not None
        with subscription:
            assert [b.offsets_list() for b in subscription.column_batches(max_rows=100, max_bytes=1 << 20)] == []
