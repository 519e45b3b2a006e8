"""Pure client logic: partitioners, request building, validation, retry policy, metadata parsing, errors."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client import (
    AckPolicy,
    ClientConfig,
    InvalidArgumentError,
    LiftbridgeError,
    NoSuchPartitionError,
    NoSuchStreamError,
    StartPosition,
    StopPosition,
    StreamOptions,
    TLSConfig,
    partition_by_key,
    partition_by_round_robin,
)
from liftbridge_provider.client import errors as errs
from liftbridge_provider.client import requests as build
from liftbridge_provider.client.metadata import EMPTY, metadata_from_response
from liftbridge_provider.client.options import parse_broker, split_brokers
from liftbridge_provider.client.reading import resubscribable
from liftbridge_provider.client.retry import MAX_BACKOFF, MIN_BACKOFF, Action, backoff_delay, classify
from liftbridge_provider.core import checks
from tests.unit.plan_driving import Rpc


def crc32_ieee_bitwise(data: bytes) -> int:
    """CRC-32 (IEEE 802.3, reflected 0xEDB88320), bit by bit: an independent reference for zlib.crc32."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0xEDB88320 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


# (key, CRC-32 IEEE as published for these strings, partitions, expected partition)
KNOWN_CRCS = [
    (b"", 0x00000000, 3, 0),
    (b"a", 0xE8B7BE43, 3, 0xE8B7BE43 % 3),
    (b"foo", 0x8C736521, 5, 0x8C736521 % 5),  # >= 2**31: must stay unsigned
    (b"123456789", 0xCBF43926, 7, 0xCBF43926 % 7),  # >= 2**31
    (b"hello", 0x3610A686, 4, 0x3610A686 % 4),
    (b"The quick brown fox jumps over the lazy dog", 0x414FA339, 10, 0x414FA339 % 10),
]


@pytest.mark.parametrize(("key", "crc", "partitions", "expected"), KNOWN_CRCS)
def test_key_partitioner_matches_crc32_ieee_table(key: bytes, crc: int, partitions: int, expected: int) -> None:
    assert crc32_ieee_bitwise(key) == crc
    assert partition_by_key("s", key, b"v", partitions) == expected


def test_key_partitioner_against_reference_for_many_keys() -> None:
    high = 0
    for i in range(2000):
        key = f"user-{i}".encode()
        crc = crc32_ieee_bitwise(key)
        high += crc >= 2**31
        for partitions in (1, 2, 3, 7, 16):
            assert partition_by_key("s", key, b"", partitions) == crc % partitions
    assert high > 500, "the table must include plenty of keys whose CRC is at or above 2**31"


def test_missing_key_goes_to_partition_zero() -> None:
    assert partition_by_key("s", None, b"v", 5) == 0


