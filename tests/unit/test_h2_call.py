"""The HTTP/2 call of publish_batch and publish (client/h2/call_state.py) as pure logic, no sockets: its peer is h2's
own server side (an H2Connection with client_side=False), and frames h2 would not send are built with
hyperframe."""

from __future__ import annotations

import struct
import time
from collections.abc import Callable

import grpc
import pytest
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.events import (
    DataReceived,
    Event,
    PingAckReceived,
    RemoteSettingsChanged,
    RequestReceived,
    SettingsAcknowledged,
    StreamEnded,
    StreamReset,
    WindowUpdated,
)
from h2.settings import SettingCodes
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    PushPromiseFrame,
)

from liftbridge_provider.client.h2.call_state import (
    DEFAULT_WINDOW,
    KEEPALIVE_IDLE,
    KEEPALIVE_TIMEOUT,
    PINGS_WITHOUT_DATA,
    QUIET_PING_SPACING,
    RECEIVE_WINDOW,
    STREAM,
    CallState,
)
from liftbridge_provider.client.publish.publish_window import PublishWindow

MAX_FRAME = 16_384  # the largest frame until a peer's setting says otherwise


def new_call(
    *, tls: bool = False, max_response_bytes: int = 1 << 20, clock: Callable[[], float] | None = None
) -> CallState:
    return CallState(
        authority="127.0.0.1:9292",
        path="/proto.API/PublishAsync",
        tls=tls,
        max_response_bytes=max_response_bytes,
        clock=clock if clock is not None else time.monotonic,
    )


class Peer:
    """The server's side: h2's server state machine, fed what the call writes."""

    def __init__(self, call: CallState, settings: dict[SettingCodes | int, int] | None = None) -> None:
        self.call = call
        self.conn = H2Connection(H2Configuration(client_side=False, header_encoding=None))
        self.conn.initiate_connection()
        if settings:  # a second SETTINGS frame: h2 applies them to its own side once the call acknowledges them
            self.conn.update_settings(settings)

    def read(self) -> list[Event]:
        """What the call writes now, as the server's events."""
        return self.conn.receive_data(self.call.outgoing())

    def write(self) -> bytes:
        """What the server has to send."""
        return self.conn.data_to_send()

    def open(self) -> None:
        """The call's opening read by the server, the server's settings and response headers read by the call."""
        self.read()
        self.conn.send_headers(STREAM, [(b":status", b"200"), (b"content-type", b"application/grpc")])
        assert self.call.receive(self.write()) == []


def parse(data: bytes) -> list[Frame]:
    """Every frame in ``data`` (after the client preface, if any)."""
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    if data.startswith(preface):
        data = data[len(preface) :]
    found, position = [], 0
    while position < len(data):
        frame, length = Frame.parse_frame_header(memoryview(data[position : position + 9]))
        frame.parse_body(memoryview(data[position + 9 : position + 9 + length]))
        found.append(frame)
        position += 9 + length
    return found


def grpc_message(payload: bytes) -> bytes:
    return struct.pack(">BI", 0, len(payload)) + payload


def data_sizes(events: list[Event]) -> list[int]:
    return [len(event.data) for event in events if isinstance(event, DataReceived)]


def test_the_call_opens_with_settings_a_larger_window_and_the_request_headers() -> None:
    events = Peer(new_call()).read()
    settings = next(event for event in events if isinstance(event, RemoteSettingsChanged))
    assert settings.changed_settings[SettingCodes.ENABLE_PUSH].new_value == 0
    assert settings.changed_settings[SettingCodes.INITIAL_WINDOW_SIZE].new_value == RECEIVE_WINDOW
    update = next(event for event in events if isinstance(event, WindowUpdated))
    assert (update.stream_id, update.delta) == (0, RECEIVE_WINDOW - DEFAULT_WINDOW)
    request = next(event for event in events if isinstance(event, RequestReceived))
    assert request.stream_id == STREAM
    headers = dict(request.headers or [])
    assert headers[b":method"] == b"POST"
    assert headers[b":scheme"] == b"http"
    assert headers[b":path"] == b"/proto.API/PublishAsync"
    assert headers[b":authority"] == b"127.0.0.1:9292"
    assert (headers[b"content-type"], headers[b"te"]) == (b"application/grpc", b"trailers")
    tls = Peer(new_call(tls=True)).read()
    assert dict(next(e for e in tls if isinstance(e, RequestReceived)).headers or [])[b":scheme"] == b"https"


