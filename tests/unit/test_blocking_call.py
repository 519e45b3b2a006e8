"""The data plane's synchronous driver (client/h2/blocking.py) and Subscribe on it (client/subscribe_call.py),
against a scripted HTTP/2 server on loopback (tests/unit/h2_peer.py): its rules, one by one.

- a frozen peer is found by the keepalive (the call ends UNAVAILABLE after an unanswered PING), also when the
  reader stopped reading for longer than the bound meanwhile (what came is read before the rule is applied);
- a deadline on every exit: the connect bound (a peer that accepts and never sends its settings: nothing
  sent, DEADLINE_EXCEEDED), the call's deadline (DEADLINE_EXCEEDED, RST_STREAM), a cancel from another thread
  (CANCELLED, RST_STREAM, the waiting reader returns), a refused connection (UNAVAILABLE);
- TLS with ALPN h2 and the client's TLSConfig, and a certificate that does not name the broker;
- Subscribe's zero-length handshake, refusals before it, the server's end after it, GOAWAY;
- several threads writing one call while one reads.

The keepalive's bounds are shortened for these tests (monkeypatched); nothing here asserts a duration.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.events import PingReceived, RequestReceived, StreamEnded, StreamReset
from hyperframe.frame import GoAwayFrame

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client import TLSConfig
from liftbridge_provider.client.h2 import call_state
from liftbridge_provider.client.h2.aio_transport import NotConnected
from liftbridge_provider.client.h2.blocking import BlockingCall
from liftbridge_provider.client.h2.grpc_status import CallFailed
from liftbridge_provider.client.reading import resubscribable
from liftbridge_provider.client.subscribe_call import SUBSCRIBE, SubscribeCall
from tests.tls_certs import write_ca, write_server_cert
from tests.unit.h2_peer import Peer, grpc_message
from tests.waiting import wait_until

REQUEST = api.SubscribeRequest(stream="s", partition=0)
HANDSHAKE = b""


@pytest.fixture(autouse=True)
def short_keepalive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(call_state, "KEEPALIVE_IDLE", 0.2)
    monkeypatch.setattr(call_state, "KEEPALIVE_TIMEOUT", 0.2)


@pytest.fixture
def peer() -> Iterator[Peer]:
    with Peer() as server:
        yield server


def new_call(
    address: str, *, timeout: float = 60.0, tls: ssl.SSLContext | None = None, name: str | None = None
) -> BlockingCall:
    return BlockingCall(address, path=SUBSCRIBE, tls=tls, server_name=name, max_response_bytes=1 << 20, timeout=timeout)


def read_to_the_end(subscribe: SubscribeCall) -> tuple[list[bytes], CallFailed | None]:
    """The messages of every read after the handshake, and the error that ended the call (None: status OK)."""
    got: list[bytes] = []
    try:
        for segments in subscribe.reads():
            got += messages(segments)
    except CallFailed as exc:
        return got, exc
    return got, None


def messages(segments: list[tuple[bytes | bytearray, list[int]]]) -> list[bytes]:
    return [bytes(buffer[spans[i] : spans[i + 1]]) for buffer, spans in segments for i in range(0, len(spans), 2)]


def resets(peer: Peer) -> list[int]:
    return [int(e.error_code) for e in peer.events if isinstance(e, StreamReset)]


# -- keepalive ----------------------------------------------------------------------------------------------


def test_a_frozen_peer_ends_the_call_by_the_keepalive(peer: Peer) -> None:
    """The server confirms and then freezes: the waiting reader sends a PING after KEEPALIVE_IDLE of silence and
    ends the call UNAVAILABLE when it goes unanswered for KEEPALIVE_TIMEOUT, long before the call's deadline
    (an hour): a reader whose waits were not bounded by the keepalive's ticks would wait for the deadline and
    pytest-timeout would fail this test."""
    peer.respond(HANDSHAKE)
    with new_call(peer.address, timeout=3600) as call:
        subscribe = SubscribeCall(call, REQUEST)
        assert subscribe.confirm()
        peer.freeze()
        with pytest.raises(CallFailed) as ended:
            list(subscribe.reads())
    assert ended.value.code() is grpc.StatusCode.UNAVAILABLE
    assert "keepalive PING" in ended.value.details()
    assert resubscribable(ended.value), "the subscription resubscribes, as after grpc's own keepalive failure"


def test_a_reader_that_stopped_reading_reads_the_pings_answer_before_judging(peer: Peer) -> None:
    """A PING goes out, the server answers at once, and the reader then does not read for longer than the
    keepalive's bound (its consumer was busy): when it reads again, the answer waiting in the socket keeps the
    call; only a PING unanswered while the reader waits ends it."""
    peer.respond(HANDSHAKE)
    with new_call(peer.address) as call:
        subscribe = SubscribeCall(call, REQUEST)
        assert subscribe.confirm()
        assert call.receive(until=time.monotonic() + 0.5) == []  # a PING went out meanwhile
        wait_until(lambda: any(isinstance(e, PingReceived) for e in peer.events), 10, "the PING")
        time.sleep(1.0)  # not reading: the answer waits in the socket
        assert call.receive(until=time.monotonic() + 0.05) == []
        assert not call.over, call.state.ended
        peer.do(Peer.trailers(0))
        assert list(subscribe.reads()) == []


# -- deadlines on every exit ----------------------------------------------------------------------------------


def test_a_peer_that_accepts_and_never_speaks_http2_is_given_up_at_the_connect_bound() -> None:
    """A frozen broker's kernel accepts the connection: nothing but the client's preface, settings and the
    request's headers reaches it (no request DATA: nothing that could be stored), and the call fails as not
    connected with DEADLINE_EXCEEDED (the health model's "silent")."""
    with Peer(settings=False) as silent, new_call(silent.address) as call:
        with pytest.raises(NotConnected) as failed:
            call.connect(within=0.3)
        assert failed.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        assert not failed.value.refused
    assert grpc_message(REQUEST.SerializeToString()) not in bytes(silent.received)


def test_a_refused_connection_fails_at_once_as_unavailable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    with new_call(address) as call, pytest.raises(NotConnected) as failed:
        call.connect()
    assert failed.value.refused
    assert failed.value.code() is grpc.StatusCode.UNAVAILABLE


def test_the_calls_deadline_ends_it_and_tells_the_server(peer: Peer) -> None:
    """A live server that sends nothing after the handshake: the call ends DEADLINE_EXCEEDED ("Deadline
    Exceeded", as grpc) at its deadline, and the server gets RST_STREAM (CANCEL) and grpc-timeout."""
    peer.respond(HANDSHAKE)
    with new_call(peer.address, timeout=0.5) as call:
        subscribe = SubscribeCall(call, REQUEST)
        assert subscribe.confirm()
        with pytest.raises(CallFailed) as ended:
            list(subscribe.reads())
    assert (ended.value.code(), ended.value.details()) == (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
    wait_until(lambda: resets(peer) == [ErrorCodes.CANCEL], 10, "the server to see RST_STREAM")
    (opened,) = [e for e in peer.events if isinstance(e, RequestReceived)]
    assert any(name == b"grpc-timeout" for name, _ in opened.headers or [])


def test_a_cancel_from_another_thread_ends_a_waiting_read_and_tells_the_server(peer: Peer) -> None:
    peer.respond(HANDSHAKE)
    with new_call(peer.address) as call:
        subscribe = SubscribeCall(call, REQUEST)
        assert subscribe.confirm()
        threading.Timer(0.2, call.cancel).start()
        with pytest.raises(CallFailed) as ended:
            list(subscribe.reads())
    assert ended.value.code() is grpc.StatusCode.CANCELLED
    wait_until(lambda: resets(peer) == [ErrorCodes.CANCEL], 10, "the server to see RST_STREAM")


def test_a_cancel_before_the_connection_is_up_sends_nothing() -> None:
    with Peer(settings=False) as silent, new_call(silent.address) as call:
        threading.Timer(0.2, call.cancel).start()
        with pytest.raises(CallFailed) as ended:
            call.connect(within=30)
        assert ended.value.code() is grpc.StatusCode.CANCELLED
    assert grpc_message(REQUEST.SerializeToString()) not in bytes(silent.received)


# -- Subscribe's handshake and ends ---------------------------------------------------------------------------


def test_the_zero_length_handshake_confirms_and_the_servers_end_is_graspable(peer: Peer) -> None:
    """The empty first message confirms; the messages after it (in the same read or not) follow; the server's
    end at the stop offset reads as grpc's: RESOURCE_EXHAUSTED "Stop offset reached"."""
    first, second = api.Message(offset=0, value=b"a"), api.Message(offset=1, value=b"b")
    sent = [first.SerializeToString(), second.SerializeToString()]
    peer.respond(HANDSHAKE, *sent, status=8, details="Stop offset reached")
    with new_call(peer.address) as call:
        subscribe = SubscribeCall(call, REQUEST)
        assert subscribe.confirm()
        got, ended = read_to_the_end(subscribe)
    assert got == sent
    assert ended is not None
    assert (ended.code(), ended.details()) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "Stop offset reached")
    request = grpc_message(REQUEST.SerializeToString())
    wait_until(lambda: bytes(peer.received).count(request) == 1, 10, "the request, written once, in full")
    wait_until(lambda: any(isinstance(e, StreamEnded) for e in peer.events), 10, "the half-close after it")


def test_a_refusal_before_the_handshake_raises_and_an_ok_end_before_it_does_not_confirm(peer: Peer) -> None:
    peer.do(lambda conn: conn.send_headers(
        1, [(b":status", b"200"), (b"grpc-status", b"9"), (b"grpc-message", b"Server not partition leader")],
        end_stream=True,
    ))  # fmt: skip
    with new_call(peer.address) as call, pytest.raises(CallFailed) as refused:
        SubscribeCall(call, REQUEST).confirm()
    assert (refused.value.code(), refused.value.details()) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "Server not partition leader",
    )
    with Peer() as ending, new_call(ending.address) as call:
        ending.respond(status=0)
        assert not SubscribeCall(call, REQUEST).confirm()


