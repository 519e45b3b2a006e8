"""``__cursors`` calls as plans without I/O: a cursor request is checked against the metadata, goes to the
``__cursors`` partition that stores the cursor, on the leader a majority of brokers name, and a read waits
until that leader's high watermark covers what it held. Both clients run :func:`cursor_request`."""

from __future__ import annotations

from typing import Any

from liftbridge_provider.client.errors import LiftbridgeTimeoutError
from liftbridge_provider.client.metadata import Metadata, PartitionInfo
from liftbridge_provider.client.options import ClientConfig
from liftbridge_provider.client.partition_plans import committed, partition_metadata
from liftbridge_provider.client.plans import KeptVote, Plan, Rpc, knowing_that, leader_call
from liftbridge_provider.client.requests import (
    CURSORS_STREAM,
    check_cursor_target,
    cursor_partition,
    knows_cursor_target,
)
from liftbridge_provider.client.retry import Deadline
from liftbridge_provider.core.errors import LiftbridgeError


def cursor_request(
    config: ClientConfig,
    snapshot: Metadata,
    deadline: Deadline,
    request: Any,
    rpc: Rpc,
    *,
    read: bool = False,
) -> Plan[Any]:
    """A SetCursor or FetchCursor ``request`` (``read``; ``rpc`` sends it), from the check to the answer.

    Cursors must be enabled and the request's partition must exist: the
    metadata is asked again when ``snapshot`` does not know them
    (:func:`~liftbridge_provider.client.plans.knowing_that`), then
    CursorsDisabledError, NoSuchStreamError or NoSuchPartitionError (the
    server itself would store a cursor for any partition). The cursor lives on
    the ``__cursors`` partition its id, stream and partition hash to; a read
    goes by :func:`cursor_read`, a write by :func:`cursor_call`. Their typed
    errors name the cursor's stream and partition, not ``__cursors``.
    """
    stream, partition = request.stream, request.partition
    snapshot = yield from knowing_that(deadline, snapshot, lambda view: knows_cursor_target(view, stream, partition))
    count = check_cursor_target(snapshot, stream, partition)
    target = cursor_partition(request.cursorId, stream, partition, count)
    plan = cursor_read if read else cursor_call
    try:
        return (yield from plan(config, snapshot, rpc, deadline, partition=target))
    except LiftbridgeError as exc:
        exc.stream, exc.partition = stream, partition
        raise


def cursor_read(config: ClientConfig, snapshot: Metadata, rpc: Rpc, deadline: Deadline, *, partition: int) -> Plan[Any]:
    """FetchCursor (``rpc``) on the leader of ``__cursors`` partition ``partition`` that a majority of brokers
    name (see :func:`cursor_call`), once its high watermark covers what the leader held when first asked.

    A new leader's high watermark lags after a failover until the dead leader
    leaves the ISR (``clustering.replica.max.lag.time``). The server reads a
    cursor only up to the high watermark and caches what it found, -1
    included, until the cursor is set again (v1.9.0), so a read in that lag
    would make a committed cursor read -1 for good. This waits for the lag to
    end within the call's deadline and never reads before: when the deadline
    comes first, LiftbridgeTimeoutError (try again later). If no leader answers
    yet, the call itself retries and reports.
    """
    kept = KeptVote()
    try:
        seen: PartitionInfo | None = yield from partition_metadata(
            config, snapshot, deadline, CURSORS_STREAM, partition, settle=False, agreed=kept
        )
    except LiftbridgeError:
        seen = None
    if seen is not None and seen.high_watermark < seen.newest_offset:
        target = seen.newest_offset
        seen = yield from committed(
            config, snapshot, deadline, CURSORS_STREAM, partition, target=target, seen=seen, agreed=kept
        )
        if seen is None or seen.high_watermark < target:
            watermark = "unknown" if seen is None else seen.high_watermark
            raise LiftbridgeTimeoutError(
                f"cursor read on {CURSORS_STREAM}/{partition}: its leader's high watermark ({watermark}) did not "
                f"reach offset {target} by the deadline (a leader failover); not read, as the server would answer "
                "-1 for a committed cursor and keep that answer; try again",
                stream=CURSORS_STREAM,
                partition=partition,
            )
    return (yield from cursor_call(config, snapshot, rpc, deadline, partition=partition, agreed=kept))


def cursor_call(
    config: ClientConfig,
    snapshot: Metadata,
    rpc: Rpc,
    deadline: Deadline,
    *,
    partition: int,
    agreed: KeptVote | None = None,
) -> Plan[Any]:
    """SetCursor or FetchCursor (``rpc``) on the leader of ``__cursors`` partition ``partition`` that more than
    half of the brokers name.

    A ``__cursors`` leader frozen past a failover still answers as leader for a
    moment after it thaws (v1.9.0). A SetCursor it takes answers OK, and its
    message even reaches the new leader's log, but only the broker that ran
    SetCursor updates its cursor cache: the new leader keeps answering the
    value it cached before, so a commit that reported success reads back the
    old value (chaos seed 128). Asking the brokers which leader they name
    costs one FetchMetadata per broker up to a majority (none with one broker),
    once per call (or per ``agreed``, a vote already taken), again only after
    an attempt on the leader it named failed.
    """
    kept = agreed or KeptVote()
    return (
        yield from leader_call(config, snapshot, rpc, deadline, stream=CURSORS_STREAM, partition=partition, agreed=kept)
    )
