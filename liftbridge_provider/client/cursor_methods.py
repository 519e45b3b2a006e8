"""The sync client's cursor and consumer group methods.

:class:`~liftbridge_provider.client.client.LiftbridgeClient` takes them in. A
cursor call is one plan (:func:`~liftbridge_provider.client.cursor_plans.cursor_request`),
a cursor move the one advance rule (:mod:`~liftbridge_provider.client.cursor_advance`),
both also run by the asyncio client; a group member is a
:class:`~liftbridge_provider.client.consumer.Consumer` over these calls.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client import cursor_advance, cursor_plans, plans
from liftbridge_provider.client import requests as build
from liftbridge_provider.client.consumer import AutoOffset, Consumer
from liftbridge_provider.client.cursor_advance import CursorMove
from liftbridge_provider.client.group_ports import GroupClient
from liftbridge_provider.client.options import ClientConfig
from liftbridge_provider.client.retry import Deadline
from liftbridge_provider.client.routing import Router
from liftbridge_provider.core.checks import check_timeout


class CursorMethods:
    """Cursors (``set_cursor``, ``fetch_cursor``, ``advance_cursor(s)``) and ``consumer`` of
    :class:`LiftbridgeClient`."""

    config: ClientConfig
    _router: Router

    def set_cursor(
        self, cursor_id: str, stream: str, partition: int, offset: int, *, timeout: float | None = None
    ) -> None:
        """Store ``offset`` (by convention the last processed offset; -1: none) for the cursor.

        Raises NoSuchStreamError / NoSuchPartitionError for a partition that does not exist,
        CursorsDisabledError when the server keeps no cursors.
        """
        check_timeout("timeout", timeout)
        request = build.set_cursor_request(cursor_id, stream, partition, offset)
        self._cursor_request(request, lambda stub, t: stub.SetCursor(request, timeout=t), timeout)

    def fetch_cursor(self, cursor_id: str, stream: str, partition: int, *, timeout: float | None = None) -> int:
        """The cursor's stored offset, or -1 if it was never set (errors as for :meth:`set_cursor`)."""
        check_timeout("timeout", timeout)
        request = build.fetch_cursor_request(cursor_id, stream, partition)
        rpc: plans.Rpc = lambda stub, t: stub.FetchCursor(request, timeout=t)  # noqa: E731
        response: api.FetchCursorResponse = self._cursor_request(request, rpc, timeout, read=True)
        return response.offset

    def advance_cursor(
        self,
        cursor_id: str,
        stream: str,
        partition: int,
        offset: int,
        *,
        expected: int | None = None,
        verify: bool = False,
        timeout: float | None = None,
    ) -> CursorMove:
        """Move the cursor forward to ``offset``: the one cursor-advance rule (``client/cursor_advance.py``).

        Fetches the cursor, and sets it only when it is below ``offset`` and, with ``expected``, still
        where this writer last saw it; a cursor already at ``offset`` is left alone. Raises
        CursorMovedError (nothing written) when it is elsewhere or past ``offset``, and with ``verify``
        reads it back (CursorMovedError ``overwritten`` when another writer set it meanwhile). The whole
        move ends within ``timeout`` (seconds, default ``request_timeout``). Returns the decision taken.
        """
        moves = self.advance_cursors(
            cursor_id, stream, {partition: offset}, expected={partition: expected}, verify=verify, timeout=timeout
        )
        return moves[partition]

    def advance_cursors(
        self,
        cursor_id: str,
        stream: str,
        offsets: Mapping[int, int],
        *,
        expected: Mapping[int, int | None] | None = None,
        verify: bool = False,
        timeout: float | None = None,
    ) -> dict[int, CursorMove]:
        """:meth:`advance_cursor` for several partitions ``{partition: offset}`` at once: every partition is
        checked before any is written, and one that moved refuses the whole move."""
        check_timeout("timeout", timeout)
        plan = cursor_advance.advance(cursor_id, stream, offsets, expected, verify=verify)
        deadline = Deadline(timeout if timeout is not None else self.config.request_timeout)
        return cursor_advance.run(
            plan,
            lambda partition: self.fetch_cursor(cursor_id, stream, partition, timeout=_left(deadline)),
            lambda partition, offset: self.set_cursor(cursor_id, stream, partition, offset, timeout=_left(deadline)),
        )

    def _cursor_request(self, request: Any, rpc: plans.Rpc, timeout: float | None, *, read: bool = False) -> Any:
        deadline = self._router.deadline(timeout)
        snapshot = self._router.metadata.snapshot
        return self._router.run(cursor_plans.cursor_request(self.config, snapshot, deadline, request, rpc, read=read))

    # -- consumer groups -------------------------------------------------------

    def consumer(
        self: GroupClient,
        group_id: str,
        consumer_id: str | None = None,
        *,
        auto_checkpoint: float | None = 5.0,
        auto_offset: AutoOffset = "latest",
        fetch_assignments_interval: float | None = None,
        read: bool = True,
    ) -> Consumer:
        """A member of consumer group ``group_id`` (as go-liftbridge's ``CreateConsumer``); call its
        ``subscribe(streams)``, then iterate ``messages()``.

        The group's coordinator spreads the streams' partitions over its members,
        moving them as members join, leave or time out. Each partition is read
        from the group's committed position (cursor ``__group:<group_id>``), or,
        with none, from ``auto_offset``: ``"latest"`` (default, new messages only),
        ``"earliest"``, or ``"none"`` (an error). Processed offsets are
        checkpointed every ``auto_checkpoint`` seconds (default 5; None: only by
        ``checkpoint()``, before a partition moves, and on close). Assignments are
        fetched every ``fetch_assignments_interval`` seconds (default 0.4 x the
        server's consumer timeout); an unresponsive coordinator is reported. The
        server needs cursors (``cursors.stream.partitions`` > 0). ``read=False``:
        the member only follows its assignments and the caller reads them.
        """
        return Consumer(
            self,
            group_id,
            consumer_id,
            auto_checkpoint=auto_checkpoint,
            auto_offset=auto_offset,
            fetch_assignments_interval=fetch_assignments_interval,
            read=read,
        )

    def _group_call(self, method: str, request: Any, *, broker: str | None = None, timeout: float | None = None) -> Any:
        """A consumer group RPC: on any broker (join, leave, report), or on ``broker`` (the coordinator)."""

        def call(stub: Any, remaining: float) -> Any:
            return getattr(stub, method)(request, timeout=remaining)

        if broker is None:
            return self._router.call_any(call, timeout=timeout)
        return self._router.call_broker(broker, call, timeout=timeout)


def _left(deadline: Deadline) -> float:
    """Seconds left for the next call of a multi-call operation (a call given no time fails as timed out)."""
    return max(deadline.remaining(), 0.001)
