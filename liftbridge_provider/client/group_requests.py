"""Consumer group requests and argument checks, shared by the sync and asyncio consumers (no I/O)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client import requests as build
from liftbridge_provider.client.groups import Membership, Partition
from liftbridge_provider.client.messages import StartPosition
from liftbridge_provider.core import checks
from liftbridge_provider.core.checks import check_seconds
from liftbridge_provider.core.errors import InvalidArgumentError

AutoOffset = Literal["earliest", "latest", "none"]
AUTO_OFFSETS = ("earliest", "latest", "none")


def check_consumer(
    group_id: object,
    consumer_id: object,
    *,
    auto_offset: object,
    auto_checkpoint: object,
    fetch_assignments_interval: object,
    read: object,
) -> None:
    """Refuse a bad consumer setting before anything is sent (InvalidArgumentError naming it)."""
    checks.check_flag(read, "read")
    if not isinstance(group_id, str) or not group_id or "," in group_id:
        raise InvalidArgumentError(f"group_id must be a non-empty string without commas, got {group_id!r}")
    if consumer_id is not None and (not isinstance(consumer_id, str) or not consumer_id):
        raise InvalidArgumentError(f"consumer_id must be a non-empty string or None, got {consumer_id!r}")
    if auto_offset not in AUTO_OFFSETS:
        raise InvalidArgumentError(f"auto_offset must be one of {', '.join(AUTO_OFFSETS)}, got {auto_offset!r}")
    if auto_checkpoint is not None:
        check_seconds("auto_checkpoint", auto_checkpoint)
    if fetch_assignments_interval is not None:
        check_seconds("fetch_assignments_interval", fetch_assignments_interval)


def check_subscribe(streams: Sequence[str], already: bool, *, closed: bool) -> tuple[str, ...]:
    """The streams a member subscribes to (at least one, valid names, once per consumer, not after close)."""
    names = tuple(checks.check_stream_names(streams))
    if not names:
        raise InvalidArgumentError("give at least one stream")
    if closed:
        raise InvalidArgumentError("this consumer is closed; create another to join the group again")
    if already:
        raise InvalidArgumentError("this consumer has subscribed already; create another for other streams")
    return names


def join(membership: Membership) -> api.JoinConsumerGroupRequest:
    return api.JoinConsumerGroupRequest(
        groupId=membership.group_id, consumerId=membership.consumer_id, streams=list(membership.streams)
    )


def leave(membership: Membership) -> api.LeaveConsumerGroupRequest:
    return api.LeaveConsumerGroupRequest(groupId=membership.group_id, consumerId=membership.consumer_id)


def fetch_assignments(membership: Membership) -> api.FetchConsumerGroupAssignmentsRequest:
    return api.FetchConsumerGroupAssignmentsRequest(
        groupId=membership.group_id, consumerId=membership.consumer_id, epoch=membership.epoch
    )


def report_coordinator(membership: Membership) -> api.ReportConsumerGroupCoordinatorRequest:
    return api.ReportConsumerGroupCoordinatorRequest(
        groupId=membership.group_id,
        consumerId=membership.consumer_id,
        coordinator=membership.coordinator or "",
        epoch=membership.epoch,
    )


def group_metadata(membership: Membership) -> api.FetchMetadataRequest:
    return api.FetchMetadataRequest(groups=[membership.group_id])


def learn_group(membership: Membership, response: api.FetchMetadataResponse) -> None:
    """Tell the membership what the metadata says of its group (coordinator and epoch)."""
    for group in response.groupMetadata:
        if group.groupId == membership.group_id and group.error == api.ConsumerGroupMetadata.OK:
            membership.on_group_metadata(group.coordinator, group.epoch)


def assignments_of(response: api.FetchConsumerGroupAssignmentsResponse) -> dict[str, list[int]]:
    return {a.stream: list(a.partitions) for a in response.assignments}


def subscribe_as_member(
    membership: Membership, partition: Partition, start: StartPosition, epoch: int
) -> api.SubscribeRequest:
    """A subscription that carries the member and the epoch (the server refuses an outdated one)."""
    request = build.subscribe_request(partition[0], partition[1], start, None)
    request.consumer.CopyFrom(
        api.Consumer(groupId=membership.group_id, groupEpoch=epoch, consumerId=membership.consumer_id)
    )
    return request
