"""The shared PublishAsync stream of single publishes (client/publish/broker_stream.py) on the data plane's
synchronous driver, against a scripted HTTP/2 server on loopback (tests/unit/h2_peer.py): its rules, one by one.

- acks reach their callers by correlation id, whichever caller reads them (the turn);
- keepalive: a frozen broker fails the waiting callers UNAVAILABLE, may be stored;
- a deadline on every exit: a caller waiting while another holds the turn, a write that cannot go out (not
  sent), a message the broker's window held back wholly (withdrawn, never written);
- a reader that fails leaves the turn to the next caller;
- what waits on the socket is read before a write (a broker gone shows, nothing is sent);
- close() fails the waiting callers and wakes the reader; an idle stream is half-closed and ended.

The keepalive's bounds are shortened for these tests (monkeypatched); no test asserts a duration beyond
"well before the deadline that would otherwise end it".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import grpc
import pytest
from h2.connection import H2Connection
from h2.events import StreamEnded, StreamReset

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client.errors import ClientClosedError, UnavailableError
from liftbridge_provider.client.h2 import call_state
from liftbridge_provider.client.h2.blocking import BlockingCall
from liftbridge_provider.client.publish.broker_stream import (
    PUBLISH_ASYNC,
    BrokerStream,
    NoAnswer,
    SendStalled,
    StreamClosed,
)
from liftbridge_provider.core.errors import LiftbridgeError
from tests.unit.h2_peer import Peer
from tests.waiting import wait_until


@pytest.fixture(autouse=True)
def short_keepalive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(call_state, "KEEPALIVE_IDLE", 0.2)
    monkeypatch.setattr(call_state, "KEEPALIVE_TIMEOUT", 0.2)


def acking(offsets: Iterator[int] | None = None) -> Callable[[bytes], bytes | None]:
    """A PublishAsync server's answer: an ack with the request's correlation id."""
    counter = offsets or iter(range(1 << 30))

    def answer(data: bytes) -> bytes:
        request = api.PublishRequest.FromString(data)
        return api.PublishResponse(
            ack=api.Ack(correlationId=request.correlationId, offset=next(counter))
        ).SerializeToString()

    return answer


def silent(data: bytes) -> None:
    return None


def open_stream(peer: Peer, *, idle_close: float = 60.0) -> tuple[BrokerStream, BlockingCall, list[BlockingCall]]:
    call = BlockingCall(
        peer.address, path=PUBLISH_ASYNC, tls=None, server_name=None, max_response_bytes=1 << 20, timeout=None
    )
    call.connect()
    released: list[BlockingCall] = []

    def release(done: BlockingCall) -> None:
        released.append(done)
        done.close()

    return BrokerStream(peer.address, call, idle_close=idle_close, release=release), call, released


def request(cid: str, value: bytes = b"v") -> api.PublishRequest:
    return api.PublishRequest(stream="s", value=value, correlationId=cid, ackPolicy=api.LEADER)


def publish(stream: BrokerStream, cid: str, seconds: float = 10.0, value: bytes = b"v") -> api.PublishResponse:
    deadline = time.monotonic() + seconds
    return stream.result(stream.send(request(cid, value), deadline), deadline)


def test_acks_reach_their_callers_whichever_caller_reads_them() -> None:
    with Peer(answer=acking()) as peer:
        stream, _, _ = open_stream(peer)
        got: dict[str, str] = {}
        errors: list[BaseException] = []

        def many(worker: int) -> None:
            try:
                for i in range(100):
                    cid = f"w{worker}-{i}"
                    got[cid] = publish(stream, cid).ack.correlationId
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=many, args=(w,)) for w in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not errors, errors[:3]
        assert len(got) == 600
        assert all(cid == answered for cid, answered in got.items())
        stream.close(lambda sent: ClientClosedError("closed"))
        assert stream.ended


def test_a_frozen_broker_fails_the_waiting_callers_by_the_keepalive_as_may_be_stored() -> None:
    """A caller waits with an hour left; the broker froze: the keepalive's PING goes unanswered and the call
    ends UNAVAILABLE, failing every waiting caller as may-be-stored (their messages were written), and the
    stream's connection is closed. Without the keepalive the callers would wait for their deadline."""
    with Peer(answer=silent) as peer:
        stream, _, released = open_stream(peer)
        peer.freeze()
        outcomes: list[BaseException] = []

        def wait(cid: str) -> None:
            try:
                publish(stream, cid, seconds=3600)
            except BaseException as exc:  # checked below
                outcomes.append(exc)

        threads = [threading.Thread(target=wait, args=(f"c{i}",)) for i in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=20)
        assert not any(t.is_alive() for t in threads), "the keepalive did not end the call"
        assert len(outcomes) == 3
        for error in outcomes:
            assert isinstance(error, UnavailableError), error
            assert error.may_be_stored
            assert "keepalive PING" in str(error)
        assert released, "the ended call's connection was closed"
        with pytest.raises(StreamClosed):
            stream.send(request("after"), time.monotonic() + 1)