def test_round_robin_cycles_per_stream() -> None:
    rr = partition_by_round_robin()
    assert [rr("a", None, b"", 3) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert rr("b", None, b"", 2) == 0
    assert rr("a", None, b"", 3) == 1


def test_create_stream_request_translates_every_option() -> None:
    request = build.create_stream_request(
        "orders.in",
        "orders",
        group="g",
        partitions=3,
        replication_factor=build.ALL_BROKERS,
        retention_max_bytes=1024,
        retention_max_messages=10,
        retention_max_age=timedelta(hours=1),
        cleaner_interval=1.5,
        segment_max_bytes=4096,
        segment_max_age=timedelta(minutes=2),
        compact_enabled=True,
        compact_max_goroutines=4,
        auto_pause_time=30,
        auto_pause_disable_if_subscribers=False,
        min_isr=2,
        optimistic_concurrency_control=True,
        encryption=False,
    )
    assert (request.subject, request.name, request.group) == ("orders.in", "orders", "g")
    assert (request.partitions, request.replicationFactor) == (3, -1)
    assert request.retentionMaxBytes.value == 1024
    assert request.retentionMaxMessages.value == 10
    assert request.retentionMaxAge.value == 3_600_000
    assert request.cleanerInterval.value == 1500
    assert request.segmentMaxBytes.value == 4096
    assert request.segmentMaxAge.value == 120_000
    assert request.compactEnabled.value is True
    assert request.compactMaxGoroutines.value == 4
    assert request.autoPauseTime.value == 30_000
    assert request.HasField("autoPauseDisableIfSubscribers")
    assert request.autoPauseDisableIfSubscribers.value is False
    assert request.minIsr.value == 2
    assert request.optimisticConcurrencyControl.value is True
    assert request.HasField("encryption")


def test_create_stream_request_leaves_unset_options_to_the_server() -> None:
    request = build.create_stream_request("s", "s")
    for field in ("retentionMaxAge", "compactEnabled", "minIsr", "encryption", "optimisticConcurrencyControl"):
        assert not request.HasField(field)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"subject": "a b", "name": "n"}, "invalid subject 'a b'"),
        ({"subject": "a.*", "name": "n"}, "invalid subject 'a.*'"),
        ({"subject": "a..b", "name": "n"}, "invalid subject 'a..b'"),
        ({"subject": "s", "name": ""}, "invalid stream name ''"),
        ({"subject": "s", "name": "a/b"}, "invalid stream name 'a/b'"),
        ({"subject": "s", "name": "__cursors"}, "cannot create stream '__cursors': it is reserved"),
        ({"subject": "s", "name": "n", "partitions": 0}, "partitions must be a whole number >= 1, got 0"),
        ({"subject": "s", "name": "n", "replication_factor": 0}, "replication_factor (or -1 for every broker)"),
        ({"subject": "s", "name": "n", "retention_max_age": -1}, "retention_max_age must not be negative"),
        ({"subject": "s", "name": "n", "retention_max_age": "1h"}, "retention_max_age must be a timedelta"),
        ({"subject": "s", "name": "n", "min_isr": 0}, "min_isr must be a whole number >= 1"),
        ({"subject": "s", "name": "n", "compact_enabled": "yes"}, "compact_enabled must be True or False"),
        ({"subject": "s", "name": "n", "retention_max_bytes": -5}, "retention_max_bytes must be a whole number >= 0"),
        # durations the server cannot hold: its int64 of nanoseconds wraps, and a retention of 585 years
        # became 0.45 ms and emptied the stream; a positive one that rounds to 0 ms means "no limit" there
        (
            {"subject": "s", "name": "n", "retention_max_age": 18446744073.710},
            "retention_max_age must be at most 9223372036.854 seconds",
        ),
        ({"subject": "s", "name": "n", "segment_max_age": timedelta.max}, "segment_max_age must be at most"),
        ({"subject": "s", "name": "n", "auto_pause_time": math.inf}, "auto_pause_time must be at most"),
        ({"subject": "s", "name": "n", "cleaner_interval": 1e300}, "cleaner_interval must be at most"),
        ({"subject": "s", "name": "n", "retention_max_age": math.nan}, "retention_max_age must not be negative"),
        ({"subject": "s", "name": "n", "retention_max_age": 0.0004}, "must be 0 or at least 0.001 seconds (1 ms)"),
        # numbers above the int32 and int64 fields of the request (protobuf raised a bare ValueError)
        ({"subject": "s", "name": "n", "partitions": 2**31}, "partitions must be at most 4096, got 2147483648"),
        ({"subject": "s", "name": "n", "partitions": 4097}, "partitions must be at most 4096, got 4097"),
        ({"subject": "s", "name": "n", "replication_factor": 2**31}, "replication_factor (or -1 for every broker)"),
        ({"subject": "s", "name": "n", "replication_factor": -1.0}, "replication_factor (or -1 for every broker)"),
        ({"subject": "s", "name": "n", "min_isr": 2**31}, "min_isr must be at most 2147483647"),
        ({"subject": "s", "name": "n", "retention_max_bytes": 2**63}, "retention_max_bytes must be at most"),
        ({"subject": "s", "name": "n", "compact_max_goroutines": 2**31}, "compact_max_goroutines must be at most"),
        # a min ISR no replica set can reach: every ack_policy="all" publish would time out
        (
            {"subject": "s", "name": "n", "replication_factor": 1, "min_isr": 3},
            "min_isr 3 is more than replication_factor 1",
        ),
        ({"subject": "s", "name": "n", "options": {"min_isr": 1}}, "options must be a StreamOptions"),
    ],
)
def test_create_stream_request_refuses_bad_input(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgumentError) as raised:
        build.create_stream_request(**kwargs)
    assert message in str(raised.value)
    assert isinstance(raised.value, ValueError)


