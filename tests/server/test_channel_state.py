"""The pool's channels read their connectivity through grpc's public API, against a real Liftbridge node.

``PooledChannel.connect`` and ``ready`` decide whether a publish may go out
(``plans.Attempt.connect_first``, ``NotSent``) and whether a shared publish
stream is still usable; they read what grpc's ``Channel.subscribe`` reports
(client/channel_state.py). These tests hold the guarantees the callers rely
on: a refused broker ends the wait at once, a silent one at the bound, a
broker that died shows without a call, a restart nobody looked at still
counts as a break, and opening and closing channels leaves no grpc thread
and no error behind.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client.connections import ConnectionPool, PooledChannel
from liftbridge_provider.client.options import ClientConfig
from liftbridge_provider.client.plans import Connection
from liftbridge_provider.devserver import DevServer, start_single
from tests.waiting import wait_until

CYCLES = 200
CYCLES_WHILE_LEASED = 40  # each close of a channel in use waits for grpc's thread (up to 0.2 s)


@pytest.fixture
def node() -> Iterator[DevServer]:
    """A node of its own: the tests kill, restart and freeze it."""
    with start_single() as server:
        yield server


@pytest.fixture
def pool(node: DevServer) -> Iterator[ConnectionPool]:
    made = ConnectionPool(ClientConfig(brokers=tuple(node.brokers)))
    yield made
    made.close()


def leased(pool: ConnectionPool, address: str) -> PooledChannel:
    with pool.lease(address) as pooled:
        return pooled


def connected(pooled: PooledChannel, timeout: float = 10) -> None:
    """Wait until the channel is connected. On a loaded machine a handshake may outlast gRPC's connection attempt
    (100 ms: grpc.min_reconnect_backoff_ms); the channel reports a failure and tries again by itself."""
    deadline = time.monotonic() + timeout
    while pooled.connect(max(deadline - time.monotonic(), 0.001)) is not Connection.READY:
        assert time.monotonic() < deadline, f"no connection within {timeout}s"
        time.sleep(0.02)


def unused_address() -> str:
    """A loopback port nothing listens on: connections to it are refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


def wait_for_state(channel: grpc.Channel, ready: bool, timeout: float) -> None:
    """Wait until the channel is READY (or, ``ready=False``, anything else) through a subscription of grpc's
    own that asks nothing: no call of ready() counts a break meanwhile."""
    reached = threading.Event()

    def report(state: grpc.ChannelConnectivity) -> None:
        if (state is grpc.ChannelConnectivity.READY) == ready:
            reached.set()

    channel.subscribe(report, try_to_connect=False)
    try:
        assert reached.wait(timeout), f"the channel was {'never' if ready else 'still'} READY after {timeout}s"
    finally:
        channel.unsubscribe(report)


def test_a_refused_broker_ends_the_wait_at_once() -> None:
    address = unused_address()
    pool = ConnectionPool(ClientConfig(brokers=(address,)))
    try:
        started = time.monotonic()
        assert leased(pool, address).connect(10) is Connection.REFUSED
        assert time.monotonic() - started < 1, "a refused connection waited"
    finally:
        pool.close()


def test_a_silent_broker_ends_the_wait_at_its_bound(node: DevServer, pool: ConnectionPool) -> None:
    """A frozen node accepts TCP (the kernel does) and never answers: a wait shorter than the connection
    attempt (gRPC gives up on one after the 100 ms of grpc.min_reconnect_backoff_ms, and the channel then
    reports a failure) ends at its bound, SILENT, not before."""
    node.freeze(node.nodes[0].server_id)
    started = time.monotonic()
    assert leased(pool, node.brokers[0]).connect(0.05) is Connection.SILENT
    assert 0.05 <= time.monotonic() - started < 1


def test_a_broker_that_died_shows_without_a_call_and_a_restart_nobody_saw_is_a_break(
    node: DevServer, pool: ConnectionPool
) -> None:
    """The channel's state follows the connection: a killed node shows as not ready with no call made, and
    when it is back (the channel reconnects by itself) the break is counted although ready() was never asked
    while it was down; a publish stream opened before it must not be offered again."""
    pooled = leased(pool, node.brokers[0])
    connected(pooled)
    before = pooled.breaks
    server_id = node.nodes[0].server_id
    node.kill(server_id)
    wait_for_state(pooled.channel, False, 5)
    node.restart(server_id)
    wait_for_state(pooled.channel, True, 15)
    assert pooled.ready(), "the channel did not reconnect by itself"
    assert pooled.breaks > before, "a break that ready() never saw was not counted"


def test_a_killed_broker_shows_in_ready_at_once(node: DevServer, pool: ConnectionPool) -> None:
    pooled = leased(pool, node.brokers[0])
    connected(pooled)
    node.kill(node.nodes[0].server_id)
    killed = time.monotonic()
    wait_until(lambda: not pooled.ready(), 5, "the channel to read the killed node's reset", poll=0.001)
    assert time.monotonic() - killed < 1
    assert pooled.connect(10) is Connection.REFUSED


@pytest.mark.parametrize("use", ["closed-at-once", "connected-and-called", "closed-while-leased"])
def test_opening_and_closing_channels_leaves_no_thread_and_no_error(
    node: DevServer, use: str, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    """grpc's thread behind Channel.subscribe raises "Channel closed!" (a traceback on stderr) if the channel
    closes under it at the wrong moment; 200 channels watched (ready() starts the watch) and closed at once, or
    after a connection and a call, and 40 closed while a lease holds them (closed at once, as calls may run on
    them), leave no thread and nothing logged."""
    address = node.brokers[0]
    before = set(threading.enumerate())
    failures: list[Any] = []
    previous_hook = threading.excepthook
    threading.excepthook = failures.append
    caplog.set_level(logging.WARNING)
    try:
        for _ in range(CYCLES_WHILE_LEASED if use == "closed-while-leased" else CYCLES):
            pool = ConnectionPool(ClientConfig(brokers=(address,)))
            with pool.lease(address) as pooled:
                if use == "closed-at-once":
                    pooled.ready()  # grpc's watching thread starts: the pool closes the channel under it
                else:
                    connected(pooled)
                    pooled.stub.FetchMetadata(api.FetchMetadataRequest(), timeout=10)
                if use == "closed-while-leased":
                    pool.close()
            pool.close()
        wait_until(lambda: set(threading.enumerate()) <= before, 5, "grpc's threads to end", poll=0.05)
    finally:
        threading.excepthook = previous_hook
    assert failures == [], [str(f.exc_value) for f in failures]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    err = capfd.readouterr().err
    assert "Traceback" not in err, err[-2000:]
