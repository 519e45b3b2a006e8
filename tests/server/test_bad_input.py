"""Bad input never reaches the real server: refused by the client before anything is sent.

- Stream names, subjects and groups that crash the v1.9.0 server
  (each tried on a private server, never the shared one).
- Bad client input of every other kind: timeouts, batches, partitioner names,
  flags, cursors of missing streams or partitions. The probe table compares the
  server's state before and after each refused call: streams, high watermarks,
  paused and readonly flags, and the stored cursors read straight from the server.
- An empty partition selection touches no partition.
- Cursors disabled on the server: the error says how to enable them.
- Messages over the server's size limit are MessageTooLargeError naming the size.
"""

from __future__ import annotations

import asyncio
import json
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider._proto import liftbridge_api_pb2_grpc as api_grpc
from liftbridge_provider.client import (
    AsyncLiftbridgeClient,
    BatchPublishError,
    InvalidArgumentError,
    LiftbridgeClient,
    LiftbridgeError,
    MessageTooLargeError,
    NoSuchPartitionError,
    NoSuchStreamError,
    PublishMessage,
    StartPosition,
    partition_by_key,
)
from liftbridge_provider.devserver import DevServer, start_single

CURSOR = "bad-input-probe"
ONE_MIB = 1024 * 1024


def unique(prefix: str = "bad") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def stream(client: LiftbridgeClient) -> str:
    """A stream with 2 partitions: 2 messages in partition 0, 1 in partition 1, cursor CURSOR at 0 on partition 0."""
    name = unique()
    client.create_stream(name.replace("-", "."), name, partitions=2)
    client.publish_batch(name, [b"a", b"b"], ack_policy="all")
    client.publish(name, b"c", partition=1, ack_policy="all")
    client.set_cursor(CURSOR, name, 0, 0)
    return name


def raw_fetch_cursor(server: DevServer, stream: str, partition: int) -> int:
    """The cursor as the server stores it, asked without the client's checks (single node: it leads __cursors)."""
    with grpc.insecure_channel(server.brokers[0]) as channel:
        request = api.FetchCursorRequest(cursorId=CURSOR, stream=stream, partition=partition)
        response: api.FetchCursorResponse = api_grpc.APIStub(channel).FetchCursor(request, timeout=5)
        return response.offset


@dataclass(frozen=True)
class ServerState:
    """What a bad call could have changed on the server."""

    streams: frozenset[str]
    partitions: tuple[tuple[int, int, bool, bool], ...]  # (id, high watermark, paused, readonly)
    cursors: tuple[int, ...]


def server_state(server: DevServer, client: LiftbridgeClient, stream: str) -> ServerState:
    metadata = client.fetch_metadata()
    partitions = tuple(
        (p.id, p.high_watermark, p.paused, p.readonly) for p in metadata.stream(stream).partitions.values()
    )
    cursors = tuple(
        raw_fetch_cursor(server, s, p) for s, p in ((stream, 0), (stream, 1), (stream, 9), ("no-such-stream", 0))
    )
    return ServerState(frozenset(metadata.streams), partitions, cursors)


def run_async(client: LiftbridgeClient, call: Callable[[AsyncLiftbridgeClient], Any]) -> Any:
    async def run() -> Any:
        async with AsyncLiftbridgeClient(client.config) as aio:
            return await call(aio)

    return asyncio.run(run())


Call = Callable[[LiftbridgeClient, str], object]

