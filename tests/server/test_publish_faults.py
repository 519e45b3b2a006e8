"""Publishes end by a bound and tell the truth about what may be stored, on one real node behind a fault proxy.

Each test failed against the client before the fix it guards (issue 47, "Defects first").
The proxy (``liftbridge_provider.devserver.proxy``) makes the network's faults exact: a broker that
freezes mid-batch (bytes stop both ways, connections stay open) and answers that never come back.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest

from liftbridge_provider.client import LiftbridgeClient, LiftbridgeError
from liftbridge_provider.client.errors import ClientClosedError, ReadonlyPartitionError
from liftbridge_provider.client.h2.call_state import KEEPALIVE_IDLE, KEEPALIVE_TIMEOUT
from liftbridge_provider.client.publish.publisher import CONNECT_TIMEOUT
from liftbridge_provider.devserver import DevServer
from liftbridge_provider.devserver.proxy import FaultProxy
from tests.waiting import wait_until

pytestmark = pytest.mark.server


def new_stream(client: LiftbridgeClient, **options: Any) -> str:
    name = f"pf-{uuid.uuid4().hex[:10]}"
    client.create_stream(name.replace("-", "."), name, **options)
    return name


@pytest.fixture
def proxy(liftbridge_server: DevServer) -> Iterator[FaultProxy]:
    with FaultProxy(liftbridge_server.brokers[0]) as running:
        yield running


@pytest.fixture
def via(proxy: FaultProxy) -> Iterator[LiftbridgeClient]:
    """A client that reaches the broker only through the proxy."""
    with LiftbridgeClient(proxy.address, address_resolver=lambda host, port: proxy.address) as proxied:
        proxied.fetch_metadata()
        yield proxied


def value(index: int) -> bytes:
    """Message ``index``'s value: 100 bytes that name it, so the proxy can spot the request that carries it."""
    return f"<msg-{index:06d}>".encode().ljust(100, b".")


def stored_indices(client: LiftbridgeClient, stream: str) -> list[int]:
    """The message numbers the partition holds, in offset order (duplicates kept)."""
    high = client.fetch_partition_metadata(stream, 0).high_watermark
    return [int(m.value[5:11]) for m in client.read_range(stream, 0, 0, high + 1, timeout=60)]


def holds(client: LiftbridgeClient, stream: str, offset: int) -> bool:
    """Partition 0 of ``stream`` has committed ``offset``."""
    return bool(client.fetch_partition_metadata(stream, 0).high_watermark >= offset)


def run_bounded(call: Any, limit: float) -> Any:
    """``call()`` in a thread: its result, or its error raised here; the test fails if it runs past ``limit`` s."""
    outcome: list[tuple[str, Any]] = []

    def run() -> None:
        try:
            outcome.append(("ok", call()))
        except BaseException as exc:  # handed to the test thread
            outcome.append(("error", exc))

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(limit)
    assert not worker.is_alive(), f"the call was still running after {limit:g}s"
    kind, result = outcome[0]
    if kind == "error":
        raise result
    return result


# A frozen call is given up within KEEPALIVE_IDLE + KEEPALIVE_TIMEOUT of the broker's last frame; a second
# connection then waits at most CONNECT_TIMEOUT for the broker's settings. The tests thaw the proxy once the
# client reconnects, so the whole batch must end well within this.
FROZEN_BOUND = KEEPALIVE_IDLE + KEEPALIVE_TIMEOUT + CONNECT_TIMEOUT + 30


