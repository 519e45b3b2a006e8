"""LiftbridgeClient against a real single Liftbridge node: every public method, bounded reads, errors."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import nats
import pytest

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client import (
    ALL_BROKERS,
    AckPolicy,
    AsyncLiftbridgeClient,
    BatchPublishError,
    BeyondHighWatermarkError,
    ClientClosedError,
    EncryptionError,
    IncorrectOffsetError,
    InvalidArgumentError,
    LiftbridgeClient,
    LiftbridgeTimeoutError,
    NoSuchPartitionError,
    NoSuchStreamError,
    PartitionPausedError,
    PublishMessage,
    ReadonlyPartitionError,
    StartPosition,
    StopPosition,
    StreamExistsError,
    UnavailableError,
    partition_by_key,
    partition_by_round_robin,
)
from liftbridge_provider.client.health import HEALTH
from liftbridge_provider.client.publish import envelope
from liftbridge_provider.client.publish.envelope import decode_ack
from liftbridge_provider.client.requests import cursor_partition
from liftbridge_provider.client.subscribe_call import SUBSCRIBE, SubscribeCall
from liftbridge_provider.devserver import DevServer, start_single
from tests.waiting import wait_until


def new_stream(client: LiftbridgeClient, partitions: int = 1, **options: Any) -> str:
    name = f"t-{uuid.uuid4().hex[:10]}"
    client.create_stream(name.replace("-", "."), name, partitions=partitions, **options)
    return name


def values(messages: Iterator[object]) -> list[bytes]:
    return [m.value for m in messages]  # type: ignore[attr-defined]


# -- streams and metadata ---------------------------------------------------------------------------


def test_create_fetch_and_delete_stream(client: LiftbridgeClient, liftbridge_server: DevServer) -> None:
    name = new_stream(client, partitions=4)
    info = client.fetch_metadata([name]).stream(name)
    assert sorted(info.partitions) == [0, 1, 2, 3]
    assert {p.leader for p in info.partitions.values()} == {"n1"}
    assert info.subject == name.replace("-", ".")
    assert [b.address for b in client.metadata().brokers.values()] == liftbridge_server.brokers
    (broker,) = client.fetch_metadata().brokers.values()
    with client._router.pool.lease(liftbridge_server.brokers[0]) as pooled:
        (answered,) = pooled.stub.FetchMetadata(api.FetchMetadataRequest(), timeout=10).brokers
    # The server's counts (from its broker list, which it caches for up to 2 minutes), as it sent them.
    assert (broker.partition_count, broker.leader_count) == (answered.partitionCount, answered.leaderCount)
    # Cached: a node whose streams another module deleted a moment ago may still count none.
    assert broker.partition_count >= broker.leader_count >= 0
    with pytest.raises(StreamExistsError):
        client.create_stream("other.subject", name)
    client.delete_stream(name)
    with pytest.raises(NoSuchStreamError):
        client.stream_info(name)
    with pytest.raises(NoSuchStreamError):
        client.delete_stream(name)


# Timeouts short enough that a create or delete sent to the server runs out of time before its answer comes back.
SHORT_TIMEOUTS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02)


def test_a_create_or_delete_that_ran_out_of_time_is_a_timeout_that_says_what_may_have_happened(
    client: LiftbridgeClient,
) -> None:
    """A create or delete whose deadline passed after it was sent may still be applied: the server waits for
    its Raft apply only as long as the call's deadline, then answers INTERNAL "raft operation timed out" while
    the apply can still commit. That came out as a plain LiftbridgeError, and a deadline that passed on the
    client's side as an UnavailableError "answer lost". Both are timeouts with an unknown outcome: a
    LiftbridgeTimeoutError naming the timeout and what may have happened, and calling again settles it. A call
    whose time ran out before it could send says so, and then nothing happened."""
    unknown = 0
    for timeout in SHORT_TIMEOUTS:
        name = f"t-{uuid.uuid4().hex[:10]}"
        failure = _failure_of(lambda: client.create_stream(name, name, timeout=timeout))  # noqa: B023
        if isinstance(failure, LiftbridgeTimeoutError):
            unknown += 1
            assert f"{timeout:g}s after the request was sent: the stream may have been created" in failure.message
        elif failure is not None:  # nothing was sent: no stream
            assert "could not connect" in failure.message, failure.message
            assert name not in client.fetch_metadata().streams
        with contextlib.suppress(StreamExistsError):  # created by the call that ran out of time
            client.create_stream(name, name)
        assert client.fetch_metadata().streams[name].subject == name

        failure = _failure_of(lambda: client.delete_stream(name, timeout=timeout))  # noqa: B023
        if isinstance(failure, LiftbridgeTimeoutError):
            unknown += 1
            assert f"{timeout:g}s after the request was sent: the stream may have been deleted" in failure.message
        elif failure is not None:  # nothing was sent: the stream is there
            assert "could not connect" in failure.message, failure.message
            assert name in client.fetch_metadata().streams
        with contextlib.suppress(NoSuchStreamError):  # deleted by the call that ran out of time
            client.delete_stream(name)
        assert name not in client.fetch_metadata().streams
    assert unknown, f"no create or delete ran out of time after sending, with timeouts {SHORT_TIMEOUTS}"


def test_a_pause_readonly_or_cursor_call_that_ran_out_of_time_is_a_timeout(client: LiftbridgeClient) -> None:
    """The server waits for a pause's or readonly's Raft apply, and for a cursor's store, only until the call's
    deadline, then answers INTERNAL "raft operation timed out" or "context deadline exceeded": those came out
    as plain LiftbridgeErrors. A pause or readonly applied twice does no harm, so the Raft timeout is an
    attempt that ran out of time (retried while the call has time); when the call has none left, every such
    end is a LiftbridgeTimeoutError (or, when nothing could be sent, an UnavailableError saying so)."""
    name = new_stream(client)
    timed_out = 0
    for timeout in SHORT_TIMEOUTS * 3:
        for call in (
            lambda: client.pause_stream(name, timeout=timeout),  # noqa: B023
            lambda: client.set_stream_readonly(name, readonly=False, timeout=timeout),  # noqa: B023
            lambda: client.set_cursor("short", name, 0, 1, timeout=timeout),  # noqa: B023
        ):
            failure = _failure_of(call)
            if isinstance(failure, LiftbridgeTimeoutError):
                timed_out += 1
            elif failure is not None:
                assert "could not connect" in failure.message, failure.message
    assert timed_out, f"no call ran out of time with timeouts {SHORT_TIMEOUTS}: the test proved nothing"
    client.pause_stream(name)  # calls with time enough still work
    assert client.fetch_partition_metadata(name, 0).paused


def _failure_of(call: Callable[[], object]) -> LiftbridgeTimeoutError | UnavailableError | None:
    """The timeout or unavailability ``call`` raised, None when it succeeded (any other error propagates)."""
    try:
        call()
    except (LiftbridgeTimeoutError, UnavailableError) as exc:
        return exc
    return None


def test_the_servers_own_streams_cannot_be_written_through_their_subjects(liftbridge_server: DevServer) -> None:
    """publish("__activity", ...) was refused, but publish_to_subject on its subject was not: the message landed
    in __activity and activity() failed on it for every reader, for good; a stream created on the subject of
    __cursors received its messages too. Both are refused before anything is sent, from a fresh client as well
    (it fetches the metadata first), and so is a delete of __cursors."""
    activity, cursors = (f"{liftbridge_server.namespace}.{kind}" for kind in ("activity", "cursors"))
    with (
        LiftbridgeClient(liftbridge_server.brokers) as fresh,
        pytest.raises(InvalidArgumentError, match="subject of the server's own stream '__activity'"),
    ):
        fresh.publish_to_subject(activity, b"garbage")
    with LiftbridgeClient(liftbridge_server.brokers) as fresh:
        with pytest.raises(InvalidArgumentError, match="subject of the server's own stream '__cursors'"):
            fresh.create_stream(cursors, f"shadow-{uuid.uuid4().hex[:6]}")
        with pytest.raises(InvalidArgumentError, match="cannot delete stream '__cursors'"):
            fresh.delete_stream("__cursors")
        assert fresh.stream_info("__activity").subject == activity
        events = list(fresh.activity(stop=StopPosition.latest(), timeout=10))
        assert events, "the activity stream holds the server's own events, all of which decode"


def test_replication_factor_all_brokers(client: LiftbridgeClient) -> None:
    name = new_stream(client, replication_factor=ALL_BROKERS)
    assert client.stream_info(name).partitions[0].replicas == ("n1",)


def test_optimistic_concurrency_control(client: LiftbridgeClient) -> None:
    name = new_stream(client, optimistic_concurrency_control=True)
    first = client.publish(name, b"a", expected_offset=0)
    assert first is not None
    assert first.offset == 0
    with pytest.raises(IncorrectOffsetError) as raised:
        client.publish(name, b"duplicate", expected_offset=0)
    assert raised.value.stream == name
    second = client.publish(name, b"b")  # expected offset "next"
    assert second is not None
    assert second.offset == 1
    assert values(client.read_range(name, 0, 0, 2)) == [b"a", b"b"]


def test_retention_max_messages_removes_old_messages(client: LiftbridgeClient) -> None:
    name = new_stream(client, retention_max_messages=5, segment_max_bytes=256, cleaner_interval=0.2)
    client.publish_batch(name, [f"m{i}".encode() * 20 for i in range(40)], ack_policy="all")
    # Read only once the cleaner (every 0.2 s) has surely run: Liftbridge v1.9.0 readers can stall on
    # segments deleted under them, and its message-count retention may remove every closed segment.
    time.sleep(2)
    earliest = client.earliest_offset(name)
    assert earliest is not None
    assert 20 < earliest <= 40
    assert client.fetch_partition_metadata(name, 0).high_watermark == 39
    if earliest < 40:
        assert [m.offset for m in client.read_range(name, 0, earliest, 40)] == list(range(earliest, 40))
    assert client.earliest_offset(new_stream(client)) is None
    full = new_stream(client)
    client.publish_batch(full, [b"a", b"b", b"c"], ack_policy="all")
    assert client.earliest_offset(full) == 0


def test_a_committed_range_that_retention_removed_reads_as_empty_instead_of_waiting_for_ever(
    client: LiftbridgeClient,
) -> None:
    """Retention by age removed every message of [0, 5): the server does not check a start offset against its
    log, so the read's subscription got nothing at all, and read_range waited for ever (no timeout) or until
    its idle_timeout. Committed offsets come at once when they exist: after a few seconds of silence the read
    asks what retention kept, skips what it removed, and ends when nothing of the range is left."""
    name = new_stream(client, retention_max_age=1, segment_max_age=0.5, cleaner_interval=0.5)
    client.publish_batch(name, [f"old {n}".encode() for n in range(5)], ack_policy="all").raise_for_failures()
    wait_until(lambda: client.earliest_offset(name, 0) == 5, 30, "retention to remove offsets 0-4")
    started = time.monotonic()
    assert list(client.read_range(name, 0, 0, 5, idle_timeout=60)) == []
    assert time.monotonic() - started < 30, "the read waited out most of its idle timeout"
    client.publish_batch(name, [b"new 5", b"new 6"], ack_policy="all").raise_for_failures()
    assert values(client.read_range(name, 0, 0, 7, idle_timeout=60)) == [b"new 5", b"new 6"]


def test_a_stop_time_before_the_first_message_or_on_an_empty_log_reads_nothing(client: LiftbridgeClient) -> None:
    """The server failed such a subscription with INTERNAL "Failed to lookup offset for timestamp: timestamp is
    before the beginning of the log" (or "failed to find log segment" on an empty log), raised as a plain
    LiftbridgeError: no message is at or before the stop time, so the read is empty."""
    name = new_stream(client)
    long_ago = StopPosition.at_time(datetime(2000, 1, 1, tzinfo=UTC))
    assert list(client.subscribe(name, start=StartPosition.earliest(), stop=long_ago, timeout=10)) == []
    client.publish(name, b"now", ack_policy="all")
    assert list(client.subscribe(name, start=StartPosition.earliest(), stop=long_ago, timeout=10)) == []
    until_now = StopPosition.at_time(datetime.now(UTC) + timedelta(seconds=1))
    assert values(client.subscribe(name, start=StartPosition.earliest(), stop=until_now, timeout=10)) == [b"now"]
    assert client.earliest_offset(name) == 0


def test_compaction_keeps_latest_value_per_key(client: LiftbridgeClient) -> None:
    name = new_stream(client, compact_enabled=True, segment_max_bytes=256, cleaner_interval=0.2)
    batch = [PublishMessage(f"v{i}".encode() * 10, key=f"k{i % 3}".encode()) for i in range(60)]
    client.publish_batch(name, batch, ack_policy="all")
    client.publish(name, b"last", key=b"k0", ack_policy="all")
    time.sleep(2)  # see the retention test: read after the cleaner ran
    read = list(client.read_range(name, 0, 0, 61))
    assert len(read) < 30, "compaction removed older values of each key"
    assert {m.key: m.value for m in read}[b"k0"] == b"last"
    assert read[-1].offset == 60


def test_auto_pause_time_pauses_idle_partition_and_publish_resumes(client: LiftbridgeClient) -> None:
    name = new_stream(client, auto_pause_time=timedelta(milliseconds=300))
    client.publish(name, b"x")
    wait_until(lambda: client.fetch_metadata([name]).partition(name, 0).paused, 10, "auto pause")
    assert client.fetch_partition_metadata(name, 0).high_watermark == 0  # known while paused
    with pytest.raises(PartitionPausedError):
        client.earliest_offset(name, 0)
    client.publish(name, b"y")  # publishing resumes the partition
    assert client.fetch_partition_metadata(name, 0).high_watermark == 1
    assert values(client.read_range(name, 0, 0, 2)) == [b"x", b"y"]


def test_encryption_without_server_key_is_refused(client: LiftbridgeClient) -> None:
    with pytest.raises(EncryptionError):
        new_stream(client, encryption=True)


def test_other_create_options_are_accepted(client: LiftbridgeClient) -> None:
    name = new_stream(
        client,
        group="workers",
        retention_max_bytes=1 << 20,
        retention_max_age=timedelta(days=1),
        segment_max_age=timedelta(hours=1),
        compact_max_goroutines=2,
        auto_pause_disable_if_subscribers=True,
        min_isr=1,
    )
    assert client.publish(name, b"ok") is not None


def test_pause_resume_and_resume_all(client: LiftbridgeClient) -> None:
    name = new_stream(client, partitions=3)
    client.publish_batch(name, [PublishMessage(b"v", partition=p) for p in range(3)], ack_policy="all")
    client.pause_stream(name, partitions=[1])
    partitions = client.fetch_metadata([name]).stream(name).partitions
    assert [p.paused for p in partitions.values()] == [False, True, False]
    started = time.monotonic()
    with pytest.raises(PartitionPausedError, match="paused"):
        list(client.read_range(name, 1, 0, 1))
    assert time.monotonic() - started < 5, "a paused partition is reported, not retried until the deadline"
    assert client.fetch_partition_metadata(name, 1).high_watermark == 0  # metadata does not resume it
    client.publish(name, b"wake", partition=1)
    assert client.fetch_partition_metadata(name, 1).high_watermark == 1
    # Every partition paused; with resume_all, resuming one resumes them all.
    client.pause_stream(name, resume_all=True)
    assert all(p.paused for p in client.fetch_metadata([name]).stream(name).partitions.values())
    for partition in range(3):
        with pytest.raises(PartitionPausedError):
            client.earliest_offset(name, partition)
    client.publish(name, b"wake all", partition=0)
    assert [client.fetch_partition_metadata(name, p).high_watermark for p in range(3)] == [1, 1, 0]
    with pytest.raises(InvalidArgumentError, match="no partition 5"):
        client.pause_stream(name, partitions=[5])


def test_read_range_and_subscribe_on_paused_partition(client: LiftbridgeClient) -> None:
    name = new_stream(client)
    client.publish_batch(name, [b"a", b"b"], ack_policy="all")
    client.pause_stream(name)
    with pytest.raises(PartitionPausedError, match="resume=True"):
        list(client.read_range(name, 0, 0, 2))
    with pytest.raises(PartitionPausedError), client.subscribe(name, start=StartPosition.earliest(), timeout=10) as sub:
        next(sub)
    assert values(client.read_range(name, 0, 0, 2, resume=True)) == [b"a", b"b"]
    client.pause_stream(name)
    with client.subscribe(name, start=StartPosition.earliest(), resume=True, timeout=10) as sub:
        assert next(sub).value == b"a"


def test_readonly_partition(client: LiftbridgeClient) -> None:
    name = new_stream(client, partitions=2)
    client.publish_batch(name, [PublishMessage(b"r", partition=1)] * 3, ack_policy="all")
    client.set_stream_readonly(name, partitions=[1])
    assert client.fetch_metadata([name]).partition(name, 1).readonly
    with pytest.raises(ReadonlyPartitionError):
        client.publish(name, b"no", partition=1)
    assert values(client.read_range(name, 1, 0, 3)) == [b"r"] * 3
    with client.subscribe(name, partition=1, start=StartPosition.earliest(), timeout=10) as sub:
        assert len(list(sub)) == 3, "a readonly partition ends the subscription cleanly"
    result = client.publish_batch(name, [PublishMessage(b"x", partition=1)] * 2, raise_on_error=False)
    assert [f.index for f in result.failures] == [0, 1]
    assert all(isinstance(f.error, ReadonlyPartitionError) and not f.may_be_stored for f in result.failures)
    client.set_stream_readonly(name, partitions=[1], readonly=False)
    assert client.publish(name, b"yes", partition=1) is not None


# -- publishing -------------------------------------------------------------------------------------


def test_publish_ack_headers_and_key_partitioner(client: LiftbridgeClient) -> None:
    name = new_stream(client, partitions=4)
    keys = [f"user-{i}".encode() for i in range(12)]
    acks = [client.publish(name, k + b"!", key=k, headers={"h": k}, partitioner=partition_by_key) for k in keys]
    for key, ack in zip(keys, acks, strict=True):
        assert ack is not None
        assert ack.partition == partition_by_key(name, key, b"", 4)
        assert ack.stream == name
    for partition in range(4):
        expected = [k for k in keys if partition_by_key(name, k, b"", 4) == partition]
        read = list(client.read_range(name, partition, 0, len(expected)))
        assert [m.key for m in read] == expected
        assert [m.headers["h"] for m in read] == expected
        assert [m.value for m in read] == [k + b"!" for k in expected]
        assert all(m.partition == partition and m.stream == name for m in read)
        assert all(abs(m.time - datetime.now(UTC)) < timedelta(minutes=1) for m in read)


def test_round_robin_and_ack_policies(client: LiftbridgeClient) -> None:
    name = new_stream(client, partitions=3)
    rr = partition_by_round_robin()
    acks = [client.publish(name, b"v", partitioner=rr, ack_policy=AckPolicy.ALL) for _ in range(6)]
    assert [a.partition for a in acks if a is not None] == [0, 1, 2, 0, 1, 2]
    assert client.publish(name, b"fire and forget", ack_policy="none") is None
    wait_until(lambda: client.fetch_partition_metadata(name, 0).high_watermark == 2, 10, "the unacked message")


def test_publish_to_subject(client: LiftbridgeClient) -> None:
    name = new_stream(client)
    ack = client.publish_to_subject(name.replace("-", "."), b"via subject", ack_policy="all")
    assert ack is not None
    assert ack.stream == name
    assert values(client.read_range(name, 0, 0, 1)) == [b"via subject"]


def test_publish_refuses_bad_input_before_sending(client: LiftbridgeClient) -> None:
    name = new_stream(client, partitions=2)
    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: client.publish(name, "text"), "value must be bytes"),  # type: ignore[arg-type]
        (lambda: client.publish(name, b"v", partition=2), "no partition 2"),
        (lambda: client.publish(name, b"v", partition=-1), "partition must be a whole number >= 0, got -1"),
        (lambda: client.publish(name, b"v", ack_policy="most"), "unknown ack policy 'most'"),
        (lambda: client.publish("bad name", b"v"), "invalid stream name 'bad name'"),
        (lambda: client.publish("", b"v"), "invalid stream name ''"),
        (lambda: client.publish_batch(name, [b"ok", 5]), "message #1: value must be bytes"),  # type: ignore[list-item]
        (lambda: client.publish_batch(name, [b"ok"], window=0), "window must be a whole number >= 1, got 0"),
        (lambda: client.publish(name, b"v", partition=0, partitioner=partition_by_key), "either partition or"),
    ]
    for call, message in cases:
        with pytest.raises(InvalidArgumentError, match=message):
            call()
    assert client.fetch_partition_metadata(name, 0).high_watermark == -1, "nothing was sent"
    with pytest.raises(NoSuchStreamError):
        client.publish("no-such-stream", b"v")


def test_publish_batch_100k_keeps_order_and_contiguous_offsets(client: LiftbridgeClient) -> None:
    name = new_stream(client, partitions=3)
    batch = [PublishMessage(f"value-{i}".encode(), key=f"k{i}".encode()) for i in range(100_000)]
    result = client.publish_batch(name, batch, partitioner=partition_by_key, window=1024)
    assert result.ok
    assert len(result.acks) == len(batch)
    per_partition: dict[int, list[tuple[int, bytes]]] = {0: [], 1: [], 2: []}
    for message, ack in zip(batch, result.acks, strict=True):
        assert ack is not None
        assert ack.partition == partition_by_key(name, message.key, b"", 3)
        per_partition[ack.partition].append((ack.offset, message.value))
    for partition, entries in per_partition.items():
        assert [offset for offset, _ in entries] == list(range(len(entries))), "offsets follow input order"
        read = list(client.read_range(name, partition, 0, len(entries)))
        assert [m.value for m in read] == [v for _, v in entries]
    assert sum(len(e) for e in per_partition.values()) == 100_000


def test_publish_batch_to_one_partition_like_publish(client: LiftbridgeClient) -> None:
    """publish_batch(partition=N) sends every message there, as publish(partition=N) does."""
    name = new_stream(client, partitions=2)
    result = client.publish_batch(name, [b"a", b"b", PublishMessage(b"c", key=b"k")], partition=1)
    assert [a.partition for a in result.acks if a is not None] == [1, 1, 1]
    assert [m.value for m in client.read_range(name, 1, 0, 3)] == [b"a", b"b", b"c"]
    with pytest.raises(InvalidArgumentError, match="no partition 2"):
        client.publish_batch(name, [b"x"], partition=2)
    with pytest.raises(InvalidArgumentError, match="give either partition or partitioner"):
        client.publish_batch(name, [b"x"], partition=0, partitioner="key")
    with pytest.raises(InvalidArgumentError, match="partition must be a whole number >= 0"):
        client.publish_batch(name, [b"x"], partition=-1)
    assert client.fetch_partition_metadata(name, 0).high_watermark == -1, "nothing reached partition 0"


def test_an_ack_inbox_and_correlation_id_reach_whoever_listens_on_the_inbox(
    client: LiftbridgeClient, liftbridge_server: DevServer
) -> None:
    """go-liftbridge's AckInbox and CorrelationID: the server publishes the ack to the given NATS
    inbox with the given id, and publish still returns it."""
    name = new_stream(client)

    async def publish_and_listen() -> tuple[Any, bytes]:
        connection = await nats.connect(servers=liftbridge_server.nats_servers)
        inbox = await connection.subscribe("my.acks.1", max_msgs=1)
        await connection.flush(timeout=10)  # the NATS server knows the subscription before the ack is published
        ack = await asyncio.to_thread(
            client.publish, name, b"x", ack_inbox="my.acks.1", correlation_id="order-7", ack_policy="all"
        )
        received = await inbox.next_msg(timeout=10)
        await connection.close()
        return ack, received.data

    ack, data = asyncio.run(publish_and_listen())
    assert ack is not None
    assert (ack.correlation_id, ack.ack_inbox, ack.offset) == ("order-7", "my.acks.1", 0)
    heard = decode_ack(data)
    assert (heard.correlationId, heard.offset, heard.stream) == ("order-7", 0, name)
    with pytest.raises(InvalidArgumentError, match=r"invalid subject 'my\.>'"):
        client.publish(name, b"y", ack_inbox="my.>")
    with pytest.raises(InvalidArgumentError, match="correlation_id must be a non-empty string"):
        client.publish(name, b"y", correlation_id="")


def test_a_batch_whose_deadline_passes_before_it_connects_says_so_and_blames_no_broker(
    liftbridge_server: DevServer,
) -> None:
    """A batch timeout too short to open the batch's connection reported each message as UnavailableError
    "could not connect to <broker>: no connection within 0.001s" (for a 0.0001 s timeout) and marked the healthy
    broker silent, so that the next calls tried it last. The deadline came first: nothing was sent, and the
    error says that, with the timeout given (on a loaded machine the deadline may already pass while the
    messages are checked, before any connection: the same "not sent" answer, said so)."""
    (broker,) = liftbridge_server.brokers
    with LiftbridgeClient(liftbridge_server.brokers) as fresh:
        name = new_stream(fresh)
        HEALTH.answered(broker)  # whatever an earlier test held against it is forgotten
        result = fresh.publish_batch(name, [b"x", b"y"], timeout=0.0001, raise_on_error=False)
        errors = [failure.error for failure in result.failures]
        assert len(errors) == 2, "100 µs is too short to connect, send and be acked"
        assert all(isinstance(e, LiftbridgeTimeoutError) and not e.may_be_stored for e in errors), errors
        assert all(e.message.startswith("not sent: the batch deadline (0.0001s) passed ") for e in errors), errors
        assert not HEALTH.suspected(broker), "a connection cut short by the deadline says nothing of the broker"


def test_publish_batch_reports_failures_by_index(client: LiftbridgeClient) -> None:
    name = new_stream(client, partitions=2)
    client.set_stream_readonly(name, partitions=[1])
    batch = [
        PublishMessage(b"ok", partition=0),
        PublishMessage(b"no", partition=1),
        PublishMessage(b"ok2", partition=0),
    ]
    with pytest.raises(BatchPublishError) as raised:
        client.publish_batch(name, batch)
    result = raised.value.result
    assert [f.index for f in result.failures] == [1]
    assert isinstance(result.failures[0].error, ReadonlyPartitionError)
    assert [a.offset if a else None for a in result.acks] == [0, None, 1]
    assert "1 of 3 messages failed: #1: readonly partition: 1" in str(raised.value)


def test_envelope_published_straight_to_nats_is_stored_and_acked(
    client: LiftbridgeClient, liftbridge_server: DevServer
) -> None:
    name = new_stream(client)
    nats_port = liftbridge_server.nodes[0].nats_port
    assert nats_port is not None
    inbox = f"_INBOX.{uuid.uuid4().hex}"
    with socket.create_connection(("127.0.0.1", nats_port), timeout=10) as nats:
        reader = nats.makefile("rb")
        reader.readline()  # INFO
        nats.sendall(f'CONNECT {{"verbose":false}}\r\nSUB {inbox} 1\r\nPING\r\n'.encode())
        assert reader.readline() == b"PONG\r\n"
        data = envelope.encode_message(
            b"raw", key=b"k", headers={"h": b"1"}, ack_inbox=inbox, correlation_id="c-1", ack_policy=1, with_crc=True
        )
        nats.sendall(f"PUB {name.replace('-', '.')} {len(data)}\r\n".encode() + data + b"\r\n")
        header = reader.readline()
        assert header.startswith(f"MSG {inbox} 1 ".encode())
        ack = envelope.decode_ack(reader.read(int(header.split()[-1]) + 2)[:-2])
    assert (ack.stream, ack.offset, ack.correlationId) == (name, 0, "c-1")
    (message,) = client.read_range(name, 0, 0, 1)
    assert (message.value, message.key, message.headers["h"]) == (b"raw", b"k", b"1")


# -- reading ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ten(client: LiftbridgeClient) -> str:
    """A stream whose partition 0 holds values b"0".."9" at offsets 0-9, with known timestamps."""
    name = new_stream(client)
    for i in range(10):
        client.publish(name, str(i).encode(), ack_policy="all")
        time.sleep(0.01)
    return name


def test_start_positions(client: LiftbridgeClient, ten: str) -> None:
    def first(start: StartPosition) -> bytes:
        with client.subscribe(ten, start=start, timeout=10) as sub:
            return next(sub).value

    assert first(StartPosition.earliest()) == b"0"
    assert first(StartPosition.latest()) == b"9"
    assert first(StartPosition.at_offset(4)) == b"4"
    stamps = [m.timestamp for m in client.read_range(ten, 0, 0, 10)]
    assert first(StartPosition.at_time(stamps[6])) == b"6"
    assert first(StartPosition.time_delta(timedelta(hours=1))) == b"0"


def test_stop_positions(client: LiftbridgeClient, ten: str) -> None:
    def read(stop: StopPosition) -> list[bytes]:
        with client.subscribe(ten, start=StartPosition.earliest(), stop=stop, timeout=10) as sub:
            return values(sub)

    assert read(StopPosition.at_offset(2)) == [b"0", b"1", b"2"]
    assert read(StopPosition.latest()) == [str(i).encode() for i in range(10)]
    stamps = [m.timestamp for m in client.read_range(ten, 0, 0, 10)]
    assert read(StopPosition.at_time(stamps[3])) == [b"0", b"1", b"2", b"3"]


def test_new_only_subscription_and_cancel_from_another_thread(client: LiftbridgeClient) -> None:
    name = new_stream(client)
    client.publish(name, b"old")
    received: list[bytes] = []
    sub = client.subscribe(name)

    def consume() -> None:
        for message in sub:
            received.append(message.value)

    reader = threading.Thread(target=consume)
    reader.start()
    wait_until(lambda: client.fetch_metadata([name]).partition(name, 0).high_watermark == 0, 5, "old message")
    time.sleep(0.3)  # let the subscription start
    client.publish(name, b"new")
    wait_until(lambda: received == [b"new"], 10, "the new message")
    sub.cancel()
    reader.join(timeout=5)
    assert not reader.is_alive(), "cancel() ends a blocked iteration"
    assert received == [b"new"]


def test_a_subscribe_call_on_the_data_plane_ends_and_fails_as_grpcs_own_call(
    client: LiftbridgeClient, ten: str, liftbridge_server: DevServer
) -> None:
    """Subscribe runs on the client's own HTTP/2 call (client/h2, client/subscribe_call.py), not on grpc's: it
    gives what grpc's own call of the same request gives (the empty confirmation, then the messages) and ends
    the same way (the server's end at the stop offset with its status and details, a deadline, a cancel from
    another thread), since the subscription's decisions (reading.SubscriptionState) read those ends."""
    address = liftbridge_server.brokers[0]

    def request(stop: int) -> api.SubscribeRequest:
        return api.SubscribeRequest(
            stream=ten, partition=0, startPosition=api.OFFSET, startOffset=0, stopPosition=api.STOP_OFFSET,
            stopOffset=stop,
        )  # fmt: skip

    def grpcs(stop: int, timeout: float) -> tuple[list[int], Any]:
        offsets: list[int] = []
        with client._router.pool.lease(address) as pooled:
            try:
                for message in pooled.stub.Subscribe(request(stop), timeout=timeout):
                    offsets.append(message.offset)
            except grpc.RpcError as exc:
                return offsets, (exc.code(), exc.details())
        return offsets, None

    def ours(stop: int, timeout: float, cancel_after: float | None = None) -> tuple[list[int], Any]:
        offsets: list[int] = []
        with client._router.pool.blocking_call(address, SUBSCRIBE, timeout=timeout) as call:
            if cancel_after is not None:
                threading.Timer(cancel_after, call.cancel).start()
            try:
                subscribe = SubscribeCall(call, request(stop))
                if subscribe.confirm():
                    offsets.append(0)  # the empty confirmation (offset 0, as grpc's call gives it)
                    for segments in subscribe.reads():
                        for buffer, spans in segments:
                            for i in range(0, len(spans), 2):
                                offsets.append(api.Message.FromString(bytes(buffer[spans[i] : spans[i + 1]])).offset)
            except grpc.RpcError as exc:
                return offsets, (exc.code(), exc.details())
        return offsets, None

    plain = grpcs(9, 10)
    own = ours(9, 10)
    assert own == plain
    assert own[0] == [0, *range(10)], "the empty confirmation, then offsets 0-9"
    assert own[1] == (grpc.StatusCode.RESOURCE_EXHAUSTED, "Stop offset reached"), "the server's end, as grpc reads it"

    started = time.monotonic()  # before the call: its deadline runs from its creation
    offsets, end = ours(50, 1.0)  # offsets past the end: the call waits, then its deadline ends it
    assert offsets == [0, *range(10)]
    # Either side's deadline may end it first: ours gives DEADLINE_EXCEEDED, the server's Subscribe returns
    # nil when its context expires (grpc-timeout), so a status OK (a clean end) may arrive first on a loaded
    # machine, as with grpc's own call (docs/client.md). The subscription's own deadline check handles both.
    assert end is None or end == (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"), end
    assert time.monotonic() - started >= 0.9, "the deadline, not anything else, ended the call"

    offsets, end = ours(50, 30, cancel_after=0.5)
    assert offsets == [0, *range(10)]
    assert end is not None
    assert end[0] == grpc.StatusCode.CANCELLED


def test_offset_at_time_is_the_first_message_received_at_or_after_it(client: LiftbridgeClient) -> None:
    """For interval-bounded ranges, the server's time index turns a time into the first offset at or
    after it; past the last committed message it is the high watermark + 1; an empty partition gives 0."""
    name = new_stream(client, partitions=2)
    for i in range(6):
        client.publish(name, str(i).encode(), ack_policy="all")
        time.sleep(0.02)
    stamps = [m.timestamp for m in client.read_range(name, 0, 0, 6)]
    assert client.offset_at_time(name, 0, stamps[0] - 10**9) == 0
    assert [client.offset_at_time(name, 0, t) for t in stamps] == list(range(6)), "exactly at a message: it"
    assert [client.offset_at_time(name, 0, t + 1) for t in stamps] == list(range(1, 7)), "just after: the next"
    assert client.offset_at_time(name, 0, datetime.now(UTC) + timedelta(hours=1)) == 6
    assert client.offset_at_time(name, 1, stamps[3]) == 0, "nothing in partition 1 yet"
    client.pause_stream(name, partitions=[0])
    assert client.offset_at_time(name, 0, stamps[2] + 1) == 3, "a paused partition is read (and resumed)"
    with pytest.raises(InvalidArgumentError, match="timezone"):
        client.offset_at_time(name, 0, datetime(2026, 1, 1))  # a naive datetime: the bad input


def test_offset_at_time_is_right_where_the_servers_time_index_is_wrong(client: LiftbridgeClient) -> None:
    """The v1.9.0 server's time lookup answers "past the end of the log" for any time once its newest
    segment is empty (here: rolled by age): a Subscribe from offset 5's time delivers nothing. Taken as the
    answer, an interval would lose every message; offset_at_time checks the hint and searches instead."""
    name = new_stream(client, segment_max_age=1, cleaner_interval=0.2)
    client.publish_batch(name, [f"m{i}".encode() for i in range(10)], ack_policy="all")
    time.sleep(2.5)  # the cleaner rolls the segment by age: the newest one is empty
    stamps = [m.timestamp for m in client.read_range(name, 0, 0, 10)]
    with client.subscribe(
        name, start=StartPosition.at_time(stamps[5]), stop=StopPosition.at_offset(9), timeout=5
    ) as sub:
        assert next(sub, None) is None, "the server's own answer is wrong (if this fails, the quirk is gone)"
    assert [client.offset_at_time(name, 0, t) for t in stamps] == list(range(10))
    assert client.offset_at_time(name, 0, stamps[9] + 1) == 10


def test_the_activity_stream_tells_what_happened_to_streams(client: LiftbridgeClient) -> None:
    """__activity as typed events, in the order the cluster applied them."""
    name = new_stream(client, partitions=2)
    client.pause_stream(name, partitions=[1])
    client.set_stream_readonly(name, partitions=[0])
    client.delete_stream(name)
    mine = []
    for event in client.activity(idle_timeout=5):
        if event.stream == name:
            mine.append(event)
        if event.op == "delete_stream" and event.stream == name:
            break
    ops = [e.op for e in mine]
    assert ops == ["create_stream", "pause_stream", "set_stream_readonly", "delete_stream"]
    created, paused, readonly, _deleted = mine
    assert created.partitions == (0, 1)
    assert (paused.partitions, paused.resume_all) == ((1,), False)
    assert (readonly.partitions, readonly.readonly) == ((0,), True)
    assert [e.id for e in mine] == sorted(e.id for e in mine), "Raft order"
    assert all(e.offset >= 0 and e.timestamp > 0 for e in mine)


def test_subscription_timeout(client: LiftbridgeClient) -> None:
    name = new_stream(client)
    started = time.monotonic()
    with pytest.raises(LiftbridgeTimeoutError), client.subscribe(name, timeout=0.5) as sub:
        next(sub)
    assert time.monotonic() - started < 5


def test_subscribe_unknown_partition_and_stream(client: LiftbridgeClient, ten: str) -> None:
    with pytest.raises(InvalidArgumentError, match="no partition 3"):
        client.subscribe(ten, partition=3)
    with pytest.raises(NoSuchStreamError):
        client.subscribe("never-created")
    with pytest.raises(NoSuchPartitionError):
        client.fetch_partition_metadata(ten, 7)


def test_read_range_exact_and_empty(client: LiftbridgeClient, ten: str) -> None:
    assert values(client.read_range(ten, 0, 3, 7)) == [b"3", b"4", b"5", b"6"]
    assert [m.offset for m in client.read_range(ten, 0, 0, 10)] == list(range(10))
    assert list(client.read_range(ten, 0, 5, 5)) == []
    empty = new_stream(client)
    assert list(client.read_range(empty, 0, 0, 0)) == []
    assert list(client.read_range(empty, 0, 0, 1, beyond_high_watermark="truncate")) == []
    with pytest.raises(BeyondHighWatermarkError, match=r"range \[0, 1\) goes beyond the committed high watermark -1"):
        list(client.read_range(empty, 0, 0, 1, timeout=0.5))


def test_range_subscription_gives_read_range_messages_as_protobufs(client: LiftbridgeClient, ten: str) -> None:
    """The Spark task's read: the same messages as read_range, as api.Message; None for an empty range; the
    checks of read_range before anything is opened."""
    subscription = client.range_subscription(ten, 0, 3, 7)
    assert subscription is not None
    with subscription:
        raw = list(subscription.raw_messages())
    assert all(isinstance(message, api.Message) for message in raw)
    assert [(m.offset, m.value) for m in raw] == [(m.offset, m.value) for m in client.read_range(ten, 0, 3, 7)]
    assert client.range_subscription(ten, 0, 5, 5) is None
    assert client.range_subscription(new_stream(client), 0, 0, 1, beyond_high_watermark="truncate") is None
    with pytest.raises(InvalidArgumentError, match="range end 2 is before start 4"):
        client.range_subscription(ten, 0, 4, 2)


def test_read_range_beyond_high_watermark(client: LiftbridgeClient, ten: str) -> None:
    started = time.monotonic()
    with pytest.raises(BeyondHighWatermarkError, match=r"range \[8, 12\) goes beyond the committed high watermark 9"):
        client.read_range(ten, 0, 8, 12, timeout=0.5)
    assert time.monotonic() - started < 0.5 + 1.0, "refused once the timeout passed"
    assert values(client.read_range(ten, 0, 8, 12, beyond_high_watermark="truncate")) == [b"8", b"9"]
    assert list(client.read_range(ten, 0, 15, 20, beyond_high_watermark="truncate")) == []
    read: list[bytes] = []
    messages = client.read_range(ten, 0, 8, 12, beyond_high_watermark="wait", timeout=1.0)
    with pytest.raises(LiftbridgeTimeoutError):
        read.extend(m.value for m in messages)
    assert read == [b"8", b"9"], "what exists is delivered before the timeout"


def test_range_beyond_what_the_leader_holds_is_refused_at_once(client: LiftbridgeClient, ten: str) -> None:
    """A range past both the committed high watermark and the newest offset the leader holds: no commit is
    on its way, so read_range (and range_subscription) refuse at once with the typed error naming the range
    and the high watermark, instead of asking the leader again until request_timeout (10 s) passes."""
    assert client.config.request_timeout == 10
    info = client.fetch_partition_metadata(ten, 0)
    assert (info.high_watermark, info.newest_offset) == (9, 9)
    refusal = r"range \[8, 12\) goes beyond the committed high watermark 9: the leader's newest offset is 9"
    for read in (client.read_range, client.range_subscription):
        started = time.monotonic()
        with pytest.raises(BeyondHighWatermarkError, match=refusal):
            read(ten, 0, 8, 12)
        elapsed = time.monotonic() - started
        assert elapsed < 2.0, f"{read.__name__} took {elapsed:.1f}s to refuse a range nothing will fill"


def test_read_range_waits_for_missing_messages(client: LiftbridgeClient) -> None:
    name = new_stream(client)
    client.publish(name, b"0", ack_policy="all")
    later = threading.Timer(0.5, lambda: [client.publish(name, str(i).encode()) for i in (1, 2)])
    later.start()
    assert values(client.read_range(name, 0, 0, 3, beyond_high_watermark="wait", timeout=20)) == [b"0", b"1", b"2"]
    later.join()


@pytest.mark.parametrize(
    ("start", "end", "message"),
    [(-1, 3, "start must be a whole number >= 0, got -1"), (5, 3, "range end 3 is before start 5")],
)
def test_read_range_refuses_bad_offsets(client: LiftbridgeClient, ten: str, start: int, end: int, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        client.read_range(ten, 0, start, end)


def test_read_range_refuses_unknown_mode(client: LiftbridgeClient, ten: str) -> None:
    with pytest.raises(InvalidArgumentError, match="beyond_high_watermark must be"):
        client.read_range(ten, 0, 0, 1, beyond_high_watermark="skip")  # type: ignore[arg-type]


# -- cursors ----------------------------------------------------------------------------------------


def test_cursors_with_several_cursor_partitions(tmp_path: Path) -> None:
    with start_single(data_dir=tmp_path, cursor_partitions=4) as server, LiftbridgeClient(server.brokers) as c:
        name = new_stream(c, partitions=3)
        expected: dict[tuple[str, int], int] = {}
        for i in range(12):
            cursor_id, partition = f"reader-{i}", i % 3
            c.set_cursor(cursor_id, name, partition, 100 + i)
            expected[(cursor_id, partition)] = 100 + i
        assert {k: c.fetch_cursor(k[0], name, k[1]) for k in expected} == expected
        assert c.fetch_cursor("never-set", name, 0) == -1
        c.set_cursor("reader-0", name, 0, 7)
        assert c.fetch_cursor("reader-0", name, 0) == 7
        used = {cursor_partition(cid, name, p, 4) for cid, p in expected}
        assert len(used) > 1, "the cursors spread over several __cursors partitions"
        for cursor_id, partition in expected:
            key = f"{cursor_id},{name},{partition}".encode()
            target = cursor_partition(cursor_id, name, partition, 4)
            with c.subscribe(
                "__cursors", partition=target, start=StartPosition.earliest(), stop=StopPosition.latest()
            ) as sub:
                assert key in {m.key for m in sub}, f"cursor {key!r} is stored in __cursors partition {target}"


def test_cursor_bad_input(client: LiftbridgeClient, ten: str) -> None:
    with pytest.raises(InvalidArgumentError, match="cursor offset must be a whole number >= -1, got -2"):
        client.set_cursor("c", ten, 0, -2)
    with pytest.raises(InvalidArgumentError, match="cursor_id must be a non-empty string"):
        client.fetch_cursor("", ten, 0)


# -- sharing, pooling, closing ----------------------------------------------------------------------


def fd_target(fd: str) -> str:
    """What this process's file descriptor ``fd`` names, or "" when a gRPC thread closed it meanwhile."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


def established_connections(port: int) -> set[str]:
    """The sockets (inodes) of this process's TCP connections to 127.0.0.1:``port`` that are ESTABLISHED."""
    links = (fd_target(fd) for fd in os.listdir("/proc/self/fd"))
    inodes = {link[8:-1] for link in links if link.startswith("socket:[")}
    found = set()
    for table in ("tcp", "tcp6"):  # gRPC dials IPv4 addresses on dual-stack (tcp6) sockets
        for line in Path(f"/proc/self/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            if remote_port == port and fields[3] == "01" and fields[9] in inodes:
                found.add(fields[9])
    return found


def test_a_client_closed_under_a_read_ends_it_with_client_closed_error(liftbridge_server: DevServer) -> None:
    """Closing the client while a subscription read (another thread or task) ended the sync read with a plain
    LiftbridgeError "Stream removed (Channel closed!)" (CANCELLED) and the async one with a CancelledError in a
    task nobody cancelled, which confuses TaskGroups and wait_for. Both are ClientClosedError; a reader task
    that is itself cancelled still gets its CancelledError."""
    with LiftbridgeClient(liftbridge_server.brokers) as setup:
        name = new_stream(setup)
        setup.publish_batch(name, [b"a", b"b"], ack_policy="all").raise_for_failures()
    sync = LiftbridgeClient(liftbridge_server.brokers)
    read = iter(sync.read_range(name, 0, 0, 3, beyond_high_watermark="wait", timeout=30))
    assert next(read).value == b"a"
    sync.close()
    with pytest.raises(ClientClosedError, match="closed while the subscription read"):
        list(read)

    async def read_while_closed() -> None:
        client = AsyncLiftbridgeClient(liftbridge_server.brokers)
        reader = asyncio.create_task(anext(client.subscribe(name, 0, 2, timeout=30)))  # waits for offset 2
        await asyncio.sleep(1)
        await client.close()
        with pytest.raises(ClientClosedError, match="closed while the subscription read"):
            await reader
        other = AsyncLiftbridgeClient(liftbridge_server.brokers)
        cancelled = asyncio.create_task(anext(other.subscribe(name, 0, 2, timeout=30)))
        await asyncio.sleep(1)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        await other.close()

    asyncio.run(read_while_closed())


def test_32_threads_share_one_client_and_close_releases_everything(liftbridge_server: DevServer) -> None:
    port = liftbridge_server.nodes[0].port
    before = established_connections(port)  # other clients of this test module: they may close meanwhile
    shared = LiftbridgeClient(liftbridge_server.brokers, max_conns_per_broker=2)
    name = new_stream(shared, partitions=4)
    errors: list[BaseException] = []

    def work(thread: int) -> None:
        try:
            for i in range(20):
                shared.publish(name, f"{thread}-{i}".encode(), partition=thread % 4)
            shared.fetch_metadata([name])
            shared.fetch_partition_metadata(name, thread % 4)
            shared.set_cursor(f"t{thread}", name, thread % 4, thread)
            assert shared.fetch_cursor(f"t{thread}", name, thread % 4) == thread
        except BaseException as exc:  # collected and re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    assert sum(shared.fetch_partition_metadata(name, p).high_watermark + 1 for p in range(4)) == 32 * 20
    # at most max_conns_per_broker gRPC channels, plus the data plane's one shared publish stream to the broker
    assert 2 <= shared.open_channels() <= 3
    opened = established_connections(port) - before
    assert 2 <= len(opened) <= 3, opened
    shared.close()
    shared.close()  # idempotent
    assert shared.open_channels() == 0
    wait_until(lambda: not established_connections(port) & opened, 5, "the client's connections to close")
    with pytest.raises(ClientClosedError):
        shared.fetch_metadata()


def test_idle_channels_close_after_keep_alive(liftbridge_server: DevServer) -> None:
    """A channel unused for keep_alive_time is closed by the janitor; a new one opens on demand. (1.5 s, not
    less: CI once stalled this thread between a call and the count for longer than 0.4 s.)"""
    with LiftbridgeClient(liftbridge_server.brokers, keep_alive_time=1.5) as short:
        short.fetch_metadata()
        assert short.open_channels() == 1
        wait_until(lambda: short.open_channels() == 0, 5, "the idle channel to close")
        short.fetch_metadata()  # a new channel opens on demand
        assert short.open_channels() == 1


def test_address_resolver_maps_advertised_addresses(liftbridge_server: DevServer) -> None:
    seen: list[tuple[str, int]] = []

    def resolve(host: str, port: int) -> str:
        seen.append((host, port))
        return f"localhost:{port}"

    with LiftbridgeClient(liftbridge_server.brokers, address_resolver=resolve) as resolving:
        name = new_stream(resolving)
        resolving.publish(name, b"x")
        assert resolving.fetch_partition_metadata(name, 0).high_watermark == 0
    assert ("127.0.0.1", liftbridge_server.nodes[0].port) in seen


def test_unreachable_broker_gives_unavailable_quickly() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    with LiftbridgeClient(f"127.0.0.1:{port}", request_timeout=2) as dead, pytest.raises(UnavailableError):
        dead.fetch_metadata()
    assert time.monotonic() - started < 10


# -- asyncio ----------------------------------------------------------------------------------------


def test_async_client_metadata_partition_metadata_and_cursors(client: LiftbridgeClient, ten: str) -> None:
    async def scenario(brokers: list[str]) -> tuple[int, int, int, int]:
        async with AsyncLiftbridgeClient(brokers) as aclient:
            metadata = await aclient.fetch_metadata([ten])
            partition = await aclient.fetch_partition_metadata(ten, 0)
            await aclient.set_cursor("async", ten, 0, 5)
            cursor = await aclient.fetch_cursor("async", ten, 0)
            unknown = await aclient.fetch_cursor("async-unset", ten, 0)
            with pytest.raises(NoSuchPartitionError):
                await aclient.fetch_partition_metadata(ten, 9)
            opened = aclient.open_channels()
        assert aclient.open_channels() == 0
        return metadata.partition(ten, 0).high_watermark, partition.high_watermark, cursor + unknown, opened

    hw_from_any, hw_from_leader, cursors, opened = asyncio.run(scenario(list(client.config.brokers)))
    assert (hw_from_any, hw_from_leader, cursors) == (9, 9, 4)
    assert opened == 1
    assert client.fetch_cursor("async", ten, 0) == 5, "the sync client sees what the async one stored"


def test_subscription_finalised_while_the_pool_lock_is_held_does_not_deadlock(
    client: LiftbridgeClient, ten: str
) -> None:
    """The garbage collector can finalise an abandoned subscription at any point, including inside the
    pool's own locked section (seen in Spark's planner worker); releasing its lease there must not block."""
    subscription = client.subscribe(ten, start=StartPosition.earliest())
    assert next(subscription).offset == 0  # now holds a lease on a pooled channel
    pool = client._pool
    done = threading.Event()

    def finalise_under_lock() -> None:
        with pool._lock:
            subscription._messages.close()  # what the garbage collector does to the abandoned generator
        done.set()

    worker = threading.Thread(target=finalise_under_lock, daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert done.is_set(), "releasing a lease under the pool lock deadlocked"


def test_closing_the_async_client_under_a_unary_call_ends_it_with_client_closed_error() -> None:
    """close() while a unary call waited on a frozen broker made the call raise a CancelledError in a task
    nobody cancelled (so no typed error, and for set_cursor no word on whether it was applied). It is a
    ClientClosedError, as for a subscription; a task that is itself cancelled still gets CancelledError."""
    with start_single() as server:
        node = server.nodes[0]

        async def scenario() -> None:
            client = AsyncLiftbridgeClient(server.brokers)
            await client.fetch_metadata()
            server.freeze(node.server_id)
            try:
                calls = [
                    asyncio.create_task(client.fetch_metadata(timeout=10)),
                    asyncio.create_task(client.set_cursor("c", "__none__", 0, 3, timeout=10)),
                ]
                await asyncio.sleep(0.5)
                await client.close()
                for call in calls:
                    with pytest.raises(ClientClosedError):
                        await call
                    assert not call.cancelled()
                other = AsyncLiftbridgeClient(server.brokers)
                cancelled = asyncio.create_task(other.fetch_metadata(timeout=10))
                await asyncio.sleep(0.5)
                cancelled.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await cancelled
                await other.close()
            finally:
                server.thaw(node.server_id)

        asyncio.run(scenario())
