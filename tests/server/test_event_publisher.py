"""The event listener's publisher against a real Liftbridge node: order per key, and bounds when it is not there.

The publisher is what keeps Airflow's scheduler and tasks from waiting on
Liftbridge: these tests check that it keeps each key's events in order on one
partition, that offering never waits, and that a stopping process waits no
longer than its flush timeout when the node answers nothing (frozen), is gone,
or lacks the stream, every event it could not publish being counted.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from liftbridge_provider.client import LiftbridgeClient
from liftbridge_provider.devserver import DevServer, start_single
from liftbridge_provider.events.publisher import PUBLISH_FAILED, QUEUE_FULL, STOPPING, EventPublisher, Sender


class Drops:
    """What the publisher reported through ``on_drop``."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = defaultdict(int)

    def __call__(self, reason: str, count: int) -> None:
        self.counts[reason] += count


def publisher(brokers: list[str], stream: str, drops: Drops, **options: float) -> EventPublisher:
    def connect() -> Sender:
        return LiftbridgeClient(brokers, request_timeout=options.get("publish_timeout", 5.0))

    return EventPublisher(
        connect=connect,
        stream=stream,
        queue_size=int(options.get("queue_size", 1000)),
        publish_timeout=options.get("publish_timeout", 5.0),
        retry_interval=options.get("retry_interval", 0.0),
        on_drop=drops,
    )


def read_all(client: LiftbridgeClient, stream: str, partitions: int) -> dict[int, list[tuple[bytes, dict[str, Any]]]]:
    found = {}
    for partition in range(partitions):
        end = client.fetch_partition_metadata(stream, partition).high_watermark + 1
        found[partition] = [(m.key or b"", json.loads(m.value)) for m in client.read_range(stream, partition, 0, end)]
    return found


def test_each_keys_events_land_on_one_partition_in_the_order_offered(
    liftbridge_server: DevServer, client: LiftbridgeClient
) -> None:
    stream = f"events-{uuid.uuid4().hex[:8]}"
    client.create_stream(stream, stream, partitions=3)
    drops = Drops()
    events = publisher(liftbridge_server.brokers, stream, drops)
    keys = [f"dag{k}/run".encode() for k in range(6)]
    for seq in range(120):
        assert events.offer(keys[seq % 6], json.dumps({"seq": seq}).encode())
    assert events.drain(30) == 0
    events.close(5)
    assert events.published == 120
    assert not drops.counts
    per_key: dict[bytes, set[int]] = defaultdict(set)
    order: dict[bytes, list[int]] = defaultdict(list)
    for partition, messages in read_all(client, stream, 3).items():
        for key, value in messages:
            per_key[key].add(partition)
            order[key].append(value["seq"])
    assert all(len(partitions) == 1 for partitions in per_key.values()), per_key
    assert len({p for partitions in per_key.values() for p in partitions}) > 1, "six keys spread over partitions"
    assert {k: order[k] for k in keys} == {k: list(range(i, 120, 6)) for i, k in enumerate(keys)}


def test_a_delayed_event_holds_back_those_behind_it_unless_draining(
    liftbridge_server: DevServer, client: LiftbridgeClient
) -> None:
    """A DAG run's end event waits its delay, and events queued after it keep their place behind it; a drain
    (the process stops) publishes them at once, in order."""
    stream = f"events-{uuid.uuid4().hex[:8]}"
    client.create_stream(stream, stream)
    events = publisher(liftbridge_server.brokers, stream, Drops())
    events.offer(b"k", b'{"seq": 0}')
    events.offer(b"k", b'{"seq": 1}', delay=600)
    events.offer(b"k", b'{"seq": 2}')
    deadline = time.monotonic() + 30
    while events.published < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # were the delay not kept, events 1 and 2 would be published by now
    assert events.published == 1
    assert events.drain(30) == 0
    assert [v["seq"] for _, v in read_all(client, stream, 1)[0]] == [0, 1, 2]
    events.close(5)


def test_a_frozen_node_costs_a_stopping_process_at_most_its_flush_timeout(liftbridge_server: DevServer) -> None:
    """The node answers nothing (SIGSTOP): offering returns at once, the queue fills and drops, and a drain
    returns by its timeout, counting what was left; nothing waits longer than asked."""
    node = start_single()
    try:
        stream = f"events-{uuid.uuid4().hex[:8]}"
        with LiftbridgeClient(node.brokers) as admin:
            admin.create_stream(stream, stream)
        drops = Drops()
        events = publisher(node.brokers, stream, drops, queue_size=5, publish_timeout=1.0, retry_interval=30)
        assert events.offer(b"k", b"{}")
        assert events.drain(30) == 0, "published while the node answered"
        node.freeze(node.nodes[0].server_id)
        started = time.monotonic()
        accepted = sum(events.offer(b"k", b"{}") for _ in range(20))
        offered_in = time.monotonic() - started
        assert offered_in < 0.5, "offering never waits on Liftbridge"
        assert 5 <= accepted <= 6  # the queue's 5, plus the one the thread may have taken out already
        assert drops.counts[QUEUE_FULL] == 20 - accepted
        started = time.monotonic()
        left = events.drain(2.0)
        assert time.monotonic() - started < 2.0 + 0.5, "a drain ends by its timeout"
        assert left >= 1
        assert drops.counts[STOPPING] == left
        assert events.published + sum(drops.counts.values()) <= 21
    finally:
        node.stop(timeout=5)


@pytest.mark.parametrize("missing", ["node", "stream"])
def test_without_the_node_or_the_stream_every_event_is_dropped_and_counted(
    liftbridge_server: DevServer, missing: str
) -> None:
    """A stopped node refuses connections and a missing stream refuses the publish: each event is dropped
    (publish_failed), counted once, and the drain is done well within its timeout."""
    node = start_single()
    brokers = node.brokers
    if missing == "node":
        node.stop(timeout=5)
    drops = Drops()
    events = publisher(brokers, "no-such-stream", drops, publish_timeout=2.0, retry_interval=0)
    try:
        for _ in range(3):
            assert events.offer(b"k", b"{}")
        assert events.drain(30) == 0
        assert dict(drops.counts) == {PUBLISH_FAILED: 3}
        assert events.dropped == {PUBLISH_FAILED: 3}
        assert events.published == 0
    finally:
        events.close(5)
        node.stop(timeout=5)


def test_a_forked_child_publishes_its_own_events_with_its_own_connection(
    liftbridge_server: DevServer, client: LiftbridgeClient
) -> None:
    """Airflow forks (LocalExecutor workers, task processes): each child of a process whose publisher is
    connected and has an event queued publishes only its own event, through a connection of its own, and
    the parent's events, the queued one included, are published once by the parent. The process that forks
    is a fresh interpreter (forked_publisher.py), as Airflow's are: this test's own process has other tests'
    threads in it, and a fork while one of them is inside a gRPC call can abort the child."""
    stream = f"events-{uuid.uuid4().hex[:8]}"
    client.create_stream(stream, stream)
    script = Path(__file__).with_name("forked_publisher.py")
    done = subprocess.run(
        [sys.executable, str(script), liftbridge_server.brokers[0], stream, "3"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome == {"children": [0, 0, 0], "parent_left": 0, "parent_published": 2}, done.stderr[-3000:]
    whos = [v["who"] for _, v in read_all(client, stream, 1)[0]]
    assert sorted(whos) == ["child 0", "child 1", "child 2", "parent", "parent, queued at the fork"]
