"""One bidirectional gRPC call on an HTTP/2 connection of its own, without I/O, driven by h2.

:class:`CallState` turns serialized requests into the bytes to write and the
bytes read into serialized responses, and says how the call ended. The
HTTP/2 is h2's (:class:`h2.connection.H2Connection`, client side: the preface
and settings, HPACK, frames, flow control, SETTINGS and PING
acknowledgements, stream and connection state); this class adds the gRPC
call on top: the request headers, the 5-byte message prefix, the responses
cut from DATA, the status from the trailers, a stream reset or a GOAWAY
(:mod:`grpc_status`). Its owner moves the bytes (:mod:`h2_transport`, on
asyncio, for ``publish_batch``).

Why a call of our own rather than grpc's: grpc writes each message of a
stream as its own socket write and completes each write through its
completion queue and event-loop threads, so a pipelined batch crossed several
threads and system calls per message on the client, and the server, reading
one small message at a time, did every later step (read, NATS publish, ack
write) once per message too. Here every message the peer's windows allow goes
out in one write (one DATA frame per largest frame, not per message), and
every ack that arrived is parsed in one pass.

The call counts the requests written out in full (:attr:`written_messages`):
a request never written in full cannot have been stored, so a publisher may
send it over another call. Server push is turned off, compressed messages
are not asked for, and the call is stream 1, the only one.

A GOAWAY is read here, not by h2 (h2 takes no frame at all once its peer said
GOAWAY, and a read that held one lost every response in it): a GOAWAY with an
error ends the call after the frames before it; a graceful one (NO_ERROR,
our stream included) lets the call run to its end: no request is written
after it, the sending side is closed, and the answers still coming are read.

Keepalive (:meth:`CallState.keepalive`): a server silent for
:data:`KEEPALIVE_IDLE` seconds is sent a PING, and a PING unanswered for
:data:`KEEPALIVE_TIMEOUT` seconds ends the call UNAVAILABLE, so a broker that
froze (its kernel keeps the connection open and answers nothing) is given up
within ``KEEPALIVE_IDLE + KEEPALIVE_TIMEOUT`` seconds of its last frame.
grpc-go counts a PING as a strike unless the server sent data since the
last one or 5 minutes passed, and closes the connection at the third strike:
after :data:`PINGS_WITHOUT_DATA` PINGs without data the next ones are
:data:`QUIET_PING_SPACING` seconds apart.
"""

from __future__ import annotations

import contextlib
import os
import struct
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import grpc
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    PingAckReceived,
    PushedStreamReceived,
    RemoteSettingsChanged,
    ResponseReceived,
    StreamEnded,
    StreamReset,
    TrailersReceived,
)
from h2.exceptions import H2Error
from h2.settings import SettingCodes, Settings

from liftbridge_provider.client.publish import grpc_status

