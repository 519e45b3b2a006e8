"""Pure validators: every bad input is refused before anything is sent.

Stream names, subjects and groups that crash the v1.9.0 server. Bad client
input of every other kind: broker lists, client options, partitioner names,
timeouts, batches, cursors on missing streams, messages over the server's size
limit. Cursors disabled on the server.
The rules and their sources in the server code are listed in docs/client.md.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any, cast

import grpc
import pytest

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client import (
    AsyncLiftbridgeClient,
    ClientConfig,
    InvalidArgumentError,
    LiftbridgeClient,
    NoSuchPartitionError,
    StartPosition,
    StopPosition,
    TLSConfig,
    partition_by_key,
    partitioners,
)
from liftbridge_provider.client import errors as errs
from liftbridge_provider.client import requests as build
from liftbridge_provider.client.metadata import Metadata, StreamInfo
from liftbridge_provider.client.publish import publisher
from liftbridge_provider.core import checks
from tests.unit.plan_driving import Rpc

# -- stream names, subjects, groups that crash the v1.9.0 server ---------------------------------


@pytest.mark.parametrize(
    "name",
    ["orders", "a.b", "a" * 255, "é" * 127, "orders-2024_01", "__cursors"],
    ids=["plain", "dotted", "255-bytes", "254-bytes-utf8", "punctuation", "reserved-name-can-be-looked-up"],
)
def test_stream_names_the_server_can_hold_pass(name: str) -> None:
    assert checks.check_stream_name(name) == name


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("a" * 256, "256 bytes; at most 255"),
        ("é" * 128, "256 bytes; at most 255"),  # 128 characters, but the file system counts bytes
        (".a", "empty token"),
        ("a.", "empty token"),
        ("a..b", "empty token"),
        (".", "empty token"),
        ("..", "empty token"),
        ("a.>", "wildcard"),
        ("a.*", "wildcard"),
        ("*", "wildcard"),
        ("x>y", "wildcard"),
        ("a b", "white space"),
        ("a\tb", "white space"),
        ("a\x00b", "control character"),
        ("a/b", "slash"),
        ("a\\b", "slash"),
        ("", "empty"),
        (None, "must be a string"),
        (5, "must be a string"),
    ],
)
def test_stream_names_that_crash_or_confuse_the_server_are_refused(name: object, reason: str) -> None:
    with pytest.raises(InvalidArgumentError) as raised:
        checks.check_stream_name(name)
    assert f"invalid stream name {name!r}"[:40] in str(raised.value)
    assert reason in str(raised.value)


MAX_SUBJECT_LINE = 4096 - 64  # NATS max_control_line (default) less what NATS adds to the line


@pytest.mark.parametrize("subject", ["events", "events.orders.eu", "x" * MAX_SUBJECT_LINE])
def test_subjects_nats_accepts_pass(subject: str) -> None:
    assert checks.check_subject(subject) == subject


@pytest.mark.parametrize(
    ("subject", "reason"),
    [
        ("*", "wildcard"),
        ("events.>", "wildcard"),
        ("events.*.eu", "wildcard"),
        ("a..b", "empty token"),
        (".a", "empty token"),
        ("", "empty"),
        ("a b", "white space"),
        ("a\rb", "white space"),
        ("x" * (MAX_SUBJECT_LINE + 1), f"at most {MAX_SUBJECT_LINE} bytes"),
        (None, "must be a string"),
    ],
)
def test_subjects_that_crash_the_server_are_refused(subject: object, reason: str) -> None:
    with pytest.raises(InvalidArgumentError) as raised:
        checks.check_subject(subject)
    assert "invalid subject" in str(raised.value)
    assert reason in str(raised.value)


def test_the_subject_limit_is_the_nats_control_line_less_a_reserve() -> None:
    assert checks.MAX_SUBJECT_LINE_BYTES == MAX_SUBJECT_LINE


@pytest.mark.parametrize("group", [None, "", "workers", "g.*", "a-b_c"])
def test_groups_nats_accepts_as_queue_names_pass(group: str | None) -> None:
    request = build.create_stream_request("s", "n", group=group)
    assert request.group == (group or "")


@pytest.mark.parametrize(
    ("group", "reason"),
    [
        ("bad group", "white space"),
        ("tab\there", "white space"),
        ("line\nbreak", "white space"),
        ("bell\x07", "control character"),
        (5, "must be a string"),
        (b"g", "must be a string"),
    ],
)
def test_groups_that_nats_refuses_as_queue_names_are_refused(group: object, reason: str) -> None:
    with pytest.raises(InvalidArgumentError) as raised:
        build.create_stream_request("s", "n", group=group)
    assert f"invalid group {group!r}" in str(raised.value)
    assert reason in str(raised.value)


@pytest.mark.parametrize(
    ("subject", "partitions", "group", "fits"),
    [
        ("s" * 4032, 1, None, True),
        ("s" * 4033, 1, None, False),
        ("s" * 4030, 2, None, True),  # the subscription of partition 1 is "<subject>.1"
        ("s" * 4031, 2, None, False),
        ("s" * 4000, 100, "g" * 28, True),  # ".99" + space + group
        ("s" * 4000, 100, "g" * 29, False),
        ("s", 1, "g" * 5000, False),
    ],
)
def test_subject_and_group_must_fit_the_nats_control_line(
    subject: str, partitions: int, group: str | None, fits: bool
) -> None:
    def build_it() -> api.CreateStreamRequest:
        return build.create_stream_request(subject, "n", partitions=partitions, group=group)

    if fits:
        assert build_it().subject == subject
    else:
        with pytest.raises(InvalidArgumentError, match=r"at most 4032 bytes"):
            build_it()


# -- client options --------------------------------------------------------------------------------


@pytest.mark.parametrize("brokers", [None, 9292, b"127.0.0.1:9292", 1.5, {"host": 1}])
@pytest.mark.parametrize("client_class", [LiftbridgeClient, AsyncLiftbridgeClient])
def test_broker_lists_that_are_not_addresses_are_refused(brokers: object, client_class: type) -> None:
    with pytest.raises(InvalidArgumentError, match=r"brokers must be 'host:port'"):
        client_class(brokers)


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("read_isr_replica", "yes", "read_isr_replica must be True or False, got 'yes'"),
        ("read_isr_replica", 1, "read_isr_replica must be True or False, got 1"),
        ("tls", "insecure", "tls must be a TLSConfig or None, got 'insecure'"),
        ("tls", True, "tls must be a TLSConfig or None, got True"),
        ("address_resolver", "127.0.0.1", "address_resolver must be a callable"),
        ("grpc_options", [("grpc.x",)], "grpc_options must be (name, value) pairs"),
        ("grpc_options", "grpc.x=1", "grpc_options must be (name, value) pairs"),
        ("request_timeout", float("nan"), "request_timeout must be a number of seconds > 0, got nan"),
        ("ack_wait", True, "ack_wait must be a number of seconds > 0, got True"),
        # gRPC keeps its message size limits in a C int: 2**40 escaped as a bare OverflowError on the first call.
        ("max_message_bytes", 2**40, "max_message_bytes must be at most 2147483647, got 1099511627776"),
        ("max_message_bytes", 0, "max_message_bytes must be a whole number >= 1, got 0"),
        ("max_conns_per_broker", 1.5, "max_conns_per_broker must be a whole number >= 1, got 1.5"),
    ],
)
def test_client_options_of_the_wrong_kind_are_refused(option: str, value: object, message: str) -> None:
    with pytest.raises(InvalidArgumentError) as raised:
        ClientConfig(brokers=("127.0.0.1:9292",), **{option: value})  # type: ignore[arg-type]
    assert message in str(raised.value)


@pytest.mark.parametrize(
    ("position", "message"),
    [
        (lambda: StartPosition.at_time(datetime(9999, 1, 1, tzinfo=UTC)), "start time must be from 1970-01-01"),
        (lambda: StopPosition.at_time(datetime(1, 1, 1, tzinfo=UTC)), "stop time must be from 1970-01-01"),
        (lambda: StartPosition.at_time(datetime(1969, 12, 31, tzinfo=UTC)), r"got 1969-12-31T00:00:00\+00:00"),
        (lambda: StartPosition.time_delta(timedelta(days=999_999_999)), "start time delta must be a timedelta from 0"),
        (lambda: StartPosition.time_delta(timedelta(seconds=-1)), "start time delta must be a timedelta from 0"),
    ],
    ids=["start in 9999", "stop in year 1", "before the epoch", "huge delta", "negative delta"],
)
def test_times_the_server_cannot_hold_are_refused_when_the_position_is_built(
    position: Callable[[], object], message: str
) -> None:
    """The server keeps times as int64 nanoseconds since the epoch: a time outside 1970-01-01..2262-04-11 escaped
    as protobuf's bare ValueError "Value out of range" when sent, a huge delta as OverflowError."""
    with pytest.raises(InvalidArgumentError, match=message):
        position()


