"""How the data plane's call takes apart what it reads (client/h2/inbound.py, through CallState.receive_spans), as
pure logic: its peer is h2's own server side, no sockets.

The call's plain DATA never reaches h2: its messages are cut in place as spans of the bytes read, its window
granted back by WINDOW_UPDATE frames of its own. Every other frame goes to h2 in order.
"""

from __future__ import annotations

import random
import struct

import grpc
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import WindowUpdated
from hyperframe.frame import DataFrame

from liftbridge_provider.client.h2.call_state import RECEIVE_WINDOW, STREAM, CallState
from liftbridge_provider.client.h2.inbound import Segments

HANDSHAKE = b""  # Subscribe's first response: an empty Message


def grpc_message(payload: bytes) -> bytes:
    return struct.pack(">BI", 0, len(payload)) + payload


def new_call() -> CallState:
    return CallState(authority="127.0.0.1:9292", path="/proto.API/Subscribe", tls=False, max_response_bytes=1 << 20)


def server_of(call: CallState) -> H2Connection:
    """h2's server side, with the call's opening read and the server's settings and response headers queued."""
    server = H2Connection(H2Configuration(client_side=False, header_encoding=None))
    server.initiate_connection()
    server.receive_data(call.outgoing())
    server.send_headers(STREAM, [(b":status", b"200"), (b"content-type", b"application/grpc")])
    return server


def messages_of(segments: Segments) -> list[bytes]:
    return [bytes(buffer[spans[i] : spans[i + 1]]) for buffer, spans in segments for i in range(0, len(spans), 2)]


def test_the_zero_length_handshake_is_a_message() -> None:
    """Subscribe's server confirms a subscription with an empty Message (a 5-byte gRPC prefix of length 0): it
    is delivered as a message of its own (a span whose start is its end), before the messages after it."""
    call = new_call()
    server = server_of(call)
    server.send_data(STREAM, grpc_message(HANDSHAKE))
    server.send_data(STREAM, grpc_message(b"first"))
    segments = call.receive_spans(server.data_to_send())
    assert messages_of(segments) == [b"", b"first"]
    (_, spans), *_ = segments
    assert spans[0] == spans[1], "the handshake: an empty span"


def test_messages_are_spans_of_the_bytes_read_not_copies() -> None:
    """A read of whole frames gives its messages as spans of that very bytes object (the compiled column
    builder decodes them in place): one segment for the read, two ints per message."""
    call = new_call()
    server = server_of(call)
    call.receive_spans(server.data_to_send())
    for value in (b"a", b"bb", b"ccc"):
        server.send_data(STREAM, grpc_message(value))
    data = server.data_to_send()
    segments = call.receive_spans(data)
    assert len(segments) == 1
    assert segments[0][0] is data
    assert messages_of(segments) == [b"a", b"bb", b"ccc"]


def test_data_before_the_response_headers_is_read() -> None:
    """Liftbridge's PublishAsync sends from two goroutines, and grpc-go then sometimes writes a message before
    the response headers (v1.9.0, about one batch in 200 with a refusal and an ack together; recorded): the
    message is read, the headers after it are taken, and the call goes on (h2 refused such DATA, and the batch
    failed as a broken stream)."""
    call = new_call()
    server = H2Connection(H2Configuration(client_side=False, header_encoding=None))
    server.initiate_connection()
    server.receive_data(call.outgoing())
    opening = server.data_to_send()
    data = DataFrame(STREAM, data=grpc_message(b"ack")).serialize()
    assert messages_of(call.receive_spans(opening + data)) == [b"ack"]
    server.send_headers(STREAM, [(b":status", b"200"), (b"content-type", b"application/grpc")])
    server.send_data(STREAM, grpc_message(b"next"))
    server.send_headers(STREAM, [(b"grpc-status", b"0")], end_stream=True)
    assert messages_of(call.receive_spans(server.data_to_send())) == [b"next"]
    assert call.ended is not None
    assert call.ended.code is grpc.StatusCode.OK