# (id, call, expected error (None: no error), text the error must contain)
PROBE: list[tuple[str, Call, type[Exception] | None, str]] = [
    ("publish timeout -1", lambda c, s: c.publish(s, b"x", timeout=-1), InvalidArgumentError, "timeout must be"),
    ("publish timeout 0", lambda c, s: c.publish(s, b"x", timeout=0), InvalidArgumentError, "timeout must be"),
    ("publish timeout nan", lambda c, s: c.publish(s, b"x", timeout=float("nan")), InvalidArgumentError, "got nan"),
    ("publish timeout inf", lambda c, s: c.publish(s, b"x", timeout=float("inf")), InvalidArgumentError, "got inf"),
    ("publish timeout True", lambda c, s: c.publish(s, b"x", timeout=True), InvalidArgumentError, "got True"),
    (
        "publish partitioner 'hash'",
        lambda c, s: c.publish(s, b"x", partitioner="hash"),  # type: ignore[arg-type]
        InvalidArgumentError,
        "partitioner must be 'key', 'round_robin' or a callable",
    ),
    (
        "publish_batch ack_wait -1",
        lambda c, s: c.publish_batch(s, [b"x"], ack_wait=-1),
        InvalidArgumentError,
        "ack_wait must be",
    ),
    (
        "publish_batch timeout -1",
        lambda c, s: c.publish_batch(s, [b"x"], timeout=-1),
        InvalidArgumentError,
        "timeout must be",
    ),
    (
        "publish_batch None",
        lambda c, s: c.publish_batch(s, None),  # type: ignore[arg-type]
        InvalidArgumentError,
        "messages must be an iterable of bytes or PublishMessage, got None",
    ),
    (
        "publish_batch bytes",
        lambda c, s: c.publish_batch(s, b"abc"),  # type: ignore[arg-type]
        InvalidArgumentError,
        "messages must be an iterable of bytes or PublishMessage, got bytes",
    ),
    (
        "publish_batch partitioner 'hash'",
        lambda c, s: c.publish_batch(s, [b"x"], partitioner="hash"),  # type: ignore[arg-type]
        InvalidArgumentError,
        "partitioner must be",
    ),
    (
        "publish_batch raise_on_error 'no'",
        lambda c, s: c.publish_batch(s, [b"x"], raise_on_error="no"),  # type: ignore[arg-type]
        InvalidArgumentError,
        "raise_on_error must be True or False",
    ),
    (
        "publish_to_subject timeout -1",
        lambda c, s: c.publish_to_subject(s.replace("-", "."), b"x", timeout=-1),
        InvalidArgumentError,
        "timeout must be",
    ),
    (
        "read_range timeout -1",
        lambda c, s: list(c.read_range(s, 0, 0, 2, timeout=-1)),
        InvalidArgumentError,
        "timeout must be",
    ),
    (
        "read_range resume 'yes'",
        lambda c, s: list(c.read_range(s, 0, 0, 2, resume="yes")),  # type: ignore[arg-type]
        InvalidArgumentError,
        "resume must be True or False",
    ),
    (
        "subscribe timeout -1",
        lambda c, s: c.subscribe(s, start=StartPosition.earliest(), timeout=-1),
        InvalidArgumentError,
        "timeout must be",
    ),
    (
        "subscribe resubscribe_wait -1",
        lambda c, s: c.subscribe(s, resubscribe_wait=-1),
        InvalidArgumentError,
        "resubscribe_wait must be",
    ),
    (
        "subscribe read_isr_replica 'yes'",
        lambda c, s: c.subscribe(s, read_isr_replica="yes"),  # type: ignore[arg-type]
        InvalidArgumentError,
        "read_isr_replica must be True or False",
    ),
    (
        "fetch_partition_metadata timeout -1",
        lambda c, s: c.fetch_partition_metadata(s, 0, timeout=-1),
        InvalidArgumentError,
        "timeout must be",
    ),
    (
        "earliest_offset probe -1",
        lambda c, s: c.earliest_offset(s, 0, probe=-1),
        InvalidArgumentError,
        "probe must be",
    ),
    (
        "create_stream timeout -1",
        lambda c, s: c.create_stream(s + ".new", s + "-new", timeout=-1),
        InvalidArgumentError,
        "timeout must be",
    ),
    ("delete_stream timeout -1", lambda c, s: c.delete_stream(s, timeout=-1), InvalidArgumentError, "timeout must be"),
    ("pause_stream timeout -1", lambda c, s: c.pause_stream(s, timeout=-1), InvalidArgumentError, "timeout must be"),
    (
        "pause_stream partitions 0",
        lambda c, s: c.pause_stream(s, partitions=0),  # type: ignore[arg-type]
        InvalidArgumentError,
        "partitions must be a list of partition numbers",
    ),
    (
        "set_stream_readonly timeout -1",
        lambda c, s: c.set_stream_readonly(s, timeout=-1),
        InvalidArgumentError,
        "timeout must be",
    ),
    (
        "set_cursor timeout -1",
        lambda c, s: c.set_cursor(CURSOR, s, 0, 1, timeout=-1),
        InvalidArgumentError,
        "timeout must be",
    ),
    (
        "set_cursor missing stream",
        lambda c, s: c.set_cursor(CURSOR, "no-such-stream", 0, 5),
        NoSuchStreamError,
        "no stream named 'no-such-stream'",
    ),
    (
        "set_cursor missing partition",
        lambda c, s: c.set_cursor(CURSOR, s, 9, 5),
        NoSuchPartitionError,
        "no partition 9",
    ),
    (
        "fetch_cursor missing stream",
        lambda c, s: c.fetch_cursor(CURSOR, "no-such-stream", 0),
        NoSuchStreamError,
        "no stream named 'no-such-stream'",
    ),
    (
        "fetch_cursor missing partition",
        lambda c, s: c.fetch_cursor(CURSOR, s, 9),
        NoSuchPartitionError,
        "no partition 9",
    ),
    (
        "async set_cursor missing stream",
        lambda c, s: run_async(c, lambda a: a.set_cursor(CURSOR, "no-such-stream", 0, 5)),
        NoSuchStreamError,
        "no stream named 'no-such-stream'",
    ),
    (
        "async set_cursor missing partition",
        lambda c, s: run_async(c, lambda a: a.set_cursor(CURSOR, s, 9, 5)),
        NoSuchPartitionError,
        "no partition 9",
    ),
    (
        "async fetch_cursor missing partition",
        lambda c, s: run_async(c, lambda a: a.fetch_cursor(CURSOR, s, 9)),
        NoSuchPartitionError,
        "no partition 9",
    ),
    # a partition the stream does not have is NoSuchPartitionError whichever call names it (publish, subscribe
    # and pause raised InvalidArgumentError, the reads and the cursor calls NoSuchPartitionError)
    *(
        (f"{name} missing partition", call, NoSuchPartitionError, "no partition 9")
        for name, call in (
            ("publish", lambda c, s: c.publish(s, b"x", partition=9)),
            ("publish_batch", lambda c, s: c.publish_batch(s, [b"x"], partition=9)),
            ("publish_batch message partition", lambda c, s: c.publish_batch(s, [PublishMessage(b"x", partition=9)])),
            ("subscribe", lambda c, s: c.subscribe(s, partition=9)),
            ("read_range", lambda c, s: list(c.read_range(s, 9, 0, 1))),
            ("fetch_partition_metadata", lambda c, s: c.fetch_partition_metadata(s, 9)),
            ("pause_stream", lambda c, s: c.pause_stream(s, partitions=[0, 9])),
            ("set_stream_readonly", lambda c, s: c.set_stream_readonly(s, partitions=[9])),
            ("async fetch_partition_metadata", lambda c, s: run_async(c, lambda a: a.fetch_partition_metadata(s, 9))),
            ("async subscribe", lambda c, s: run_async(c, lambda a: a.subscribe(s, partition=9).__anext__())),
        )
    ),
    # numbers the server cannot hold: a retention of 585 years wrapped to 0.45 ms on the server and its
    # cleaner emptied the stream; others raised protobuf's bare ValueError ("Value out of range")
    (
        "create_stream retention 585 years",
        lambda c, s: c.create_stream(s + ".new", s + "-new", retention_max_age=18446744073.710),
        InvalidArgumentError,
        "retention_max_age must be at most 9223372036.854 seconds",
    ),
    (
        "create_stream retention 0.4 ms",
        lambda c, s: c.create_stream(s + ".new", s + "-new", retention_max_age=0.0004),
        InvalidArgumentError,
        "must be 0 or at least 0.001 seconds",
    ),
    (
        "create_stream partitions 2**31",
        lambda c, s: c.create_stream(s + ".new", s + "-new", partitions=2**31),
        InvalidArgumentError,
        "partitions must be at most 4096, got 2147483648",
    ),
    (
        # 1,000,000 wedged a v1.9.0 node, and 10,000 held the metadata leader past a 120 s create: refused first
        "create_stream partitions 1,000,000",
        lambda c, s: c.create_stream(s + ".new", s + "-new", partitions=1_000_000),
        InvalidArgumentError,
        "partitions must be at most 4096, got 1000000",
    ),
    (
        "create_stream min_isr above replication",
        lambda c, s: c.create_stream(s + ".new", s + "-new", replication_factor=1, min_isr=3),
        InvalidArgumentError,
        "min_isr 3 is more than replication_factor 1",
    ),
    (
        "fetch_partition_metadata partition 2**31",
        lambda c, s: c.fetch_partition_metadata(s, 2**31),
        InvalidArgumentError,
        "partition must be at most 2147483647",
    ),
    (
        "set_cursor offset 2**63",
        lambda c, s: c.set_cursor(CURSOR, s, 0, 2**63),
        InvalidArgumentError,
        "must be at most 9223372036854775807",
    ),
    (
        "publish expected_offset 2**63",
        lambda c, s: c.publish(s, b"x", expected_offset=2**63),
        InvalidArgumentError,
        "expected_offset must be at most 9223372036854775807",
    ),
    (
        "subscribe start offset 2**63",
        lambda c, s: c.subscribe(s, start=StartPosition.at_offset(2**63)),
        InvalidArgumentError,
        "must be at most 9223372036854775807",
    ),
    # the server's own streams: a stray message in __cursors, or __cursors made readonly, broke every cursor
    (
        "publish to __cursors",
        lambda c, s: c.publish("__cursors", b"garbage"),
        InvalidArgumentError,
        "cannot publish to stream '__cursors': it is reserved",
    ),
    (
        "publish_batch to __activity",
        lambda c, s: c.publish_batch("__activity", [b"garbage"]),
        InvalidArgumentError,
        "it is reserved",
    ),
    (
        "set_stream_readonly __cursors",
        lambda c, s: c.set_stream_readonly("__cursors"),
        InvalidArgumentError,
        "cannot make readonly stream '__cursors'",
    ),
    ("pause_stream __cursors", lambda c, s: c.pause_stream("__cursors"), InvalidArgumentError, "cannot pause stream"),
    # arguments never checked: an empty range returned [] for partition -1; the waits asked the server
    (
        "read_range partition -1, empty range",
        lambda c, s: list(c.read_range(s, -1, 5, 5)),
        InvalidArgumentError,
        "partition must be a whole number >= 0, got -1",
    ),
    (
        "wait_for_commit stream 'a b'",
        lambda c, s: c.wait_for_commit("a b", 0, 1),
        InvalidArgumentError,
        "invalid stream name 'a b'",
    ),
    (
        "wait_for_high_watermark partition -1",
        lambda c, s: c.wait_for_high_watermark(s, -1, 1),
        InvalidArgumentError,
        "partition must be a whole number >= 0, got -1",
    ),
    # flags checked before any server call: "no" is truthy and verified; "x" was accepted
    (
        "fetch_partition_metadata settle 'x'",
        lambda c, s: c.fetch_partition_metadata(s, 0, settle="x"),  # type: ignore[arg-type]
        InvalidArgumentError,
        "settle must be True or False",
    ),
    (
        "advance_cursor verify 'no'",
        lambda c, s: c.advance_cursor(CURSOR, s, 0, 1, verify="no"),  # type: ignore[arg-type]
        InvalidArgumentError,
        "verify must be True or False",
    ),
    (
        "earliest_offset resume 'no'",
        lambda c, s: c.earliest_offset(s, 0, resume="no"),  # type: ignore[arg-type]
        InvalidArgumentError,
        "resume must be True or False",
    ),
    (
        "async set_cursor timeout -1",
        lambda c, s: run_async(c, lambda a: a.set_cursor(CURSOR, s, 0, 1, timeout=-1)),
        InvalidArgumentError,
        "timeout must be",
    ),
]