def test_the_last_time_the_server_can_hold_passes() -> None:
    latest = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=checks.INT64_MAX // 1000)
    assert StartPosition.at_time(latest).timestamp == checks.INT64_MAX // 1000 * 1000
    assert StopPosition.at_time(datetime(1970, 1, 1, tzinfo=UTC)).timestamp == 0


def test_good_client_options_pass() -> None:
    config = ClientConfig(
        brokers="a:1,b",  # type: ignore[arg-type]  # normalised
        read_isr_replica=True,
        tls=TLSConfig(server_name="x"),
        address_resolver=lambda host, port: f"{host}:{port}",
        grpc_options=(("grpc.enable_retries", 0),),
    )
    assert config.brokers == ("a:1", "b:9292")
    assert config.grpc_options == (("grpc.enable_retries", 0),)


# -- timeouts ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "expected"), [(None, None), (1, 1.0), (0.25, 0.25), (3600, 3600.0)])
def test_timeouts_pass(value: float | None, expected: float | None) -> None:
    assert checks.check_timeout("timeout", value) == expected


@pytest.mark.parametrize("value", [-1, -0.5, 0, math.nan, math.inf, -math.inf, True, False, "5", [1]])
def test_bad_timeouts_are_refused(value: object) -> None:
    with pytest.raises(InvalidArgumentError) as raised:
        checks.check_timeout("ack_wait", value)
    assert str(raised.value) == f"ack_wait must be a number of seconds > 0 (or None for the default), got {value!r}"