def test_stream_options_are_one_value_given_whole_or_as_keywords() -> None:
    """StreamOptions and keyword arguments make the same request; keywords override the value's fields."""
    options = StreamOptions(group="g", retention_max_age=timedelta(hours=1), min_isr=2)
    whole = build.create_stream_request("s", "s", replication_factor=3, options=options)
    keywords = build.create_stream_request("s", "s", replication_factor=3, group="g", retention_max_age=3600, min_isr=2)
    assert whole == keywords
    assert build.create_stream_request("s", "s", replication_factor=3, options=options, min_isr=3).minIsr.value == 3
    assert options.given() == {"group": "g", "retention_max_age": timedelta(hours=1), "min_isr": 2}


def test_an_unknown_stream_option_is_refused_naming_it_and_the_allowed_ones() -> None:
    with pytest.raises(InvalidArgumentError, match=r"unknown stream options \['retention_max_byte'\]; allowed: "):
        build.create_stream_request("s", "s", retention_max_byte=5)
    assert "retention_max_bytes" in StreamOptions.names()


def test_publish_request_defaults_expected_offset_to_next() -> None:
    request = build.publish_request("s", b"v", partition=2, key=b"k", headers={"h": b"x"})
    assert request.expectedOffset == -1
    assert (request.partition, request.key, dict(request.headers)) == (2, b"k", {"h": b"x"})
    assert request.ackPolicy == api.LEADER


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"value": "text"}, "value must be bytes, got str"),
        ({"value": b"v", "key": 5}, "key must be bytes, got int"),
        ({"value": b"v", "headers": {"h": "x"}}, "header 'h' must be bytes"),
        ({"value": b"v", "headers": {1: b"x"}}, "header names must be str"),
        ({"value": b"v", "expected_offset": -2}, "expected_offset must be a whole number >= 0, got -2"),
    ],
)
def test_publish_request_refuses_bad_input(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        build.publish_request("s", partition=0, **kwargs)


@pytest.mark.parametrize(
    ("value", "expected"), [("all", AckPolicy.ALL), ("LEADER", AckPolicy.LEADER), (2, AckPolicy.NONE)]
)
def test_ack_policy_parse(value: Any, expected: AckPolicy) -> None:
    assert AckPolicy.parse(value) is expected


@pytest.mark.parametrize("value", ["most", 7, True, None])
def test_ack_policy_parse_refuses_unknown(value: Any) -> None:
    with pytest.raises(InvalidArgumentError, match=r"unknown ack policy .*allowed: leader, all, none"):
        AckPolicy.parse(value)


def test_positions() -> None:
    when = datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=UTC)
    assert StartPosition.at_time(when).timestamp == int(when.timestamp()) * 1_000_000_000 + 6_000_000
    assert StartPosition.at_offset(5).offset == 5
    assert StopPosition.at_offset(9).kind == api.STOP_OFFSET
    delta = StartPosition.time_delta(timedelta(seconds=10))
    assert abs(delta.timestamp / 1e9 - (datetime.now(UTC).timestamp() - 10)) < 5
    with pytest.raises(InvalidArgumentError, match="start offset must be a whole number >= 0, got -1"):
        StartPosition.at_offset(-1)
    with pytest.raises(InvalidArgumentError, match="timezone-aware"):
        StopPosition.at_time(datetime(2026, 1, 1))