@pytest.mark.parametrize("policy", ["leader", "none"])
def test_batch_to_a_broker_frozen_mid_batch_ends_and_lands_each_message_once(
    client: LiftbridgeClient, via: LiftbridgeClient, proxy: FaultProxy, policy: str
) -> None:
    """A batch over the client's own HTTP/2 call hung forever when its broker froze mid-batch with the default
    arguments (no timeout): with acks, once its write buffer was full nothing more was taken and nothing
    expired it; with ack policy NONE it waited for the server to end the call. Keepalive PINGs now find the
    frozen broker; the batch goes on over a new connection once the broker answers again, and every
    message ends acked (or, with NONE, sent and confirmed), or failed saying whether it may be stored."""
    stream = new_stream(client)
    count = 20_000
    proxy.blackhole_when_client_sends(b"<msg-002000>")  # the broker freezes once message 2,000 is on the wire
    thawed = threading.Event()
    connections = proxy.accepted + 1  # the batch's own connection comes next

    def thaw_on_reconnect() -> None:  # the broker answers again only once the client gave up the frozen call
        wait_until(lambda: proxy.accepted > connections, FROZEN_BOUND, "the client to reconnect")
        proxy.blackhole(False)
        thawed.set()

    threading.Thread(target=thaw_on_reconnect, daemon=True).start()
    started = time.monotonic()
    result = run_bounded(
        lambda: via.publish_batch(
            stream, [value(i) for i in range(count)], ack_policy=policy, window=count, raise_on_error=False
        ),
        FROZEN_BOUND,
    )
    assert thawed.is_set(), "the batch ended without reconnecting"
    elapsed = time.monotonic() - started
    assert elapsed < FROZEN_BOUND
    failed = {f.index: f.error for f in result.failures}
    assert len(result.acks) == count
    if policy == "leader":
        assert all((ack is None) == (i in failed) for i, ack in enumerate(result.acks))
    assert failed, "the frozen call lost messages that may be stored: they must be reported"
    wait_until(
        lambda: client.fetch_partition_metadata(stream, 0).high_watermark >= count - len(failed) - 1,
        30,
        "the delivered messages to be committed",
    )
    time.sleep(1)  # what the frozen connection still carried is applied by now, if it ever is
    stored = stored_indices(client, stream)
    assert len(stored) == len(set(stored)), "a message was stored twice"
    for index in set(stored) - failed.keys():
        assert 0 <= index < count
    not_stored_but_ok = set(range(count)) - failed.keys() - set(stored)
    assert not not_stored_but_ok, f"{len(not_stored_but_ok)} messages reported sent were lost"
    stored_but_said_not = {i for i in stored if i in failed and not failed[i].may_be_stored}
    assert not stored_but_said_not, f"{len(stored_but_said_not)} stored messages were reported as not stored"


def test_batch_none_waiting_on_a_frozen_broker_does_not_spin(
    client: LiftbridgeClient, via: LiftbridgeClient, proxy: FaultProxy
) -> None:
    """With ack policy NONE a batch waits for the server to end the call; once a response had completed the
    batch's 'finished' future, each turn of that wait returned at once and the loop spun at full CPU.
    Now the wait costs next to nothing until the deadline (or the keepalive) ends it."""
    stream = new_stream(client)
    client.set_stream_readonly(stream)  # every message is refused: the refusals complete the batch early
    wait_until(lambda: via.fetch_metadata([stream]).stream(stream).partition(0).readonly, 10, "readonly")
    # 19 small messages, then one larger than the broker's first flow-control window: its tail and the end of
    # the stream wait for the broker, which freezes as its first refusal leaves
    messages = [value(i) for i in range(19)] + [value(19).ljust(300_000, b".")]
    proxy.blackhole_when_server_sends(b"readonly")
    cpu_before = time.process_time()
    with pytest.raises(LiftbridgeError):
        run_bounded(lambda: via.publish_batch(stream, messages, ack_policy="none", timeout=8), 30)
    cpu = time.process_time() - cpu_before
    assert cpu < 2, f"the batch's wait used {cpu:.1f}s of CPU in 8s"


def test_batch_none_reports_the_servers_refusals(client: LiftbridgeClient) -> None:
    """publish_batch with ack policy NONE over gRPC reported success for messages the server refused (they
    were never 'in flight', so the refusal was dropped): on a readonly partition 20 of 20 'succeeded' and
    none was stored. A single publish with NONE raises, and the batch now agrees."""
    stream = new_stream(client)
    client.set_stream_readonly(stream)
    wait_until(lambda: client.fetch_metadata([stream]).stream(stream).partition(0).readonly, 10, "readonly")
    result = client.publish_batch(stream, [value(i) for i in range(20)], ack_policy="none", raise_on_error=False)
    assert [f.index for f in result.failures] == list(range(20))
    for failure in result.failures:
        assert isinstance(failure.error, ReadonlyPartitionError)
        assert not failure.may_be_stored
    with pytest.raises(ReadonlyPartitionError):
        client.publish(stream, b"single", ack_policy="none")