@pytest.mark.parametrize("value", [1e9 + 1, 1e12, 1e300])
def test_timeouts_beyond_what_grpc_can_hold_are_refused(value: float) -> None:
    """A request_timeout of 1e12 was accepted, and every call then failed at once with "no answer within
    1e+12s" (gRPC's deadline overflows); timeouts and waits now go up to 1e9 seconds (about 31 years)."""
    with pytest.raises(InvalidArgumentError, match=r"ack_wait must be at most 1e\+09 seconds"):
        checks.check_timeout("ack_wait", value)
    with pytest.raises(InvalidArgumentError, match=r"request_timeout must be at most 1e\+09 seconds"):
        ClientConfig(brokers=("a",), request_timeout=value)
    assert checks.check_timeout("ack_wait", 1e9) == 1e9


# -- flags, partitions, batches -------------------------------------------------------------------


@pytest.mark.parametrize("value", ["yes", 1, None, "true"])
def test_flags_must_be_booleans(value: object) -> None:
    with pytest.raises(InvalidArgumentError, match=r"resume must be True or False"):
        checks.check_flag(value, "resume")
    assert checks.check_flag(True, "resume") is True


@pytest.mark.parametrize(
    ("partitions", "expected"),
    [(None, None), ([], []), ((), []), ([1, 0], [1, 0]), (range(2), [0, 1])],
)
def test_partition_selection(partitions: Any, expected: list[int] | None) -> None:
    assert checks.check_partition_selection(partitions, 2, "s") == expected


def test_a_missing_partition_is_bad_input_too() -> None:
    """Code that catches bad input (the ingest job's exit status 2, an operator's no-retry failure) keeps
    catching a partition number the stream does not have, now that every call raises NoSuchPartitionError."""
    assert issubclass(NoSuchPartitionError, InvalidArgumentError)
    with pytest.raises(InvalidArgumentError, match="no partition 3: stream 's' has partitions 0-1"):
        checks.check_partition(3, 2, "s")


@pytest.mark.parametrize(
    ("partitions", "error", "message"),
    [
        (0, InvalidArgumentError, "partitions must be a list of partition numbers (or None for all), got 0"),
        ("01", InvalidArgumentError, "partitions must be a list of partition numbers (or None for all), got '01'"),
        ([2], NoSuchPartitionError, "no partition 2: stream 's' has partitions 0-1"),
        ([-1], InvalidArgumentError, "partition must be a whole number >= 0, got -1"),
        ([True], InvalidArgumentError, "partition must be a whole number >= 0, got True"),
    ],
)
def test_bad_partition_selections_are_refused(partitions: object, error: type[Exception], message: str) -> None:
    """A malformed selection is bad input; a well-formed one naming a partition the stream lacks is the error
    the server gives for a missing partition."""
    with pytest.raises(error) as raised:
        checks.check_partition_selection(partitions, 2, "s")
    assert message in str(raised.value)