@pytest.mark.parametrize(("call", "error", "text"), [p[1:] for p in PROBE], ids=[p[0] for p in PROBE])
def test_bad_input_never_reaches_the_server(  # noqa: PLR0917 - fixtures and table columns
    liftbridge_server: DevServer,
    client: LiftbridgeClient,
    stream: str,
    call: Call,
    error: type[Exception],
    text: str,
) -> None:
    """Each bad input gets a typed error naming the value, and the server's state is unchanged."""
    before = server_state(liftbridge_server, client, stream)
    with pytest.raises(error) as raised:
        call(client, stream)
    assert text in str(raised.value)
    assert server_state(liftbridge_server, client, stream) == before, "nothing may reach the server"


def test_a_readonly_cursors_stream_can_be_made_writable_again(client: LiftbridgeClient, stream: str) -> None:
    """Making __cursors readonly is refused; making it writable is not: that is the way out of a readonly
    __cursors left by another tool, and cursors are set and read as before."""
    with pytest.raises(InvalidArgumentError, match="cannot make readonly stream '__cursors'"):
        client.set_stream_readonly("__cursors")
    client.set_stream_readonly("__cursors", readonly=False)
    client.set_cursor(CURSOR, stream, 1, 0)
    assert client.fetch_cursor(CURSOR, stream, 1) == 0


