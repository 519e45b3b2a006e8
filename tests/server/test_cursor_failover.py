"""Cursor writes and reads around a ``__cursors`` leader that was frozen past a failover (real 3-node cluster)."""

from __future__ import annotations

import asyncio
import time

import pytest

from liftbridge_provider.client import AsyncLiftbridgeClient, LiftbridgeClient
from liftbridge_provider.devserver import DevServer
from liftbridge_provider.devserver.inspection import partition_leaders

pytestmark = pytest.mark.cluster

FROZEN_FOR = 8.0  # seconds: the leader timeout (1 s) and the ISR lag time (3 s) pass, another node leads


def _new_leader(cluster: DevServer, old: str) -> str:
    """The ``__cursors``/0 leader the running nodes name once it is not ``old`` (within 20 s)."""
    deadline = time.monotonic() + 20
    while True:
        leader = cluster.partition_leaders("__cursors")[0]
        if leader not in (None, old):
            return leader
        assert time.monotonic() < deadline, f"__cursors/0 still led by {leader} 20 s after {old} froze"
        time.sleep(0.3)


def _settled(cluster: DevServer, leader: str) -> None:
    """Wait (20 s at most) until every node names ``leader`` for ``__cursors``/0: the thawed one stepped down."""
    deadline = time.monotonic() + 20
    while True:
        views = {n.server_id: partition_leaders(n.address, "__cursors")[0] for n in cluster.nodes}
        if set(views.values()) == {leader}:
            return
        assert time.monotonic() < deadline, f"nodes still disagree on the __cursors/0 leader: {views}"
        time.sleep(0.3)


def test_a_cursor_set_as_a_frozen_leader_thaws_is_read_back(liftbridge_cluster: DevServer) -> None:
    """Guards chaos seed 128 (a commit that reported success while the cursor kept reading the old value).

    A ``__cursors`` leader frozen past a failover still acts as leader for a
    moment after it thaws (v1.9.0). A client whose metadata still names it sends
    SetCursor there; it answers OK and the message even reaches the new leader's
    log through NATS, but only the broker that handled SetCursor updates its
    cursor cache: the new leader, which had cached the old value when it was
    read during the freeze, answers the old value until it restarts. Failed on
    the code before the fix (read 10 after setting 20).
    """
    cluster = liftbridge_cluster
    with LiftbridgeClient(cluster.brokers, request_timeout=5.0) as cached:
        cached.create_stream("fenced", "fenced", partitions=1, replication_factor=3)
        cached.set_cursor("ingest", "fenced", 0, 10)
        old = cluster.partition_leaders("__cursors")[0]
        assert old is not None
        cluster.freeze(old)
        try:
            new = _new_leader(cluster, old)
            time.sleep(FROZEN_FOR)
            running = [n.address for n in cluster.nodes if n.server_id != old]
            with LiftbridgeClient(running, request_timeout=5.0) as other:
                assert other.fetch_cursor("ingest", "fenced", 0, timeout=15) == 10
        finally:
            cluster.thaw(old)
        cached.set_cursor("ingest", "fenced", 0, 20, timeout=15)
    _settled(cluster, new)
    with LiftbridgeClient(cluster.brokers, request_timeout=5.0) as fresh:
        assert fresh.fetch_cursor("ingest", "fenced", 0, timeout=15) == 20


def test_the_async_client_sets_a_cursor_at_the_leader_the_cluster_agrees_on(liftbridge_cluster: DevServer) -> None:
    """The asyncio client runs the same cursor plans: the same stale-leader case as above."""
    cluster = liftbridge_cluster
    with LiftbridgeClient(cluster.brokers, request_timeout=5.0) as admin:
        admin.create_stream("fenced", "fenced", partitions=1, replication_factor=3)

    async def run() -> int:
        async with AsyncLiftbridgeClient(cluster.brokers, request_timeout=5.0) as cached:
            await cached.set_cursor("ingest", "fenced", 0, 10)
            old = cluster.partition_leaders("__cursors")[0]
            assert old is not None
            cluster.freeze(old)
            try:
                new = await asyncio.to_thread(_new_leader, cluster, old)
                await asyncio.sleep(FROZEN_FOR)
                running = [n.address for n in cluster.nodes if n.server_id != old]
                async with AsyncLiftbridgeClient(running, request_timeout=5.0) as other:
                    assert await other.fetch_cursor("ingest", "fenced", 0, timeout=15) == 10
            finally:
                cluster.thaw(old)
            await cached.set_cursor("ingest", "fenced", 0, 20, timeout=15)
        await asyncio.to_thread(_settled, cluster, new)
        async with AsyncLiftbridgeClient(cluster.brokers, request_timeout=5.0) as fresh:
            return await fresh.fetch_cursor("ingest", "fenced", 0, timeout=15)

    assert asyncio.run(run()) == 20
