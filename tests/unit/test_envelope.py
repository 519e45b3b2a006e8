"""The envelope codec: exact header bytes, CRC-32C, round trips, and refusal of malformed input."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable

import pytest

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client.errors import EnvelopeError
from liftbridge_provider.client.publish.envelope import (
    MAGIC,
    MessageType,
    crc32c,
    decode_ack,
    decode_message,
    encode_ack,
    encode_message,
)
from liftbridge_provider.core.errors import InvalidArgumentError

# An envelope header by hand: magic, version 0, header length, flags, type.
PUBLISH_HEADER = bytes([0xB9, 0x0E, 0x43, 0xB4, 0x00, 0x08, 0x00, 0x00])
PUBLISH_CRC_HEADER = bytes([0xB9, 0x0E, 0x43, 0xB4, 0x00, 0x0C, 0x01, 0x00])
ACK_HEADER = bytes([0xB9, 0x0E, 0x43, 0xB4, 0x00, 0x08, 0x00, 0x01])

# Ack{stream "s", offset 5, ackInbox "in", correlationId "c", ackPolicy ALL}
# as the pinned server (v1.9.0, server/protocol MarshalAck) writes it.
SERVER_ACK = bytes.fromhex("b90e43b4000800010a017320052a02696e3201633801")

Decoder = Callable[[bytes], object]
DECODERS = [pytest.param(decode_message, id="decode_message"), pytest.param(decode_ack, id="decode_ack")]


def bitwise_crc32c(data: bytes) -> int:
    """A slow, table-free CRC-32C to check the fast one against."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def publish(payload: bytes, *, header_len: int = 8, flags: int = 0, version: int = 0, msg_type: int = 0) -> bytes:
    return MAGIC + bytes([version, header_len, flags, msg_type]) + payload


# -- CRC-32C --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [(b"", 0), (b"123456789", 0xE3069283), (bytes(32), 0x8A9136AA), (b"\xff" * 32, 0x62A8AB43)],
)
def test_crc32c_known_vectors(data: bytes, expected: int) -> None:
    assert crc32c(data) == expected


def test_crc32c_matches_a_bitwise_implementation() -> None:
    rng = random.Random(32)
    for size in (1, 2, 7, 64, 1000):
        data = rng.randbytes(size)
        assert crc32c(data) == bitwise_crc32c(data)
    assert crc32c(bytearray(b"123456789")) == crc32c(memoryview(b"123456789")) == 0xE3069283


# -- header bytes ---------------------------------------------------------------------------------


def test_header_without_crc() -> None:
    data = encode_message(b"hello")
    assert data[:8] == b"\xb9\x0e\x43\xb4\x00\x08\x00\x00"
    assert api.Message.FromString(data[8:]).value == b"hello"


def test_header_with_crc_covers_the_payload_only() -> None:
    data = encode_message(b"hello", key=b"k", with_crc=True)
    assert data[:8] == b"\xb9\x0e\x43\xb4\x00\x0c\x01\x00"
    payload = data[12:]
    assert data[8:12] == crc32c(payload).to_bytes(4, "big")
    assert api.Message.FromString(payload).key == b"k"


def test_ack_header() -> None:
    assert encode_ack(api.Ack(stream="s"))[:8] == b"\xb9\x0e\x43\xb4\x00\x08\x00\x01"
    assert encode_ack(api.Ack(stream="s"), with_crc=True)[:8] == b"\xb9\x0e\x43\xb4\x00\x0c\x01\x01"


def test_message_types() -> None:
    assert (MessageType.PUBLISH, MessageType.ACK) == (0, 1)


# -- interop vectors, built by hand from the spec ---------------------------------------------------


def test_interop_publish_vector() -> None:
    # Message fields in field-number order: offset=1 (varint -1, ten bytes), key=2, value=3.
    payload = (
        b"\x08" + b"\xff" * 9 + b"\x01"  # offset -1: "any next offset"
        b"\x12\x01k"  # key "k"
        b"\x1a\x02hi"  # value "hi"
    )
    assert encode_message(b"hi", key=b"k") == PUBLISH_HEADER + payload
    crc = bitwise_crc32c(payload).to_bytes(4, "big")
    assert encode_message(b"hi", key=b"k", with_crc=True) == PUBLISH_CRC_HEADER + crc + payload
    assert crc == bytes.fromhex("e356b228")
    assert decode_message(PUBLISH_CRC_HEADER + crc + payload).value == b"hi"


def test_interop_ack_vector() -> None:
    payload = b"\x0a\x01s" + b"\x20\x05" + b"\x2a\x02in" + b"\x32\x01c" + b"\x38\x01"
    assert ACK_HEADER + payload == SERVER_ACK
    ack = decode_ack(SERVER_ACK)
    assert (ack.stream, ack.offset, ack.ackInbox, ack.correlationId, ack.ackPolicy) == ("s", 5, "in", "c", api.ALL)
    assert encode_ack(ack) == SERVER_ACK


# -- round trips ----------------------------------------------------------------------------------


