"""Acks of the NATS fast path handed straight from nats-py's protocol parser, without its per-message Msg,
queue and callback task.

nats-py's parser awaits the client's ``_process_msg`` for every MSG; for a
subscription with a callback, that builds a ``Msg``, puts it on the
subscription's ``asyncio.Queue`` and wakes the subscription's task, which
awaits the callback: a large share of the NATS path's client CPU per message
(profile in docs/benchmarks.md). :func:`deliver_directly`
wraps ``_process_msg`` on one client so that the messages of one subscription
go to a plain function instead, on the parser's own turn; every other message
(and any with headers) takes nats-py's way. These are private parts of
nats-py (2.16 has them): without them it returns False and the subscription's
callback keeps working as before.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.aio.subscription import Subscription


def deliver_directly(client: NatsClient, subscription: Subscription, handler: Callable[[bytes], None]) -> bool:
    """Hand the payload of each message of ``subscription`` to ``handler`` as the parser reads it (True), or
    leave everything to nats-py (False: its private ``_process_msg`` or the subscription id is not there)."""
    original = getattr(client, "_process_msg", None)
    sid = getattr(subscription, "_id", None)
    if original is None or not inspect.iscoroutinefunction(original) or not isinstance(sid, int):
        return False

    async def process(
        message_sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None, *rest: Any
    ) -> None:
        if message_sid == sid and not headers and not rest:
            handler(data)
            return
        await original(message_sid, subject, reply, data, headers, *rest)

    client._process_msg = process  # type: ignore[method-assign,assignment]
    return True
