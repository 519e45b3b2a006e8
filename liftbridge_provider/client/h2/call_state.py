"""One gRPC call on an HTTP/2 connection of its own, without I/O, driven by h2: the call every streaming RPC
of the client runs on (the data plane: ``publish_batch``'s PublishAsync, Subscribe).

:class:`CallState` turns serialized requests into the bytes to write and the bytes read into serialized
responses, and says how the call ended. The HTTP/2 is h2's (:class:`h2.connection.H2Connection`, client side:
the preface and settings, HPACK, frames, flow control, SETTINGS and PING acknowledgements, stream and
connection state); this class adds the gRPC call on top: the request headers (with ``grpc-timeout`` when the
call has a deadline), the 5-byte message prefix, the status from the trailers, a stream reset or a GOAWAY
(:mod:`grpc_status`). The call's own DATA is cut into messages in place by :mod:`inbound`, without h2 (h2
cost about 9.5 us per frame, and a Subscribe server writes a frame per message), and so are the server's
PINGs (answered here) and WINDOW_UPDATEs (h2 took about 20 us for each, and grpc-go sends both for nearly
every message it reads). So the call also frames its own requests as DATA and keeps its own send windows
(the connection's and the stream's, from the server's settings and WINDOW_UPDATEs, as RFC 9113 says); h2
still writes the preface, the settings, the headers and the end of the stream. Its owner moves the bytes:
:mod:`aio_transport` on asyncio, :mod:`blocking` on the calling thread.

Why a call of our own rather than grpc's: grpc writes each message of a stream as its own socket write and
completes each write through its completion queue and event-loop threads, so a pipelined batch crossed
several threads and system calls per message on the client, and the server, reading one small message at a
time, did every later step (read, NATS publish, ack write) once per message too. Here every message the
peer's windows allow goes out in one write (one DATA frame per largest frame, not per message), and every
response that arrived is cut in one pass. grpc's receive path alone cost more CPU per message than
go-liftbridge's whole Subscribe; and grpc-python keeps a single-threaded call it cancelled for the life of
the process (about 19 KB each); a call here is plain Python objects, gone with its owner.

The call counts the requests written out in full (:attr:`written_messages`): a request never written in full
cannot have been stored, so a publisher may send it over another call. Server push is turned off, compressed
messages are not asked for, and the call is stream 1, the only one.

A GOAWAY is read by the call, not by h2 (h2 takes no frame at all once its peer said GOAWAY, and a read that
held one lost every response in it): a GOAWAY with an error ends the call after the frames before it; a
graceful one (NO_ERROR, our stream included) lets the call run to its end: no request is written after it,
the sending side is closed, and the answers still coming are read.

Keepalive (:meth:`CallState.keepalive`): a server silent for :data:`KEEPALIVE_IDLE` seconds is sent a PING,
and a PING unanswered for :data:`KEEPALIVE_TIMEOUT` seconds ends the call UNAVAILABLE, so a broker that froze
(its kernel keeps the connection open and answers nothing) is given up within ``KEEPALIVE_IDLE +
KEEPALIVE_TIMEOUT`` seconds of its last frame while the owner reads. grpc-go counts a PING as a strike
unless the server sent data since the last one or 5 minutes passed, and closes the connection at the third
strike: after :data:`PINGS_WITHOUT_DATA` PINGs without data the next ones are :data:`QUIET_PING_SPACING`
seconds apart.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import deque
from collections.abc import Callable, Iterable

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

from liftbridge_provider.client.h2 import grpc_status
from liftbridge_provider.client.h2.grpc_status import CallFailed, Ended
from liftbridge_provider.client.h2.inbound import DATA, FRAME, GRPC_PREFIX, STREAM, Inbound, Segments, ping_ack

__all__ = [
    "DEFAULT_WINDOW",
    "KEEPALIVE_IDLE",
    "KEEPALIVE_TIMEOUT",
    "PINGS_WITHOUT_DATA",
    "QUIET_PING_SPACING",
    "RECEIVE_WINDOW",
    "STREAM",
    "CallFailed",
    "CallState",
    "Ended",
    "Segments",
]

DEFAULT_WINDOW = 65_535  # every flow-control window's size until a setting or update changes it (RFC 9113), bytes
MAX_WINDOW = 2**31 - 1  # the largest flow-control window HTTP/2 allows, bytes
RECEIVE_WINDOW = 1 << 24  # bytes the server may send ahead of what we read, per stream and connection (16 MiB)
USER_AGENT = "liftbridge-provider (h2)"
KEEPALIVE_IDLE = 10.0  # seconds without a frame from the server before a PING asks whether it is alive
KEEPALIVE_TIMEOUT = 10.0  # seconds a PING may wait for its acknowledgement before the call ends UNAVAILABLE
PINGS_WITHOUT_DATA = 3  # PINGs in a row grpc-go takes without data of its own in between (2 strikes allowed)
QUIET_PING_SPACING = 310.0  # seconds between later PINGs without data (grpc-go's minimum is 300)


class CallState:
    """The state of one call: what to write, what was read, how it ended.

    :param authority: the ``:authority`` of the request (the address dialled, or the TLS server name).
    :param path: the method's path, e.g. ``/proto.API/PublishAsync``.
    :param tls: whether the connection is TLS (the ``:scheme``).
    :param max_response_bytes: largest response accepted; a larger one ends the call (RESOURCE_EXHAUSTED).
    :param timeout: seconds the server is told the call may last (``grpc-timeout``); None: no deadline sent.
        The owner ends the call at its deadline itself; this lets the server stop at the same time.
    :param clock: seconds on a monotonic clock (default ``time.monotonic``), for the keepalive.
    """

    def __init__(
        self,
        *,
        authority: str,
        path: str,
        tls: bool,
        max_response_bytes: int,
        timeout: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        conn = H2Connection(H2Configuration(client_side=True, header_encoding=None))
        conn.local_settings = Settings(
            client=True,
            initial_values={SettingCodes.ENABLE_PUSH: 0, SettingCodes.INITIAL_WINDOW_SIZE: RECEIVE_WINDOW},
        )
        conn.initiate_connection()
        conn.increment_flow_control_window(RECEIVE_WINDOW - DEFAULT_WINDOW)
        headers = [
            (b":method", b"POST"),
            (b":scheme", b"https" if tls else b"http"),
            (b":path", path.encode()),
            (b":authority", authority.encode()),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
            (b"user-agent", USER_AGENT.encode()),
        ]
        if timeout is not None:
            headers.append((b"grpc-timeout", grpc_status.grpc_timeout(timeout)))
        conn.send_headers(STREAM, headers)
        self._conn = conn
        self._control = bytearray()  # our own frames to write after h2's (WINDOW_UPDATE for the call's DATA)
        self._inbound = Inbound(
            max_response_bytes=max_response_bytes,
            window=RECEIVE_WINDOW,
            max_frame=conn.local_settings.max_frame_size,
            granted=self._control.extend,
        )
        self._pending = bytearray()  # gRPC-framed requests not handed to h2 yet
        self._ends: deque[int] = deque()  # where each queued request ends, as a count of DATA bytes since the start
        self._queued_total = 0  # DATA bytes queued since the start
        self._written_total = 0  # DATA bytes handed to h2 (and so to the next outgoing()) since the start
        self._written_end = 0  # where the last request written in full ends, as a count of DATA bytes
        self.written_messages = 0  # requests written out in full
        # What the server lets us send (RFC 9113, 6.9): its connection window and the stream's, which starts at
        # its SETTINGS_INITIAL_WINDOW_SIZE and follows its changes.
        self._send_window = DEFAULT_WINDOW
        self._stream_window = DEFAULT_WINDOW
        self._peer_initial_window = DEFAULT_WINDOW
        self._closing = False  # the sending side is to be closed after the pending requests
        self._closed_sending = False
        # The server's SETTINGS came: it is alive and speaks HTTP/2. No request is written before (a frozen
        # broker's kernel accepts the connection and takes the bytes, and the requests would then count as
        # written, possibly stored, while nothing reads them), as grpc waits for it before it uses a connection.
        self.peer_ready = False
        self._fields: dict[bytes, bytes] = {}  # the last header block of our stream
        self._headers_seen = False
        self.ended: Ended | None = None
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

    @property
    def queued_through(self) -> int:
        """DATA bytes queued since the start (prefixes included): where the next request queued starts."""
        return self._queued_total

    @property
    def written_through(self) -> int:
        """DATA bytes handed to h2 (and so to the bytes to write) since the start: a request that starts at or
        after this has not been written at all."""
        return self._written_total

    def withdraw(self, start: int) -> bool:
        """Take back the last request queued, which starts at DATA byte ``start``, when none of it has been
        written (the peer's window held it back): True, and it is never written. False when some of it went out,
        or when it is not the last one queued."""
        ends = self._ends
        if not ends or self._written_total > start or ends[-1] != self._queued_total:
            return False
        if len(ends) > 1 and ends[-2] != start:
            return False
        size = self._queued_total - start
        if not 0 < size <= len(self._pending):
            return False
        del self._pending[len(self._pending) - size :]
        ends.pop()
        self._queued_total = start
        return True

    def close_sending(self) -> None:
        """Half-close the call once every queued request is written (END_STREAM)."""
        self._closing = True

    def fail(self, code: grpc.StatusCode, details: str) -> bytes:
        """End the call from this side with ``code``; the bytes that tell the server (RST_STREAM CANCEL)."""
        self.end(code, details)
        with contextlib.suppress(H2Error):  # the stream or the connection is closed already: nothing to tell
            self._conn.reset_stream(STREAM, ErrorCodes.CANCEL)
        return self._conn.data_to_send()

    def outgoing(self) -> bytes:
        """Everything that may be written now: h2's frames (settings, acknowledgements, headers), then the
        queued requests as DATA within the peer's windows, at most its largest frame each, then the end of the
        stream when asked, then our own frames (PING answers, window updates for the DATA the call read)."""
        conn = self._conn
        if self.ended is not None:
            return conn.data_to_send()
        out = conn.data_to_send()
        pending = self._pending
        if pending and self.peer_ready and not self.draining:
            allowed = min(len(pending), self._send_window, self._stream_window)
            if allowed > 0:
                out += self._data_frames(allowed, conn.max_outbound_frame_size)
        if ((self._closing and not pending) or self.draining) and not self._closed_sending and self.peer_ready:
            conn.end_stream(STREAM)
            self._closed_sending = True
            out += conn.data_to_send()
        if self._control:
            out += self._control
            self._control.clear()
            self._inbound.grants_written()
        return out

    def _data_frames(self, allowed: int, step: int) -> bytes:
        """The first ``allowed`` bytes of the queued requests as DATA frames of at most ``step`` bytes each, taken
        off the queue and the send windows."""
        pending, pack = self._pending, FRAME.pack
        frames: bytes | bytearray
        if allowed <= step:
            frames = pack((allowed << 8) | DATA, 0, STREAM) + pending[:allowed]
        else:
            frames = bytearray()
            with memoryview(pending) as view:
                for start in range(0, allowed, step):
                    size = min(step, allowed - start)
                    frames += pack((size << 8) | DATA, 0, STREAM)
                    with view[start : start + size] as part:
                        frames += part
        del pending[:allowed]
        self._send_window -= allowed
        self._stream_window -= allowed
        self._written_total += allowed
        ends, written, count = self._ends, self._written_total, 0
        while ends and ends[0] <= written:
            self._written_end = ends.popleft()
            count += 1
        self.written_messages += count
        return bytes(frames)

    # -- receiving -------------------------------------------------------------------------------------------

    def receive_spans(self, data: bytes) -> Segments:
        """Take bytes read from the connection; the complete responses they finish, in order, as spans of the
        buffers that hold them (:data:`~liftbridge_provider.client.h2.inbound.Segments`: no copy per message)."""
        if self.ended is not None:
            return []
        self._heard_at = self._clock()
        segments = self._inbound.walk(data, self)
        if self._inbound.data_seen:
            self._inbound.data_seen = False
            self._pings_without_data = 0
        return segments

    def receive(self, data: bytes) -> list[bytes]:
        """Take bytes read from the connection; the complete responses they finish, in order, as bytes."""
        return [
            bytes(buffer[spans[i] : spans[i + 1]])
            for buffer, spans in self.receive_spans(data)
            for i in range(0, len(spans), 2)
        ]

    @property
    def over(self) -> bool:
        """The call has ended (:attr:`ended` says how)."""
        return self.ended is not None

    # The walk's sink (inbound.Sink): h2's frames, the GOAWAY, and an end found in what was read.

    def h2_frames(self, data: bytes) -> None:
        """Hand frames other than the call's plain DATA to h2 and act on its events."""
        try:
            events = self._conn.receive_data(data)
        except H2Error as exc:  # h2 has queued its GOAWAY; the events of this part are lost with it
            self.end(grpc.StatusCode.INTERNAL, f"HTTP/2 error from the server's side: {exc}")
            return
        for event in events:
            if isinstance(event, DataReceived):
                length = event.flow_controlled_length or 0
                if length and self.ended is None:
                    self._conn.acknowledge_received_data(length, event.stream_id)
                if event.stream_id == STREAM and event.data and self.ended is None:
                    self._inbound.taken_by_h2(event.data, self)
            elif self.ended is None:
                self._on_event(event)

    def goaway(self, payload: bytes) -> None:
        """The server's GOAWAY (its payload: last stream id, error code, debug data)."""
        if len(payload) < 8:
            self.end(grpc.StatusCode.INTERNAL, "the server sent a GOAWAY frame too short to read")
            return
        last_stream = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
        code = int.from_bytes(payload[4:8], "big")
        if code != ErrorCodes.NO_ERROR:
            details = f"the server closed the connection (HTTP/2 error {code})"
            self.end(grpc_status.status_of_reset(code), details, goaway=True)
        elif last_stream < STREAM:
            self.end(grpc.StatusCode.UNAVAILABLE, "the server closed the connection before the call", goaway=True)
        else:  # graceful: the call may finish; nothing more goes out on it
            self.draining = True

    def ping(self, flags: int, payload: bytes) -> None:
        """The server's PING: answered (with the next bytes written), or, an answer to ours, the keepalive's."""
        if flags & 0x1:
            self._ping_sent_at = None
        else:
            self._control += ping_ack(payload)

    def window_update(self, stream: int, increment: int) -> None:
        """The server lets us send ``increment`` more bytes on the connection (``stream`` 0) or the call."""
        if increment == 0:
            self.end(grpc.StatusCode.INTERNAL, "the server sent a WINDOW_UPDATE of 0 bytes (an HTTP/2 error)")
            return
        if stream == 0:
            self._send_window += increment
        else:
            self._stream_window += increment
        if max(self._send_window, self._stream_window) > MAX_WINDOW:
            self.end(grpc.StatusCode.INTERNAL, "the server's flow-control window grew over 2^31-1 (an HTTP/2 error)")

    def end(self, code: grpc.StatusCode, details: str, *, goaway: bool = False) -> None:
        """End the call with ``code`` (the first end counts); ``goaway``: the server's GOAWAY ended it."""
        if self.ended is None:
            self.ended = Ended(code, details, goaway)

    # -- keepalive -------------------------------------------------------------------------------------------

    def keepalive(self) -> float | None:
        """Keep the keepalive rule (see the module docstring) now: a PING when the server has been silent
        long enough, the call ended UNAVAILABLE when a PING went unanswered too long; then the seconds until
        this should be called again (None once the call has ended). The owner writes :meth:`outgoing` after.
        An owner that waited without reading must read what came first: an answer may wait unread."""
        if self.ended is not None:
            return None
        now = self._clock()
        if self._ping_sent_at is not None:
            left = self._ping_sent_at + KEEPALIVE_TIMEOUT - now
            if left > 0:
                return left
            self.end(
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

    def resumed(self) -> None:
        """The owner stopped reading for a while (its consumer was slow) and reads again: silence counts from
        now, also for a PING in flight (its answer may be among what was left unread)."""
        now = self._clock()
        self._heard_at = now
        if self._ping_sent_at is not None:
            self._ping_sent_at = now

    def connection_lost(self, reason: str) -> None:
        """The connection closed (``reason``): a call not ended yet ends UNAVAILABLE."""
        self.end(grpc.StatusCode.UNAVAILABLE, reason)

    def _on_event(self, event: object) -> None:
        if isinstance(event, RemoteSettingsChanged):
            self.peer_ready = True
            initial = self._conn.remote_settings.initial_window_size
            self._stream_window += initial - self._peer_initial_window  # RFC 9113, 6.9.2
            self._peer_initial_window = initial
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
                self.end(grpc_status.status_of_reset(code), f"the server reset the call (HTTP/2 error {code})")
        elif isinstance(event, ConnectionTerminated):
            code = int(event.error_code or 0)
            if code != ErrorCodes.NO_ERROR:
                details = f"the server closed the connection (HTTP/2 error {code})"
                self.end(grpc_status.status_of_reset(code), details, goaway=True)
            elif (event.last_stream_id or 0) < STREAM:
                self.end(grpc.StatusCode.UNAVAILABLE, "the server closed the connection before the call", goaway=True)
            else:
                self.end(grpc.StatusCode.UNAVAILABLE, "the server is closing the connection (GOAWAY)", goaway=True)
        elif isinstance(event, PushedStreamReceived):
            self.end(grpc.StatusCode.INTERNAL, "the server pushed a stream, which was turned off")
        # Settings, pings, window updates: h2 has answered or applied them; the owner writes outgoing().

    def _on_headers(self, headers: Iterable[tuple[bytes, bytes]]) -> None:
        fields = {bytes(name): bytes(value) for name, value in headers}
        self._fields = fields
        first = not self._headers_seen
        self._headers_seen = True
        status = fields.get(b":status", b"200").decode("ascii", "replace")
        if first and status != "200":
            self.end(grpc_status.status_of_http(status), f"the server answered HTTP status {status}")

    def _on_stream_ended(self) -> None:
        fields = self._fields
        if b"grpc-status" not in fields:
            self.end(grpc.StatusCode.INTERNAL, "the server ended the call without a status")
            return
        code = grpc_status.status_of_number(fields[b"grpc-status"].decode("ascii", "replace"))
        details = grpc_status.grpc_message(fields.get(b"grpc-message", b"").decode("utf-8", "replace"))
        self.end(code, details or code.name)