@pytest.mark.parametrize(
    ("code", "last_stream"),
    [(ErrorCodes.INTERNAL_ERROR, 1), (ErrorCodes.ENHANCE_YOUR_CALM, 1), (ErrorCodes.NO_ERROR, 0)],
)
def test_a_goaway_ends_the_subscribe_call_as_a_lost_one(code: int, last_stream: int) -> None:
    """A GOAWAY with an error, or one that leaves the call out: the call ends UNAVAILABLE, as grpc's own client
    ends a call its connection's GOAWAY ended (gRPC's HTTP/2 mapping of ENHANCE_YOUR_CALM alone would say
    RESOURCE_EXHAUSTED, which the subscription does not resubscribe after), after the messages before it."""
    with Peer() as server, new_call(server.address) as call:
        server.respond(HANDSHAKE, b"")
        server.do(lambda conn: conn.close_connection(error_code=code, last_stream_id=last_stream))
        subscribe = SubscribeCall(call, REQUEST)
        assert subscribe.confirm()
        got, ended = read_to_the_end(subscribe)
    assert got == [b""]
    assert ended is not None
    assert ended.code() is grpc.StatusCode.UNAVAILABLE
    assert resubscribable(ended)


def test_a_graceful_goaway_lets_the_call_end_normally(peer: Peer) -> None:
    """GOAWAY NO_ERROR naming the call (a server shutting down gracefully): the call drains to its end."""

    def goaway_then_trailers(conn: H2Connection) -> bytes:
        conn.send_headers(1, [(b"grpc-status", b"0")], end_stream=True)
        trailers = conn.data_to_send()  # h2 sends nothing after its own GOAWAY: the frame goes first, raw
        return GoAwayFrame(0, last_stream_id=1, error_code=ErrorCodes.NO_ERROR).serialize() + trailers

    peer.respond(HANDSHAKE, b"")
    peer.do(goaway_then_trailers)
    with new_call(peer.address) as call:
        subscribe = SubscribeCall(call, REQUEST)
        assert subscribe.confirm()
        assert [messages(segments) for segments in subscribe.reads()] == [[b""]]
        assert call.state.ended is not None
        assert call.state.ended.code is grpc.StatusCode.OK


