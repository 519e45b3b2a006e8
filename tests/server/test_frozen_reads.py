"""Reads whose broker freezes (SIGSTOP: its kernel keeps the connection open and nothing answers) end by the data
plane's keepalive, within ``KEEPALIVE_IDLE + KEEPALIVE_TIMEOUT`` (20 s) of the broker's last frame, and follow
the new leader: the sync subscription, the Spark task's column batches, and the asyncio subscription.

Each client here has ``liveness_interval=60``, three times the keepalive's bound: before the keepalive, only the
call's own liveness deadline ended a call to a frozen leader, 60 s after it opened. What shows the keepalive
ended it is its own reason in the log ("no answer to a keepalive PING"), which the liveness deadline never
gives. The liveness stays on as in production: once on a loaded CI machine (2026-12-07) the call to the new
leader, confirmed, sent nothing for 120 s while the offsets were committed, and only the liveness deadline
(here an hour then) would have reopened it (docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterator

import pytest

from liftbridge_provider.client import LiftbridgeClient, StartPosition
from liftbridge_provider.client.aio import AsyncLiftbridgeClient
from liftbridge_provider.devserver import DevServer
from tests.server.leaders import metadata_leader, partition_led_away_from, settled_without
from tests.server.test_client_faults import frozen
from tests.waiting import wait_until, wait_until_answered

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

LIVENESS = 60.0  # seconds a Subscribe call lives: 3 x (KEEPALIVE_IDLE + KEEPALIVE_TIMEOUT = 20 s)


class Reader:
    """Reads offsets on a thread; remembers them and the error that ended the read."""

    def __init__(self, offsets: Callable[[], Iterator[int]]) -> None:
        self.offsets: list[int] = []
        self.error: BaseException | None = None
        self._read = offsets
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for offset in self._read():
                self.offsets.append(offset)
        except BaseException as exc:  # inspected by the test
            self.error = exc


def keepalive_ended_a_call(caplog: pytest.LogCaptureFixture) -> bool:
    return any("keepalive PING" in record.getMessage() for record in caplog.records)


def partition_to_freeze(cluster: DevServer, client: LiftbridgeClient, prefix: str) -> tuple[str, int, str]:
    """A new replicated partition whose leader is not the metadata leader (a frozen metadata leader holds every
    failover until another node leads the metadata: docs/reliability.md), once its ISR is whole, with 10
    messages: its stream, number and leader."""
    name, partition = partition_led_away_from(client, metadata_leader(cluster), prefix)
    wait_until_answered(lambda: len(client.fetch_partition_metadata(name, partition).isr) == 3, 30, "an ISR of 3")
    leader = client.fetch_partition_metadata(name, partition).leader
    assert leader is not None
    client.publish_batch(name, [b"a"] * 10, partition=partition, ack_policy="all")
    return name, partition, leader


def fail_over(client: LiftbridgeClient, name: str, partition: int, leader: str) -> None:
    """Wait until the partition's failover away from the frozen ``leader`` settled, then publish 10 more."""
    wait_until_answered(lambda: settled_without(client, name, leader, partition), 90, "the failover to settle")
    client.publish_batch(name, [b"b"] * 10, partition=partition, ack_policy="all")


def test_a_subscription_to_a_frozen_leader_is_ended_by_the_keepalive_and_follows_the_new_one(
    liftbridge_cluster: DevServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="liftbridge_provider.client")
    with LiftbridgeClient(liftbridge_cluster.brokers, request_timeout=5, liveness_interval=LIVENESS) as client:
        name, partition, leader = partition_to_freeze(liftbridge_cluster, client, "frozen-keepalive")
        start = StartPosition.earliest()
        subscription = client.subscribe(name, partition=partition, start=start, resubscribe_wait=120)
        reader = Reader(lambda: (message.offset for message in subscription))
        wait_until(lambda: len(reader.offsets) == 10, 30, "the first 10 messages")
        with frozen(liftbridge_cluster, leader):
            fail_over(client, name, partition, leader)
            wait_until(lambda: len(reader.offsets) >= 20 or reader.error is not None, 120, "the messages after it")
        subscription.cancel()
        reader.thread.join(10)
    assert reader.error is None, reader.error
    assert reader.offsets == list(range(20))
    assert keepalive_ended_a_call(caplog), "the call to the frozen leader ended by the keepalive"


def test_column_batches_from_a_frozen_leader_are_ended_by_the_keepalive_and_go_on_from_the_new_one(
    liftbridge_cluster: DevServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The Spark task's read: every offset of the range once, in order, across the freeze."""
    caplog.set_level(logging.INFO, logger="liftbridge_provider.client")
    with LiftbridgeClient(liftbridge_cluster.brokers, request_timeout=5, liveness_interval=LIVENESS) as client:
        name, partition, leader = partition_to_freeze(liftbridge_cluster, client, "frozen-columns")
        subscription = client.range_subscription(name, partition, 0, 20, beyond_high_watermark="wait")
        assert subscription is not None

        def offsets() -> Iterator[int]:
            with subscription:
                for batch in subscription.column_batches(max_rows=1, max_bytes=1 << 20):
                    yield from batch.offsets_list()

        reader = Reader(offsets)  # a batch is handed out once the next message does not fit (one row each)
        wait_until(lambda: len(reader.offsets) == 9, 30, "the batches of the first 10 messages but the last")
        with frozen(liftbridge_cluster, leader):
            fail_over(client, name, partition, leader)
            wait_until(lambda: len(reader.offsets) >= 20 or reader.error is not None, 120, "the messages after it")
        reader.thread.join(30)
    assert reader.error is None, reader.error
    assert reader.offsets == list(range(20))
    assert keepalive_ended_a_call(caplog), "the call to the frozen leader ended by the keepalive"


def test_an_async_subscription_to_a_frozen_leader_is_ended_by_the_keepalive_and_follows_the_new_one(
    liftbridge_cluster: DevServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="liftbridge_provider.client")
    with LiftbridgeClient(liftbridge_cluster.brokers, request_timeout=5) as client:
        name, partition, leader = partition_to_freeze(liftbridge_cluster, client, "frozen-async")

        async def scenario() -> list[int]:
            offsets: list[int] = []
            async with AsyncLiftbridgeClient(
                liftbridge_cluster.brokers, request_timeout=5, liveness_interval=LIVENESS, resubscribe_wait=120
            ) as aclient:
                messages = aclient.subscribe(name, partition, 0)
                for _ in range(10):
                    offsets.append((await anext(messages)).offset)
                loop = asyncio.get_running_loop()
                with frozen(liftbridge_cluster, leader):
                    await loop.run_in_executor(None, fail_over, client, name, partition, leader)
                    for _ in range(10):
                        offsets.append((await asyncio.wait_for(anext(messages), 120)).offset)
                await messages.aclose()
            return offsets

        assert asyncio.run(scenario()) == list(range(20))
    assert keepalive_ended_a_call(caplog), "the call to the frozen leader ended by the keepalive"
