"""A running ``publish_batch`` stops sending when its caller stops waiting for it, against a real node.

The batch runs on a private event loop in a thread of its own while the caller waits. Before, a caller
interrupted in that wait (Ctrl-C, or the exception Airflow's SIGTERM handler raises in a task being
killed) left the thread sending the rest of the batch, and ``client.close()`` did not stop it either:
messages went on being stored after the task had ended or the client was closed.
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections.abc import Iterator
from types import FrameType

import pytest

from liftbridge_provider.client import ClientClosedError, LiftbridgeClient, NatsConfig
from liftbridge_provider.devserver import DevServer
from tests.waiting import wait_until

MESSAGES = 400_000  # far more than a node takes in the seconds these tests wait


class Interrupted(Exception):
    """Raised in the main thread by the test's timer, as Airflow's SIGTERM handler raises in a killed task."""


@pytest.fixture(params=["grpc", "nats"])
def batch_client(request: pytest.FixtureRequest, liftbridge_server: DevServer) -> Iterator[LiftbridgeClient]:
    nats = NatsConfig(servers=tuple(liftbridge_server.nats_servers)) if request.param == "nats" else None
    with LiftbridgeClient(liftbridge_server.brokers, nats=nats) as client:
        yield client


def new_stream(client: LiftbridgeClient) -> str:
    name = f"stop-{uuid.uuid4().hex[:10]}"
    client.create_stream(name, name)
    client.wait_for_high_watermark(name, 0, -1, timeout=10)
    return name


def stored(admin: LiftbridgeClient, name: str) -> int:
    return admin.fetch_partition_metadata(name, 0).newest_offset + 1


def assert_no_more_stored(admin: LiftbridgeClient, name: str) -> None:
    """What is stored stops growing within a moment (messages already written may still land) and stays."""
    time.sleep(1.0)
    settled = stored(admin, name)
    time.sleep(2.0)
    assert stored(admin, name) == settled, "the batch went on sending after its caller stopped waiting"
    assert settled < MESSAGES


def test_an_interrupted_caller_stops_its_batch(batch_client: LiftbridgeClient, liftbridge_server: DevServer) -> None:
    assert threading.current_thread() is threading.main_thread(), "signals reach only the main thread"
    name = new_stream(batch_client)
    main = threading.main_thread().ident
    assert main is not None

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise Interrupted()

    def interrupt_once_under_way(admin: LiftbridgeClient) -> None:
        wait_until(lambda: stored(admin, name) > 1000, 60, "the batch to be under way")
        signal.pthread_kill(main, signal.SIGALRM)

    earlier = set(threading.enumerate())  # another module's client may still be ending its own
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        with LiftbridgeClient(liftbridge_server.brokers) as admin:
            watcher = threading.Thread(target=interrupt_once_under_way, args=(admin,))
            watcher.start()
            with pytest.raises(Interrupted):
                batch_client.publish_batch(name, [b"v"] * MESSAGES, timeout=120)
            interrupted = time.monotonic()
            watcher.join(timeout=60)
            assert_no_more_stored(admin, name)
        started = [t for t in threading.enumerate() if t not in earlier]
        assert not [t for t in started if t.name.startswith("liftbridge-publish-")], "a batch lives"
        assert time.monotonic() - interrupted < 15
    finally:
        signal.signal(signal.SIGALRM, previous)


def test_closing_the_client_stops_a_running_batch(liftbridge_server: DevServer, batch_client: LiftbridgeClient) -> None:
    name = new_stream(batch_client)
    outcome: list[BaseException | object] = []

    def publish() -> None:
        try:
            outcome.append(batch_client.publish_batch(name, [b"v"] * MESSAGES, timeout=120))
        except BaseException as exc:  # checked below
            outcome.append(exc)

    worker = threading.Thread(target=publish)
    worker.start()
    with LiftbridgeClient(liftbridge_server.brokers) as admin:
        wait_until(lambda: stored(admin, name) > 1000, 30, "the batch to be under way")
        batch_client.close()
        worker.join(timeout=10)
        assert not worker.is_alive(), "publish_batch did not end after close()"
        (result,) = outcome
        assert isinstance(result, ClientClosedError), result
        assert result.may_be_stored, "messages written before close() may be stored"
        assert_no_more_stored(admin, name)
