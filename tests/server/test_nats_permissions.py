"""publish_batch over NATS when NATS denies this client a subject, against a real node whose embedded NATS
server has users with permissions.

A NATS server answers a publish to a subject the user may not publish to with a "permissions violation"
error and drops the message; the connection stays up. Before, the batch kept sending to the denied
subject and every such message ended ``ack_wait`` (5 s) later as ``AckTimeoutError(may_be_stored=True)``,
although none of them could have been stored. A denied subscription to the ack inbox left every message
waiting for an ack that could not come.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from liftbridge_provider.client import (
    BatchResult,
    LiftbridgeClient,
    NatsConfig,
    PermissionDeniedError,
    PublishMessage,
)
from liftbridge_provider.devserver import DevServer, start_single

NATS_USERS = """
authorization {
  users = [
    {user: liftbridge, password: lb-secret}
    {user: limited, password: limited-secret, permissions: {publish: {deny: ["denied.>", "mixed.*.1"]}}}
    {user: deaf, password: deaf-secret, permissions: {subscribe: {deny: ["_INBOX.>"]}}}
  ]
}
"""
ACK_WAIT = 20.0  # far longer than the failures below may take


@pytest.fixture(scope="module")
def guarded() -> Iterator[DevServer]:
    extra = {"nats.user": "liftbridge", "nats.password": "lb-secret"}
    with start_single(extra_config=extra, nats_conf=NATS_USERS) as server:
        yield server


def client_as(server: DevServer, user: str) -> LiftbridgeClient:
    nats = NatsConfig(servers=tuple(server.nats_servers), user=user, password=f"{user}-secret")
    return LiftbridgeClient(server.brokers, nats=nats)


def new_stream(client: LiftbridgeClient, subject: str, partitions: int = 1) -> str:
    name = f"perm-{uuid.uuid4().hex[:8]}"
    client.create_stream(f"{subject}.{name}", name, partitions=partitions)
    for partition in range(partitions):
        client.wait_for_high_watermark(name, partition, -1, timeout=10)
    return name


def fifty_denied(client: LiftbridgeClient, name: str) -> BatchResult:
    """Publish 50 messages to ``name``: every one must fail with PermissionDeniedError, well before ``ACK_WAIT``."""
    started = time.monotonic()
    result = client.publish_batch(
        name, [b"m%d" % i for i in range(50)], ack_wait=ACK_WAIT, timeout=60, raise_on_error=False
    )
    elapsed = time.monotonic() - started
    assert len(result.failures) == 50
    assert all(isinstance(f.error, PermissionDeniedError) for f in result.failures), result.failures[:2]
    assert elapsed < ACK_WAIT / 2, f"the batch took {elapsed:.1f}s: it waited for acks"
    return result


def test_a_denied_subject_fails_its_messages_at_once_as_not_stored(guarded: DevServer) -> None:
    with client_as(guarded, "limited") as client:
        name = new_stream(client, "denied")
        result = fifty_denied(client, name)
        assert not any(f.error.may_be_stored for f in result.failures), "NATS dropped them: none was stored"
        assert client.fetch_partition_metadata(name, 0).newest_offset == -1, "nothing was stored"


def test_only_the_denied_partition_fails_and_the_others_are_acked(guarded: DevServer) -> None:
    """Partition 1 of a stream listens on ``<subject>.1``, and only that subject is denied (``mixed.*.1``):
    its messages fail at once as not stored, partition 0's are all acked, in one batch."""
    with client_as(guarded, "limited") as client:
        name = new_stream(client, "mixed", partitions=2)
        messages = [PublishMessage(b"m%d" % i, partition=i % 2) for i in range(40)]
        result = client.publish_batch(name, messages, ack_wait=ACK_WAIT, timeout=60, raise_on_error=False)
        failed = {f.index for f in result.failures}
        assert failed == set(range(1, 40, 2)), sorted(failed)[:5]
        assert all(isinstance(f.error, PermissionDeniedError) and not f.error.may_be_stored for f in result.failures)
        assert client.fetch_partition_metadata(name, 0).newest_offset == 19, "partition 0's 20 were stored"
        assert client.fetch_partition_metadata(name, 1).newest_offset == -1


def test_a_denied_ack_inbox_ends_the_batch_at_once(guarded: DevServer) -> None:
    """The client may publish but not subscribe to its ack inbox: no ack can come. The batch ends at once,
    every message failed: not sent, or sent and may be stored (NATS took it), never a wait for acks."""
    with client_as(guarded, "deaf") as client:
        name = new_stream(client, "open")
        result = fifty_denied(client, name)
        stored = client.fetch_partition_metadata(name, 0).newest_offset + 1
        claimed = sum(f.error.may_be_stored for f in result.failures)
        assert stored <= claimed, f"{stored} stored, but only {claimed} reported as may be stored"
