"""The HTTP/2 call of publish_batch (client/h2_wire.py, client/h2_call.py) as pure logic: a scripted server
side built with hpack's encoder, bytes in and bytes out, no sockets."""

from __future__ import annotations

import struct

import grpc
import hpack
import pytest

from liftbridge_provider.client import h2_wire as wire
from liftbridge_provider.client.h2_call import RECEIVE_WINDOW, STREAM, CallState
from liftbridge_provider.client.publish_window import PublishWindow


def new_call() -> CallState:
    return CallState(authority="127.0.0.1:9292", path="/proto.API/PublishAsync", tls=False, max_response_bytes=1 << 20)


def frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """(type, flags, stream, payload) of every frame in ``data`` (after the preface, if any)."""
    if data.startswith(wire.PREFACE):
        data = data[len(wire.PREFACE) :]
    found, position = [], 0
    while position < len(data):
        high, low, kind, flags, stream = wire.FRAME_HEADER.unpack_from(data, position)
        end = position + 9 + (high << 8 | low)
        found.append((kind, flags, stream, data[position + 9 : end]))
        position = end
    assert position == len(data)
    return found


def grpc_message(payload: bytes) -> bytes:
    return struct.pack(">BI", 0, len(payload)) + payload


def trailers(encoder: hpack.Encoder, status: int, message: str = "") -> bytes:
    fields = [("grpc-status", str(status))] + ([("grpc-message", message)] if message else [])
    return wire.frame(wire.HEADERS, wire.END_HEADERS | wire.END_STREAM, STREAM, encoder.encode(fields))


def response_headers(encoder: hpack.Encoder, status: str = "200") -> bytes:
    block = encoder.encode([(":status", status), ("content-type", "application/grpc")])
    return wire.frame(wire.HEADERS, wire.END_HEADERS, STREAM, block)


def test_the_call_opens_with_the_preface_settings_and_the_request_headers() -> None:
    call = new_call()
    out = call.outgoing()
    assert out.startswith(wire.PREFACE)
    sent = frames(out)
    assert [kind for kind, *_ in sent] == [wire.SETTINGS, wire.WINDOW_UPDATE, wire.HEADERS]
    assert dict(wire.parse_settings(sent[0][3])) == {
        wire.SETTINGS_ENABLE_PUSH: 0,
        wire.SETTINGS_INITIAL_WINDOW_SIZE: RECEIVE_WINDOW,
    }
    assert wire.parse_u32(sent[1][3]) == RECEIVE_WINDOW - wire.DEFAULT_WINDOW
    _kind, flags, stream, block = sent[2]
    assert (flags, stream) == (wire.END_HEADERS, STREAM)
    headers = {bytes(name).decode(): bytes(value).decode() for name, value in hpack.Decoder().decode(block, raw=True)}
    assert headers[":method"] == "POST"
    assert headers[":scheme"] == "http"
    assert headers[":path"] == "/proto.API/PublishAsync"
    assert headers[":authority"] == "127.0.0.1:9292"
    assert (headers["content-type"], headers["te"]) == ("application/grpc", "trailers")


def test_queued_requests_go_out_together_within_the_peer_window_and_largest_frame() -> None:
    call = new_call()
    call.outgoing()
    call.queue([b"a" * 40_000, b"b" * 40_000])  # 80,010 bytes framed: over the default 65,535 window
    sent = frames(call.outgoing())
    assert [(kind, len(payload)) for kind, _, _, payload in sent] == [
        (wire.DATA, wire.DEFAULT_MAX_FRAME),
        (wire.DATA, wire.DEFAULT_MAX_FRAME),
        (wire.DATA, wire.DEFAULT_MAX_FRAME),
        (wire.DATA, wire.DEFAULT_WINDOW - 3 * wire.DEFAULT_MAX_FRAME),
    ]
    assert call.written_messages == 1  # the second is only partly written
    assert call.queued_bytes == 80_010 - wire.DEFAULT_WINDOW
    assert call.outgoing() == b""  # no credit left
    call.receive(wire.window_update(0, 100_000) + wire.window_update(STREAM, 100_000))
    rest = frames(call.outgoing())
    assert sum(len(payload) for *_, payload in rest) == 80_010 - wire.DEFAULT_WINDOW
    assert call.written_messages == 2