def test_empty_partition_selection_touches_no_partition(liftbridge_server: DevServer, client: LiftbridgeClient) -> None:
    """The server reads an empty partition list as "all"; the client sends nothing."""
    name = unique()
    client.create_stream(name.replace("-", "."), name, partitions=3)
    client.publish(name, b"x", ack_policy="all")
    before = server_state(liftbridge_server, client, name)

    client.pause_stream(name, partitions=[])
    client.set_stream_readonly(name, partitions=[])
    client.set_stream_readonly(name, partitions=iter(()))

    assert server_state(liftbridge_server, client, name) == before, "an empty selection must touch no partition"
    client.set_stream_readonly(name, partitions=None)
    flags = {p.id: p.readonly for p in client.fetch_metadata([name]).stream(name).partitions.values()}
    assert flags == {0: True, 1: True, 2: True}, "None still means every partition"


@pytest.mark.parametrize(
    ("partitions", "message"),
    [
        ("0", "partitions must be a list of partition numbers (or None for all), got '0'"),
        ([-1], "partition must be a whole number >= 0, got -1"),
        ([0, "1"], "partition must be a whole number >= 0, got '1'"),
    ],
)
def test_a_malformed_partition_selection_is_refused_before_the_partition_lookup(
    client: LiftbridgeClient, partitions: Any, message: str
) -> None:
    """The selection's shape is checked before the client asks the cluster how many partitions the stream has: on
    a stream that does not exist the caller hears about the bad value, not about the missing stream."""
    missing = unique("no-such")
    with pytest.raises(InvalidArgumentError) as paused:
        client.pause_stream(missing, partitions=partitions)
    assert message in str(paused.value)
    with pytest.raises(InvalidArgumentError) as made_readonly:
        client.set_stream_readonly(missing, partitions=partitions)
    assert message in str(made_readonly.value)
    with pytest.raises(NoSuchStreamError):  # a well-formed selection is looked up, and the stream is missing
        client.pause_stream(missing, partitions=[0])


