"""broker_selection="workload" on a real cluster with an uneven spread.

go-liftbridge's SetConnectToLowWorkloadServer sends calls that any broker can serve to the broker that
holds and leads the fewest partitions, as the metadata counts them; this client's counterpart must pick
that broker every time once it has the counts (a random pick would hit it 5 times running 1 time in 243).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from liftbridge_provider.client import LiftbridgeClient
from liftbridge_provider.client.metadata import Metadata
from liftbridge_provider.devserver import DevServer, start_cluster


@pytest.fixture
def cluster() -> Iterator[DevServer]:
    """Three nodes that count brokers' partitions afresh for every metadata request (each node caches its
    broker list, counts included, for metadata.cache.max.age: 2 minutes by default, so two nodes can
    answer with different counts)."""
    with start_cluster(extra_config={"metadata.cache.max.age": "1ms"}) as nodes:
        yield nodes


def workloads(metadata: Metadata) -> dict[str, int]:
    return {b.address: b.partition_count + b.leader_count for b in metadata.brokers.values()}


def last_used_address(client: LiftbridgeClient) -> str:
    channels = [c for group in client._pool._channels.values() for c in group]
    return max(channels, key=lambda c: c.last_used).address


def test_workload_selection_calls_the_least_loaded_broker(cluster: DevServer) -> None:
    with (
        LiftbridgeClient(cluster.brokers) as admin,
        LiftbridgeClient(cluster.brokers, broker_selection="workload") as client,
    ):
        # Single-replica streams until one broker holds strictly the fewest.
        deadline = time.monotonic() + 60
        while True:
            loads = sorted(workloads(client.fetch_metadata()).values())
            if loads[0] < loads[1]:
                break
            assert time.monotonic() < deadline, f"no broker with strictly the fewest partitions: {loads}"
            name = f"sel-{uuid.uuid4().hex[:6]}"
            admin.create_stream(name, name, replication_factor=1)
            time.sleep(0.5)
        calls = []
        for _ in range(5):
            known = workloads(client.metadata())  # what the pick is made from: the last answer's counts
            client.fetch_metadata()
            calls.append((known, last_used_address(client)))
    for known, picked in calls:
        assert known[picked] == min(known.values()), f"workloads {known}: the call went to {picked}"
    assert any(sorted(known.values())[:2] != [min(known.values())] * 2 for known, _ in calls), "no unique minimum"