def test_settings_change_the_stream_window_and_frame_size_and_are_acknowledged() -> None:
    call = new_call()
    call.outgoing()
    settings = wire.settings([(wire.SETTINGS_INITIAL_WINDOW_SIZE, 10), (wire.SETTINGS_MAX_FRAME_SIZE, 20_000)])
    assert call.receive(settings) == []
    assert frames(call.outgoing()) == [(wire.SETTINGS, wire.ACK, 0, b"")]
    call.queue([b"x" * 30])
    assert [len(payload) for *_, payload in frames(call.outgoing())] == [10]
    call.receive(wire.settings([(wire.SETTINGS_INITIAL_WINDOW_SIZE, 50_000)]))  # +49,990 for the open stream
    out = frames(call.outgoing())
    assert out[0] == (wire.SETTINGS, wire.ACK, 0, b"")
    assert sum(len(payload) for kind, _, _, payload in out if kind == wire.DATA) == 25


def test_pings_are_answered_and_responses_are_cut_from_data_frames() -> None:
    call = new_call()
    call.outgoing()
    encoder = hpack.Encoder()
    one, two = grpc_message(b"first"), grpc_message(b"second")
    data = response_headers(encoder) + wire.frame(wire.PING, 0, 0, b"12345678")
    data += wire.frame(wire.DATA, 0, STREAM, one + two[:3]) + wire.frame(wire.DATA, 0, STREAM, two[3:])
    assert call.receive(data[:20]) == []  # a frame cut in two waits for its end
    assert call.receive(data[20:]) == [b"first", b"second"]
    assert frames(call.outgoing()) == [(wire.PING, wire.ACK, 0, b"12345678")]
    assert call.ended is None


def test_padded_data_is_read_without_its_padding() -> None:
    call = new_call()
    payload = bytes([4]) + grpc_message(b"ok") + b"\0" * 4
    assert call.receive(wire.frame(wire.DATA, wire.PADDED, STREAM, payload)) == [b"ok"]


def test_trailers_end_the_call_with_their_status_and_message() -> None:
    call = new_call()
    encoder = hpack.Encoder()
    call.receive(response_headers(encoder) + trailers(encoder, 0))
    assert call.ended is not None
    assert call.ended.code is grpc.StatusCode.OK
    failing = new_call()
    encoder = hpack.Encoder()
    failing.receive(response_headers(encoder) + trailers(encoder, 8, "grpc: received message larger than max%3A 5"))
    assert failing.ended is not None
    assert (failing.ended.code, failing.ended.details) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "grpc: received message larger than max: 5",
    )


def test_a_header_block_split_over_continuation_frames_is_decoded_whole() -> None:
    call = new_call()
    block = hpack.Encoder().encode([(":status", "200"), ("grpc-status", "14"), ("grpc-message", "gone")])
    data = wire.frame(wire.HEADERS, wire.END_STREAM, STREAM, block[:3])
    data += wire.frame(wire.CONTINUATION, wire.END_HEADERS, STREAM, block[3:])
    call.receive(data)
    assert call.ended is not None
    assert (call.ended.code, call.ended.details) == (grpc.StatusCode.UNAVAILABLE, "gone")


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (wire.rst_stream(STREAM, wire.REFUSED_STREAM), grpc.StatusCode.UNAVAILABLE),
        (wire.rst_stream(STREAM, wire.CANCEL), grpc.StatusCode.CANCELLED),
        (wire.rst_stream(STREAM, wire.FLOW_CONTROL_ERROR), grpc.StatusCode.INTERNAL),
        (wire.goaway(0, wire.NO_ERROR), grpc.StatusCode.UNAVAILABLE),
        (wire.goaway(STREAM, wire.ENHANCE_YOUR_CALM), grpc.StatusCode.RESOURCE_EXHAUSTED),
        (wire.frame(wire.DATA, wire.END_STREAM, STREAM), grpc.StatusCode.INTERNAL),
        (wire.frame(wire.DATA, 0, STREAM, struct.pack(">BI", 1, 1) + b"z"), grpc.StatusCode.INTERNAL),
        (wire.frame(wire.PUSH_PROMISE, wire.END_HEADERS, STREAM, b"\0\0\0\2"), grpc.StatusCode.INTERNAL),
    ],
)
def test_resets_goaways_and_broken_input_end_the_call(data: bytes, code: grpc.StatusCode) -> None:
    call = new_call()
    call.outgoing()
    call.queue([b"waiting"])
    call.receive(data)
    assert call.ended is not None
    assert call.ended.code is code
    assert call.outgoing() == b""  # nothing more is written once it ended
    assert call.written_messages == 0