@pytest.mark.parametrize("ack_policy", [api.LEADER, api.ALL, api.NONE])
@pytest.mark.parametrize("with_crc", [False, True])
def test_message_round_trip(ack_policy: int, with_crc: bool) -> None:
    data = encode_message(
        b"\x00value\xff",
        key=b"key",
        headers={"trace": b"abc", "empty": b""},
        ack_inbox="_INBOX.acks",
        correlation_id="corr-1",
        ack_policy=ack_policy,
        with_crc=with_crc,
    )
    msg = decode_message(data)
    assert msg.value == b"\x00value\xff"
    assert msg.key == b"key"
    assert dict(msg.headers) == {"trace": b"abc", "empty": b""}
    assert (msg.ackInbox, msg.correlationId, msg.ackPolicy) == ("_INBOX.acks", "corr-1", ack_policy)
    assert msg.offset == -1


def test_message_round_trip_defaults_and_bytes_likes() -> None:
    msg = decode_message(encode_message(bytearray(b"v"), key=memoryview(b"k"), expected_offset=42))
    assert (msg.value, msg.key, msg.offset, msg.ackPolicy, dict(msg.headers)) == (b"v", b"k", 42, api.LEADER, {})
    assert decode_message(encode_message(b"")).value == b""


@pytest.mark.parametrize("with_crc", [False, True])
def test_ack_round_trip(with_crc: bool) -> None:
    ack = api.Ack(
        stream="orders",
        partitionSubject="orders.1",
        msgSubject="orders",
        offset=17,
        ackInbox="_INBOX.x",
        correlationId="c-17",
        ackPolicy=api.ALL,
        receptionTimestamp=1_700_000_000_000_000_000,
        commitTimestamp=1_700_000_000_000_000_001,
        ackError=api.Ack.INCORRECT_OFFSET,
    )
    assert decode_ack(encode_ack(ack, with_crc=with_crc)) == ack


def test_empty_payload_decodes_to_defaults() -> None:
    assert decode_ack(ACK_HEADER) == api.Ack()
    assert decode_message(bytearray(PUBLISH_HEADER)) == api.Message()


def test_longer_header_is_skipped() -> None:
    payload = api.Message(value=b"v").SerializeToString()
    assert decode_message(publish(b"\xaa\xbb" + payload, header_len=10)).value == b"v"


def test_unknown_flag_bits_are_ignored() -> None:
    payload = api.Message(value=b"v").SerializeToString()
    assert decode_message(publish(payload, flags=0x02)).value == b"v"


# -- malformed input ------------------------------------------------------------------------------

GOOD_PAYLOAD = api.Message(value=b"value", key=b"key").SerializeToString()


@pytest.mark.parametrize("decode", DECODERS)
@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        pytest.param(b"", "0 bytes", id="empty"),
        pytest.param(MAGIC + b"\x00\x08\x00", "7 bytes", id="short"),
        pytest.param(b"LIFT\x00\x08\x00\x00", "magic b'LIFT' != b'\\xb9\\x0eC\\xb4'", id="LIFT"),
        pytest.param(b"\xb9\x0e\x43\xb5\x00\x08\x00\x00", "magic", id="magic-off-by-one"),
        pytest.param(b'{"value": "not an envelope"}', "magic", id="json"),
        pytest.param(publish(b"", version=1), "version 1", id="version"),
        pytest.param(publish(b"", header_len=7), "header length 7", id="header-len-short"),
        pytest.param(publish(b"", header_len=0), "header length 0", id="header-len-zero"),
        pytest.param(publish(b"abc", header_len=12), "header length 12", id="header-len-past-end"),
        pytest.param(publish(b"", header_len=255), "header length 255", id="header-len-255"),
    ],
)
def test_malformed_header(decode: Decoder, data: bytes, fragment: str) -> None:
    with pytest.raises(EnvelopeError, match="envelope") as info:
        decode(data)
    assert fragment in str(info.value)


def test_wrong_magic_message() -> None:
    with pytest.raises(EnvelopeError) as info:
        decode_message(b"LIFT\x00\x08\x00\x00rest")
    assert str(info.value) == "not a Liftbridge envelope: magic b'LIFT' != b'\\xb9\\x0eC\\xb4'"


def test_crc_mismatch() -> None:
    data = bytearray(encode_message(b"value", with_crc=True))
    data[-1] ^= 0x01
    with pytest.raises(EnvelopeError, match="CRC-32C mismatch"):
        decode_message(bytes(data))


def test_crc_itself_corrupted() -> None:
    data = bytearray(encode_ack(api.Ack(stream="s"), with_crc=True))
    data[9] ^= 0x80
    with pytest.raises(EnvelopeError, match="CRC-32C mismatch"):
        decode_ack(bytes(data))


@pytest.mark.parametrize("header_len", [8, 11, 16])
def test_crc_flag_needs_a_12_byte_header(header_len: int) -> None:
    crc = crc32c(GOOD_PAYLOAD).to_bytes(4, "big")
    data = publish(crc + b"\x00" * 4 + GOOD_PAYLOAD, header_len=header_len, flags=0x01)
    with pytest.raises(EnvelopeError, match=f"CRC flag but header length {header_len}"):
        decode_message(data)