def test_queued_requests_go_out_together_within_the_peer_window_and_largest_frame() -> None:
    call = new_call()
    peer = Peer(call)
    peer.read()
    call.receive(peer.write())  # the server's SETTINGS: requests may go out
    call.queue([b"a" * 40_000, b"b" * 40_000])  # 80,010 bytes framed: over the default 65,535 window
    data = call.outgoing()
    assert [len(frame.data) for frame in parse(data) if isinstance(frame, DataFrame)] == [
        MAX_FRAME,
        MAX_FRAME,
        MAX_FRAME,
        DEFAULT_WINDOW - 3 * MAX_FRAME,
    ]
    assert peer.conn.receive_data(data)
    assert call.written_messages == 1  # the second is only partly written
    assert call.queued_bytes == 80_010 - DEFAULT_WINDOW
    assert call.outgoing() == b""  # no credit left
    peer.conn.increment_flow_control_window(100_000)
    peer.conn.increment_flow_control_window(100_000, STREAM)
    call.receive(peer.write())
    assert sum(data_sizes(peer.read())) == 80_010 - DEFAULT_WINDOW
    assert call.written_messages == 2


def test_no_request_is_written_before_the_servers_settings_came() -> None:
    """A frozen broker's kernel accepts the connection and takes the bytes while nothing reads them: a request
    written then would count as written (maybe stored) though no server saw it. So requests wait for the
    server's SETTINGS, as grpc waits for them before it uses a connection (found by the watcher fault test:
    a batch sent to a frozen leader failed as 'no ack' instead of going to the next broker)."""
    call = new_call()
    peer = Peer(call)
    call.queue([b"held"])
    ready_before_settings = call.peer_ready
    assert not ready_before_settings
    assert data_sizes(peer.read()) == []  # the preface, settings and headers only
    assert call.written_messages == 0  # nothing of it was written: it may go to another broker
    call.receive(peer.write())
    assert call.peer_ready
    events = peer.read()
    assert data_sizes(events) == [9]
    assert call.written_messages == 1


def test_settings_change_the_stream_window_and_frame_size_and_are_acknowledged() -> None:
    call = new_call()
    peer = Peer(call, {SettingCodes.INITIAL_WINDOW_SIZE: 10, SettingCodes.MAX_FRAME_SIZE: 20_000})
    peer.read()
    assert call.receive(peer.write()) == []
    call.queue([b"x" * 30])
    events = peer.read()
    assert any(isinstance(event, SettingsAcknowledged) for event in events)
    assert data_sizes(events) == [10]
    peer.conn.update_settings({SettingCodes.INITIAL_WINDOW_SIZE: 50_000})  # +49,990 for the open stream
    call.receive(peer.write())
    events = peer.read()
    assert any(isinstance(event, SettingsAcknowledged) for event in events)
    assert data_sizes(events) == [25]
    call.queue([b"y" * 20_000])
    assert data_sizes(peer.read()) == [20_000, 5]  # frames up to the peer's 20,000, not the default 16,384


def test_pings_are_answered_and_responses_are_cut_from_data_frames() -> None:
    call = new_call()
    peer = Peer(call)
    peer.open()
    one, two = grpc_message(b"first"), grpc_message(b"second")
    peer.conn.ping(b"12345678")
    peer.conn.send_data(STREAM, one + two[:3])
    peer.conn.send_data(STREAM, two[3:])
    data = peer.write()
    assert call.receive(data[:20]) == []  # a frame cut in two waits for its end
    assert call.receive(data[20:]) == [b"first", b"second"]
    pongs = [event for event in peer.read() if isinstance(event, PingAckReceived)]
    assert [pong.ping_data for pong in pongs] == [b"12345678"]
    assert call.ended is None


def test_padded_data_is_read_without_its_padding() -> None:
    call = new_call()
    peer = Peer(call)
    peer.open()
    peer.conn.send_data(STREAM, grpc_message(b"ok"), pad_length=4)
    assert call.receive(peer.write()) == [b"ok"]


def trailers(peer: Peer, status: int, message: str = "", **more: bytes) -> bytes:
    fields = [(b"grpc-status", str(status).encode())] + ([(b"grpc-message", message.encode())] if message else [])
    fields += [(name.encode(), value) for name, value in more.items()]
    peer.conn.send_headers(STREAM, fields, end_stream=True)
    return peer.write()


