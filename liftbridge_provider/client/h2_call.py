"""One bidirectional gRPC call on an HTTP/2 connection of its own, without I/O (in the manner of h2).

:class:`CallState` turns serialized requests into the bytes to write and the
bytes read into serialized responses, and says how the call ended. Its owner
(:mod:`h2_transport`) moves the bytes. Why a call of our own rather than
grpc's: grpc writes each message of a stream as its own socket write and
completes each write through its completion queue and event-loop threads, so
a pipelined batch crossed several threads and system calls per message on the
client, and the server, reading one small message at a time, did every later
step (read, NATS publish, ack write) once per message too. Here every message
the window allows goes out in one write, and every ack that arrived is parsed
in one pass.

What it does: the connection preface and settings, the request headers, DATA
frames within the peer's flow-control windows (at most its largest frame),
WINDOW_UPDATE for what it read, SETTINGS and PING acknowledgements, the
response headers and trailers (``grpc-status``, ``grpc-message``), RST_STREAM
and GOAWAY. What it does not: server push (turned off), compressed messages
(none asked for), more than one stream (stream 1 only).

The call counts the requests written out in full (:attr:`written_messages`):
a request never written in full cannot have been stored, so a publisher may
send it over another call.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

import grpc
from hpack import Decoder
from hpack.exceptions import HPACKError

from liftbridge_provider.client import h2_wire as wire

STREAM = 1  # the call's stream id (the first a client opens)
RECEIVE_WINDOW = 1 << 24  # bytes the server may send ahead of what we read, per stream and connection (16 MiB)
USER_AGENT = "liftbridge-provider (direct HTTP/2)"


@dataclass(frozen=True)
class Ended:
    """How a call ended: ``code`` OK when the server closed it normally."""

    code: grpc.StatusCode
    details: str


class CallFailed(grpc.RpcError):
    """A call that ended with a status other than OK, shaped like grpc's errors (``code()``, ``details()``)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class CallState:
    """The state of one call: what to write, what was read, how it ended.

    :param authority: the ``:authority`` of the request (the address dialled, or the TLS server name).
    :param path: the method's path, e.g. ``/proto.API/PublishAsync``.
    :param tls: whether the connection is TLS (the ``:scheme``).
    :param max_response_bytes: largest response accepted; a larger one ends the call (RESOURCE_EXHAUSTED).
    """

    def __init__(self, *, authority: str, path: str, tls: bool, max_response_bytes: int) -> None:
        self._max_response = max_response_bytes
        self._control = bytearray()  # frames that go out before any DATA
        self._control += wire.PREFACE
        self._control += wire.settings(
            [
                (wire.SETTINGS_ENABLE_PUSH, 0),
                (wire.SETTINGS_INITIAL_WINDOW_SIZE, RECEIVE_WINDOW),
            ]
        )
        self._control += wire.window_update(0, RECEIVE_WINDOW - wire.DEFAULT_WINDOW)
        headers = wire.request_headers(authority=authority, path=path, tls=tls, user_agent=USER_AGENT)
        self._control += wire.frame(wire.HEADERS, wire.END_HEADERS, STREAM, headers)
        self._pending = bytearray()  # gRPC-framed requests not written yet
        self._ends: deque[int] = deque()  # where each queued request ends, as a count of DATA bytes since the start
        self._queued_total = 0  # DATA bytes queued since the start
        self._written_total = 0  # DATA bytes written since the start
        self._written_end = 0  # where the last request written in full ends, as a count of DATA bytes
        self.written_messages = 0  # requests written out in full
        self._closing = False  # the sending side is to be closed after the pending requests
        self._closed_sending = False
        # Flow control of what we send (the peer's windows) and of what we read (ours).
        self._peer_initial = wire.DEFAULT_WINDOW
        self._stream_window = wire.DEFAULT_WINDOW
        self._connection_window = wire.DEFAULT_WINDOW
        self._max_frame = wire.DEFAULT_MAX_FRAME
        self._unacknowledged = 0  # bytes read since our last WINDOW_UPDATE
        # What was read.
        self._input = bytearray()
        self._messages = bytearray()  # DATA of our stream, not yet cut into messages
        self._decoder = Decoder()
        self._header_block: bytearray | None = None  # a header block waiting for its CONTINUATION frames
        self._header_stream = 0
        self._block_ends_stream = False
        self._headers_seen = False
        self.ended: Ended | None = None

    # -- sending ---------------------------------------------------------------------------------------------

    @property
    def queued_bytes(self) -> int:
        """Bytes of requests queued and not written yet (the peer's windows hold them back)."""
        return len(self._pending)

    def queue(self, messages: Iterable[bytes]) -> None:
        """Queue serialized requests, in order; :meth:`outgoing` writes them as the windows allow."""
        if self._closing:
            raise ValueError("the sending side is closed")
        pending, ends, pack = self._pending, self._ends, wire.GRPC_PREFIX.pack
        total = self._queued_total
        for message in messages:
            size = len(message)
            pending += pack(0, size)
            pending += message
            total += size + 5
            ends.append(total)
        self._queued_total = total

    def withdraw(self) -> bool:
        """Take back the last queued request if none of its bytes were written yet (True); else False."""
        ends = self._ends
        if not ends:
            return False
        start = ends[-2] if len(ends) >= 2 else self._written_end
        if self._written_total > start:
            return False
        size = ends.pop() - start
        del self._pending[len(self._pending) - size :]
        self._queued_total -= size
        return True

    def close_sending(self) -> None:
        """Half-close the call once every queued request is written (END_STREAM)."""
        self._closing = True

    def fail(self, code: grpc.StatusCode, details: str) -> bytes:
        """End the call from this side with ``code``; the bytes that tell the server (RST_STREAM CANCEL)."""
        self._end(code, details)
        return wire.rst_stream(STREAM, wire.CANCEL)

    def outgoing(self) -> bytes:
        """Everything that may be written now: control frames, then queued DATA within the peer's windows."""
        out = self._control
        self._control = bytearray()
        if self.ended is not None:
            return bytes(out)
        pending = self._pending
        allowed = min(len(pending), self._stream_window, self._connection_window)
        if allowed > 0:
            step, header = self._max_frame, wire.FRAME_HEADER.pack
            for start in range(0, allowed, step):
                size = min(step, allowed - start)
                out += header(size >> 8, size & 0xFF, wire.DATA, 0, STREAM)
                out += pending[start : start + size]
            del pending[:allowed]
            self._stream_window -= allowed
            self._connection_window -= allowed
            self._written_total += allowed
            ends, written, count = self._ends, self._written_total, 0
            while ends and ends[0] <= written:
                self._written_end = ends.popleft()
                count += 1
            self.written_messages += count
        if self._closing and not pending and not self._closed_sending:
            out += wire.frame(wire.DATA, wire.END_STREAM, STREAM)
            self._closed_sending = True
        return bytes(out)

    # -- receiving -------------------------------------------------------------------------------------------

    def receive(self, data: bytes) -> list[bytes]:
        """Take bytes read from the connection; the complete responses they finish, in order."""
        buffer = self._input
        buffer += data
        position, size = 0, len(buffer)
        unpack = wire.FRAME_HEADER.unpack_from
        while size - position >= 9 and self.ended is None:
            high, low, kind, flags, stream = unpack(buffer, position)
            end = position + 9 + (high << 8 | low)
            if end > size:
                break
            payload = bytes(buffer[position + 9 : end])
            position = end
            if kind == wire.DATA:
                self._on_data(flags, stream & wire.MAX_WINDOW, payload)
            else:
                self._on_frame(kind, flags, stream & wire.MAX_WINDOW, payload)
        del buffer[:position]
        return self._responses()

    def connection_lost(self, reason: str) -> None:
        """The connection closed (``reason``): a call not ended yet ends UNAVAILABLE."""
        if self.ended is None:
            self.ended = Ended(grpc.StatusCode.UNAVAILABLE, reason)

    def _on_data(self, flags: int, stream: int, payload: bytes) -> None:
        self._unacknowledged += len(payload)  # padding counts against the window too
        if self._unacknowledged >= RECEIVE_WINDOW // 2:
            self._control += wire.window_update(0, self._unacknowledged)
            self._control += wire.window_update(STREAM, self._unacknowledged)
            self._unacknowledged = 0
        if stream != STREAM:
            return
        self._messages += wire.without_padding(flags, payload) if flags & wire.PADDED else payload
        if flags & wire.END_STREAM:
            self._end(grpc.StatusCode.INTERNAL, "the server ended the call without a status")

    def _responses(self) -> list[bytes]:
        messages, position, found = self._messages, 0, []
        unpack, limit = wire.GRPC_PREFIX.unpack_from, self._max_response
        while len(messages) - position >= 5:
            compressed, size = unpack(messages, position)
            if compressed:
                self._end(grpc.StatusCode.INTERNAL, "the server sent a compressed message, which was not asked for")
                break
            if size > limit:
                self._end(grpc.StatusCode.RESOURCE_EXHAUSTED, f"a response of {size} bytes is over {limit}")
                break
            end = position + 5 + size
            if end > len(messages):
                break
            found.append(bytes(messages[position + 5 : end]))
            position = end
        del messages[:position]
        return found

    def _on_frame(self, kind: int, flags: int, stream: int, payload: bytes) -> None:
        if self._header_block is not None and kind != wire.CONTINUATION:
            self._end(grpc.StatusCode.INTERNAL, "a header block was interrupted by another frame")
        elif kind == wire.HEADERS:
            self._on_headers(flags, stream, payload)
        elif kind == wire.CONTINUATION:
            self._on_continuation(flags, payload)
        elif kind == wire.SETTINGS:
            if not flags & wire.ACK:
                self._on_settings(payload)
        elif kind == wire.PING:
            if not flags & wire.ACK:
                self._control += wire.ping_ack(payload)
        elif kind == wire.WINDOW_UPDATE:
            self._on_window_update(stream, payload)
        elif kind == wire.RST_STREAM:
            if stream == STREAM:
                code = wire.parse_u32(payload)
                self._end(wire.status_of_reset(code), f"the server reset the call (HTTP/2 error {code})")
        elif kind == wire.GOAWAY:
            self._on_goaway(payload)
        elif kind == wire.PUSH_PROMISE:
            self._end(grpc.StatusCode.INTERNAL, "the server pushed a stream, which was turned off")
        # PRIORITY and unknown frame types are ignored, as HTTP/2 asks.

    def _on_settings(self, payload: bytes) -> None:
        try:
            pairs = wire.parse_settings(payload)
        except ValueError as exc:
            self._end(grpc.StatusCode.INTERNAL, str(exc))
            return
        for key, value in pairs:
            if key == wire.SETTINGS_INITIAL_WINDOW_SIZE:
                if value > wire.MAX_WINDOW:
                    self._end(grpc.StatusCode.INTERNAL, f"the server set a stream window of {value} bytes")
                    return
                self._stream_window += value - self._peer_initial
                self._peer_initial = value
            elif key == wire.SETTINGS_MAX_FRAME_SIZE:
                if not wire.DEFAULT_MAX_FRAME <= value <= wire.MAX_FRAME_LIMIT:
                    self._end(grpc.StatusCode.INTERNAL, f"the server set a largest frame of {value} bytes")
                    return
                self._max_frame = value
        self._control += wire.settings_ack()

    def _on_window_update(self, stream: int, payload: bytes) -> None:
        increment = wire.parse_u32(payload) & wire.MAX_WINDOW
        if stream == 0:
            self._connection_window += increment
        elif stream == STREAM:
            self._stream_window += increment

    def _on_goaway(self, payload: bytes) -> None:
        last, code = wire.parse_u32_pair(payload)
        if code != wire.NO_ERROR:
            self._end(wire.status_of_reset(code), f"the server closed the connection (HTTP/2 error {code})")
        elif last < STREAM:
            self._end(grpc.StatusCode.UNAVAILABLE, "the server closed the connection before the call")
        # A graceful GOAWAY that covers our stream: the call goes on until the server ends it.

    def _on_headers(self, flags: int, stream: int, payload: bytes) -> None:
        try:
            block = wire.without_padding(flags, payload, priority=True)
        except ValueError as exc:
            self._end(grpc.StatusCode.INTERNAL, str(exc))
            return
        self._block_ends_stream = bool(flags & wire.END_STREAM) and stream == STREAM
        if flags & wire.END_HEADERS:
            self._header_block_done(bytes(block), stream == STREAM)
        else:
            self._header_block = bytearray(block)
            self._header_stream = stream

    def _on_continuation(self, flags: int, payload: bytes) -> None:
        if self._header_block is None:
            self._end(grpc.StatusCode.INTERNAL, "a CONTINUATION frame without a header block")
            return
        self._header_block += payload
        if flags & wire.END_HEADERS:
            block, self._header_block = bytes(self._header_block), None
            self._header_block_done(block, self._header_stream == STREAM)

    def _header_block_done(self, block: bytes, ours: bool) -> None:
        try:  # every block is decoded, ours or not: the decoder's table follows the connection
            fields = {bytes(name): bytes(value) for name, value in self._decoder.decode(block, raw=True)}
        except HPACKError as exc:
            self._end(grpc.StatusCode.INTERNAL, f"a header block could not be decoded: {exc}")
            return
        if not ours:
            return
        first = not self._headers_seen
        self._headers_seen = True
        status = fields.get(b":status", b"200").decode("ascii", "replace")
        if first and status != "200":
            self._end(wire.status_of_http(status), f"the server answered HTTP status {status}")
        elif self._block_ends_stream:
            code = wire.status_of_number(fields.get(b"grpc-status", b"").decode("ascii", "replace"))
            details = wire.grpc_message(fields.get(b"grpc-message", b"").decode("utf-8", "replace"))
            self._end(code, details or code.name)

    def _end(self, code: grpc.StatusCode, details: str) -> None:
        if self.ended is None:
            self.ended = Ended(code, details)
