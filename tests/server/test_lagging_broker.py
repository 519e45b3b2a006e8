"""A broker behind the metadata answers NOT_FOUND for a stream that exists: the client asks again (issue 49).

Right after ``create_stream`` a broker that has not applied the creation yet refused a publish as an unknown
stream (CI 2026-12-07), and right after a killed partition leader restarted, the node asked for the high
watermark had not loaded the partition yet (the soak's 5 ``read_slice`` failures). The client raised
NoSuchStreamError / NoSuchPartitionError although its fresh metadata listed both. The rule
(``client/retry.after_unknown``): fresh metadata that lists the stream and partition makes a NOT_FOUND a
broker that has not caught up, asked again within the call's deadline (a LiftbridgeTimeoutError naming the
refusal when it ends); metadata that does not list them makes the stream missing, raised at once.

The lag is made exact with a real node behind the fault proxy: it renames the stream in the client's next
requests to a name of the same length that the node does not know, so the real server answers NOT_FOUND,
the way a lagging broker does; the metadata requests of the client name no stream, so they still list it.
The last test tries the real race on a three-node cluster, bounded.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from liftbridge_provider.client import LiftbridgeClient, LiftbridgeTimeoutError, NatsConfig, NoSuchStreamError
from liftbridge_provider.client.messages import StartPosition, StopPosition
from liftbridge_provider.client.publish.batch_result import BatchResult
from liftbridge_provider.devserver import DevServer, start_cluster
from liftbridge_provider.devserver.proxy import FaultProxy

pytestmark = pytest.mark.server


@pytest.fixture
def proxy(liftbridge_server: DevServer) -> Iterator[FaultProxy]:
    with FaultProxy(liftbridge_server.brokers[0]) as running:
        yield running


@pytest.fixture
def via(proxy: FaultProxy) -> Iterator[LiftbridgeClient]:
    """A client that reaches the node only through the proxy."""
    with LiftbridgeClient(proxy.address, address_resolver=lambda host, port: proxy.address) as proxied:
        yield proxied


def new_stream(client: LiftbridgeClient, via: LiftbridgeClient) -> tuple[str, bytes]:
    """A new stream that ``via``'s metadata lists, and a name of the same length that no stream has."""
    name = f"lag-{uuid.uuid4().hex[:10]}"
    client.create_stream(f"lag.subject.{name[4:]}", name)
    via.fetch_metadata()
    return name, f"gal-{name[4:]}".encode()


def stored(client: LiftbridgeClient, stream: str) -> list[bytes]:
    """Every value partition 0 of ``stream`` holds, in offset order."""
    high = client.fetch_partition_metadata(stream, 0).high_watermark
    return [m.value for m in client.read_range(stream, 0, 0, high + 1, timeout=30)]


@pytest.mark.parametrize("ack_policy", ["leader", "none"], ids=["shared-streams", "unary"])
def test_a_publish_refused_as_an_unknown_stream_that_the_metadata_lists_goes_again_and_is_stored_once(
    client: LiftbridgeClient, via: LiftbridgeClient, proxy: FaultProxy, ack_policy: str
) -> None:
    """The first two publishes reach a node that answers "no such stream" (nothing stored): the client asks
    again, as its metadata lists the stream, and the third is stored, once. Before the fix: NoSuchStreamError."""
    stream, unknown = new_stream(client, via)
    proxy.rename_in_requests(stream.encode(), unknown, times=2)
    via.publish(stream, b"once", ack_policy=ack_policy, timeout=10)
    assert proxy.renamed == 2, "both refusals reached the node"
    deadline = time.monotonic() + 10
    while client.fetch_partition_metadata(stream, 0).high_watermark < 0 and time.monotonic() < deadline:
        time.sleep(0.05)  # ack policy NONE: nothing to wait on but the partition
    assert stored(client, stream) == [b"once"], "stored exactly once: the refusals stored nothing"


def test_partition_calls_and_reads_refused_as_unknown_ask_again(
    client: LiftbridgeClient, via: LiftbridgeClient, proxy: FaultProxy
) -> None:
    """The high-watermark check of a read (FetchPartitionMetadata on the leader) and a Subscribe, each refused
    twice as unknown by a node behind the metadata, answer once it catches up (the soak's read_slice failure).
    Before the fix: NoSuchPartitionError / NoSuchStreamError at once."""
    stream, unknown = new_stream(client, via)
    for index in range(3):
        client.publish(stream, b"m%d" % index, ack_policy="all", timeout=10)
    proxy.rename_in_requests(stream.encode(), unknown, times=2)
    assert via.fetch_partition_metadata(stream, 0, timeout=10).high_watermark == 2
    assert proxy.renamed == 2
    proxy.rename_in_requests(stream.encode(), unknown, times=2)
    assert [m.value for m in via.read_range(stream, 0, 0, 3, timeout=10)] == [b"m0", b"m1", b"m2"]
    proxy.rename_in_requests(stream.encode(), unknown, times=2)
    read = via.subscribe(stream, start=StartPosition.earliest(), stop=StopPosition.at_offset(2), timeout=10)
    assert [m.value for m in read] == [b"m0", b"m1", b"m2"], "the Subscribe refused twice was opened again"
    assert proxy.renamed == 4 + 2