@pytest.mark.parametrize("messages", [None, b"abc", "abc", 5, bytearray(b"x")])
def test_a_batch_must_be_an_iterable_of_messages(messages: object) -> None:
    with pytest.raises(InvalidArgumentError) as raised:
        checks.check_batch_messages(messages)
    assert "messages must be an iterable of bytes or PublishMessage" in str(raised.value)
    assert "nothing was sent" in str(raised.value)


def test_batches_of_any_iterable_pass() -> None:
    assert checks.check_batch_messages([b"a"]) == [b"a"]
    generated = (b"x" for _ in range(2))
    assert checks.check_batch_messages(generated) is generated


@pytest.mark.parametrize("streams", ["orders", b"orders", 5])
def test_stream_lists_must_not_be_a_single_string(streams: object) -> None:
    with pytest.raises(InvalidArgumentError, match=r"streams must be a list of stream names"):
        checks.check_stream_names(streams)
    assert checks.check_stream_names(("a", "b")) == ["a", "b"]


# -- partitioners -----------------------------------------------------------------------------------


def test_partitioner_names_resolve() -> None:
    assert partitioners.resolve_partitioner(None) is None
    assert partitioners.resolve_partitioner("key") is partition_by_key
    round_robin = partitioners.resolve_partitioner("round_robin")
    assert round_robin is not None
    assert [round_robin("s", None, b"", 3) for _ in range(4)] == [0, 1, 2, 0]

    def custom(stream: str, key: bytes | None, value: bytes, partitions: int) -> int:
        return partitions - 1

    assert partitioners.resolve_partitioner(custom) is custom


@pytest.mark.parametrize("value", ["hash", "KEY", 5, b"key"])
def test_unknown_partitioners_are_refused(value: object) -> None:
    with pytest.raises(InvalidArgumentError) as raised:
        partitioners.resolve_partitioner(value)  # type: ignore[arg-type]
    assert str(raised.value) == (
        f"partitioner must be 'key', 'round_robin' or a callable (stream, key, value, partitions) -> int, got {value!r}"
    )


# -- cursors ----------------------------------------------------------------------------------------


def snapshot(*streams: tuple[str, int]) -> Metadata:
    infos = {}
    for name, count in streams:
        pb = api.StreamMetadata(name=name, subject=name)
        for partition in range(count):
            pb.partitions[partition].CopyFrom(api.PartitionMetadata(id=partition, leader="b1"))
        infos[name] = StreamInfo.from_proto(pb)
    return Metadata(MappingProxyType({}), MappingProxyType(infos), 0.0)


def test_cursor_target_names_the_cursor_partition_count() -> None:
    assert build.check_cursor_target(snapshot(("__cursors", 3), ("s", 2)), "s", 1) == 3


@pytest.mark.parametrize(
    ("metadata", "stream", "partition", "kind", "message"),
    [
        (snapshot(("s", 2)), "s", 0, "CursorsDisabledError", "cursors are disabled on this server"),
        (snapshot(("__cursors", 1)), "missing", 0, "NoSuchStreamError", "no stream named 'missing'"),
        (snapshot(("__cursors", 1), ("s", 2)), "s", 9, "NoSuchPartitionError", "no partition 9"),
    ],
)
def test_cursor_targets_that_do_not_exist_are_refused(
    metadata: Metadata, stream: str, partition: int, kind: str, message: str
) -> None:
    with pytest.raises(getattr(errs, kind)) as raised:
        build.check_cursor_target(metadata, stream, partition)
    assert message in str(raised.value)
    assert (raised.value.stream, raised.value.partition) == (stream, partition)


def test_disabled_cursors_say_which_setting_enables_them() -> None:
    with pytest.raises(errs.CursorsDisabledError) as raised:
        build.check_cursor_target(snapshot(("s", 1)), "s", 0)
    assert "set cursors.stream.partitions" in str(raised.value)
    assert "__cursors" not in str(raised.value).split(":")[0]


