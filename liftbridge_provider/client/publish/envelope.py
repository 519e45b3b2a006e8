"""The Liftbridge envelope: the framing of protobuf messages sent over NATS directly.

A publish written to a stream's NATS subject (instead of through gRPC), and the
ack the server sends back to the message's ack inbox, are each one envelope::

    offset 0-3  magic B9 0E 43 B4
    offset 4    protocol version (0)
    offset 5    header length: where the payload starts (8, or 12 with a CRC)
    offset 6    flags; bit 0 set = a CRC-32C of the payload follows at 8-11
    offset 7    message type (0 publish, 1 ack; other values are server-internal)
    [8-11]      CRC-32C (Castagnoli), big-endian, of the payload only
    header len  the protobuf payload (``api.Message`` or ``api.Ack``)

Decoding follows the server: the payload starts at the header length (a longer
header is skipped), and a CRC flag needs a header of exactly 12 bytes. Malformed
input raises :class:`EnvelopeError`, and nothing else.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import TypeAlias, cast

import google_crc32c
from google.protobuf.message import DecodeError

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client.errors import EnvelopeError
from liftbridge_provider.core.errors import InvalidArgumentError

__all__ = [
    "CRC_HEADER_LEN",
    "FLAG_CRC",
    "MAGIC",
    "MIN_HEADER_LEN",
    "VERSION",
    "BytesLike",
    "MessageType",
    "crc32c",
    "decode_ack",
    "decode_message",
    "encode_ack",
    "encode_message",
    "wrap_publish",
]

BytesLike: TypeAlias = bytes | bytearray | memoryview

MAGIC: bytes = b"\xb9\x0e\x43\xb4"
VERSION: int = 0x00
MIN_HEADER_LEN: int = 8
CRC_HEADER_LEN: int = 12
FLAG_CRC: int = 0x01

_ACK_POLICIES = (api.LEADER, api.ALL, api.NONE)
_INT64_MAX = 2**63 - 1
_LAST_INTERNAL_TYPE = 14  # server-internal types 2..14 (replication, raft join, ...)


class MessageType(enum.IntEnum):
    """The envelope types a client sends or receives."""

    PUBLISH = 0
    ACK = 1


_TYPE_NAMES = {t.value: t.name for t in MessageType}


def crc32c(data: BytesLike) -> int:
    """CRC-32C (Castagnoli) of ``data``, as used by the envelope's checksum (google-crc32c, in C)."""
    return int(google_crc32c.value(bytes(data)))


def encode_message(
    value: BytesLike,
    *,
    key: BytesLike = b"",
    headers: Mapping[str, bytes] | None = None,
    ack_inbox: str = "",
    correlation_id: str = "",
    ack_policy: int = api.LEADER,
    expected_offset: int = -1,
    with_crc: bool = False,
) -> bytes:
    """A publish envelope around an ``api.Message``, ready for a stream's NATS subject.

    ``expected_offset`` is only checked by streams with optimistic concurrency
    control; -1 (the default, as in go-liftbridge) means "the next offset".
    """
    msg = api.Message(
        value=_as_bytes("value", value),
        key=_as_bytes("key", key),
        headers=_check_headers(headers),
        ackInbox=_check_str("ack_inbox", ack_inbox),
        correlationId=_check_str("correlation_id", correlation_id),
        ackPolicy=_check_ack_policy(ack_policy),
        offset=_check_expected_offset(expected_offset),
    )
    return _encode(MessageType.PUBLISH, msg.SerializeToString(deterministic=True), with_crc)


def wrap_publish(message: api.Message) -> bytes:
    """A publish envelope (no CRC) around a ``message`` whose fields the caller has already checked."""
    return _encode(MessageType.PUBLISH, message.SerializeToString(), False)


def encode_ack(ack: api.Ack, *, with_crc: bool = False) -> bytes:
    """An ack envelope around ``ack``, as the server publishes it to an ack inbox."""
    if not isinstance(ack, api.Ack):
        raise InvalidArgumentError(f"ack must be an api.Ack, not {type(ack).__name__}")
    return _encode(MessageType.ACK, ack.SerializeToString(deterministic=True), with_crc)


def decode_message(data: BytesLike) -> api.Message:
    """The ``api.Message`` in a publish envelope; EnvelopeError if ``data`` is not one."""
    msg = api.Message()
    _parse(msg, _decode(data, MessageType.PUBLISH))
    return msg


def decode_ack(data: BytesLike) -> api.Ack:
    """The ``api.Ack`` in an ack envelope; EnvelopeError if ``data`` is not one."""
    ack = api.Ack()
    if isinstance(data, bytes) and data.startswith(_PLAIN_ACK_HEADER):  # what the server sends: one check
        _parse(ack, data[MIN_HEADER_LEN:])
    else:
        _parse(ack, _decode(data, MessageType.ACK))
    return ack