def test_a_stream_missing_from_the_metadata_too_still_fails_at_once(
    client: LiftbridgeClient, via: LiftbridgeClient
) -> None:
    """A stream deleted after the client cached it: the node's NOT_FOUND, confirmed by fresh metadata, raises
    NoSuchStreamError within a second or two, not at the deadline (bad input never becomes a timeout)."""
    stream, _ = new_stream(client, via)
    client.delete_stream(stream)
    for call in (
        lambda: via.publish(stream, b"x", timeout=30),
        lambda: via.publish(stream, b"x", ack_policy="none", timeout=30),
        lambda: via.fetch_partition_metadata(stream, 0, timeout=30),
    ):
        via.fetch_metadata()  # a stale cache would fail before sending; this asks the node itself
        started = time.monotonic()
        with pytest.raises(NoSuchStreamError):
            call()
        assert time.monotonic() - started < 5, "failed fast, not at the 30 s deadline"


def test_brokers_that_keep_refusing_what_the_metadata_lists_end_by_the_deadline_with_a_timeout(
    client: LiftbridgeClient, via: LiftbridgeClient, proxy: FaultProxy
) -> None:
    """A node that never catches up: the call ends by its deadline with LiftbridgeTimeoutError (transient,
    unlike NoSuchStreamError) naming the refusal; a publish says nothing was stored."""
    stream, unknown = new_stream(client, via)
    proxy.rename_in_requests(stream.encode(), unknown, times=10**6)
    for policy in ("leader", "none"):
        started = time.monotonic()
        with pytest.raises(LiftbridgeTimeoutError, match="unknown") as caught:
            via.publish(stream, b"x", ack_policy=policy, timeout=2)
        assert time.monotonic() - started < 4
        assert caught.value.may_be_stored is False
    started = time.monotonic()
    with pytest.raises(LiftbridgeTimeoutError, match="unknown"):
        via.fetch_partition_metadata(stream, 0, timeout=2)
    assert time.monotonic() - started < 4
    proxy.rename_in_requests(stream.encode(), unknown, times=0)
    assert stored(client, stream) == [], "no refused publish was stored"


def test_a_batch_refused_as_an_unknown_stream_that_the_metadata_lists_goes_again_in_order_and_is_stored_once(
    client: LiftbridgeClient, via: LiftbridgeClient, proxy: FaultProxy
) -> None:
    """publish_batch over the pipelined HTTP/2 call: the node refuses the first writes of the batch as an
    unknown stream (nothing stored); the messages are held, the metadata lists the stream, so they go again
    and the whole batch is stored once, in order. Before the fix: NoSuchStreamError for the refused ones."""
    stream, unknown = new_stream(client, via)
    values = [b"b%02d" % index for index in range(30)]
    proxy.rename_in_requests(stream.encode(), unknown, times=2)
    result = via.publish_batch(stream, values, window=10, timeout=15, raise_on_error=False)
    assert proxy.renamed == 2, "both refused writes reached the node"
    assert result.ok, [f"#{f.index}: {f.error!r}" for f in result.failures]
    assert [ack.offset for ack in result.acks if ack is not None] == list(range(30)), "acked in input order"
    assert stored(client, stream) == values, "each message stored once, in the batch's order"


def test_a_batch_that_brokers_keep_refusing_as_unknown_ends_by_its_deadline_with_a_timeout(
    client: LiftbridgeClient, via: LiftbridgeClient, proxy: FaultProxy
) -> None:
    """A node that never catches up: publish_batch sends the refused messages again until the batch's
    deadline, then each ends in LiftbridgeTimeoutError naming the refusal, not stored (may_be_stored=False),
    and nothing is stored. The one exception allowed: the message sent again alone (PublishWindow's probing)
    may still await its answer when the deadline comes (sent with the last 50 ms to spare, its refusal late on a
    loaded machine: CI); it then truthfully says it may be stored."""
    stream, unknown = new_stream(client, via)
    proxy.rename_in_requests(stream.encode(), unknown, times=10**6)
    started = time.monotonic()
    result: BatchResult = via.publish_batch(stream, [b"x"] * 5, timeout=3, raise_on_error=False)
    assert 2 < time.monotonic() - started < 6, "asked again until the 3 s deadline, not past it"
    assert proxy.renamed > 1, "sent again while the metadata lists the stream"
    assert [f.index for f in result.failures] == list(range(5))
    in_flight = [f for f in result.failures if "batch deadline" in f.error.message and f.may_be_stored]
    assert len(in_flight) <= 1, f"more than the one probe awaited its answer at the deadline: {in_flight}"
    for failure in result.failures:
        assert isinstance(failure.error, LiftbridgeTimeoutError), repr(failure.error)
        if failure not in in_flight:
            assert "unknown" in failure.error.message
            assert failure.may_be_stored is False, "a refusal stored nothing"
    proxy.rename_in_requests(stream.encode(), unknown, times=0)
    assert stored(client, stream) == [], "no refused publish was stored"