def test_wrong_message_type() -> None:
    with pytest.raises(EnvelopeError, match=r"holds type 1 \(ACK\), expected type 0 \(PUBLISH\)"):
        decode_message(encode_ack(api.Ack(stream="s")))
    with pytest.raises(EnvelopeError, match=r"holds type 0 \(PUBLISH\), expected type 1 \(ACK\)"):
        decode_ack(encode_message(b"v"))
    with pytest.raises(EnvelopeError, match=r"type 2 \(server-internal\)"):
        decode_message(publish(b"", msg_type=2))
    with pytest.raises(EnvelopeError, match=r"type 200 \(unknown\)"):
        decode_ack(publish(b"", msg_type=200))


@pytest.mark.parametrize("decode", DECODERS)
@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(b"\xff\xff\xff", id="truncated-varint-tag"),
        pytest.param(b"\x1a\x10abc", id="length-past-end"),
        pytest.param(b"\x0f", id="bad-wire-type"),
        pytest.param(b"\x00\x01", id="field-zero"),
    ],
)
def test_garbage_protobuf_payload(decode: Decoder, payload: bytes) -> None:
    data = encode_ack(api.Ack()) if decode is decode_ack else encode_message(b"")
    with pytest.raises(EnvelopeError, match="not a valid"):
        decode(data[:8] + payload)


@pytest.mark.parametrize("decode", DECODERS)
def test_non_bytes_input(decode: Decoder) -> None:
    with pytest.raises(EnvelopeError, match="expected bytes, got str"):
        decode("not bytes")  # type: ignore[arg-type]


@pytest.mark.parametrize("decode", DECODERS)
def test_random_bytes_raise_only_envelope_error(decode: Decoder) -> None:
    rng = random.Random(20240601)
    msg_type = 1 if decode is decode_ack else 0
    for i in range(2000):
        body = rng.randbytes(rng.randrange(0, 64))
        if i % 2:  # half of them get a valid-looking header so the later checks are reached
            body = publish(body, header_len=rng.choice([8, 12, rng.randrange(256)]), flags=rng.randrange(4),
                           version=rng.choice([0, 0, 0, 1]), msg_type=rng.choice([msg_type, msg_type, 2]))  # fmt: skip
        with contextlib.suppress(EnvelopeError):  # anything else fails the test
            decode(body)


def test_truncations_of_a_good_envelope() -> None:
    data = encode_message(b"value", key=b"key", headers={"h": b"v"}, with_crc=True)
    for end in range(len(data)):
        with pytest.raises(EnvelopeError):
            decode_message(data[:end])


# -- bad input to the encoders --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        pytest.param({"value": "text"}, "value must be bytes, not str: 'text'", id="str-value"),
        pytest.param({"value": b"v", "key": 5}, "key must be bytes, not int: 5", id="int-key"),
        pytest.param({"value": b"v", "headers": {"h": 5}}, "header 'h' must be bytes, not int: 5", id="int-header"),
        pytest.param({"value": b"v", "headers": {"h": "s"}}, "header 'h' must be bytes, not str", id="str-header"),
        pytest.param({"value": b"v", "headers": {1: b"x"}}, "header names must be str, not int: 1", id="int-name"),
        pytest.param({"value": b"v", "headers": [("h", b"x")]}, "headers must be a mapping", id="list-headers"),
        pytest.param({"value": b"v", "ack_policy": 7}, "not 7", id="ack-policy-7"),
        pytest.param({"value": b"v", "ack_policy": -1}, "not -1", id="ack-policy-neg"),
        pytest.param({"value": b"v", "ack_policy": True}, "not True", id="ack-policy-bool"),
        pytest.param({"value": b"v", "ack_policy": 1.0}, "not 1.0", id="ack-policy-float"),
        pytest.param({"value": b"v", "ack_inbox": b"in"}, "ack_inbox must be a str", id="bytes-inbox"),
        pytest.param({"value": b"v", "correlation_id": 3}, "correlation_id must be a str", id="int-corr"),
        pytest.param({"value": b"v", "expected_offset": -2}, "not -2", id="offset-neg"),
        pytest.param({"value": b"v", "expected_offset": 2**63}, "not 9223372036854775808", id="offset-big"),
    ],
)
def test_encode_message_rejects_bad_input(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        encode_message(**kwargs)  # type: ignore[arg-type]
    assert fragment in str(info.value)
    assert isinstance(info.value, ValueError)


def test_ack_policy_error_names_the_allowed_values() -> None:
    with pytest.raises(InvalidArgumentError, match=r"one of 0 \(LEADER\), 1 \(ALL\), 2 \(NONE\), not 7"):
        encode_message(b"v", ack_policy=7)


def test_encode_ack_rejects_a_message() -> None:
    with pytest.raises(InvalidArgumentError, match=r"ack must be an api\.Ack, not Message"):
        encode_ack(api.Message())  # type: ignore[arg-type]