def test_partitioner_names_key_and_round_robin(client: LiftbridgeClient) -> None:
    """partitioner="key" raised "str is not callable"; the names are accepted like the callables."""
    name = unique()
    client.create_stream(name.replace("-", "."), name, partitions=3)
    ack = client.publish(name, b"v", key=b"customer-7", partitioner="key")
    assert ack is not None
    assert ack.partition == partition_by_key(name, b"customer-7", b"v", 3) == zlib.crc32(b"customer-7") % 3

    result = client.publish_batch(name, [b"1", b"2", b"3", b"4", b"5", b"6"], partitioner="round_robin")
    counts = {p: 0 for p in range(3)}
    for batch_ack in result.acks:
        assert batch_ack is not None
        counts[batch_ack.partition] += 1
    assert counts == {0: 2, 1: 2, 2: 2}


# -- Inputs that crash the v1.9.0 server, each tried on a private server ----------------------------

CRASHERS: list[tuple[str, Callable[[LiftbridgeClient], object], str]] = [
    # (id, call, text of the refusal)
    ("name of 256 bytes", lambda c: c.create_stream("long", "a" * 256), "256 bytes; at most 255"),
    ("name of 256 bytes in 128 characters", lambda c: c.create_stream("long", "é" * 128), "256 bytes; at most 255"),
    ("name with an empty token", lambda c: c.create_stream("dot", ".a"), "empty token"),
    ("name with a > token", lambda c: c.create_stream("gt", "a.>"), "wildcard"),
    ("name with a * token", lambda c: c.create_stream("star", "a.*"), "wildcard"),
    ("subject *", lambda c: c.create_stream("*", "star"), "wildcard"),  # refused before this change too
    ("subject events.>", lambda c: c.create_stream("events.>", "events"), "wildcard"),  # refused before too
    ("group with a space", lambda c: c.create_stream("grp", "grp", group="bad group"), "white space"),
    ("subject of 5000 bytes", lambda c: c.create_stream("s" * 5000, "long-subject"), "at most 4032 bytes"),
    ("group of 5000 bytes", lambda c: c.create_stream("grp", "grp", group="g" * 5000), "at most 4032 bytes"),
    (
        "subject of 4031 bytes with a partition 1",
        lambda c: c.create_stream("s" * 4031, "two", partitions=2),
        "at most 4032 bytes",
    ),
    ("publish_to_subject of 5000 bytes", lambda c: c.publish_to_subject("s" * 5000, b"x"), "at most 4032 bytes"),
]


