"""High-watermark reads around a partition leader that was frozen past a failover (real 3-node cluster).

A Liftbridge v1.9.0 leader frozen past a failover still acts as leader for a moment after it thaws: it
answers FetchPartitionMetadata with its own log, which lacks what the new leader took while it was frozen.
A client whose metadata still names it got that stale answer. Chaos seed 86 (2026-11-28) froze two
concurrent runs of one cursor with different ends that way (one asked the thawed ex-leader: high
watermark 0 instead of 101), and the second run's commit was refused; the commit operator's own check
would refuse a range the same way ("ends past the committed high watermark"), for good.
"""

from __future__ import annotations

import time

import pytest

from liftbridge_provider.client import LiftbridgeClient, NoSuchStreamError
from liftbridge_provider.devserver import DevServer
from tests.server.leaders import metadata_leader, settled_without
from tests.waiting import wait_until_answered

pytestmark = pytest.mark.cluster

TAKEN_WHILE_FROZEN = 50
FROZEN_FOR = 8.0  # seconds after the failover: the ISR lag time (3 s) passes too, as in chaos seed 86


def _new_leader(cluster: DevServer, stream: str, old: str) -> str:
    deadline = time.monotonic() + 20
    while True:
        leader = cluster.partition_leaders(stream)[0]
        if leader not in (None, old):
            return leader
        assert time.monotonic() < deadline, f"{stream}/0 still led by {leader} 20 s after {old} froze"
        time.sleep(0.3)


def _led_by_the_metadata_leader(cluster: DevServer, cached: LiftbridgeClient, prefix: str) -> tuple[str, str]:
    """A new RF 3 stream whose partition 0 the metadata leader leads (up to ten tries), and that node."""
    chief = metadata_leader(cluster)
    for attempt in range(10):
        stream = f"{prefix}-{attempt}"
        cached.create_stream(stream, stream, partitions=1, replication_factor=3)
        if cluster.partition_leaders(stream)[0] == chief:
            return stream, chief
    pytest.fail(f"ten streams, none led by the metadata leader {chief}")


def _first_publish(client: LiftbridgeClient, stream: str) -> None:
    """Offset 0 of a stream just created. The broker a publish goes to may not have applied the creation yet
    and refuse it as a stream it does not know (nothing stored, CI 2026-12-07): asked again until one took it."""
    deadline = time.monotonic() + 15
    while True:
        try:
            assert client.publish(stream, b"before", ack_policy="all", timeout=15) is not None
            return
        except NoSuchStreamError:
            assert time.monotonic() < deadline, f"{stream} unknown to the brokers 15 s after its creation"
            time.sleep(0.2)


def _thawed_ex_leader(cluster: DevServer, cached: LiftbridgeClient, prefix: str) -> str:
    """Freeze the node leading both the metadata and a new stream's partition 0 until others lead both,
    publish there, thaw: ``cached`` (whose metadata names the old leader) is then to ask a node that still
    acts as leader with the old log, as in chaos seed 86. The stream's name."""
    stream, old = _led_by_the_metadata_leader(cluster, cached, prefix)
    _first_publish(cached, stream)  # offset 0
    cluster.freeze(old)
    try:
        _new_leader(cluster, stream, old)
        running = [n.address for n in cluster.nodes if n.server_id != old]
        with LiftbridgeClient(running, request_timeout=5.0) as other:
            # Publish once the failover has settled: the frozen node out of the ISR of the leader the brokers
            # agree on. Before that a report retried against the new metadata leader could move the partition
            # again, and messages acked by the leader alone were gone (a loaded machine saw a high watermark of
            # 0 for 50 acked messages); ack ALL then says they are committed.
            wait_until_answered(lambda: settled_without(other, stream, old), 30, f"{stream}/0 settled without {old}")
            result = other.publish_batch(
                stream, [b"while frozen"] * TAKEN_WHILE_FROZEN, ack_policy="all", ack_wait=20, timeout=30
            )
            assert result.ok
            committed = other.wait_for_commit(stream, 0, TAKEN_WHILE_FROZEN, timeout=30)  # a new leader lags a moment
            assert committed.high_watermark == TAKEN_WHILE_FROZEN, committed
        time.sleep(FROZEN_FOR)
    finally:
        cluster.thaw(old)
    return stream


def test_wait_for_commit_confirms_a_refusal_with_the_leader_the_cluster_agrees_on(
    liftbridge_cluster: DevServer,
) -> None:
    """The commit operator and the Spark reads refuse a range ending past the committed high watermark after
    ``wait_for_commit``; asked right after the thaw through the stale metadata, it answered the ex-leader's
    high watermark 0 for offset 50 (committed by the new leader), and the range was refused."""
    with LiftbridgeClient(liftbridge_cluster.brokers, request_timeout=5.0) as cached:
        stream = _thawed_ex_leader(liftbridge_cluster, cached, "stale-commit")
        info = cached.wait_for_commit(stream, 0, TAKEN_WHILE_FROZEN, timeout=15)
        assert info.high_watermark >= TAKEN_WHILE_FROZEN, f"a stale leader's answer: {info}"


def test_a_high_watermark_asked_of_the_agreed_leader_is_not_a_thawed_leaders(liftbridge_cluster: DevServer) -> None:
    """``fetch_partition_metadata(agreed=True)`` (what the ranges freeze uses) asks the leader more than half
    of the brokers name, not the one the client's metadata names."""
    with LiftbridgeClient(liftbridge_cluster.brokers, request_timeout=5.0) as cached:
        stream = _thawed_ex_leader(liftbridge_cluster, cached, "stale-freeze")
        info = cached.fetch_partition_metadata(stream, 0, agreed=True, timeout=15)
        assert info.high_watermark == TAKEN_WHILE_FROZEN, f"a stale leader's answer: {info}"
