"""A watcher's events for the activity stream (``value_format="activity"``): the decoded change as JSON.

Apart from the pure watcher logic (:mod:`liftbridge_provider.core.watching`)
because decoding an ``__activity`` message takes the client's protobuf
(:func:`~liftbridge_provider.client.activity.decode_activity`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from liftbridge_provider.client.activity import OPS, decode_activity
from liftbridge_provider.client.messages import Message
from liftbridge_provider.core.errors import InvalidArgumentError


def activity_payload(message: Message, ops: Sequence[str] | None) -> dict[str, Any] | None:
    """The JSON event for one message of ``__activity``: where it is and the decoded change (``activity``:
    the fields of :class:`~liftbridge_provider.client.ActivityEvent`); None for an op not in ``ops``."""
    event = decode_activity(message)
    if ops is not None and event.op not in ops:
        return None
    activity = asdict(event)
    activity["partitions"], activity["streams"] = list(event.partitions), list(event.streams)
    return {"stream": message.stream, "partition": message.partition, "offset": message.offset, "activity": activity}


def check_activity_ops(ops: object) -> tuple[str, ...] | None:
    """None, or a list of activity op names (``OPS``), each known."""
    if ops is None:
        return None
    if isinstance(ops, str) or not isinstance(ops, Sequence) or not ops:
        raise InvalidArgumentError(f"activity_ops must be a non-empty list of {sorted(OPS.values())}, got {ops!r}")
    unknown = [op for op in ops if op not in OPS.values()]
    if unknown:
        raise InvalidArgumentError(f"unknown activity op(s) {unknown}; known: {sorted(OPS.values())}")
    return tuple(ops)
