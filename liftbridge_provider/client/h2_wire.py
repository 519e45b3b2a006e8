"""HTTP/2 framing and header blocks for one gRPC call on a connection of its own, without I/O.

The facts here come from RFC 9113 (HTTP/2: frame layout, types, flags,
settings, error codes), RFC 7541 (HPACK: the static table indices and the
literal representations used for requests) and gRPC's PROTOCOL-HTTP2 (the
request headers, the 5-byte message prefix, the status of an HTTP status or a
stream reset). :mod:`h2_call` keeps the call's state on top of these.

Request header blocks are written as HPACK literals "without indexing" and
without Huffman coding: the encoder keeps no dynamic table, so the server's
decoder needs none of our state. Response header blocks are decoded with
``hpack`` (the server does use its dynamic table and Huffman coding).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from urllib.parse import unquote

import grpc

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types (RFC 9113 section 6).
DATA = 0x0
HEADERS = 0x1
PRIORITY = 0x2
RST_STREAM = 0x3
SETTINGS = 0x4
PUSH_PROMISE = 0x5
PING = 0x6
GOAWAY = 0x7
WINDOW_UPDATE = 0x8
CONTINUATION = 0x9

# Flags.
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

# Settings identifiers (RFC 9113 section 6.5.2).
SETTINGS_HEADER_TABLE_SIZE = 0x1
SETTINGS_ENABLE_PUSH = 0x2
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
SETTINGS_MAX_FRAME_SIZE = 0x5

# Error codes (RFC 9113 section 7).
NO_ERROR = 0x0
PROTOCOL_ERROR = 0x1
FLOW_CONTROL_ERROR = 0x3
REFUSED_STREAM = 0x7
CANCEL = 0x8
ENHANCE_YOUR_CALM = 0xB
INADEQUATE_SECURITY = 0xC

DEFAULT_WINDOW = 65_535  # every flow-control window's size until a setting or update changes it, bytes
DEFAULT_MAX_FRAME = 16_384  # largest frame payload a peer accepts until it says otherwise, bytes
MAX_FRAME_LIMIT = (1 << 24) - 1  # largest SETTINGS_MAX_FRAME_SIZE allowed, bytes
MAX_WINDOW = (1 << 31) - 1  # largest flow-control window, bytes

FRAME_HEADER = struct.Struct(">HBBBI")  # length (high 16 bits, low 8 bits), type, flags, stream id (with R bit)
GRPC_PREFIX = struct.Struct(">BI")  # compressed flag, message length
_SETTING = struct.Struct(">HI")
_U32 = struct.Struct(">I")
_U32_PAIR = struct.Struct(">II")


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    """One frame: the 9-byte header, then ``payload``."""
    size = len(payload)
    return FRAME_HEADER.pack(size >> 8, size & 0xFF, kind, flags, stream) + payload


def settings(pairs: Iterable[tuple[int, int]]) -> bytes:
    """A SETTINGS frame with ``(identifier, value)`` pairs."""
    return frame(SETTINGS, 0, 0, b"".join(_SETTING.pack(key, value) for key, value in pairs))


def settings_ack() -> bytes:
    return frame(SETTINGS, ACK, 0)


def ping_ack(payload: bytes) -> bytes:
    return frame(PING, ACK, 0, payload)


def window_update(stream: int, increment: int) -> bytes:
    """Grant the peer ``increment`` more bytes of DATA on ``stream`` (0: the connection)."""
    return frame(WINDOW_UPDATE, 0, stream, _U32.pack(increment))


def rst_stream(stream: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream, _U32.pack(code))


def goaway(last_stream: int, code: int) -> bytes:
    return frame(GOAWAY, 0, 0, _U32_PAIR.pack(last_stream, code))


def parse_settings(payload: bytes) -> list[tuple[int, int]]:
    """The ``(identifier, value)`` pairs of a SETTINGS frame's payload (a multiple of 6 bytes)."""
    if len(payload) % 6:
        raise ValueError(f"a SETTINGS payload of {len(payload)} bytes is not a multiple of 6")
    return [_SETTING.unpack_from(payload, at) for at in range(0, len(payload), 6)]


def parse_u32_pair(payload: bytes) -> tuple[int, int]:
    """The two 32-bit numbers a GOAWAY frame starts with (last stream id without its R bit, error code)."""
    last, code = _U32_PAIR.unpack_from(payload)
    return last & MAX_WINDOW, code