def test_subscribe_request_refuses_reversed_offsets() -> None:
    with pytest.raises(InvalidArgumentError, match="stop offset 3 is before start offset 5"):
        build.subscribe_request("s", 0, StartPosition.at_offset(5), StopPosition.at_offset(3))


def test_cursor_partition_uses_commas() -> None:
    key = b"c1,orders,2"
    assert build.cursor_partition("c1", "orders", 2, 7) == crc32_ieee_bitwise(key) % 7
    with pytest.raises(InvalidArgumentError, match="cursor_id must be a non-empty string without commas"):
        checks.check_cursor_id("a,b")


@pytest.mark.parametrize(
    ("address", "expected"),
    [("h", ("h", 9292)), ("h:1", ("h", 1)), ("[::1]:5", ("::1", 5)), (" 10.0.0.1:80 ", ("10.0.0.1", 80))],
)
def test_parse_broker(address: str, expected: tuple[str, int]) -> None:
    assert parse_broker(address) == expected


@pytest.mark.parametrize(
    "address",
    ["lb_1.internal-zone.example:9292", "xn--bcher-kva.example:1", "LB-2", "[fe80::1]:9292", "127.0.0.1"],
)
def test_parse_broker_takes_host_names_addresses_and_underscores(address: str) -> None:
    """Names as DNS and container networks use them (underscores included), punycode, IPv4 and IPv6."""
    assert parse_broker(address)[0]


@pytest.mark.parametrize(
    "address",
    # A NUL reached gRPC as a target cut short at the NUL ("Failed to create channel to ''"); the others
    # went to the resolver and came back, after the whole request timeout, as "Domain name not found" or
    # "Misformatted domain name": none of them can name a broker.
    ["h:0", "h:70000", "a b:1", "", "h:x", "h\x00:1", "\x00", "a*:1", "é:9292", "h?x", "user@h:1", "h#1", "h\tx"],
)
def test_parse_broker_refuses(address: str) -> None:
    with pytest.raises(InvalidArgumentError, match="invalid broker address") as raised:
        parse_broker(address)
    assert "letters, digits" in str(raised.value), "the message says what a host may be"


def test_split_brokers_and_config_validation() -> None:
    assert split_brokers("a:1, b") == ("a:1", "b:9292")
    assert ClientConfig(brokers=("x",)).brokers == ("x:9292",)
    with pytest.raises(InvalidArgumentError, match="at least one broker"):
        ClientConfig(brokers=())
    with pytest.raises(InvalidArgumentError, match="request_timeout must be a number of seconds > 0, got -1"):
        ClientConfig(brokers=("x",), request_timeout=-1)
    with pytest.raises(InvalidArgumentError, match="max_conns_per_broker must be a whole number >= 1, got 0"):
        ClientConfig(brokers=("x",), max_conns_per_broker=0)
    with pytest.raises(InvalidArgumentError, match="both a client certificate and a client key"):
        TLSConfig(cert="c.pem")


@pytest.mark.parametrize(
    ("code", "details", "leader", "action"),
    [
        (grpc.StatusCode.UNAVAILABLE, "connection refused", False, Action.NEXT_BROKER),
        (grpc.StatusCode.UNAVAILABLE, "connection refused", True, Action.REFRESH),
        (grpc.StatusCode.UNAVAILABLE, "Tls handshake failed (TSI_PROTOCOL_FAILURE)", False, Action.FAIL),
        (grpc.StatusCode.INTERNAL, "No known metadata leader", False, Action.BACK_OFF),
        (grpc.StatusCode.INTERNAL, "nats: no responders available for request", False, Action.BACK_OFF),
        (grpc.StatusCode.INTERNAL, "nats: no responders available for request", True, Action.BACK_OFF),
        (grpc.StatusCode.INTERNAL, "failed to append", False, Action.FAIL),
        (grpc.StatusCode.FAILED_PRECONDITION, "Server not partition leader", True, Action.REFRESH),
        (grpc.StatusCode.FAILED_PRECONDITION, "Server not partition leader", False, Action.FAIL),
        (grpc.StatusCode.NOT_FOUND, "No such partition", True, Action.FAIL),
        (grpc.StatusCode.ALREADY_EXISTS, "stream exists", False, Action.FAIL),
    ],
)
def test_retry_classification(code: grpc.StatusCode, details: str, leader: bool, action: Action) -> None:
    assert classify(Rpc(code, details), leader_directed=leader) is action