def test_a_graceful_goaway_covering_the_stream_lets_it_go_on_and_other_http_status_ends_it() -> None:
    call = new_call()
    call.receive(wire.goaway(STREAM, wire.NO_ERROR))
    assert call.ended is None
    refused = new_call()
    refused.receive(response_headers(hpack.Encoder(), "503"))
    assert refused.ended is not None
    assert refused.ended.code is grpc.StatusCode.UNAVAILABLE


def test_a_response_over_the_limit_ends_the_call() -> None:
    call = CallState(authority="a:1", path="/p", tls=True, max_response_bytes=4)
    assert call.receive(wire.frame(wire.DATA, 0, STREAM, grpc_message(b"12345"))) == []
    assert call.ended is not None
    assert call.ended.code is grpc.StatusCode.RESOURCE_EXHAUSTED


def test_read_bytes_are_granted_back_once_half_the_window_is_used() -> None:
    call = new_call()
    call.outgoing()
    chunk = wire.frame(wire.DATA, 0, STREAM, grpc_message(b"x" * (wire.DEFAULT_MAX_FRAME - 5)))
    count = RECEIVE_WINDOW // 2 // wire.DEFAULT_MAX_FRAME
    assert len(call.receive(chunk * count)) == count
    updates = frames(call.outgoing())
    assert [(kind, stream) for kind, _, stream, _ in updates] == [(wire.WINDOW_UPDATE, 0), (wire.WINDOW_UPDATE, STREAM)]
    assert {wire.parse_u32(payload) for *_, payload in updates} == {count * wire.DEFAULT_MAX_FRAME}


def test_closing_the_sending_side_follows_the_last_request_and_failing_resets_the_stream() -> None:
    call = new_call()
    call.outgoing()
    call.queue([b"last"])
    call.close_sending()
    sent = frames(call.outgoing())
    assert sent[-1] == (wire.DATA, wire.END_STREAM, STREAM, b"")
    assert call.written_messages == 1
    with pytest.raises(ValueError, match="closed"):
        call.queue([b"more"])
    assert frames(call.fail(grpc.StatusCode.CANCELLED, "done")) == [
        (wire.RST_STREAM, 0, STREAM, struct.pack(">I", wire.CANCEL))
    ]
    assert call.ended is not None
    assert call.ended.code is grpc.StatusCode.CANCELLED


def test_untaken_messages_go_back_to_the_window_and_failed_ones_stay_failed() -> None:
    window = PublishWindow(6, window=10, ack_wait=1.0, expects_ack=True)
    assert list(window.take_many(0.0, 4)) == [0, 1, 2, 3]
    window.expire(1.5, TimeoutError)  # type: ignore[arg-type]
    assert window.untake(2) == 2
    assert window.in_flight == 0
    assert list(window.take_many(2.0, 10)) == [4, 5]  # 2 and 3 timed out: they stay failed, never re-taken
    fresh = PublishWindow(3, window=10, ack_wait=1.0, expects_ack=False)
    assert list(fresh.take_many(0.0, 5)) == [0, 1, 2]
    assert fresh.untake(1) == 2
    assert list(fresh.take_many(0.0, 5)) == [1, 2]
    with pytest.raises(ValueError, match="not taken"):
        fresh.untake(4)


def test_take_many_stops_at_the_window_and_before_a_refused_message() -> None:
    window = PublishWindow(10, window=3, ack_wait=1.0, expects_ack=True)
    window.refuse(1, TimeoutError("refused"))  # type: ignore[arg-type]
    assert list(window.take_many(0.0, 10)) == [0]
    assert list(window.take_many(0.0, 10)) == [2, 3]  # the refused one is skipped; the window holds 3
    assert list(window.take_many(0.0, 10)) == []


def test_a_request_none_of_which_was_written_can_be_taken_back() -> None:
    call = new_call()
    call.outgoing()
    call.queue([b"a" * 70_000])  # over the default window: only part of it goes out
    call.outgoing()
    call.queue([b"second"])
    assert call.withdraw()  # nothing of the second was written
    assert not call.withdraw()  # the first was partly written
    assert call.queued_bytes == 70_005 - wire.DEFAULT_WINDOW
    call.receive(wire.window_update(0, 10_000) + wire.window_update(STREAM, 10_000))
    call.outgoing()
    assert call.written_messages == 1
    assert call.queued_bytes == 0
    assert not call.withdraw()