# -- messages over the server's size limit ------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "details"),
    [
        # unary Publish over NATS max_payload (api.go:871/893 wraps nats.ErrMaxPayload, gRPC UNKNOWN)
        (grpc.StatusCode.UNKNOWN, "failed to publish to NATS: nats: maximum payload exceeded"),
        # unary Publish over clustering.replication.max.bytes (Ack TOO_LARGE, api.go:1017, INVALID_ARGUMENT)
        (grpc.StatusCode.INVALID_ARGUMENT, "message exceeds max replication size"),
    ],
)
def test_a_too_large_refusal_is_message_too_large(code: grpc.StatusCode, details: str) -> None:
    error = errs.error_from_rpc(Rpc(code, details), stream="s", partition=0)
    assert type(error) is errs.MessageTooLargeError


@pytest.mark.parametrize(
    ("code", "message"),
    [
        (api.PublishAsyncError.INTERNAL, "failed to publish to NATS: nats: maximum payload exceeded"),
        (api.PublishAsyncError.BAD_REQUEST, "message exceeds max replication size"),
    ],
)
def test_a_too_large_async_refusal_is_message_too_large(code: int, message: str) -> None:
    response = api.PublishResponse(correlationId="0", asyncError=api.PublishAsyncError(code=code, message=message))  # type: ignore[arg-type]
    error = publisher.async_error(response, "s", 0)
    assert type(error) is errs.MessageTooLargeError
    assert not error.may_be_stored


def test_message_too_large_names_the_size_and_the_limits() -> None:
    error = errs.MessageTooLargeError("failed to publish to NATS: nats: maximum payload exceeded", stream="s")
    sized = error.with_size(1_048_640)
    assert isinstance(sized, errs.MessageTooLargeError)
    assert sized.size == 1_048_640
    text = str(sized)
    assert "message of 1048640 bytes" in text
    assert "max_payload" in text
    assert "clustering.replication.max.bytes" in text
    assert "1 MiB" in text
    assert "maximum payload exceeded" in text


# -- every public method refuses bad timeouts through the same validator ---------------------------

PUBLIC_TIMEOUTS: list[tuple[str, Callable[[LiftbridgeClient], object]]] = [
    ("fetch_partition_metadata", lambda c: c.fetch_partition_metadata("s", 0, timeout=-1)),
    ("create_stream", lambda c: c.create_stream("s", "s", timeout=-1)),
    ("delete_stream", lambda c: c.delete_stream("s", timeout=-1)),
    ("pause_stream", lambda c: c.pause_stream("s", timeout=-1)),
    ("set_stream_readonly", lambda c: c.set_stream_readonly("s", timeout=-1)),
    ("publish", lambda c: c.publish("s", b"v", timeout=-1)),
    ("publish_batch timeout", lambda c: c.publish_batch("s", [b"v"], timeout=-1)),
    ("publish_batch ack_wait", lambda c: c.publish_batch("s", [b"v"], ack_wait=-1)),
    ("publish_to_subject", lambda c: c.publish_to_subject("s", b"v", timeout=-1)),
    ("subscribe timeout", lambda c: c.subscribe("s", timeout=-1)),
    ("subscribe resubscribe_wait", lambda c: c.subscribe("s", resubscribe_wait=-1)),
    ("read_range", lambda c: c.read_range("s", 0, 0, 1, timeout=-1)),
    ("earliest_offset timeout", lambda c: c.earliest_offset("s", 0, timeout=-1)),
    ("earliest_offset probe", lambda c: c.earliest_offset("s", 0, probe=-1)),
    ("set_cursor", lambda c: c.set_cursor("c", "s", 0, 1, timeout=-1)),
    ("fetch_cursor", lambda c: c.fetch_cursor("c", "s", 0, timeout=-1)),
]


@pytest.mark.parametrize("call", [c for _, c in PUBLIC_TIMEOUTS], ids=[n for n, _ in PUBLIC_TIMEOUTS])
def test_every_sync_method_refuses_a_negative_timeout_without_a_broker(
    call: Callable[[LiftbridgeClient], object],
) -> None:
    """The broker address is unreachable (port 1): the refusal must come before any connection attempt."""
    with LiftbridgeClient("127.0.0.1:1", request_timeout=0.5) as client:
        with pytest.raises(InvalidArgumentError, match=r"must be a number of seconds > 0"):
            call(client)
        assert client.open_channels() == 0, "nothing was dialled"