def test_trailers_end_the_call_with_their_status_and_message() -> None:
    call = new_call()
    peer = Peer(call)
    peer.open()
    peer.conn.send_data(STREAM, grpc_message(b"last ack"))
    assert call.receive(peer.write() + trailers(peer, 0)) == [b"last ack"]  # what came before the end is read
    assert call.ended is not None
    assert call.ended.code is grpc.StatusCode.OK
    failing = new_call()
    peer = Peer(failing)
    peer.open()
    failing.receive(trailers(peer, 8, "grpc: received message larger than max%3A 5"))
    assert failing.ended is not None
    assert (failing.ended.code, failing.ended.details) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "grpc: received message larger than max: 5",
    )


def test_a_trailers_only_response_split_over_continuation_frames_ends_the_call() -> None:
    call = new_call()
    peer = Peer(call)
    peer.read()
    call.receive(peer.write())
    headers = [(b":status", b"200"), (b"grpc-status", b"14"), (b"grpc-message", b"gone"), (b"x-filler", b"z" * 20_000)]
    peer.conn.send_headers(STREAM, headers, end_stream=True)
    data = peer.write()
    assert [type(frame) for frame in parse(data)] == [HeadersFrame, ContinuationFrame]
    call.receive(data)
    assert call.ended is not None
    assert (call.ended.code, call.ended.details) == (grpc.StatusCode.UNAVAILABLE, "gone")


def _reset(code: ErrorCodes) -> Callable[[Peer], bytes]:
    def write(peer: Peer) -> bytes:
        peer.conn.reset_stream(STREAM, code)
        return peer.write()

    return write


def _goaway(code: ErrorCodes, last: int) -> Callable[[Peer], bytes]:
    def write(peer: Peer) -> bytes:
        peer.conn.close_connection(code, last_stream_id=last)
        return peer.write()

    return write


def _data(payload: bytes, *, end: bool = False) -> Callable[[Peer], bytes]:
    def write(peer: Peer) -> bytes:
        peer.conn.send_data(STREAM, payload, end_stream=end)
        return peer.write()

    return write


def _push(peer: Peer) -> bytes:
    frame = PushPromiseFrame(STREAM, promised_stream_id=2, data=b"\x82\x86\x84\x41\x01a", flags=["END_HEADERS"])
    return frame.serialize()


@pytest.mark.parametrize(
    ("server", "code"),
    [
        (_reset(ErrorCodes.REFUSED_STREAM), grpc.StatusCode.UNAVAILABLE),
        (_reset(ErrorCodes.CANCEL), grpc.StatusCode.CANCELLED),
        (_reset(ErrorCodes.FLOW_CONTROL_ERROR), grpc.StatusCode.INTERNAL),
        (_goaway(ErrorCodes.NO_ERROR, 0), grpc.StatusCode.UNAVAILABLE),
        (_goaway(ErrorCodes.ENHANCE_YOUR_CALM, STREAM), grpc.StatusCode.RESOURCE_EXHAUSTED),
        (_data(b"", end=True), grpc.StatusCode.INTERNAL),  # ended without trailers
        (_data(struct.pack(">BI", 1, 1) + b"z"), grpc.StatusCode.INTERNAL),  # compressed, not asked for
        (_push, grpc.StatusCode.INTERNAL),
        (lambda peer: DataFrame(3, data=b"x").serialize(), grpc.StatusCode.INTERNAL),  # a stream never opened
    ],
)
def test_resets_goaways_and_broken_input_end_the_call(server: Callable[[Peer], bytes], code: grpc.StatusCode) -> None:
    call = new_call()
    peer = Peer(call)
    peer.open()
    call.queue([b"waiting"])
    call.receive(server(peer))
    assert call.ended is not None
    assert call.ended.code is code, call.ended
    assert not [frame for frame in parse(call.outgoing()) if isinstance(frame, DataFrame)]  # nothing more written
    assert call.written_messages == 0


def test_an_http_status_other_than_200_ends_the_call() -> None:
    call = new_call()
    peer = Peer(call)
    peer.read()
    peer.conn.send_headers(STREAM, [(b":status", b"503")])
    call.receive(peer.write())
    assert call.ended is not None
    assert call.ended.code is grpc.StatusCode.UNAVAILABLE
    assert call.ended.details == "the server answered HTTP status 503"