def test_a_caller_waits_no_longer_than_its_deadline_while_another_holds_the_turn() -> None:
    with Peer(answer=silent) as peer:
        stream, _, _ = open_stream(peer)

        def hold() -> None:
            with pytest.raises(NoAnswer):
                publish(stream, "long", 3.0)

        holder = threading.Thread(target=hold, daemon=True)
        holder.start()
        time.sleep(0.1)  # the holder reads, waiting for its ack
        started = time.monotonic()
        with pytest.raises(NoAnswer) as missing:
            publish(stream, "short", 0.3)
        assert time.monotonic() - started < 2.0
        assert missing.value.sent, "written in full: it may be stored"
        holder.join(timeout=10)
        stream.close(lambda sent: ClientClosedError("closed"))


def test_a_reader_that_fails_leaves_the_turn_to_the_next_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller holding the turn fails inside its read (here an exception from the driver): it must not leave
    the stream marked as read by someone, or every other caller would wait for a reader that never comes back;
    the next caller takes the turn and gets its ack."""
    answers: list[bytes] = []
    release_acks = threading.Event()

    def held(data: bytes) -> bytes | None:  # the first request's ack is held until the second one came
        answers.append(data)
        return acking()(data) if len(answers) > 1 else None

    with Peer(answer=held) as peer:
        stream, call, _ = open_stream(peer)
        original = call.receive
        failed = threading.Event()

        def failing_once(until: float | None = None) -> object:
            waiting = until is not None and until - time.monotonic() > 1  # the wait for the ack, not a look
            if threading.current_thread().name == "first" and waiting and not failed.is_set():
                release_acks.wait(5)
                failed.set()
                raise RuntimeError("driver bug")
            return original(until)

        monkeypatch.setattr(call, "receive", failing_once)
        outcome: list[BaseException] = []

        def first_caller() -> None:
            with pytest.raises(RuntimeError) as raised:
                publish(stream, "one")
            outcome.append(raised.value)

        first = threading.Thread(target=first_caller, name="first")
        first.start()
        wait_until(lambda: answers and stream._reading, 5, "the first caller to wait for its ack")
        second: list[api.PublishResponse] = []
        other = threading.Thread(target=lambda: second.append(publish(stream, "two", 5.0)))
        other.start()
        wait_until(lambda: len(answers) == 2, 5, "the second request")
        release_acks.set()
        other.join(timeout=10)
        first.join(timeout=10)
        assert second, "the second caller never got the turn"
        assert second[0].ack.correlationId == "two"
        assert outcome
        stream.close(lambda sent: ClientClosedError("closed"))


def test_a_write_that_cannot_go_out_by_its_deadline_is_not_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    """The broker stopped reading (frozen) while a large message was written: the next message cannot go out by
    its deadline and is not sent at all (SendStalled); the large one, partly written, may be stored."""
    monkeypatch.setattr(call_state, "KEEPALIVE_IDLE", 30.0)  # the frozen broker's call stays up meanwhile
    with Peer(answer=silent, window=1 << 30) as peer:
        stream, call, _ = open_stream(peer)
        peer.freeze()
        with pytest.raises(NoAnswer) as big:
            publish(stream, "big", 0.5, value=b"B" * (32 << 20))
        assert big.value.sent
        assert not call.clear, "the socket took the whole message: the test needs a larger one"
        started = time.monotonic()
        with pytest.raises(SendStalled):
            publish(stream, "behind", 0.3)
        assert time.monotonic() - started < 2.0
        stream.close(lambda sent: ClientClosedError("closed"))


def test_a_message_the_brokers_window_held_back_is_withdrawn_at_its_deadline_and_never_written() -> None:
    """The broker's flow-control window is used up exactly (it never grants it back here): the next message
    goes to the call whole but none of it can be written; at its deadline it is taken back (not sent), and
    it is not written when the window opens later."""
    with Peer(streaming=True) as peer:
        peer.respond()
        stream, call, _ = open_stream(peer)
        filler = request("fill", b"")
        filler.value = b"F" * (65_535 - 5 - filler.ByteSize() - 4)
        filler.value += b"F" * (65_535 - 5 - filler.ByteSize())
        assert filler.ByteSize() + 5 == 65_535
        deadline = time.monotonic() + 0.3
        stream.send(filler, deadline)
        wait_until(lambda: call.clear, 5, "the filler to go out")
        with pytest.raises(NoAnswer) as held:
            publish(stream, "held", 0.3, value=b"HELD")
        assert not held.value.sent, "none of it went out: not sent"
        assert call.clear, "taken back"

        def open_windows(conn: H2Connection) -> None:
            conn.increment_flow_control_window(1 << 20)
            conn.increment_flow_control_window(1 << 20, 1)

        peer.do(open_windows)
        with pytest.raises(NoAnswer):
            publish(stream, "later", 1.0, value=b"LATER")
        wait_until(lambda: b"LATER" in bytes(peer.received), 5, "the later message")
        assert b"HELD" not in bytes(peer.received)
        stream.close(lambda sent: ClientClosedError("closed"))


def test_a_broker_gone_since_the_last_publish_shows_before_the_write() -> None:
    with Peer(answer=acking()) as peer:
        stream, _, released = open_stream(peer)
        assert publish(stream, "first").ack.offset == 0
    # the server's side is closed: its end waits unread on the socket (once the kernel delivered it)
    wait_until(stream._call.news, 5, "the server's end on the socket")
    time.sleep(0.01)  # longer ago than FRESH: the write looks first
    with pytest.raises(StreamClosed):
        stream.send(request("second"), time.monotonic() + 1)
    assert not stream.usable
    assert released


def test_close_fails_the_waiting_callers_and_wakes_the_reader() -> None:
    with Peer(answer=silent) as peer:
        stream, _, released = open_stream(peer)
        outcome: list[BaseException] = []

        def wait() -> None:
            try:
                publish(stream, "waits", 60)
            except BaseException as exc:  # checked below
                outcome.append(exc)

        waiting = threading.Thread(target=wait)
        waiting.start()
        wait_until(lambda: peer.data() and stream._reading, 5, "the caller to wait for its ack")
        stream.close(lambda sent: ClientClosedError("closed", may_be_stored=sent))
        waiting.join(timeout=5)
        assert not waiting.is_alive(), "close() did not wake the reader"
        (error,) = outcome
        assert isinstance(error, ClientClosedError)
        assert error.may_be_stored, "written: it may be stored"
        assert released, "the reader closed the connection as it left"
        wait_until(lambda: any(isinstance(e, StreamReset) for e in peer.events), 5, "RST_STREAM")


def test_an_idle_stream_is_half_closed_and_ended() -> None:
    with Peer(answer=acking()) as peer:
        stream, _, released = open_stream(peer, idle_close=0.2)
        publish(stream, "one")
        assert not stream.close_if_idle(time.monotonic())
        assert stream.close_if_idle(time.monotonic() + 0.3)
        assert stream.ended
        assert released
        wait_until(lambda: any(isinstance(e, StreamEnded) for e in peer.events), 5, "the half-close")
        with pytest.raises(StreamClosed):
            stream.send(request("two"), time.monotonic() + 1)


def test_a_response_that_does_not_parse_ends_the_call_after_the_others() -> None:
    """As grpc does: the call ends (INTERNAL) and the callers still waiting fail as may-be-stored."""

    def garbage(data: bytes) -> bytes:
        return b"\xff\xff\xff"

    with Peer(answer=garbage) as peer:
        stream, _, _ = open_stream(peer)
        with pytest.raises(LiftbridgeError) as failed:
            publish(stream, "one", 5.0)
        assert isinstance(failed.value, UnavailableError)
        assert failed.value.may_be_stored
        assert "INTERNAL" in str(failed.value)
        assert failed.value.code == grpc.StatusCode.UNAVAILABLE