def test_a_batch_to_a_stream_missing_from_the_metadata_too_still_fails_at_once(
    client: LiftbridgeClient, via: LiftbridgeClient
) -> None:
    """A stream deleted after ``via`` cached it (so the batch is sent): publish_batch's NOT_FOUND refusals,
    confirmed by fresh metadata, fail every message with NoSuchStreamError (not stored) within a second or two,
    not at the batch's 30 s deadline."""
    stream, _ = new_stream(client, via)
    client.delete_stream(stream)
    started = time.monotonic()
    result = via.publish_batch(stream, [b"x"] * 50, window=8, timeout=30, raise_on_error=False)
    assert time.monotonic() - started < 5, "failed fast, not at the 30 s deadline"
    assert [f.index for f in result.failures] == list(range(50))
    for failure in result.failures:
        assert isinstance(failure.error, NoSuchStreamError), repr(failure.error)
        assert failure.may_be_stored is False


@pytest.fixture(scope="module")
def cluster() -> Iterator[DevServer]:
    with start_cluster(size=3) as started:
        yield started


def test_a_nats_batch_whose_metadata_answer_does_not_list_the_stream_yet_asks_again(
    client: LiftbridgeClient, liftbridge_server: DevServer, proxy: FaultProxy
) -> None:
    """publish_batch over NATS asks fresh metadata for the partitions' subjects; a broker behind (the soak of
    2026-12-07: one restarted by a failover) answers without the stream. That answer is asked again, 0.2 s
    later, before the stream counts as missing: the batch is stored once. Before the fix: NoSuchStreamError at
    once, nothing sent, for a stream that exists."""
    nats = NatsConfig(servers=tuple(liftbridge_server.nats_servers))
    with LiftbridgeClient(proxy.address, address_resolver=lambda host, port: proxy.address, nats=nats) as over_nats:
        stream, unknown = new_stream(client, over_nats)
        values = [b"n%02d" % index for index in range(20)]
        proxy.rename_in_requests(stream.encode(), unknown, times=1)  # the batch's metadata request
        result = over_nats.publish_batch(stream, values, window=10, timeout=15, raise_on_error=False)
        assert proxy.renamed == 1, "the metadata request reached the node renamed"
    assert result.ok, [f"#{f.index}: {f.error!r}" for f in result.failures]
    assert stored(client, stream) == values, "each message stored once, in the batch's order"


def test_a_nats_batch_to_a_stream_missing_from_the_metadata_still_fails_at_once(
    liftbridge_server: DevServer,
) -> None:
    """The other side of the rule: a stream no answer lists is missing, NoSuchStreamError within a second."""
    nats = NatsConfig(servers=tuple(liftbridge_server.nats_servers))
    with LiftbridgeClient(liftbridge_server.brokers, nats=nats) as over_nats:
        started = time.monotonic()
        with pytest.raises(NoSuchStreamError):
            over_nats.publish_batch(f"none-{uuid.uuid4().hex[:8]}", [b"x"], timeout=15)
        assert time.monotonic() - started < 2


def test_calls_right_after_create_stream_on_a_cluster_find_the_stream(cluster: DevServer) -> None:
    """The real race, bounded: 15 streams, each created and then at once published to, its high watermark
    asked, read and a cursor set, on a 3-node cluster whose brokers apply the creation a moment apart. No call
    may fail as if the stream did not exist (CI 2026-12-07 saw a publish refused so)."""
    with LiftbridgeClient(cluster.brokers) as client:
        for round_ in range(15):
            stream = f"race-{round_}-{uuid.uuid4().hex[:6]}"
            client.create_stream(f"race.{stream[5:]}", stream, replication_factor=3)
            assert client.publish(stream, b"first", ack_policy="all", timeout=15) is not None
            assert client.fetch_partition_metadata(stream, 0, timeout=15).high_watermark >= 0
            assert [m.value for m in client.read_range(stream, 0, 0, 1, timeout=15)] == [b"first"]
            client.set_cursor("race", stream, 0, 0, timeout=15)
