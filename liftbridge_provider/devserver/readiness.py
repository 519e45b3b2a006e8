"""Real readiness of a Liftbridge cluster, checked through the gRPC API.

An open port is not enough: gRPC serves before a metadata leader exists. A
cluster is ready when every node lists every broker, each partition of the
internal cursor stream has a leader and a replica on every node, and a probe
stream replicated to every node can be created and deleted.

No node is asked for its broker list before every node serves gRPC. A node
answers the server-info survey behind FetchMetadata only once its Raft setup is
done, and it starts serving gRPC after that. A survey that one slow node missed
is cached by the node that ran it for ``metadata.cache.max.age`` (2 minutes by
default), so asking too early would leave that node listing too few brokers
for longer than any readiness wait.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

import grpc

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider._proto import liftbridge_api_pb2_grpc as api_grpc
from liftbridge_provider.client.requests import CURSORS_STREAM

RPC_TIMEOUT = 5.0  # seconds per readiness RPC
SERVING_TIMEOUT = 2.0  # seconds for a node to answer the serving probe
SERVING_PROBE = "lbdev-serving-probe"  # a stream name no test creates


UNFORMED = "knows brokers"
"""What a readiness failure says of a node whose metadata lists fewer brokers than the cluster has."""


class NotReady(Exception):
    """The cluster answered but is not ready yet; the message says why."""


def check_ready(
    addresses: Sequence[str],
    cursor_partitions: int,
    credentials: grpc.ChannelCredentials | None = None,
) -> None:
    """Return when the cluster at ``addresses`` is ready; raise NotReady or grpc.RpcError otherwise."""
    for address in addresses:
        with _channel(address, credentials) as channel:
            _check_serving(api_grpc.APIStub(channel), address)
    for address in addresses:
        with _channel(address, credentials) as channel:
            _check_metadata(api_grpc.APIStub(channel), address, len(addresses), cursor_partitions)
    with _channel(addresses[0], credentials) as channel:
        _probe_create_delete(api_grpc.APIStub(channel), replication=len(addresses))


def _channel(address: str, credentials: grpc.ChannelCredentials | None) -> grpc.Channel:
    if credentials is None:
        return grpc.insecure_channel(address)
    return grpc.secure_channel(address, credentials)


def _check_serving(stub: Any, address: str) -> None:
    """Raise NotReady unless ``address`` answers a call that surveys nobody (a partition's metadata: the node
    answers from its own state, NOT_FOUND for a stream that does not exist)."""
    request = api.FetchPartitionMetadataRequest(stream=SERVING_PROBE, partition=0)
    try:
        stub.FetchPartitionMetadata(request, timeout=SERVING_TIMEOUT)
    except grpc.RpcError as exc:
        if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            raise NotReady(f"{address} does not serve gRPC yet ({exc.code().name})") from exc
        # any other answer (NOT_FOUND, FAILED_PRECONDITION) comes from a serving node


def _check_metadata(stub: Any, address: str, brokers: int, cursor_partitions: int) -> None:
    request = api.FetchMetadataRequest(streams=[CURSORS_STREAM])
    response: api.FetchMetadataResponse = stub.FetchMetadata(request, timeout=RPC_TIMEOUT)
    if len(response.brokers) != brokers:
        seen = sorted(b.id for b in response.brokers)
        raise NotReady(f"{address} {UNFORMED} {seen}, expected {brokers}")
    if cursor_partitions == 0:
        return  # cursors disabled: the server creates no __cursors stream
    cursors = [s for s in response.streamMetadata if s.name == CURSORS_STREAM]
    if not cursors or cursors[0].error != api.StreamMetadata.OK:
        raise NotReady(f"{address} has no {CURSORS_STREAM} stream yet")
    partitions = cursors[0].partitions
    leaders = [p.leader for p in partitions.values() if p.leader]
    if len(partitions) != cursor_partitions or len(leaders) != cursor_partitions:
        raise NotReady(f"{address}: {CURSORS_STREAM} has {len(leaders)}/{cursor_partitions} partition leaders")
    thin = sorted(p.id for p in partitions.values() if len(p.replicas) < brokers)
    if thin:
        raise NotReady(f"{address}: {CURSORS_STREAM} partitions {thin} have fewer than {brokers} replicas")


def _probe_create_delete(stub: Any, replication: int) -> None:
    name = f"lbdev-ready-{secrets.token_hex(4)}"
    request = api.CreateStreamRequest(
        subject=name.replace("-", "."), name=name, partitions=1, replicationFactor=replication
    )
    stub.CreateStream(request, timeout=RPC_TIMEOUT)
    stub.DeleteStream(api.DeleteStreamRequest(name=name), timeout=RPC_TIMEOUT)
