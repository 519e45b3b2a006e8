"""The bytes a call reads, taken apart before h2 sees them: the call's own DATA cut into gRPC messages in place,
GOAWAY read by the call, every other frame handed to h2.

Why not hand everything to h2: h2 parses each frame in Python and makes an event object, a copy of the
payload and its flow-control bookkeeping per frame. A Subscribe stream's server (grpc-go) writes each message
as a DATA frame of its own, so h2 cost about 9.5 us a message here, three times go-liftbridge's whole read.
:class:`Inbound` walks the frame headers itself: a DATA frame of the call (stream 1, neither padded nor
ending the stream) never reaches h2; its messages are cut from the bytes as read, as (start, end) spans, and
the call's flow-control windows are granted back by WINDOW_UPDATE frames of our own (h2 never sees that DATA,
so its own windows stay as they were opened). A message cut across frames or reads is put together in a
buffer of its own. Any other frame (headers, trailers, settings, RST_STREAM, a padded or stream-ending DATA
frame) goes to h2 as it comes, in order; h2 keeps its own partial frames.

GOAWAY, PING and WINDOW_UPDATE are read here too, each handed to the owner whole, after the frames before it.
h2 takes no frame at all once its peer said GOAWAY (a read that held one lost every response in it). PING and
WINDOW_UPDATE come with nearly every message the server reads (grpc-go's flow-control estimate PINGs after
each read, with a WINDOW_UPDATE before it), and h2 took about 20 us for each, more than the rest of a
publish's read: the call answers a PING itself and keeps its own send windows (``call_state.py``).

What :meth:`Inbound.walk` returns, ``Segments``: a list of ``(buffer, spans)``, ``spans`` a flat list
``[start0, end0, start1, end1, ...]`` of messages in ``buffer`` (the bytes read, or a message put together),
in the order they came. A zero-length message (Subscribe's handshake) is a span whose start is its end.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Protocol

import grpc

STREAM = 1  # the call's stream id (the first a client opens)
FRAME = struct.Struct(">IBI")  # a frame header: length (24 bits) and type (8 bits), flags, stream id
FRAME_HEADER = 9  # bytes
DATA, PING, GOAWAY, WINDOW_UPDATE_FRAME = 0x0, 0x6, 0x7, 0x8  # frame types
END_STREAM, PADDED = 0x1, 0x8  # DATA flags
ACK = 0x1  # PING flag
GRPC_PREFIX = struct.Struct(">BI")  # a gRPC message's prefix: compressed flag, length
WINDOW_UPDATE = struct.Struct(">IBII")  # length 4 and type 0x8, flags, stream id, increment

Segments = list[tuple[bytes | bytearray, list[int]]]
"""Messages as ``(buffer, [start0, end0, start1, end1, ...])`` (see the module docstring)."""


class Sink(Protocol):
    """The call that owns the walk: h2's frames, the GOAWAY, and the end go to it."""

    def h2_frames(self, data: bytes) -> None:
        """Hand frames (or the rest of one) to h2."""

    def goaway(self, payload: bytes) -> None:
        """The server's GOAWAY frame's payload."""

    def ping(self, flags: int, payload: bytes) -> None:
        """The server's PING frame (stream 0, 8 bytes): its flags (ACK: the answer to ours) and payload."""

    def window_update(self, stream: int, increment: int) -> None:
        """The server's WINDOW_UPDATE for the connection (stream 0) or the call's stream."""

    def end(self, code: grpc.StatusCode, details: str, *, goaway: bool = False) -> None:
        """End the call from what was read (a protocol error, a refused message)."""

    @property
    def over(self) -> bool:
        """The call has ended: the rest of the read is not looked at."""


def _ours(head: int, stream: int) -> bool:
    """A frame the walk hands to the owner itself (a GOAWAY, or a well-formed PING or WINDOW_UPDATE of the
    connection or the call's stream); a malformed one goes to h2, which refuses it as HTTP/2 says."""
    kind, length = head & 0xFF, head >> 8
    if kind == GOAWAY:
        return True
    if kind == PING:
        return length == 8 and stream == 0
    return kind == WINDOW_UPDATE_FRAME and length == 4 and stream in (0, STREAM)


def ping_ack(payload: bytes) -> bytes:
    """The PING frame that answers one whose payload is ``payload``."""
    return FRAME.pack((8 << 8) | PING, ACK, 0) + payload


def window_update(increment: int) -> bytes:
    """WINDOW_UPDATE frames granting ``increment`` bytes back to the call's stream and to the connection."""
    head = (4 << 8) | 0x8  # length 4, type WINDOW_UPDATE
    return WINDOW_UPDATE.pack(head, 0, STREAM, increment) + WINDOW_UPDATE.pack(head, 0, 0, increment)