_PLAIN_HEADERS = {kind: MAGIC + bytes((VERSION, MIN_HEADER_LEN, 0, kind)) for kind in MessageType}  # no CRC
_PLAIN_ACK_HEADER = _PLAIN_HEADERS[MessageType.ACK]


def _encode(msg_type: MessageType, payload: bytes, with_crc: bool) -> bytes:
    if not with_crc:
        return _PLAIN_HEADERS[msg_type] + payload
    header = MAGIC + bytes((VERSION, CRC_HEADER_LEN, FLAG_CRC, msg_type))
    return header + crc32c(payload).to_bytes(4, "big") + payload


def _decode(data: BytesLike, expected_type: MessageType) -> bytes:
    """Check the envelope header of ``data`` and return its payload."""
    if not isinstance(data, BytesLike):
        raise EnvelopeError(f"not a Liftbridge envelope: expected bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) < MIN_HEADER_LEN:
        raise EnvelopeError(
            f"not a Liftbridge envelope: {len(data)} bytes, shorter than the {MIN_HEADER_LEN}-byte header"
        )
    if data[:4] != MAGIC:
        raise EnvelopeError(f"not a Liftbridge envelope: magic {data[:4]!r} != {MAGIC!r}")
    version, header_len, flags, msg_type = data[4:8]
    if version != VERSION:
        raise EnvelopeError(f"unsupported envelope protocol version {version} (supported: {VERSION})")
    if not MIN_HEADER_LEN <= header_len <= len(data):
        raise EnvelopeError(
            f"bad envelope header length {header_len}: must be {MIN_HEADER_LEN}..{len(data)} (the data's length)"
        )
    if msg_type != expected_type:
        raise EnvelopeError(f"envelope holds {_type_name(msg_type)}, expected {_type_name(expected_type)}")
    if flags & FLAG_CRC:
        _check_crc(data, header_len)
    return data[header_len:]


def _check_crc(data: bytes, header_len: int) -> None:
    if header_len != CRC_HEADER_LEN:
        raise EnvelopeError(f"envelope has the CRC flag but header length {header_len}, not {CRC_HEADER_LEN}")
    expected, actual = int.from_bytes(data[MIN_HEADER_LEN:CRC_HEADER_LEN], "big"), crc32c(data[CRC_HEADER_LEN:])
    if expected != actual:
        raise EnvelopeError(f"envelope CRC-32C mismatch: header says {expected:#010x}, payload has {actual:#010x}")


def _parse(target: api.Message | api.Ack, payload: bytes) -> None:
    try:
        target.ParseFromString(payload)
    except DecodeError as exc:
        name = type(target).__name__
        raise EnvelopeError(f"envelope payload is not a valid {name} protobuf: {exc}") from exc


def _type_name(msg_type: int) -> str:
    if msg_type in _TYPE_NAMES:
        return f"type {msg_type} ({_TYPE_NAMES[msg_type]})"
    if msg_type <= _LAST_INTERNAL_TYPE:
        return f"type {msg_type} (server-internal)"
    return f"type {msg_type} (unknown)"


def _as_bytes(name: str, value: object) -> bytes:
    if not isinstance(value, BytesLike):
        raise InvalidArgumentError(f"{name} must be bytes, not {type(value).__name__}: {value!r}")
    return bytes(value)


def _check_str(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{name} must be a str, not {type(value).__name__}: {value!r}")
    return value


def _check_headers(headers: Mapping[str, bytes] | None) -> dict[str, bytes]:
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise InvalidArgumentError(f"headers must be a mapping of str to bytes, not {type(headers).__name__}")
    checked = {}
    for name, value in headers.items():
        if not isinstance(name, str):
            raise InvalidArgumentError(f"header names must be str, not {type(name).__name__}: {name!r}")
        checked[name] = _as_bytes(f"header {name!r}", value)
    return checked


def _check_ack_policy(ack_policy: object) -> api.AckPolicy:
    if isinstance(ack_policy, bool) or not isinstance(ack_policy, int) or ack_policy not in _ACK_POLICIES:
        raise InvalidArgumentError(
            f"ack_policy must be one of {api.LEADER} (LEADER), {api.ALL} (ALL), {api.NONE} (NONE), not {ack_policy!r}"
        )
    return cast("api.AckPolicy", ack_policy)  # the generated enum's values are plain ints


def _check_expected_offset(offset: object) -> int:
    if isinstance(offset, bool) or not isinstance(offset, int) or not -1 <= offset <= _INT64_MAX:
        raise InvalidArgumentError(f"expected_offset must be -1 (next offset) or an offset >= 0, not {offset!r}")
    return offset