ASYNC_CALLS: list[tuple[str, Callable[[AsyncLiftbridgeClient], Any], str]] = [
    ("fetch_partition_metadata", lambda c: c.fetch_partition_metadata("s", 0, timeout=-1), "must be a number of"),
    ("fetch_cursor", lambda c: c.fetch_cursor("c", "s", 0, timeout=math.nan), "must be a number of"),
    ("set_cursor", lambda c: c.set_cursor("c", "s", 0, 1, timeout=0), "must be a number of"),
    ("set_cursor offset", lambda c: c.set_cursor("c", "s", 0, -2), "cursor offset must be a whole number >= -1"),
    ("fetch_metadata", lambda c: c.fetch_metadata("orders"), "streams must be a list of stream names"),
    ("subscribe stream", lambda c: anext(c.subscribe("a b", 0, 0)), "invalid stream name 'a b'"),
    ("subscribe partition", lambda c: anext(c.subscribe("s", -1, 0)), "partition must be a whole number >= 0"),
    # The async subscribe checked no flag: "y" reached protobuf as a TypeError, 1 and 0 went out as booleans.
    ("subscribe resume", lambda c: anext(c.subscribe("s", 0, 0, resume=cast(Any, "y"))), "resume must be True or"),
    ("subscribe resume 1", lambda c: anext(c.subscribe("s", 0, 0, resume=cast(Any, 1))), "resume must be True or"),
    (
        "subscribe replica",
        lambda c: anext(c.subscribe("s", 0, 0, read_isr_replica=cast(Any, 0))),
        "read_isr_replica must be True or False",
    ),
    (
        "subscribe two starts",  # start_offset silently won over start
        lambda c: anext(c.subscribe("s", 0, 0, start=StartPosition.earliest())),
        "give start_offset or start, not both",
    ),
]


@pytest.mark.parametrize(("call", "message"), [c[1:] for c in ASYNC_CALLS], ids=[c[0] for c in ASYNC_CALLS])
def test_the_async_client_refuses_the_same_inputs_without_a_broker(
    call: Callable[[AsyncLiftbridgeClient], Any], message: str
) -> None:
    """Same validators as the sync client; the broker (port 1) is never dialled."""

    async def run() -> None:
        async with AsyncLiftbridgeClient("127.0.0.1:1", request_timeout=0.5) as client:
            with pytest.raises(InvalidArgumentError, match=message):
                await call(client)
            assert client.open_channels() == 0, "nothing was dialled"

    asyncio.run(run())


def test_a_consumer_refuses_a_read_flag_that_is_not_a_boolean_and_a_subscribe_after_close() -> None:
    """``read="x"`` was taken as true; subscribe() on a closed consumer said it "has subscribed already". Neither
    dials the broker (port 1)."""
    with LiftbridgeClient("127.0.0.1:1", request_timeout=0.5) as client:
        with pytest.raises(InvalidArgumentError, match="read must be True or False, got 'x'"):
            client.consumer("g", read=cast(Any, "x"))
        member = client.consumer("g")
        member.close()
        with pytest.raises(InvalidArgumentError, match="this consumer is closed; create another"):
            member.subscribe(["s"])

    async def run() -> None:
        async with AsyncLiftbridgeClient("127.0.0.1:1", request_timeout=0.5) as client:
            member = client.consumer("g")
            await member.close()
            with pytest.raises(InvalidArgumentError, match="this consumer is closed; create another"):
                await member.subscribe(["s"])
            assert client.open_channels() == 0, "nothing was dialled"

    asyncio.run(run())


def test_subjects_of_the_servers_own_streams_and_their_partitions_are_refused() -> None:
    """A message published to the subject of ``__activity`` (or a stream created on the subject of
    ``__cursors``) landed in that stream, and one not of its kind broke ``activity()`` for every reader, for
    good. The subjects come from the metadata: the server names them after its namespace."""
    stream = StreamInfo("__activity", "ns.activity", MappingProxyType({}), 0)
    cursors = StreamInfo("__cursors", "ns.cursors", MappingProxyType({}), 0)
    known = Metadata(MappingProxyType({}), MappingProxyType({"__activity": stream, "__cursors": cursors}), 0.0)
    for subject in ("ns.activity", "ns.cursors", "ns.cursors.2"):
        with pytest.raises(InvalidArgumentError, match=f"cannot publish to subject '{subject}'"):
            build.check_not_reserved_subject(subject, known, "publish to")
    for subject in ("ns.activity2", "ns.cursors.x", "ns.cursors2.1", "orders"):
        assert build.check_not_reserved_subject(subject, known, "publish to") == subject
    with (
        LiftbridgeClient("127.0.0.1:1", request_timeout=0.5) as client,
        pytest.raises(InvalidArgumentError, match="cannot delete stream '__cursors': it is reserved"),
    ):
        client.delete_stream("__cursors")