class Inbound:
    """The state of the walk across reads (see the module docstring).

    :param max_response_bytes: largest message accepted; a larger one ends the call (RESOURCE_EXHAUSTED).
    :param window: bytes of DATA the server may send ahead of what was granted back (the windows the call
        opened, per stream and connection); half of it read is granted back at once.
    :param max_frame: largest frame payload the call accepts (its SETTINGS_MAX_FRAME_SIZE), bytes.
    :param granted: takes the WINDOW_UPDATE frames to write.
    """

    def __init__(
        self, *, max_response_bytes: int, window: int, max_frame: int, granted: Callable[[bytes], None]
    ) -> None:
        self._limit = max_response_bytes
        self._window = window
        self._max_frame = max_frame
        self._granted = granted
        self._held = b""  # the start of a frame header, or of a GOAWAY frame, that the next read completes
        self._skip = 0  # bytes of a frame already handed to h2 that the next reads still carry
        self._data_left = 0  # bytes of a DATA frame of the call that the next reads still carry
        self._partial = bytearray()  # a message (its prefix included) cut across frames or reads, so far
        self._unacknowledged = 0  # DATA bytes read and not granted back yet
        self._window_left = window  # DATA bytes the server may send now (the grants it has been sent count)
        self._grant_unwritten = 0  # bytes granted back in frames the owner has not written yet
        self.data_seen = False  # DATA of the call came since the owner last cleared this
        self._spans: list[int] | None = None  # the spans of the read's own bytes that messages go to now
        self._out: Segments = []  # the messages of the read being walked
        self._skip_started = False  # the read began with the rest of a frame h2 has the start of

    def walk(self, data: bytes, sink: Sink) -> Segments:
        """Take one read; the messages it completes (see the module docstring), in order. Stops where the call
        ends (``sink.over``)."""
        out: Segments = []
        self._out, self._spans = out, None
        if self._held:
            data, self._held = self._held + data, b""
        size = len(data)
        position = self._carried_over(data, size, sink)  # the first byte of a new frame
        start = 0 if self._skip_started else position  # the first byte not handed to h2 yet
        unpack = FRAME.unpack_from
        while position + FRAME_HEADER <= size and not sink.over:
            head, flags, stream = unpack(data, position)
            end = position + FRAME_HEADER + (head >> 8)
            if head & 0xFF == DATA and stream == STREAM and not flags & (END_STREAM | PADDED):
                if start < position:
                    sink.h2_frames(data[start:position])
                    self._spans = None  # h2 may have cut messages of its own meanwhile: later ones go after them
                    start = position
                    continue  # the call may have ended
                position = start = self._data_frames(data, position, out, sink)
            elif _ours(head, stream):
                if end > size:
                    break  # held until it is whole
                if start < position:
                    sink.h2_frames(data[start:position])
                    self._spans = None
                    start = position
                    continue  # the call may have ended
                kind, payload = head & 0xFF, data[position + FRAME_HEADER : end]
                if kind == GOAWAY:
                    sink.goaway(payload)
                elif kind == PING:
                    sink.ping(flags, payload)
                else:
                    sink.window_update(stream, int.from_bytes(payload, "big") & 0x7FFFFFFF)
                position = start = end
            elif end > size:
                self._skip = end - size
                position = size
            else:
                position = end
        if sink.over:
            return self._done(out)
        if position < size:  # a header cut in two, or a GOAWAY still to come whole
            self._held = data[position:]
        if start < position:
            sink.h2_frames(data if start == 0 and position == size else data[start:position])
        return self._done(out)

    def _data_frames(self, data: bytes, position: int, out: Segments, sink: Sink) -> int:
        """Cut the DATA frames of the call (plain: neither padded nor ending the stream) that follow one another
        from ``position``; where the first other frame starts (or the read's end, or where the call ended).

        The hot path of every read (a Subscribe server writes one frame per message): a whole frame of whole
        messages is cut inline, with names bound locally; a frame cut by the read, a window to grant back, a
        message begun earlier or an error take :meth:`_data_frame_slowly`.
        """
        size = len(data)
        unpack, prefix = FRAME.unpack_from, GRPC_PREFIX.unpack_from
        limit, max_frame, half = self._limit, self._max_frame, self._window // 2
        spans = self._spans
        while position + FRAME_HEADER <= size:
            head, flags, stream = unpack(data, position)
            if head & 0xFF != DATA or stream != STREAM or flags & (END_STREAM | PADDED):
                break
            length = head >> 8
            end = position + FRAME_HEADER + length
            unacknowledged = self._unacknowledged + length
            left = self._window_left - length
            if end > size or unacknowledged >= half or left < 0 or length > max_frame or self._partial:
                self._spans = spans
                position = self._data_frame_slowly(data, position, end, out, sink)
                spans = self._spans
                if sink.over:
                    break
                continue
            self._unacknowledged = unacknowledged
            self._window_left = left
            self.data_seen = True
            cut = position + FRAME_HEADER
            while cut + 5 <= end:
                compressed, length = prefix(data, cut)
                if compressed or length > limit:
                    self._refuse(compressed, length, sink)
                    return size
                ends = cut + 5 + length
                if ends > end:
                    break
                if spans is None:
                    spans = self._spans = []
                    out.append((data, spans))
                spans.append(cut + 5)
                spans.append(ends)
                cut = ends
            if cut < end:
                self._partial += data[cut:end]
            position = end
        self._spans = spans
        return position

    def _done(self, out: Segments) -> Segments:
        self._out, self._spans = [], None
        return out

    def _carried_over(self, data: bytes, size: int, sink: Sink) -> int:
        """Take the part of ``data`` that belongs to a frame an earlier read began (the rest of a frame h2 has
        the start of, or of a DATA frame of the call); where the next frame starts (``size``: none in this
        read). ``_skip_started`` says whether those bytes are h2's (still to hand over)."""
        self._skip_started = False
        if self._skip:
            if self._skip >= size:
                self._skip -= size
                self._skip_started = True
                return size
            position, self._skip = self._skip, 0
            self._skip_started = True
            return position
        if self._data_left:
            stop = min(self._data_left, size)
            self._data_left -= stop
            self._cut(data, 0, stop, self._out, sink)
            return stop
        return 0

    def _data_frame_slowly(self, data: bytes, position: int, end: int, out: Segments, sink: Sink) -> int:
        """A DATA frame of the call that the inline path does not take (cut by the read, a window to grant, a
        message begun earlier, an error); where the next frame starts."""
        if not self._data_frame(end - position - FRAME_HEADER, sink):
            return len(data)
        if end > len(data):
            self._data_left = end - len(data)
            self._cut(data, position + FRAME_HEADER, len(data), out, sink)
            return len(data)
        self._cut(data, position + FRAME_HEADER, end, out, sink)
        return end

    def _data_frame(self, length: int, sink: Sink) -> bool:
        """Account for a DATA frame of ``length`` bytes of the call (flow control); False when it ends the call.

        DATA may come before the response headers: Liftbridge's PublishAsync sends from two goroutines, and
        grpc-go then sometimes writes a message before the headers it queued (seen on v1.9.0, about one
        batch in 200 with an error and an ack together); h2 took that too, so the call does."""
        if length > self._max_frame:
            sink.end(grpc.StatusCode.INTERNAL, f"the server sent a frame of {length} bytes, over {self._max_frame}")
            return False
        self.data_seen = True
        self._window_left -= length
        if self._window_left < 0:
            sink.end(grpc.StatusCode.INTERNAL, "the server sent more DATA than its flow-control window allows")
            return False
        unacknowledged = self._unacknowledged + length
        if unacknowledged >= self._window // 2:
            self._granted(window_update(unacknowledged))
            self._grant_unwritten += unacknowledged
            unacknowledged = 0
        self._unacknowledged = unacknowledged
        return True

    def grants_written(self) -> None:
        """The owner wrote the WINDOW_UPDATE frames handed to ``granted``: the server may send that much more."""
        self._window_left += self._grant_unwritten
        self._grant_unwritten = 0

    def taken_by_h2(self, message: bytes, sink: Sink) -> None:
        """DATA of the call that h2 parsed (a padded or stream-ending frame) during the walk: cut like any
        other, in order with the rest of the read."""
        self.data_seen = True
        self._spans = None  # not the read's own bytes
        self._cut(message, 0, len(message), self._out, sink)
        self._spans = None

    def _cut(self, data: bytes, position: int, stop: int, out: Segments, sink: Sink) -> None:
        """Cut the messages of ``data[position:stop]`` (the call's DATA) into ``out``."""
        if self._partial:
            position = self._complete(data, position, stop, out, sink)
            if sink.over:
                return
        unpack, limit = GRPC_PREFIX.unpack_from, self._limit
        spans = self._spans
        while position + 5 <= stop:
            compressed, length = unpack(data, position)
            if compressed or length > limit:
                self._refuse(compressed, length, sink)
                return
            end = position + 5 + length
            if end > stop:
                break
            if spans is None:
                spans = self._spans = []
                out.append((data, spans))
            spans.append(position + 5)
            spans.append(end)
            position = end
        if position < stop:
            self._partial += data[position:stop]

    def _complete(self, data: bytes, position: int, stop: int, out: Segments, sink: Sink) -> int:
        """Add to the message begun in an earlier frame; where the rest of ``data`` starts."""
        partial = self._partial
        if len(partial) < 5:
            take = min(5 - len(partial), stop - position)
            partial += data[position : position + take]
            position += take
            if len(partial) < 5:
                return position
        compressed, length = GRPC_PREFIX.unpack_from(partial)
        if compressed or length > self._limit:
            self._refuse(compressed, length, sink)
            return stop
        take = min(5 + length - len(partial), stop - position)
        partial += data[position : position + take]
        position += take
        if len(partial) == 5 + length:
            out.append((partial, [5, 5 + length]))
            self._partial = bytearray()
            self._spans = None  # the next message of the read starts a segment after this one
        return position

    def _refuse(self, compressed: int, length: int, sink: Sink) -> None:
        if compressed:
            sink.end(grpc.StatusCode.INTERNAL, "the server sent a compressed message, which was not asked for")
        else:
            sink.end(grpc.StatusCode.RESOURCE_EXHAUSTED, f"a response of {length} bytes is over {self._limit}")