def stream_of_every_kind(call: CallState) -> tuple[bytes, list[bytes]]:
    """A server's bytes with frames of every kind the call meets (settings, headers, PING, a window update, a
    padded DATA frame, a message cut across frames, the handshake, trailers) and the messages in them."""
    server = server_of(call)
    big = bytes(range(256)) * 100  # 25,600 bytes: more than a frame (16 KiB), so cut across frames
    sent = [HANDSHAKE, b"x" * 7, b"", b"y" * 40, big, b"z" * 3, b"padded", b"last"]
    server.send_data(STREAM, grpc_message(sent[0]) + grpc_message(sent[1]))
    server.ping(b"12345678")
    server.send_data(STREAM, grpc_message(sent[2]) + grpc_message(sent[3]))
    message = grpc_message(sent[4])
    server.send_data(STREAM, message[:16_000])
    server.increment_flow_control_window(1000)
    server.send_data(STREAM, message[16_000:] + grpc_message(sent[5])[:2])
    server.send_data(STREAM, grpc_message(sent[5])[2:])
    server.send_data(STREAM, grpc_message(sent[6]), pad_length=9)
    server.send_data(STREAM, grpc_message(sent[7]))
    server.send_headers(STREAM, [(b"grpc-status", b"0")], end_stream=True)
    return server.data_to_send(), sent


def test_frames_of_every_kind_cut_anywhere_give_the_same_messages_in_order() -> None:
    """The bytes cut between reads at random places (a frame header, a DATA payload, a message's prefix, a
    PING, the trailers): the same messages in the same order, and the same end."""
    stream, sent = stream_of_every_kind(new_call())
    chance = random.Random(7)
    for _ in range(3000):
        cuts = sorted(chance.sample(range(1, len(stream)), chance.randint(1, 6)))
        call = new_call()
        call.outgoing()
        got, previous = [], 0
        for cut in [*cuts, len(stream)]:
            got += messages_of(call.receive_spans(stream[previous:cut]))
            previous = cut
        assert got == sent, cuts
        assert call.ended is not None, cuts
        assert call.ended.code is grpc.StatusCode.OK, cuts


def test_the_window_is_granted_back_by_frames_of_the_calls_own() -> None:
    """h2 never sees the call's plain DATA; once half the 16 MiB window was read, the call writes WINDOW_UPDATE
    frames for its stream and the connection itself, which the server takes: its windows are whole again."""
    call = new_call()
    server = server_of(call)
    call.receive_spans(server.data_to_send())
    server.receive_data(call.outgoing())  # the call's settings acknowledged, its window applied
    chunk = grpc_message(b"v" * 16_000)
    sent = 0
    while sent < RECEIVE_WINDOW // 2:
        server.send_data(STREAM, chunk)
        sent += len(chunk)
    assert server.local_flow_control_window(STREAM) == RECEIVE_WINDOW - sent
    assert len(messages_of(call.receive_spans(server.data_to_send()))) == sent // len(chunk)
    events = server.receive_data(call.outgoing())
    assert {event.stream_id for event in events if isinstance(event, WindowUpdated)} == {0, STREAM}
    assert server.local_flow_control_window(STREAM) == RECEIVE_WINDOW


def test_data_beyond_the_window_ends_the_call() -> None:
    """A server that sends more than the window it was given breaks HTTP/2's flow control: the call ends
    INTERNAL (as h2 would have ended it), and nothing after is read."""
    call = new_call()
    server = server_of(call)
    call.receive_spans(server.data_to_send())
    frame = DataFrame(STREAM, data=grpc_message(b"v" * 16_000)).serialize()
    flood = frame * (RECEIVE_WINDOW // len(frame) + 2)
    call.receive_spans(flood)
    assert call.ended is not None
    assert call.ended.code is grpc.StatusCode.INTERNAL
    assert "flow-control window" in call.ended.details