STREAM = 1  # the call's stream id (the first a client opens)
DEFAULT_WINDOW = 65_535  # every flow-control window's size until a setting or update changes it (RFC 9113), bytes
RECEIVE_WINDOW = 1 << 24  # bytes the server may send ahead of what we read, per stream and connection (16 MiB)
USER_AGENT = "liftbridge-provider (h2)"
KEEPALIVE_IDLE = 10.0  # seconds without a frame from the server before a PING asks whether it is alive
KEEPALIVE_TIMEOUT = 10.0  # seconds a PING may wait for its acknowledgement before the call ends UNAVAILABLE
PINGS_WITHOUT_DATA = 3  # PINGs in a row grpc-go takes without data of its own in between (2 strikes allowed)
QUIET_PING_SPACING = 310.0  # seconds between later PINGs without data (grpc-go's minimum is 300)
FRAME = struct.Struct(">I")  # a frame header's first 4 bytes: length (24 bits), then type (8 bits)
FRAME_HEADER = 9  # bytes
GOAWAY = 0x7  # the GOAWAY frame's type
GRPC_PREFIX = struct.Struct(">BI")  # a gRPC message's prefix: compressed flag, length


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
    :param clock: seconds on a monotonic clock (default ``time.monotonic``), for the keepalive.
    """

    def __init__(
        self,
        *,
        authority: str,
        path: str,
        tls: bool,
        max_response_bytes: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max_response = max_response_bytes
        self._clock = clock
        conn = H2Connection(H2Configuration(client_side=True, header_encoding=None))
        conn.local_settings = Settings(
            client=True,
            initial_values={SettingCodes.ENABLE_PUSH: 0, SettingCodes.INITIAL_WINDOW_SIZE: RECEIVE_WINDOW},
        )
        conn.initiate_connection()
        conn.increment_flow_control_window(RECEIVE_WINDOW - DEFAULT_WINDOW)
        conn.send_headers(
            STREAM,
            [
                (b":method", b"POST"),
                (b":scheme", b"https" if tls else b"http"),
                (b":path", path.encode()),
                (b":authority", authority.encode()),
                (b"content-type", b"application/grpc"),
                (b"te", b"trailers"),
                (b"user-agent", USER_AGENT.encode()),
            ],
        )
        self._conn = conn
        self._pending = bytearray()  # gRPC-framed requests not handed to h2 yet
        self._ends: deque[int] = deque()  # where each queued request ends, as a count of DATA bytes since the start
        self._queued_total = 0  # DATA bytes queued since the start
        self._written_total = 0  # DATA bytes handed to h2 (and so to the next outgoing()) since the start
        self._written_end = 0  # where the last request written in full ends, as a count of DATA bytes
        self.written_messages = 0  # requests written out in full
        self._closing = False  # the sending side is to be closed after the pending requests
        self._closed_sending = False
        self._messages = bytearray()  # DATA of our stream, not yet cut into messages
        self._unacknowledged = 0  # flow-controlled bytes read and not handed to h2's window accounting yet
        self._headers_seen = False
        # The server's SETTINGS came: it is alive and speaks HTTP/2. No request is written before (a frozen
        # broker's kernel accepts the connection and takes the bytes, and the requests would then count as
        # written, possibly stored, while nothing reads them), as grpc waits for it before it uses a connection.
        self.peer_ready = False
        self._fields: dict[bytes, bytes] = {}  # the last header block of our stream
        self.ended: Ended | None = None
        # Frames are walked here only to take GOAWAY out before h2 sees it (see the module docstring).
        self._held = b""  # the start of a frame header, or of a GOAWAY frame, that the next read completes
        self._skip = 0  # bytes of a frame already handed to h2 that the next reads still carry
        self.draining = False  # the server said GOAWAY gracefully: nothing more is written, answers are read
        # Keepalive: when the server was last heard, the PING awaiting its acknowledgement, PINGs since data.
        self._heard_at = clock()
        self._ping_sent_at: float | None = None
        self._pings_without_data = 0

    # -- sending ---------------------------------------------------------------------------------------------

    @property
    def queued_bytes(self) -> int:
        """Bytes of requests queued and not written yet (the peer's windows hold them back)."""
        return len(self._pending)

    def queue(self, messages: Iterable[bytes]) -> None:
        """Queue serialized requests, in order; :meth:`outgoing` writes them as the windows allow."""
        if self._closing:
            raise ValueError("the sending side is closed")
        pending, ends, pack = self._pending, self._ends, GRPC_PREFIX.pack
        total = self._queued_total
        for message in messages:
            size = len(message)
            pending += pack(0, size)
            pending += message
            total += size + 5
            ends.append(total)
        self._queued_total = total

    def close_sending(self) -> None:
        """Half-close the call once every queued request is written (END_STREAM)."""
        self._closing = True

    def fail(self, code: grpc.StatusCode, details: str) -> bytes:
        """End the call from this side with ``code``; the bytes that tell the server (RST_STREAM CANCEL)."""
        self._end(code, details)
        with contextlib.suppress(H2Error):  # the stream or the connection is closed already: nothing to tell
            self._conn.reset_stream(STREAM, ErrorCodes.CANCEL)
        return self._conn.data_to_send()

    def outgoing(self) -> bytes:
        """Everything that may be written now: h2's frames (settings, acknowledgements, window updates), then
        the queued requests as DATA within the peer's windows, at most its largest frame each."""
        conn = self._conn
        if self.ended is not None:
            return conn.data_to_send()
        pending = self._pending
        if pending and self.peer_ready and not self.draining:
            allowed = min(len(pending), conn.local_flow_control_window(STREAM))
            if allowed > 0:
                step = conn.max_outbound_frame_size
                send = conn.send_data
                if allowed <= step:
                    send(STREAM, bytes(pending[:allowed]))
                else:
                    view = memoryview(pending)
                    try:
                        for start in range(0, allowed, step):
                            send(STREAM, bytes(view[start : min(start + step, allowed)]))
                    finally:
                        view.release()
                del pending[:allowed]
                self._written_total += allowed
                ends, written, count = self._ends, self._written_total, 0
                while ends and ends[0] <= written:
                    self._written_end = ends.popleft()
                    count += 1
                self.written_messages += count
        if ((self._closing and not pending) or self.draining) and not self._closed_sending and self.peer_ready:
            conn.end_stream(STREAM)
            self._closed_sending = True
        return conn.data_to_send()

    # -- receiving -------------------------------------------------------------------------------------------

    def receive(self, data: bytes) -> list[bytes]:
        """Take bytes read from the connection; the complete responses they finish, in order."""
        if self.ended is not None:
            return []
        self._heard_at = self._clock()
        for part, goaway in self._split_at_goaway(data):
            if part:
                self._receive_frames(part)
            if goaway is not None:
                self._on_goaway(goaway)
            if self.over:
                break
        return self._responses()

    @property
    def over(self) -> bool:
        """The call has ended (:attr:`ended` says how)."""
        return self.ended is not None

    def _receive_frames(self, data: bytes) -> None:
        try:
            events = self._conn.receive_data(data)
        except H2Error as exc:  # h2 has queued its GOAWAY; the events of this part are lost with it
            self._end(grpc.StatusCode.INTERNAL, f"HTTP/2 error from the server's side: {exc}")
            return
        read = 0
        for event in events:
            if isinstance(event, DataReceived):
                read += event.flow_controlled_length or 0
                if event.stream_id == STREAM and event.data:
                    self._messages += event.data
                    self._pings_without_data = 0
            elif self.ended is None:
                self._on_event(event)
        if read:
            # Handed to h2 once half the window was read, when h2 grants it back anyway (a WINDOW_UPDATE for
            # the stream and the connection): one call then rather than one per read.
            self._unacknowledged += read
            if self._unacknowledged >= RECEIVE_WINDOW // 2 and self.ended is None:
                self._conn.acknowledge_received_data(self._unacknowledged, STREAM)
                self._unacknowledged = 0

    def _split_at_goaway(self, data: bytes) -> list[tuple[bytes, bytes | None]]:
        """``data`` (after what an earlier read held back) as parts for h2, each followed by the GOAWAY frame
        that ends it, if any. A frame header, or a GOAWAY frame, that is not complete yet is held back for the
        next read; any other frame goes to h2 as it comes (h2 keeps its own partial frames)."""
        if self._held:
            data, self._held = self._held + data, b""
        size, position = len(data), 0
        if self._skip:
            if self._skip >= size:
                self._skip -= size
                return [(data, None)]
            position, self._skip = self._skip, 0
        parts: list[tuple[bytes, bytes | None]] = []
        start, unpack = 0, FRAME.unpack_from
        while position + FRAME_HEADER <= size:
            header = unpack(data, position)[0]
            end = position + FRAME_HEADER + (header >> 8)
            if header & 0xFF == GOAWAY:
                if end > size:
                    break
                parts.append((data[start:position], data[position + FRAME_HEADER : end]))
                start = position = end
                continue
            if end > size:
                self._skip = end - size
                position = size
                break
            position = end
        if position < size:  # a header cut in two, or a GOAWAY still to come whole
            self._held = data[position:]
            parts.append((data[start:position], None))
        elif start < size or not parts:
            parts.append((data[start:], None))
        return parts

    def _on_goaway(self, payload: bytes) -> None:
        """The server's GOAWAY (its payload: last stream id, error code, debug data)."""
        if len(payload) < 8:
            self._end(grpc.StatusCode.INTERNAL, "the server sent a GOAWAY frame too short to read")
            return
        last_stream, code = struct.unpack_from(">II", payload)
        last_stream &= 0x7FFFFFFF
        if code != ErrorCodes.NO_ERROR:
            self._end(grpc_status.status_of_reset(code), f"the server closed the connection (HTTP/2 error {code})")
        elif last_stream < STREAM:
            self._end(grpc.StatusCode.UNAVAILABLE, "the server closed the connection before the call")
        else:  # graceful: the call may finish; nothing more goes out on it
            self.draining = True

    def keepalive(self) -> float | None:
        """Keep the keepalive rule (see the module docstring) now: a PING when the server has been silent
        long enough, the call ended UNAVAILABLE when a PING went unanswered too long; then the seconds until
        this should be called again (None once the call has ended). The owner writes :meth:`outgoing` after."""
        if self.ended is not None:
            return None
        now = self._clock()
        if self._ping_sent_at is not None:
            left = self._ping_sent_at + KEEPALIVE_TIMEOUT - now
            if left > 0:
                return left
            self._end(
                grpc.StatusCode.UNAVAILABLE,
                f"no answer to a keepalive PING within {KEEPALIVE_TIMEOUT:g}s: the broker is frozen or unreachable",
            )
            return None
        quiet = self._pings_without_data >= PINGS_WITHOUT_DATA
        left = self._heard_at + (QUIET_PING_SPACING if quiet else KEEPALIVE_IDLE) - now
        if left > 0:
            return left
        self._conn.ping(os.urandom(8))
        self._ping_sent_at = now
        self._pings_without_data += 1
        return KEEPALIVE_TIMEOUT

    def connection_lost(self, reason: str) -> None:
        """The connection closed (``reason``): a call not ended yet ends UNAVAILABLE."""
        if self.ended is None:
            self.ended = Ended(grpc.StatusCode.UNAVAILABLE, reason)

    def _on_event(self, event: object) -> None:
        if isinstance(event, RemoteSettingsChanged):
            self.peer_ready = True
        elif isinstance(event, PingAckReceived):
            self._ping_sent_at = None
        elif isinstance(event, (ResponseReceived, TrailersReceived)):
            if event.stream_id == STREAM:
                self._pings_without_data = 0
                self._on_headers(event.headers or [])
        elif isinstance(event, StreamEnded):
            if event.stream_id == STREAM:
                self._on_stream_ended()
        elif isinstance(event, StreamReset):
            if event.stream_id == STREAM:
                code = int(event.error_code or 0)
                self._end(grpc_status.status_of_reset(code), f"the server reset the call (HTTP/2 error {code})")
        elif isinstance(event, ConnectionTerminated):
            code = int(event.error_code or 0)
            if code != ErrorCodes.NO_ERROR:
                self._end(grpc_status.status_of_reset(code), f"the server closed the connection (HTTP/2 error {code})")
            elif (event.last_stream_id or 0) < STREAM:
                self._end(grpc.StatusCode.UNAVAILABLE, "the server closed the connection before the call")
            else:
                self._end(grpc.StatusCode.UNAVAILABLE, "the server is closing the connection (GOAWAY)")
        elif isinstance(event, PushedStreamReceived):
            self._end(grpc.StatusCode.INTERNAL, "the server pushed a stream, which was turned off")
        # Settings, pings, window updates: h2 has answered or applied them; the owner writes outgoing().

    def _on_headers(self, headers: Iterable[tuple[bytes, bytes]]) -> None:
        fields = {bytes(name): bytes(value) for name, value in headers}
        self._fields = fields
        first = not self._headers_seen
        self._headers_seen = True
        status = fields.get(b":status", b"200").decode("ascii", "replace")
        if first and status != "200":
            self._end(grpc_status.status_of_http(status), f"the server answered HTTP status {status}")

    def _on_stream_ended(self) -> None:
        fields = self._fields
        if b"grpc-status" not in fields:
            self._end(grpc.StatusCode.INTERNAL, "the server ended the call without a status")
            return
        code = grpc_status.status_of_number(fields[b"grpc-status"].decode("ascii", "replace"))
        details = grpc_status.grpc_message(fields.get(b"grpc-message", b"").decode("utf-8", "replace"))
        self._end(code, details or code.name)

    def _responses(self) -> list[bytes]:
        messages, position, found = self._messages, 0, []
        unpack, limit = GRPC_PREFIX.unpack_from, self._max_response
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

    def _end(self, code: grpc.StatusCode, details: str) -> None:
        if self.ended is None:
            self.ended = Ended(code, details)
