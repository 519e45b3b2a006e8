"""Failover in a real three-node cluster: the partition leader is SIGKILLed while the client works."""

from __future__ import annotations

import collections
import itertools
import threading
import time

import pytest

from liftbridge_provider.client import (
    AckTimeoutError,
    BatchResult,
    LiftbridgeClient,
    LiftbridgeError,
    StartPosition,
    Subscription,
    UnavailableError,
)
from liftbridge_provider.devserver import DevServer
from tests.server.leaders import settled_without
from tests.waiting import wait_until_answered as wait_until

pytestmark = pytest.mark.cluster


def replicated_stream(client: LiftbridgeClient, name: str) -> str:
    client.create_stream(name, name, replication_factor=3, min_isr=2)
    wait_until(lambda: len(client.fetch_partition_metadata(name, 0).isr) == 3, 20, "an ISR of 3")
    leader = client.fetch_partition_metadata(name, 0).leader
    assert leader is not None
    return leader


def new_leader(client: LiftbridgeClient, name: str, old: str) -> str:
    def elected() -> bool:
        leader = client.fetch_partition_metadata(name, 0).leader
        return leader is not None and leader != old

    wait_until(elected, 30, "a new partition leader")
    leader = client.fetch_partition_metadata(name, 0).leader
    assert leader is not None
    return leader


def test_acked_messages_survive_leader_kill_during_batch_publish(liftbridge_cluster: DevServer) -> None:
    with LiftbridgeClient(liftbridge_cluster.brokers, request_timeout=30) as client:
        leader = replicated_stream(client, "failover")
        values = [f"value-{i}".encode() for i in range(30_000)]
        outcome: list[BatchResult | BaseException] = []

        def publish() -> None:
            try:
                outcome.append(
                    client.publish_batch(
                        "failover", values, ack_policy="all", window=256, ack_wait=5, raise_on_error=False
                    )
                )
            except BaseException as exc:  # re-raised in the test thread
                outcome.append(exc)

        publisher = threading.Thread(target=publish)
        publisher.start()
        wait_until(lambda: client.fetch_partition_metadata("failover", 0).high_watermark >= 3000, 60, "progress")
        liftbridge_cluster.kill(leader)
        killed_at = time.monotonic()
        publisher.join(timeout=180)
        assert not publisher.is_alive(), "publish_batch must finish by itself"
        (result,) = outcome
        if isinstance(result, BaseException):
            raise result
        survivor = new_leader(client, "failover", leader)

        acked = [(index, ack.offset) for index, ack in enumerate(result.acks) if ack is not None]
        failed = {f.index for f in result.failures}
        assert len(acked) + len(failed) == len(values), "every message is either acked or reported"
        assert len(acked) > 3000
        kinds = collections.Counter(f"{type(f.error).__name__}: {f.error.message[:60]}" for f in result.failures)
        assert max(index for index, _ in acked) > max(failed, default=-1), f"the batch stopped at the kill: {kinds}"
        for failure in result.failures:
            assert isinstance(failure.error, AckTimeoutError | UnavailableError), failure.error
            assert failure.may_be_stored
        assert time.monotonic() - killed_at < 180

        high_watermark = client.fetch_partition_metadata("failover", 0).high_watermark
        stored = {m.offset: m.value for m in client.read_range("failover", 0, 0, high_watermark + 1)}
        for index, offset in acked:
            assert stored[offset] == values[index], f"acked message #{index} at offset {offset} was lost"

        after = client.publish("failover", b"after failover", ack_policy="all")
        assert after is not None
        assert [m.value for m in client.read_range("failover", 0, after.offset, after.offset + 1)] == [
            b"after failover"
        ]
        assert survivor != leader


def collect(subscription: Subscription, into: list[int]) -> threading.Thread:
    def run() -> None:
        try:
            for message in subscription:
                into.append(message.offset)
        except LiftbridgeError as exc:  # shows up as missing offsets in the assertions
            into.append(-1)
            print(f"subscription failed: {exc}")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_subscriptions_survive_leader_change(liftbridge_cluster: DevServer) -> None:
    with LiftbridgeClient(liftbridge_cluster.brokers, request_timeout=30, resubscribe_wait=60) as client:
        leader = replicated_stream(client, "subs")
        client.publish_batch("subs", [f"{i}".encode() for i in range(100)], ack_policy="all")
        from_leader: list[int] = []
        from_replica: list[int] = []
        leader_sub = client.subscribe("subs", start=StartPosition.earliest())
        replica_sub = client.subscribe("subs", start=StartPosition.earliest(), read_isr_replica=True)
        threads = [collect(leader_sub, from_leader), collect(replica_sub, from_replica)]
        wait_until(lambda: len(from_leader) == 100 and len(from_replica) == 100, 30, "the first 100 messages")

        liftbridge_cluster.kill(leader)
        new_leader(client, "subs", leader)
        # Ack ALL needs the dead leader out of the ISR first (max lag 3 s, then the metadata leader applies it).
        wait_until(lambda: settled_without(client, "subs", leader), 60, "subs/0 settled without the killed leader")
        result = client.publish_batch("subs", [f"{i}".encode() for i in range(100, 200)], ack_policy="all")
        assert result.ok

        wait_until(lambda: len(from_leader) >= 200 and len(from_replica) >= 200, 60, "the messages after failover")
        leader_sub.cancel()
        replica_sub.cancel()
        for thread in threads:
            thread.join(timeout=10)
        for name, offsets in (("leader", from_leader), ("replica", from_replica)):
            breaks = [(i, a, b) for i, (a, b) in enumerate(itertools.pairwise(offsets)) if b != a + 1]
            assert offsets == list(range(200)), f"{name} subscription: gap or duplicate at {breaks}"