def test_a_response_over_the_limit_ends_the_call() -> None:
    call = new_call(tls=True, max_response_bytes=4)
    peer = Peer(call)
    peer.open()
    peer.conn.send_data(STREAM, grpc_message(b"1234"))
    assert call.receive(peer.write()) == [b"1234"]
    peer.conn.send_data(STREAM, grpc_message(b"12345"))
    assert call.receive(peer.write()) == []
    assert call.ended is not None
    assert call.ended.code is grpc.StatusCode.RESOURCE_EXHAUSTED


def test_read_bytes_are_granted_back_once_half_the_window_is_used() -> None:
    call = new_call()
    peer = Peer(call)
    peer.open()
    chunk = grpc_message(b"x" * (MAX_FRAME - 5))
    count = RECEIVE_WINDOW // 2 // MAX_FRAME
    for _ in range(count - 1):
        peer.conn.send_data(STREAM, chunk)
    assert len(call.receive(peer.write())) == count - 1
    assert not [event for event in peer.read() if isinstance(event, WindowUpdated)]  # under half: nothing yet
    peer.conn.send_data(STREAM, chunk)
    assert len(call.receive(peer.write())) == 1
    updates = [(event.stream_id, event.delta) for event in peer.read() if isinstance(event, WindowUpdated)]
    assert sorted(updates) == [(0, count * MAX_FRAME), (STREAM, count * MAX_FRAME)]


def test_closing_the_sending_side_follows_the_last_request_and_failing_resets_the_stream() -> None:
    call = new_call()
    peer = Peer(call)
    peer.open()
    call.queue([b"last"])
    call.close_sending()
    events = peer.read()
    assert data_sizes(events) == [9, 0]  # the request, then an empty DATA frame with END_STREAM
    assert isinstance(events[-1], StreamEnded)
    assert call.written_messages == 1
    with pytest.raises(ValueError, match="closed"):
        call.queue([b"more"])
    resets = [event for event in peer.conn.receive_data(call.fail(grpc.StatusCode.CANCELLED, "done"))]
    assert [(type(event), event.error_code) for event in resets if isinstance(event, StreamReset)] == [
        (StreamReset, ErrorCodes.CANCEL)
    ]
    assert call.ended is not None
    assert call.ended.code is grpc.StatusCode.CANCELLED


def test_untaken_messages_go_back_to_the_window_and_failed_ones_stay_failed() -> None:
    window = PublishWindow(6, window=10, ack_wait=1.0, expects_ack=True)
    assert list(window.take_many(0.0, 4)) == [0, 1, 2, 3]
    window.expire(1.5, TimeoutError)  # type: ignore[arg-type]
    assert window.untake([2, 3]) == 2
    assert window.in_flight == 0
    assert list(window.take_many(2.0, 10)) == [4, 5]  # 2 and 3 timed out: they stay failed, never re-taken
    fresh = PublishWindow(3, window=10, ack_wait=1.0, expects_ack=False)
    assert list(fresh.take_many(0.0, 5)) == [0, 1, 2]
    assert fresh.untake([1, 2]) == 2
    assert list(fresh.take_many(0.0, 5)) == [1, 2]
    with pytest.raises(ValueError, match="not taken"):
        fresh.untake([4])


def test_take_many_stops_at_the_window_and_before_a_refused_message() -> None:
    window = PublishWindow(10, window=3, ack_wait=1.0, expects_ack=True)
    window.refuse(1, TimeoutError("refused"))  # type: ignore[arg-type]
    assert list(window.take_many(0.0, 10)) == [0]
    assert list(window.take_many(0.0, 10)) == [2, 3]  # the refused one is skipped; the window holds 3
    assert list(window.take_many(0.0, 10)) == []


# -- GOAWAY, read by the call itself (h2 takes no frame after one) -------------------------------------


def goaway_frame(code: int = 0, last: int = STREAM) -> bytes:
    frame = GoAwayFrame(0)
    frame.last_stream_id, frame.error_code = last, code
    return frame.serialize()


def answers(peer: Peer, *payloads: bytes) -> bytes:
    for payload in payloads:
        peer.conn.send_data(STREAM, grpc_message(payload))
    return peer.write()


def test_responses_around_a_graceful_goaway_in_one_read_are_all_taken() -> None:
    """A read that held DATA, a graceful GOAWAY and more DATA made h2 raise, and every response in it was lost
    (issue 47, item 6): acks the server had sent were reported as lost, possibly stored."""
    call = new_call()
    peer = Peer(call)
    peer.open()
    data = answers(peer, b"before") + goaway_frame() + answers(peer, b"after")
    assert call.receive(data) == [b"before", b"after"]
    assert call.ended is None
    assert call.draining


