"""The activity stream (``__activity``): what happened to the cluster's streams and consumer groups, typed.

A server with ``activity.stream.enabled`` publishes one event per metadata
change (from its Raft log, so each event's ``id`` is that log index) to the
single partition of ``__activity``, as a serialized ``ActivityStreamEvent``.
:func:`decode_activity` turns a received message into an :class:`ActivityEvent`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from google.protobuf.message import DecodeError

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client.errors import EnvelopeError
from liftbridge_provider.client.messages import Message

ACTIVITY_STREAM = "__activity"

OPS = {
    api.CREATE_STREAM: "create_stream",
    api.DELETE_STREAM: "delete_stream",
    api.PAUSE_STREAM: "pause_stream",
    api.RESUME_STREAM: "resume_stream",
    api.SET_STREAM_READONLY: "set_stream_readonly",
    api.JOIN_CONSUMER_GROUP: "join_consumer_group",
    api.LEAVE_CONSUMER_GROUP: "leave_consumer_group",
}
"""Event kinds, as :attr:`ActivityEvent.op` names them."""


@dataclass(frozen=True)
class ActivityEvent:
    """One change: ``op`` (a name of :data:`OPS`), and the fields that kind carries (the others stay empty).

    ``stream`` and ``partitions`` for the stream ops (no partitions: all of
    them); ``resume_all`` (pause), ``readonly`` (set readonly); ``group_id``,
    ``consumer_id``, ``streams`` (join) and ``expired`` (left by timing out) for
    consumer groups. ``id`` is the server's Raft index of the change; ``offset``
    and ``timestamp`` (ns) place it in ``__activity``.
    """

    id: int
    op: str
    offset: int
    timestamp: int
    stream: str | None = None
    partitions: tuple[int, ...] = ()
    resume_all: bool = False
    readonly: bool = False
    group_id: str | None = None
    consumer_id: str | None = None
    streams: tuple[str, ...] = ()
    expired: bool = False


def decode_activity(message: Message) -> ActivityEvent:
    """The event a message of ``__activity`` carries; EnvelopeError if it holds none."""
    event = api.ActivityStreamEvent()
    try:
        event.ParseFromString(message.value)
    except DecodeError as exc:
        raise EnvelopeError(f"__activity offset {message.offset} holds no activity event: {exc}") from exc
    if event.op not in OPS:
        raise EnvelopeError(f"__activity offset {message.offset}: unknown activity op {event.op}")
    base = ActivityEvent(event.id, OPS[event.op], message.offset, message.timestamp)
    if event.op == api.CREATE_STREAM:
        create = event.createStreamOp
        return replace(base, stream=create.stream, partitions=tuple(create.partitions))
    if event.op == api.DELETE_STREAM:
        return replace(base, stream=event.deleteStreamOp.stream)
    if event.op == api.PAUSE_STREAM:
        pause = event.pauseStreamOp
        return replace(base, stream=pause.stream, partitions=tuple(pause.partitions), resume_all=pause.resumeAll)
    if event.op == api.RESUME_STREAM:
        resume = event.resumeStreamOp
        return replace(base, stream=resume.stream, partitions=tuple(resume.partitions))
    if event.op == api.SET_STREAM_READONLY:
        readonly = event.setStreamReadonlyOp
        return replace(base, stream=readonly.stream, partitions=tuple(readonly.partitions), readonly=readonly.readonly)
    if event.op == api.JOIN_CONSUMER_GROUP:
        join = event.joinConsumerGroupOp
        return replace(base, group_id=join.groupId, consumer_id=join.consumerId, streams=tuple(join.streams))
    leave = event.leaveConsumerGroupOp
    return replace(base, group_id=leave.groupId, consumer_id=leave.consumerId, expired=leave.expired)