def assert_server_healthy(server: DevServer, client: LiftbridgeClient, streams_before: frozenset[str]) -> None:
    assert server.nodes[0].running, f"the server died:\n{server.nodes[0].process.log_tail()}"
    assert frozenset(client.fetch_metadata().streams) == streams_before, "no stream may be created"
    client.create_stream("healthy", "healthy", partitions=2)
    assert client.publish("healthy", b"ok", partition=1, ack_policy="all", timeout=5) is not None
    assert [m.value for m in client.read_range("healthy", 1, 0, 1, timeout=5)] == [b"ok"]


@pytest.mark.parametrize(("call", "text"), [c[1:] for c in CRASHERS], ids=[c[0] for c in CRASHERS])
def test_inputs_that_crash_the_server_are_refused_before_sending(
    call: Callable[[LiftbridgeClient], object], text: str
) -> None:
    """Each of these made the v1.9.0 server panic (or broke its NATS connection for good)."""
    with start_single() as server, LiftbridgeClient(server.brokers, request_timeout=5) as client:
        before = frozenset(client.fetch_metadata().streams)
        with pytest.raises(InvalidArgumentError) as raised:
            call(client)
        assert text in str(raised.value)
        assert_server_healthy(server, client, before)


def test_the_create_stream_operator_refuses_them_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server-crashing names through the Airflow face: the task fails without retries and the server lives."""
    from airflow.sdk.exceptions import AirflowFailException  # noqa: PLC0415 - Airflow reads its home on import

    from liftbridge_provider.operators.streams import LiftbridgeCreateStreamOperator  # noqa: PLC0415

    conn_id = f"lb_bad_input_{uuid.uuid4().hex[:8]}"
    with start_single() as server, LiftbridgeClient(server.brokers, request_timeout=5) as client:
        connection = {"conn_type": "liftbridge", "host": server.brokers[0], "extra": {"request_timeout": 5}}
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(connection))
        before = frozenset(client.fetch_metadata().streams)
        cases: list[tuple[dict[str, Any], str]] = [
            ({"stream": "grp", "group": "bad group"}, "invalid group 'bad group'"),
            ({"stream": "a" * 300}, "300 bytes; at most 255"),
            ({"stream": "wild", "subject": "events.>"}, "invalid subject 'events.>'"),
            # a float or a bool was truncated by int() (2 and 1 partitions), None failed untyped (retried)
            ({"stream": "float-count", "partitions": 2.7}, "partitions must be a whole number"),
            ({"stream": "bool-count", "partitions": True}, "partitions must be a whole number"),
            ({"stream": "none-count", "partitions": None}, "partitions must be a whole number"),
            ({"stream": "huge-count", "partitions": 2**31}, "partitions must be at most 4096, got 2147483648"),
            ({"stream": "wrap", "retention_max_age": 18446744073.710}, "retention_max_age must be at most"),
            ({"stream": "isr", "min_isr": 3}, "min_isr 3 is more than replication_factor 1"),
        ]
        for arguments, text in cases:
            operator = LiftbridgeCreateStreamOperator(task_id=unique("create"), liftbridge_conn_id=conn_id, **arguments)
            with pytest.raises(AirflowFailException, match=text):
                operator.execute({})
        assert_server_healthy(server, client, before)


# -- Cursors disabled on the server -------------------------------------------------------------------


def test_cursors_disabled_on_the_server_say_how_to_enable_them() -> None:
    """With cursors disabled, "no stream named '__cursors'" becomes an error that names the setting."""
    disabled = "cursors are disabled on this server: set cursors.stream.partitions"
    with (
        start_single(extra_config={"cursors.stream.partitions": 0}) as server,
        LiftbridgeClient(server.brokers, request_timeout=5) as client,
    ):
        client.create_stream("s", "s")
        with pytest.raises(LiftbridgeError, match=disabled):
            client.set_cursor("c", "s", 0, 1)
        with pytest.raises(LiftbridgeError, match=disabled):
            client.fetch_cursor("c", "s", 0)
        with pytest.raises(LiftbridgeError, match=disabled):
            run_async(client, lambda a: a.fetch_cursor("c", "s", 0))
        with pytest.raises(LiftbridgeError, match=disabled):
            run_async(client, lambda a: a.set_cursor("c", "s", 0, 1))


# -- messages over the server's size limit ------------------------------------------------------------


def test_a_message_over_the_nats_limit_is_message_too_large(client: LiftbridgeClient, stream: str) -> None:
    """A 1 MiB value (over NATS's payload limit) raised the base LiftbridgeError ("maximum payload exceeded")."""
    high_watermark = client.fetch_partition_metadata(stream, 0).high_watermark
    with pytest.raises(MessageTooLargeError) as raised:
        client.publish(stream, b"x" * ONE_MIB, ack_policy="all")
    assert_names_size_and_limit(raised.value, ONE_MIB)

    with pytest.raises(BatchPublishError) as batch:
        client.publish_batch(stream, [b"small", b"x" * ONE_MIB], ack_policy="all", ack_wait=5, timeout=30)
    (failure,) = batch.value.result.failures
    assert failure.index == 1
    assert isinstance(failure.error, MessageTooLargeError)
    assert_names_size_and_limit(failure.error, ONE_MIB)
    assert client.fetch_partition_metadata(stream, 0).high_watermark == high_watermark + 1, "only the small one"


def test_a_message_over_the_replication_limit_is_message_too_large() -> None:
    """Over clustering.replication.max.bytes the server answers TOO_LARGE; the size is named."""
    with (
        start_single(extra_config={"clustering.replication.max.bytes": 65536}) as server,
        LiftbridgeClient(server.brokers, request_timeout=5) as client,
    ):
        client.create_stream("s", "s")
        with pytest.raises(MessageTooLargeError) as raised:
            client.publish("s", b"x" * 100_000, ack_policy="all")
        assert_names_size_and_limit(raised.value, 100_000)
        result = client.publish_batch("s", [b"x" * 100_000], ack_wait=5, raise_on_error=False)
        (failure,) = result.failures
        assert isinstance(failure.error, MessageTooLargeError)
        assert_names_size_and_limit(failure.error, 100_000)
        assert client.fetch_partition_metadata("s", 0).high_watermark == -1


@pytest.mark.parametrize(
    ("size", "options"),
    [(5 * ONE_MIB, {}), (300_000, {"max_message_bytes": 200_000})],
    ids=["over-the-servers-grpc-limit", "over-the-clients-limit"],
)
def test_a_batch_refuses_a_message_too_large_for_grpc_alone_and_sends_the_rest(
    liftbridge_server: DevServer, size: int, options: dict[str, object]
) -> None:
    """A message over the server's gRPC receive limit (4 MiB) ended the batch's PublishAsync call: the
    messages awaiting an ack failed as may-be-stored and every later one failed unsent (81 of 101). Now that
    message alone fails, before anything is sent, and the other 100 are acked and stored once."""
    with LiftbridgeClient(liftbridge_server.brokers, **options) as client:
        name = f"big-{uuid.uuid4().hex[:8]}"
        client.create_stream(name, name)
        messages = [b"s"] * 50 + [b"B" * size] + [b"s"] * 50
        result = client.publish_batch(name, messages, ack_wait=10, timeout=60, raise_on_error=False)
        (failure,) = result.failures
        assert failure.index == 50
        assert isinstance(failure.error, MessageTooLargeError)
        assert not failure.error.may_be_stored
        assert "nothing was sent" in str(failure.error)
        assert sum(ack is not None for ack in result.acks) == 100
        newest = client.fetch_partition_metadata(name, 0).newest_offset
        assert [m.value for m in client.read_range(name, 0, 0, newest + 1)] == [b"s"] * 100


def assert_names_size_and_limit(error: LiftbridgeError, value_bytes: int) -> None:
    assert isinstance(error, MessageTooLargeError)
    assert error.size is not None
    assert value_bytes < error.size < value_bytes + 200, "the size as sent: value, key, headers and fields"
    text = str(error)
    assert f"message of {error.size} bytes" in text
    assert "1 MiB" in text
    assert "max_payload" in text
    assert "clustering.replication.max.bytes" in text