def test_a_graceful_goaway_lets_the_call_end_normally_and_writes_nothing_more() -> None:
    call = new_call()
    peer = Peer(call)
    peer.open()
    call.queue([b"written"])
    peer.read()
    assert call.written_messages == 1
    call.receive(goaway_frame())
    call.queue([b"never written"])
    frames = parse(call.outgoing())
    assert [f for f in frames if isinstance(f, DataFrame) and f.data] == []  # no request after the GOAWAY
    assert any(isinstance(f, DataFrame) and "END_STREAM" in f.flags for f in frames)  # the sending side closed
    assert call.written_messages == 1
    assert call.receive(answers(peer, b"ack") + trailers(peer, 0)) == [b"ack"]
    assert call.ended is not None
    assert call.ended.code is grpc.StatusCode.OK


@pytest.mark.parametrize(("code", "status"), [(2, grpc.StatusCode.INTERNAL), (11, grpc.StatusCode.RESOURCE_EXHAUSTED)])
def test_a_goaway_with_an_error_ends_the_call_after_the_responses_before_it(code: int, status: grpc.StatusCode) -> None:
    call = new_call()
    peer = Peer(call)
    peer.open()
    assert call.receive(answers(peer, b"first") + goaway_frame(code)) == [b"first"]
    assert call.ended is not None
    assert call.ended.code is status


def test_frames_cut_anywhere_read_the_same() -> None:
    """The call walks frame headers to find GOAWAY: a header, a GOAWAY or a DATA frame cut between two reads at
    any byte gives the same responses and the same end."""
    peer_call = new_call()
    peer = Peer(peer_call)
    peer.open()
    stream = answers(peer, b"a" * 40, b"b") + goaway_frame() + answers(peer, b"c" * 300) + trailers(peer, 0)
    for cut in range(1, len(stream)):
        for second in (cut, min(cut + 7, len(stream))):
            call = new_call()
            twin = Peer(call)
            twin.open()  # the same settings and headers, so the server frames above decode the same
            got = call.receive(stream[:cut]) + call.receive(stream[cut:second]) + call.receive(stream[second:])
            assert got == [b"a" * 40, b"b", b"c" * 300], cut
            assert call.ended is not None, cut
            assert call.ended.code is grpc.StatusCode.OK, cut


def test_pings_and_window_updates_cut_anywhere_are_read_by_the_call() -> None:
    """The call reads the server's PINGs and WINDOW_UPDATEs itself (not h2): cut between reads at any byte, a
    PING is answered once with its payload and the WINDOW_UPDATEs open the windows for what was held back."""
    peer = Peer(new_call())
    peer.open()
    peer.conn.ping(b"pingpong")
    peer.conn.increment_flow_control_window(70_000)
    peer.conn.increment_flow_control_window(70_000, STREAM)
    stream = answers(peer, b"a" * 40) + peer.write() + answers(peer, b"b")
    for cut in range(1, len(stream)):
        call = new_call()
        Peer(call).open()
        call.queue([b"r" * 100_000])
        call.outgoing()
        assert call.queued_bytes == 100_005 - DEFAULT_WINDOW
        assert call.receive(stream[:cut]) + call.receive(stream[cut:]) == [b"a" * 40, b"b"], cut
        written = call.outgoing()
        answered = [f for f in parse(written) if isinstance(f, PingFrame) and "ACK" in f.flags]
        assert [f.opaque_data for f in answered] == [b"pingpong"], cut
        assert call.written_messages == 1, cut
        assert call.ended is None, cut


def test_window_updates_open_the_calls_own_send_windows_and_bad_ones_end_the_call() -> None:
    """The call keeps its send windows itself (h2 never sees its DATA nor the server's WINDOW_UPDATEs): the
    connection's and the stream's both bound what goes out; an update of 0 or one past 2^31-1 is an HTTP/2
    error that ends the call."""
    call = new_call()
    peer = Peer(call)
    peer.open()
    call.queue([b"x" * 70_000])
    assert sum(data_sizes(peer.read())) == DEFAULT_WINDOW
    peer.conn.increment_flow_control_window(10_000, STREAM)  # the stream's only: the connection's still closed
    call.receive(peer.write())
    assert data_sizes(peer.read()) == []
    peer.conn.increment_flow_control_window(3_000)
    call.receive(peer.write())
    assert sum(data_sizes(peer.read())) == 3_000
    assert not call.over
    zero = struct.pack(">IBII", (4 << 8) | 0x8, 0, 0, 0)
    call.receive(zero)
    assert call.ended is not None
    assert call.ended.code is grpc.StatusCode.INTERNAL
    over = new_call()
    Peer(over).open()
    over.receive(struct.pack(">IBII", (4 << 8) | 0x8, 0, STREAM, 2**31 - 1))
    assert over.ended is not None
    assert "2^31-1" in over.ended.details