@pytest.mark.parametrize("how", ["correlation_id", "ack_inbox", "publish_to_subject"])
def test_unary_publish_interrupted_by_close_may_be_stored(
    client: LiftbridgeClient, via: LiftbridgeClient, proxy: FaultProxy, how: str
) -> None:
    """A unary publish cut short by ``client.close()`` raised a plain error with ``may_be_stored=False`` although
    the server had stored the message, so a caller's retry stored it twice."""
    stream = new_stream(client)
    via.fetch_metadata([stream])  # the publish needs no answer from the broker before it sends
    proxy.hold_responses()  # the request reaches the server, its answer never reaches the client
    errors: list[BaseException] = []

    def publish() -> None:
        try:
            if how == "publish_to_subject":
                via.publish_to_subject(stream.replace("-", "."), value(0), ack_policy="all", timeout=60)
            elif how == "ack_inbox":
                via.publish(stream, value(0), ack_policy="all", ack_inbox=f"inbox.{uuid.uuid4().hex}", timeout=60)
            else:
                via.publish(stream, value(0), ack_policy="all", correlation_id="c-1", timeout=60)
        except BaseException as exc:  # the test thread looks at it
            errors.append(exc)

    worker = threading.Thread(target=publish, daemon=True)
    worker.start()
    wait_until(lambda: client.fetch_partition_metadata(stream, 0).high_watermark == 0, 20, "the message stored")
    via.close()
    worker.join(20)
    assert not worker.is_alive(), "the publish did not end when the client closed"
    assert len(errors) == 1, errors
    assert isinstance(errors[0], LiftbridgeError), errors
    assert errors[0].may_be_stored, f"a stored message was reported as not stored: {errors[0]!r}"


def test_batch_closed_between_streams_may_be_stored(client: LiftbridgeClient, proxy: FaultProxy) -> None:
    """``close()`` while a batch backs off between two streams re-raised the worker's 'closed' error with
    ``may_be_stored=False``, although the first stream had carried (and the server stored) messages."""
    stream = new_stream(client)
    for attempt in range(3):  # the close may come before or after the worker notices: either way the same answer
        with LiftbridgeClient(proxy.address, address_resolver=lambda host, port: proxy.address) as proxied:
            proxied.fetch_metadata()
            before = client.fetch_partition_metadata(stream, 0).high_watermark
            proxied.fetch_metadata([stream])
            proxy.hold_responses_when_client_sends(b"<msg-000000>")  # messages are stored, no ack comes back
            outcome: list[BaseException | object] = []

            def publish(target: LiftbridgeClient = proxied, into: list[Any] = outcome) -> None:
                try:
                    into.append(
                        target.publish_batch(stream, [value(i) for i in range(10)], window=5, raise_on_error=False)
                    )
                except BaseException as exc:  # the test thread looks at it
                    into.append(exc)

            worker = threading.Thread(target=publish, daemon=True)
            worker.start()
            wait_until(partial(holds, client, stream, before + 5), 20, "messages of the first stream stored")
            proxy.close_connections()  # the stream breaks: the batch backs off before the next
            time.sleep(0.01 * attempt)
            proxied.close()
            worker.join(20)
            proxy.hold_responses(False)
            assert not worker.is_alive()
            (error,) = outcome
            assert isinstance(error, ClientClosedError), error
            assert error.may_be_stored, "messages the first stream carried were reported as not stored"


def test_messages_that_expire_unwritten_are_not_reported_as_maybe_stored(
    client: LiftbridgeClient, via: LiftbridgeClient, proxy: FaultProxy
) -> None:
    """Messages taken into the window but never written (the frozen broker's flow-control window was full)
    were reported ``may_be_stored=True`` when their ack_wait ran out; nothing of them left the client."""
    stream = new_stream(client)
    count = 20_000
    proxy.blackhole_when_client_sends(b"<msg-000100>")
    result = run_bounded(
        lambda: via.publish_batch(
            stream, [value(i) for i in range(count)], window=count, ack_wait=1, timeout=6, raise_on_error=False
        ),
        30,
    )
    maybe = [f.index for f in result.failures if f.may_be_stored]
    # What the client may write is bounded by the broker's HTTP/2 stream window, 65,535 bytes until the broker
    # reads (grpc-go's initial window), and each message takes over 100 bytes of it.
    assert len(result.failures) == count
    assert maybe, "the messages written before the freeze may be stored"
    assert len(maybe) <= 65_535 // 100, f"{len(maybe)} of {count} reported as possibly stored"
    assert maybe == list(range(len(maybe))), "only a prefix can have been written"