# -- TLS ------------------------------------------------------------------------------------------------------


def server_tls(folder: Path) -> tuple[ssl.SSLContext, TLSConfig]:
    ca = write_ca(folder)
    server = write_server_cert(folder, ca)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(server.cert_path, server.key_path)
    context.set_alpn_protocols(["h2"])
    return context, TLSConfig(ca=str(ca.cert_path))


def test_tls_with_alpn_h2_carries_the_call(tmp_path: Path) -> None:
    context, tls = server_tls(tmp_path)
    with Peer(tls=context) as peer, new_call(peer.address, tls=tls.ssl_context(alpn=("h2",))) as call:
        peer.respond(HANDSHAKE, b"over tls", status=0)
        subscribe = SubscribeCall(call, REQUEST)
        assert subscribe.confirm()
        assert [messages(segments) for segments in subscribe.reads()] == [[b"over tls"]]


def test_tls_refuses_a_certificate_that_does_not_name_the_broker(tmp_path: Path) -> None:
    """The name checked is ``server_name`` (else the host dialled): one the certificate does not cover fails
    the handshake, as not connected, before any HTTP/2 byte is written."""
    context, tls = server_tls(tmp_path)
    with Peer(tls=context) as peer:
        call = new_call(peer.address, tls=tls.ssl_context(alpn=("h2",)), name="not-in-the-certificate.example")
        with call, pytest.raises(NotConnected) as failed:
            call.connect()
        assert "certificate" in failed.value.reason.lower() or "hostname" in failed.value.reason.lower()
        assert failed.value.code() is grpc.StatusCode.UNAVAILABLE


