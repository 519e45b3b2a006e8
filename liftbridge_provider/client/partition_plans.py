"""Partition metadata as plans without I/O: from the leader, paused partitions too, and settling one that
paused while its leader held offsets above the high watermark (see :func:`unsettled`)."""

from __future__ import annotations

from typing import Any

import grpc

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client.errors import NoSuchStreamError, PermissionDeniedError
from liftbridge_provider.client.metadata import Metadata, PartitionInfo, metadata_from_response
from liftbridge_provider.client.options import ClientConfig
from liftbridge_provider.client.plans import (
    Attempt,
    KeptVote,
    Plan,
    Rpc,
    Sleep,
    any_broker,
    leader_call,
    refreshed,
)
from liftbridge_provider.client.retry import Deadline
from liftbridge_provider.core.errors import InvalidArgumentError, LiftbridgeError, NoSuchPartitionError


def partition_metadata(
    config: ClientConfig,
    snapshot: Metadata,
    deadline: Deadline,
    stream: str,
    partition: int,
    *,
    settle: bool = True,
    agreed: KeptVote | None = None,
) -> Plan[PartitionInfo]:
    """Authoritative partition metadata from the leader; for a paused partition, the leader's metadata view.

    A paused partition refuses FetchPartitionMetadata, but its high watermark is
    known: no message arrives while it is paused (a publish resumes it). The
    leader's FetchMetadata answer carries it, from the leader's own log, and
    asking for it does not resume the partition, unless it is unsettled (see
    :func:`unsettled`) and ``settle`` is on: then :func:`settled` resumes it.
    """
    request = api.FetchPartitionMetadataRequest(stream=stream, partition=partition)

    def fetch(stub: Any, timeout: float) -> Any:
        return stub.FetchPartitionMetadata(request, timeout=timeout)

    def from_leader_view(address: str) -> Plan[PartitionInfo]:
        view = yield from leader_view(config, snapshot, deadline, stream, address)
        return view.partition(stream, partition)

    response = yield from leader_call(
        config,
        snapshot,
        fetch,
        deadline,
        stream=stream,
        partition=partition,
        agreed=agreed,
        when_paused=from_leader_view,
    )
    if not isinstance(response, PartitionInfo):
        return PartitionInfo.from_proto(stream, response.metadata)
    if settle and unsettled(response):
        return (yield from settled(config, snapshot, deadline, response))
    return response


SETTLE_WAIT = 5.0
"""Seconds, at most, a call waits for a leader to commit what it holds after resuming a partition."""
SETTLE_POLL = 0.1  # seconds between high watermark checks while settling
RESUME_RETRY = 0.25  # seconds before a failed resume is tried again while settling


def unsettled(info: PartitionInfo) -> bool:
    """Paused while its leader held offsets above the high watermark.

    A leader's high watermark moves only while its partition runs. A partition
    that pauses right after a failover, before the new leader saw its followers
    catch up, keeps acked offsets hidden until it runs again, which for an idle
    partition can be never (newest offsets that were never acked look the same).
    """
    return info.paused and info.newest_offset > info.high_watermark


def settled(config: ClientConfig, snapshot: Metadata, deadline: Deadline, paused: PartitionInfo) -> Plan[PartitionInfo]:
    """Resume an unsettled partition and wait (at most :data:`SETTLE_WAIT` s) until its leader commits what it held.

    Returns the last metadata seen, settled or not (offsets never acked may stay
    above the high watermark); a partition that cannot be resumed in time
    answers as it was.
    """
    stream, partition = paused.stream, paused.id
    wait = Deadline(min(deadline.remaining(), SETTLE_WAIT))
    snapshot = yield from refreshed(wait, snapshot, (stream,))
    while True:
        try:
            yield from leader_call(
                config, snapshot, resume_rpc(stream, partition), wait, stream=stream, partition=partition
            )
            break
        except (PermissionDeniedError, InvalidArgumentError, NoSuchStreamError, NoSuchPartitionError):
            return paused  # this client may not subscribe here, or the partition went: nothing to settle
        except LiftbridgeError:  # e.g. "no responders": the metadata leader that applies a resume is changing
            if wait.remaining() <= RESUME_RETRY:
                return paused
            yield Sleep(RESUME_RETRY)
    latest = yield from committed(config, snapshot, wait, stream, partition, target=paused.newest_offset, seen=paused)
    return latest or paused


def committed(
    config: ClientConfig,
    snapshot: Metadata,
    wait: Deadline,
    stream: str,
    partition: int,
    *,
    target: int | None = None,
    seen: PartitionInfo | None = None,
    agreed: KeptVote | None = None,
) -> Plan[PartitionInfo | None]:
    """Ask the leader (``agreed``: see :func:`leader_call`) every :data:`SETTLE_POLL` s until the high watermark
    reaches ``target`` (default: the newest offset of each answer), ``wait`` runs out or no leader answers;
    the last answer (or ``seen``)."""
    while True:
        if seen is not None:
            if seen.high_watermark >= (seen.newest_offset if target is None else target):
                return seen
            if wait.remaining() <= SETTLE_POLL:
                return seen
            yield Sleep(SETTLE_POLL)
        try:
            seen = yield from partition_metadata(config, snapshot, wait, stream, partition, settle=False, agreed=agreed)
        except LiftbridgeError:
            return seen


def resume_rpc(stream: str, partition: int) -> Rpc:
    """Subscribe with ``resume`` (the server resumes a paused partition first), then cancel at once.

    The server's first message is an empty one that confirms the subscription.
    """
    request = api.SubscribeRequest(stream=stream, partition=partition, resume=True)

    def rpc(stub: Any, timeout: float) -> Any:
        call = stub.Subscribe(request, timeout=timeout)
        if isinstance(call, grpc.aio.Call):
            return _first_then_cancel(call)
        try:
            return next(call)
        finally:
            call.cancel()

    return rpc


async def _first_then_cancel(call: Any) -> Any:
    try:
        return await call.read()
    finally:
        call.cancel()


def running(config: ClientConfig, snapshot: Metadata, deadline: Deadline, stream: str, partition: int) -> Plan[Any]:
    """FetchPartitionMetadata on the leader: PartitionPausedError if the partition is paused (its metadata flag
    sticks after a resume, and a paused partition's leader refuses the call)."""
    request = api.FetchPartitionMetadataRequest(stream=stream, partition=partition)

    def fetch(stub: Any, timeout: float) -> Any:
        return stub.FetchPartitionMetadata(request, timeout=timeout)

    return (yield from leader_call(config, snapshot, fetch, deadline, stream=stream, partition=partition))


def leader_view(
    config: ClientConfig, snapshot: Metadata, deadline: Deadline, stream: str, address: str
) -> Plan[Metadata]:
    """The stream's metadata as the broker at ``address`` sees it (any broker's, if that one does not answer)."""
    request = api.FetchMetadataRequest(streams=[stream])

    def fetch(stub: Any, timeout: float) -> Any:
        return stub.FetchMetadata(request, timeout=timeout)

    try:
        response = yield Attempt(address, deadline.attempt_budget(), fetch)
    except grpc.RpcError:
        response = yield from any_broker(config, snapshot, fetch, deadline, stream=stream)
    view = metadata_from_response(response, snapshot, [stream])
    view.stream(stream)
    return view