def test_a_request_none_of_which_was_written_can_be_withdrawn() -> None:
    """A message the server's window held back wholly is taken back at its caller's deadline (the shared publish
    stream's "not sent"); one partly written, or not the last queued, stays."""
    call = new_call()
    peer = Peer(call)
    peer.open()
    first_starts = call.queued_through
    call.queue([b"a" * (DEFAULT_WINDOW - 5)])  # exactly the window
    assert sum(data_sizes(peer.read())) == DEFAULT_WINDOW
    assert not call.withdraw(first_starts), "written: it stays"
    held_starts = call.queued_through
    call.queue([b"held"])
    assert call.written_through == held_starts
    assert call.withdraw(held_starts)
    assert call.queued_bytes == 0
    assert call.queued_through == held_starts
    call.queue([b"next"])
    peer.conn.increment_flow_control_window(1_000)
    peer.conn.increment_flow_control_window(1_000, STREAM)
    call.receive(peer.write())
    events = peer.read()
    assert [e.data for e in events if isinstance(e, DataReceived)] == [grpc_message(b"next")]
    call.queue([b"one", b"two"])
    assert not call.withdraw(held_starts + 9), "not the last one queued"


# -- keepalive --------------------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pings(data: bytes) -> list[Frame]:
    return [f for f in parse(data) if type(f).__name__ == "PingFrame" and "ACK" not in f.flags]


def test_a_silent_server_is_pinged_and_a_frozen_one_ends_the_call() -> None:
    """A batch to a frozen broker hung forever (issue 47, item 1): the call sent no PING. Now a server silent for
    KEEPALIVE_IDLE s is pinged, and one that leaves the PING unanswered KEEPALIVE_TIMEOUT s ends the call."""
    clock = Clock()
    call = new_call(clock=clock)
    peer = Peer(call)
    peer.open()
    assert call.keepalive() == pytest.approx(KEEPALIVE_IDLE)
    clock.now += KEEPALIVE_IDLE - 0.5
    assert pings(call.outgoing()) == []
    assert call.keepalive() == pytest.approx(0.5)
    clock.now += 0.5
    assert call.keepalive() == pytest.approx(KEEPALIVE_TIMEOUT)
    assert len(pings(call.outgoing())) == 1
    clock.now += KEEPALIVE_TIMEOUT
    assert call.keepalive() is None
    assert call.ended is not None
    assert call.ended.code is grpc.StatusCode.UNAVAILABLE
    assert "keepalive" in call.ended.details


def test_an_answered_ping_keeps_the_call_and_quiet_pings_space_out() -> None:
    """grpc-go closes a connection at the third PING strike (a PING within 5 minutes of the last with no data
    from the server between): after PINGS_WITHOUT_DATA PINGs the next ones wait QUIET_PING_SPACING s."""
    clock = Clock()
    call = new_call(clock=clock)
    peer = Peer(call)
    peer.open()
    for _ in range(PINGS_WITHOUT_DATA):
        clock.now += KEEPALIVE_IDLE
        call.keepalive()
        peer.read()  # h2's server side acknowledges the PING
        clock.now += 0.1
        call.receive(peer.write())
        assert call.ended is None
    assert call.keepalive() == pytest.approx(QUIET_PING_SPACING)
    call.receive(answers(peer, b"ack"))  # data from the server: PINGs at the short spacing again
    assert call.keepalive() == pytest.approx(KEEPALIVE_IDLE)


def test_any_frame_from_the_server_postpones_the_ping() -> None:
    clock = Clock()
    call = new_call(clock=clock)
    peer = Peer(call)
    peer.open()
    clock.now += KEEPALIVE_IDLE - 1
    peer.conn.increment_flow_control_window(100)  # a WINDOW_UPDATE: the server is alive
    call.receive(peer.write())
    assert call.keepalive() == pytest.approx(KEEPALIVE_IDLE)