def test_backoff_is_jittered_between_10_and_500_ms() -> None:
    delays = [backoff_delay(attempt) for attempt in range(12) for _ in range(50)]
    assert min(delays) >= MIN_BACKOFF
    assert max(delays) <= MAX_BACKOFF
    assert len({round(d, 6) for d in delays}) > 100, "delays must be jittered"
    assert max(backoff_delay(0) for _ in range(50)) <= 0.010 + 1e-9


@pytest.mark.parametrize(
    ("code", "details", "kind"),
    [
        (grpc.StatusCode.ALREADY_EXISTS, "stream already exists", errs.StreamExistsError),
        (grpc.StatusCode.NOT_FOUND, "No such partition", NoSuchPartitionError),
        (grpc.StatusCode.NOT_FOUND, "no such stream: x", errs.NoSuchStreamError),
        (grpc.StatusCode.FAILED_PRECONDITION, "readonly partition: 0", errs.ReadonlyPartitionError),
        (grpc.StatusCode.FAILED_PRECONDITION, "log closed", errs.PartitionPausedError),
        (grpc.StatusCode.FAILED_PRECONDITION, "Server not partition leader", errs.NotLeaderError),
        (grpc.StatusCode.INVALID_ARGUMENT, "message exceeds max replication size", errs.MessageTooLargeError),
        (grpc.StatusCode.UNKNOWN, "incorrect expected offset", errs.IncorrectOffsetError),
        (grpc.StatusCode.UNKNOWN, "The client is not authorized to call X", errs.PermissionDeniedError),
        (grpc.StatusCode.UNAVAILABLE, "down", errs.UnavailableError),
        (grpc.StatusCode.DEADLINE_EXCEEDED, "late", errs.LiftbridgeTimeoutError),
        (grpc.StatusCode.INTERNAL, "context deadline exceeded", errs.LiftbridgeTimeoutError),  # the server's own wait
        (grpc.StatusCode.INTERNAL, "Failed to pause stream: raft operation timed out", errs.LiftbridgeTimeoutError),
        (grpc.StatusCode.INTERNAL, "No known metadata leader", errs.NoMetadataLeaderError),
    ],
)
def test_error_mapping(code: grpc.StatusCode, details: str, kind: type[LiftbridgeError]) -> None:
    error = errs.error_from_rpc(Rpc(code, details), stream="s", partition=1)
    assert type(error) is kind
    assert str(error) == f"{details} (stream='s', partition=1, grpc={code.name})"


def metadata_response(hw: int = 4) -> api.FetchMetadataResponse:
    response = api.FetchMetadataResponse()
    response.brokers.add(id="b1", host="127.0.0.1", port=1)
    stream = response.streamMetadata.add(name="s", subject="subj")
    stream.partitions[0].CopyFrom(
        api.PartitionMetadata(id=0, leader="b1", replicas=["b1"], isr=["b1"], highWatermark=hw)
    )
    response.streamMetadata.add(name="gone", error=api.StreamMetadata.UNKNOWN_STREAM)
    return response


def test_metadata_snapshot_from_response() -> None:
    snapshot = metadata_from_response(metadata_response(), EMPTY)
    assert snapshot.partition("s", 0).high_watermark == 4
    leader = snapshot.leader("s", 0)
    assert leader is not None
    assert leader.address == "127.0.0.1:1"
    assert "gone" not in snapshot.streams
    with pytest.raises(NoSuchStreamError):
        snapshot.stream("gone")
    with pytest.raises(NoSuchPartitionError, match="no partition 3; stream 's' has partitions 0-0"):
        snapshot.partition("s", 3)
    with pytest.raises(TypeError):
        snapshot.streams["x"] = snapshot.streams["s"]  # type: ignore[index]