# -- many writers, one reader ------------------------------------------------------------------------------


def test_several_threads_write_one_call_while_one_reads() -> None:
    """The driver serves a call written from several threads (a shared publish stream) and read by one waiting
    caller: every request arrives whole, in one piece each."""
    with Peer(streaming=True) as peer, new_call(peer.address) as call:
        peer.respond(HANDSHAKE)
        call.connect()

        def write(n: int) -> None:
            for i in range(50):
                call.send([b"%d-%d" % (n, i)])

        threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        # receive() also returns [] when what waited for room in the socket went out (the writers filled it):
        # the caller reads again (CI once got that [] first under load).
        got: list[bytes] = []
        for _ in range(100):
            if got := messages(call.receive(time.monotonic() + 10)):
                break
        assert got == [b""]
        for thread in threads:
            thread.join()
        call.close_sending()
        wait_until(lambda: any(isinstance(e, StreamEnded) for e in peer.events), 10, "the half-close")
    sent = b"".join(peer.data())
    expected = {grpc_message(b"%d-%d" % (n, i)) for n in range(4) for i in range(50)}
    found, position = set(), 0
    while position < len(sent):
        size = int.from_bytes(sent[position + 1 : position + 5], "big")
        found.add(sent[position : position + 5 + size])
        position += 5 + size
    assert found == expected


def test_a_write_that_fills_the_socket_goes_out_while_another_thread_waits_to_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Helper E's finding: a reader waiting in poll() had asked only for input, so what a writer on another
    thread left unwritten (the socket full: the peer was not reading) went out only at the reader's next
    wake-up, a response or its keepalive tick (up to 10 s). The writer wakes the reader now, which then waits
    for room too: the rest goes out as soon as the peer reads again."""
    monkeypatch.setattr(call_state, "KEEPALIVE_IDLE", 60.0)  # no keepalive tick wakes the reader here
    size = 32 << 20  # more than the loopback socket buffers take while the peer reads nothing
    with Peer(streaming=True, window=1 << 30) as peer, new_call(peer.address) as call:
        peer.respond(HANDSHAKE)
        call.connect()
        assert messages(call.receive()) == [b""]
        reader = threading.Thread(target=call.receive, args=(time.monotonic() + 30,), daemon=True)
        reader.start()
        time.sleep(0.2)  # the reader waits in poll(), for input only
        peer.freeze()
        call.send([b"x" * size])
        assert not call.clear, "the socket took everything: the test needs a fuller write"
        time.sleep(0.2)
        peer.thaw()
        wait_until(lambda: sum(map(len, peer.data())) >= size + 5, 5, "the rest of the write")
        wait_until(lambda: call.clear, 5, "the call to say everything went out")
        reader.join(timeout=5)
        assert not reader.is_alive(), "the reader goes on waiting once what waited was written"