def parse_u32(payload: bytes) -> int:
    """The 32-bit number of a RST_STREAM (error code) or WINDOW_UPDATE (increment, R bit cleared)."""
    return int(_U32.unpack_from(payload)[0])


def without_padding(flags: int, payload: bytes, *, priority: bool = False) -> bytes:
    """A DATA or HEADERS payload without its padding (PADDED) and priority fields (HEADERS with PRIORITY)."""
    start, end = 0, len(payload)
    if flags & PADDED:
        if not payload:
            raise ValueError("a padded frame without its pad length")
        start, end = 1, end - payload[0]
    if priority and flags & PRIORITY_FLAG:
        start += 5
    if end < start:
        raise ValueError("the padding is longer than the frame")
    return payload[start:end]


# -- HPACK literals for request headers (RFC 7541 sections 5.1, 5.2, 6.2.2 and Appendix A) ----------------

_METHOD_POST = 3  # static table entries with name and value
_SCHEME_HTTP = 6
_SCHEME_HTTPS = 7
_NAME_AUTHORITY = 1  # static table entries used for their name only
_NAME_PATH = 4
_NAME_CONTENT_TYPE = 31
_NAME_USER_AGENT = 58


def _integer(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """An HPACK integer with an N-bit prefix, ``first`` holding the bits above the prefix."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(text: str) -> bytes:
    raw = text.encode()
    return _integer(len(raw), 7) + raw  # H bit 0: no Huffman coding


def _literal(name_index: int, value: str) -> bytes:
    """A literal header field without indexing whose name is a static table entry."""
    return _integer(name_index, 4) + _string(value)


def _literal_new_name(name: str, value: str) -> bytes:
    return b"\x00" + _string(name) + _string(value)


def request_headers(*, authority: str, path: str, tls: bool, user_agent: str) -> bytes:
    """The header block of a gRPC request: POST ``path`` to ``authority``, content-type application/grpc."""
    return b"".join(
        (
            _integer(_METHOD_POST, 7, 0x80),
            _integer(_SCHEME_HTTPS if tls else _SCHEME_HTTP, 7, 0x80),
            _literal(_NAME_PATH, path),
            _literal(_NAME_AUTHORITY, authority),
            _literal(_NAME_CONTENT_TYPE, "application/grpc"),
            _literal_new_name("te", "trailers"),
            _literal(_NAME_USER_AGENT, user_agent),
        )
    )


# -- gRPC status from HTTP/2 (gRPC's PROTOCOL-HTTP2.md) ------------------------------------------------------

_STATUS_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}

_STATUS_OF_HTTP = {
    400: grpc.StatusCode.INTERNAL,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.UNIMPLEMENTED,
    429: grpc.StatusCode.UNAVAILABLE,
    502: grpc.StatusCode.UNAVAILABLE,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.UNAVAILABLE,
}

_STATUS_OF_RESET = {
    REFUSED_STREAM: grpc.StatusCode.UNAVAILABLE,
    CANCEL: grpc.StatusCode.CANCELLED,
    ENHANCE_YOUR_CALM: grpc.StatusCode.RESOURCE_EXHAUSTED,
    INADEQUATE_SECURITY: grpc.StatusCode.PERMISSION_DENIED,
}


def status_of_number(number: str | None) -> grpc.StatusCode:
    """The status a ``grpc-status`` value names (UNKNOWN for a missing or unknown one)."""
    try:
        return _STATUS_BY_NUMBER.get(int(number or ""), grpc.StatusCode.UNKNOWN)
    except ValueError:
        return grpc.StatusCode.UNKNOWN


def status_of_http(status: str | None) -> grpc.StatusCode:
    """The gRPC status of a response whose HTTP ``:status`` is not 200."""
    try:
        return _STATUS_OF_HTTP.get(int(status or ""), grpc.StatusCode.UNKNOWN)
    except ValueError:
        return grpc.StatusCode.UNKNOWN


def status_of_reset(code: int) -> grpc.StatusCode:
    """The gRPC status of a stream reset (RST_STREAM) or a GOAWAY with error ``code``."""
    return _STATUS_OF_RESET.get(code, grpc.StatusCode.INTERNAL)


def grpc_message(value: str | None) -> str:
    """A ``grpc-message`` trailer's text (percent-encoded on the wire)."""
    return unquote(value) if value else ""