def test_partial_metadata_keeps_other_streams() -> None:
    first = metadata_from_response(metadata_response(hw=4), EMPTY)
    other = api.FetchMetadataResponse()
    other.brokers.add(id="b1", host="127.0.0.1", port=1)
    other.streamMetadata.add(name="t", subject="t")
    merged = metadata_from_response(other, first, ["t"])
    assert set(merged.streams) == {"s", "t"}
    assert set(metadata_from_response(other, first).streams) == {"t"}


def test_a_leader_left_out_of_a_cached_broker_list_keeps_its_last_address() -> None:
    """Chaos seed 82: a server answered from its 2-minute broker cache without a broker that had restarted
    meanwhile; that broker still leads partitions, so its last known address is kept. A broker no partition
    names any more is dropped."""
    before = api.FetchMetadataResponse()
    for index in (1, 2, 3):
        before.brokers.add(id=f"b{index}", host="127.0.0.1", port=index)
    first = metadata_from_response(before, EMPTY)
    stale = api.FetchMetadataResponse()
    stale.brokers.add(id="b1", host="127.0.0.1", port=1)
    stream = stale.streamMetadata.add(name="s", subject="subj")
    stream.partitions[0].CopyFrom(api.PartitionMetadata(id=0, leader="b2", replicas=["b1", "b2"], isr=["b1", "b2"]))
    merged = metadata_from_response(stale, first)
    leader = merged.leader("s", 0)
    assert leader is not None
    assert leader.address == "127.0.0.1:2"
    assert set(merged.brokers) == {"b1", "b2"}


@pytest.mark.parametrize(
    ("code", "details", "again"),
    [
        # Found by the chaos harness (seed 27): the server's reader met a segment the cleaner had just closed
        # (compaction replaces segments under readers); read again from the next offset, as after a loss.
        (grpc.StatusCode.UNKNOWN, "failed to reinitialize reader: segment has been closed", True),
        (grpc.StatusCode.INTERNAL, "segment has been closed", True),
        (grpc.StatusCode.UNAVAILABLE, "Socket closed", True),
        # A paused partition resumed by the read while the metadata leader is being elected, or before the new
        # one listens for forwarded requests: the same "leader changing" answers a unary call retries.
        (grpc.StatusCode.INTERNAL, "failed to resume stream: no known metadata leader", True),
        (grpc.StatusCode.INTERNAL, "failed to resume stream: nats: no responders available for request", True),
        (grpc.StatusCode.UNKNOWN, "some other server failure", False),
        (grpc.StatusCode.NOT_FOUND, "no such stream", False),
    ],
)
def test_which_ends_of_a_subscription_are_read_again_elsewhere(
    code: grpc.StatusCode, details: str, again: bool
) -> None:
    assert resubscribable(Rpc(code, details)) is again


LONE_SURROGATE = "h\udc80"  # what bytes.decode(errors="surrogateescape") leaves for a byte that is not UTF-8


@pytest.mark.parametrize(
    "check",
    [
        lambda: checks.check_stream_name(LONE_SURROGATE),
        lambda: checks.check_subject(LONE_SURROGATE),
        lambda: checks.check_group(LONE_SURROGATE),
        lambda: checks.check_headers({LONE_SURROGATE: b"v"}),
        lambda: checks.check_cursor_id(LONE_SURROGATE),
    ],
    ids=["stream name", "subject", "group", "header name", "cursor id"],
)
def test_text_that_is_not_utf8_is_refused_by_name(check: Any) -> None:
    """A lone surrogate raised a bare UnicodeEncodeError from deep in the publish or request building, with no
    value or message index named (nothing was sent, but the caller could not tell which input was bad)."""
    with pytest.raises(InvalidArgumentError, match=r"not UTF-8 text"):
        check()
