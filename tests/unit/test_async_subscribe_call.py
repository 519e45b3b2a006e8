"""Subscribe on the data plane's asyncio driver (client/subscribe_call.AsyncSubscribeCall on
client/h2/aio_transport.py), against the scripted HTTP/2 server of tests/unit/h2_peer.py: the same rules as the
sync driver's (tests/unit/test_blocking_call.py), awaited.

The keepalive's bounds are shortened for these tests (monkeypatched); nothing here asserts a duration.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from h2.connection import H2Connection
from h2.errors import ErrorCodes

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client import subscribe_call
from liftbridge_provider.client.h2 import call_state
from liftbridge_provider.client.h2.aio_transport import NotConnected
from liftbridge_provider.client.h2.grpc_status import CallFailed
from liftbridge_provider.client.subscribe_call import AsyncSubscribeCall
from tests.unit.h2_peer import Peer

REQUEST = api.SubscribeRequest(stream="s", partition=0)


@pytest.fixture(autouse=True)
def short_keepalive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(call_state, "KEEPALIVE_IDLE", 0.2)
    monkeypatch.setattr(call_state, "KEEPALIVE_TIMEOUT", 0.2)


async def read(peer: Peer, timeout: float, *, freeze_after: int | None = None) -> tuple[list[bytes], BaseException]:
    """Every response of one call (the handshake included), and how it ended (StopAsyncIteration: status OK)."""
    call = AsyncSubscribeCall(timeout)
    got: list[bytes] = []
    try:
        await call.open(peer.address, REQUEST, tls=None, server_name=None, max_response_bytes=1 << 20)
        async for response in call.messages():
            got.append(response)
            if freeze_after is not None and len(got) == freeze_after:
                peer.freeze()
    except (CallFailed, NotConnected) as exc:
        return got, exc
    finally:
        call.close()
    return got, StopAsyncIteration()


def test_a_frozen_peer_ends_the_call_by_the_keepalive() -> None:
    with Peer() as peer:
        peer.respond(b"")
        got, ended = asyncio.run(read(peer, 3600, freeze_after=1))
    assert got == [b""]
    assert isinstance(ended, CallFailed)
    assert ended.code() is grpc.StatusCode.UNAVAILABLE
    assert "keepalive PING" in ended.details()


def test_the_calls_deadline_ends_it() -> None:
    with Peer() as peer:
        peer.respond(b"")
        got, ended = asyncio.run(read(peer, 0.5))
    assert got == [b""]
    assert isinstance(ended, CallFailed)
    assert (ended.code(), ended.details()) == (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")


def test_a_peer_that_never_speaks_http2_is_given_up_at_the_connect_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subscribe_call, "CONNECT_WAIT", 0.3)
    with Peer(settings=False) as silent:
        got, ended = asyncio.run(read(silent, 60))
    assert got == []
    assert isinstance(ended, NotConnected)
    assert ended.code() is grpc.StatusCode.DEADLINE_EXCEEDED


def test_the_handshake_messages_and_the_servers_end() -> None:
    with Peer() as peer:
        peer.respond(b"", b"one", b"two", status=8, details="Stop offset reached")
        got, ended = asyncio.run(read(peer, 60))
    assert got == [b"", b"one", b"two"]
    assert isinstance(ended, CallFailed)
    assert (ended.code(), ended.details()) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "Stop offset reached")


def test_a_goaway_ends_the_call_unavailable_as_grpc_ends_it() -> None:
    def calm_down(conn: H2Connection) -> bytes | None:
        conn.close_connection(error_code=ErrorCodes.ENHANCE_YOUR_CALM, last_stream_id=1)
        return None

    with Peer() as peer:
        peer.respond(b"")
        peer.do(calm_down)
        got, ended = asyncio.run(read(peer, 60))
    assert got == [b""]
    assert isinstance(ended, CallFailed)
    assert ended.code() is grpc.StatusCode.UNAVAILABLE


def test_a_consumer_behind_pauses_reading_and_gets_every_message(monkeypatch: pytest.MonkeyPatch) -> None:
    """Responses beyond MAX_BUFFERED bytes pause the reading (the server's window then bounds what it sends);
    taking them resumes it; every message arrives, once, in order."""
    monkeypatch.setattr(subscribe_call, "MAX_BUFFERED", 1000)
    sent = [b"m%03d" % i + b"x" * 96 for i in range(200)]

    async def slowly(peer: Peer) -> tuple[list[bytes], bool, grpc.StatusCode | None]:
        call = AsyncSubscribeCall(60)
        got: list[bytes] = []
        try:
            await call.open(peer.address, REQUEST, tls=None, server_name=None, max_response_bytes=1 << 20)
            await asyncio.sleep(0.3)  # everything arrives meanwhile: more than MAX_BUFFERED
            assert call.stream is not None
            paused_once = call.stream.reading_paused
            async for response in call.messages():
                got.append(response)
        except CallFailed as exc:  # the server's end at the stop offset
            return got, paused_once, exc.code()
        finally:
            call.close()
        return got, paused_once, None

    with Peer() as peer:
        peer.respond(b"", *sent, status=8, details="Stop offset reached")
        got, paused_once, end = asyncio.run(slowly(peer))
    assert paused_once
    assert got == [b"", *sent]
    assert end is grpc.StatusCode.RESOURCE_EXHAUSTED
