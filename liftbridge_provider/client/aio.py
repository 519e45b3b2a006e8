"""AsyncLiftbridgeClient: the asyncio side, for Airflow triggers.

It covers what triggers need: metadata, partition metadata (from the leader,
paused partitions included), cursors, and subscriptions that follow the
partition leader. It is a second front end over the same cores as the sync
client: request building and validation (:mod:`requests`), call plans
(:mod:`plans`: routing, retries, deadlines), carried out by
:class:`~liftbridge_provider.client.routing.AsyncRouter` (the sync client's
``Router`` drives the same plans), and the subscription state machine
(:mod:`reading`). Only the waiting (``await``) differs. One ``grpc.aio``
channel per broker for the unary calls, closed by ``close()``; each Subscribe
call runs on the data plane's asyncio driver (a connection of its own:
:class:`~liftbridge_provider.client.subscribe_call.AsyncSubscribeCall`), with
the same keepalive, deadline and connect bound as the sync client's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client import cursor_advance, cursor_plans, partition_plans, plans
from liftbridge_provider.client import requests as build
from liftbridge_provider.client.activity import ACTIVITY_STREAM, ActivityEvent, decode_activity
from liftbridge_provider.client.aio_consumer import AsyncConsumer
from liftbridge_provider.client.cursor_advance import CursorMove
from liftbridge_provider.client.group_requests import AutoOffset
from liftbridge_provider.client.h2.grpc_status import CallFailed
from liftbridge_provider.client.health import HEALTH
from liftbridge_provider.client.messages import Message, StartPosition, StopPosition
from liftbridge_provider.client.metadata import Metadata, PartitionInfo
from liftbridge_provider.client.options import ClientConfig
from liftbridge_provider.client.reading import NoLeaderYet, SubscriptionState, Verdict, closed_while_reading
from liftbridge_provider.client.retry import Deadline
from liftbridge_provider.client.routing import AsyncRouter
from liftbridge_provider.client.subscribe_call import AsyncSubscribeCall
from liftbridge_provider.core import checks
from liftbridge_provider.core.checks import check_timeout
from liftbridge_provider.core.errors import InvalidArgumentError, LiftbridgeError

log = logging.getLogger(__name__)


class AsyncLiftbridgeClient:
    """Asyncio client for metadata, cursors and subscriptions. Arguments as for :class:`LiftbridgeClient`."""

    def __init__(self, brokers: str | Sequence[str] | ClientConfig, **options: Any) -> None:
        self.config = ClientConfig.of(brokers, **options)
        self._router = AsyncRouter(self.config)

    async def close(self) -> None:
        """Close every channel; idempotent."""
        await self._router.close()

    async def __aenter__(self) -> AsyncLiftbridgeClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def open_channels(self) -> int:
        return self._router.open_channels()

    # -- calls -------------------------------------------------------------------------------------

    async def fetch_metadata(self, streams: Iterable[str] = (), *, timeout: float | None = None) -> Metadata:
        """Ask the cluster for metadata (all streams, or only ``streams``); the result is also cached."""
        check_timeout("timeout", timeout)
        names = checks.check_stream_names(streams)
        return await self._router.refresh(names, timeout)

    async def fetch_partition_metadata(
        self,
        stream: str,
        partition: int = 0,
        *,
        timeout: float | None = None,
        settle: bool = True,
        agreed: bool = False,
    ) -> PartitionInfo:
        """Authoritative partition metadata (high watermark, newest offset, ISR), from the leader;
        a paused partition answers too, resumed only when unsettled; ``agreed`` as for the sync client."""
        check_timeout("timeout", timeout)
        build.partition_metadata_request(stream, partition, settle=settle)
        deadline = self._router.deadline(timeout)
        vote = plans.KeptVote() if agreed else None
        return await self._router.run(
            partition_plans.partition_metadata(
                self.config, self._router.snapshot, deadline, stream, partition, settle=settle, agreed=vote
            )
        )

    async def fetch_cursor(self, cursor_id: str, stream: str, partition: int, *, timeout: float | None = None) -> int:
        """The cursor's stored offset, or -1 if it was never set.

        Raises NoSuchStreamError / NoSuchPartitionError for a partition that does not exist,
        CursorsDisabledError when the server keeps no cursors (as the sync client).
        """
        check_timeout("timeout", timeout)
        request = build.fetch_cursor_request(cursor_id, stream, partition)
        response = await self._cursor_request(
            request, lambda stub, t: stub.FetchCursor(request, timeout=t), timeout, read=True
        )
        offset: int = response.offset
        return offset

    async def set_cursor(
        self, cursor_id: str, stream: str, partition: int, offset: int, *, timeout: float | None = None
    ) -> None:
        """Store ``offset`` (the last processed offset; -1: none) for the cursor (errors as :meth:`fetch_cursor`)."""
        check_timeout("timeout", timeout)
        request = build.set_cursor_request(cursor_id, stream, partition, offset)
        await self._cursor_request(request, lambda stub, t: stub.SetCursor(request, timeout=t), timeout)

    async def advance_cursor(
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
        """Move the cursor forward to ``offset`` by the one cursor-advance rule (as the sync client's)."""
        moves = await self.advance_cursors(
            cursor_id, stream, {partition: offset}, expected={partition: expected}, verify=verify, timeout=timeout
        )
        return moves[partition]

    async def advance_cursors(
        self,
        cursor_id: str,
        stream: str,
        offsets: Mapping[int, int],
        *,
        expected: Mapping[int, int | None] | None = None,
        verify: bool = False,
        timeout: float | None = None,
    ) -> dict[int, CursorMove]:
        """:meth:`advance_cursor` for several partitions at once (as the sync client's; one ``timeout`` for all)."""
        check_timeout("timeout", timeout)
        plan = cursor_advance.advance(cursor_id, stream, offsets, expected, verify=verify)
        deadline = Deadline(timeout if timeout is not None else self.config.request_timeout)

        def left() -> float:
            return max(deadline.remaining(), 0.001)

        return await cursor_advance.run_async(
            plan,
            lambda partition: self.fetch_cursor(cursor_id, stream, partition, timeout=left()),
            lambda partition, offset: self.set_cursor(cursor_id, stream, partition, offset, timeout=left()),
        )

    async def subscribe(
        self,
        stream: str,
        partition: int = 0,
        start_offset: int | None = None,
        *,
        start: StartPosition | None = None,
        stop: StopPosition | None = None,
        read_isr_replica: bool | None = None,
        resume: bool = False,
        timeout: float | None = None,
        idle_timeout: float | None = None,
        resubscribe_wait: float | None = None,
    ) -> AsyncGenerator[Message, None]:
        """Messages of one partition (an async generator), as :meth:`LiftbridgeClient.subscribe`.

        ``start_offset`` is a shorthand for ``start=StartPosition.at_offset(n)``;
        with neither, only new messages. Without ``stop`` it runs until closed,
        following the leader and never repeating an offset.
        """
        check_timeout("timeout", timeout)
        check_timeout("idle_timeout", idle_timeout)
        check_timeout("resubscribe_wait", resubscribe_wait)
        if start_offset is not None:
            if start is not None:
                raise InvalidArgumentError(f"give start_offset or start, not both (got {start_offset} and {start})")
            start = StartPosition.at_offset(checks.check_offset(start_offset, "start_offset"))
        replica = self.config.read_isr_replica if read_isr_replica is None else read_isr_replica
        request = build.subscribe_request(  # checks the positions and the flags
            stream, partition, start or StartPosition.new_only(), stop, read_isr_replica=replica, resume=resume
        )
        stop_offset = stop.offset if stop is not None and stop.kind == api.STOP_OFFSET else None
        async for message in self._subscription(request, stop_offset, timeout, idle_timeout, resubscribe_wait):
            yield message

    async def _subscription(
        self,
        request: api.SubscribeRequest,
        stop_offset: int | None = None,
        timeout: float | None = None,
        idle_timeout: float | None = None,
        resubscribe_wait: float | None = None,
    ) -> AsyncGenerator[Message, None]:
        """Carry out a built Subscribe request as the subscription state machine directs."""
        stream, partition = request.stream, request.partition
        state = SubscriptionState(
            self.config,
            request,
            stop_offset=stop_offset,
            timeout=timeout,
            idle_timeout=idle_timeout,
            resubscribe_wait=resubscribe_wait if resubscribe_wait is not None else self.config.resubscribe_wait,
        )
        while True:
            failure: grpc.RpcError | None = None
            try:
                async for raw in self._open_and_read(state):
                    verdict = state.on_message(raw.offset)
                    if verdict is Verdict.SKIP:
                        continue
                    if verdict is Verdict.END:
                        return
                    yield Message(raw)
                    state.progressed()
                    if verdict is Verdict.DELIVER_LAST:
                        return
            except grpc.RpcError as exc:
                failure = exc
            except asyncio.CancelledError:
                # grpc.aio cancels the calls of a channel the client closed; the task itself was not cancelled.
                task = asyncio.current_task()
                if self._router.closed and (task is None or not task.cancelling()):
                    raise closed_while_reading(stream, partition) from None
                raise
            if self._router.closed:
                raise closed_while_reading(stream, partition)
            told = state.broker_signal(failure)
            if told is not None:
                HEALTH.tell(*told)
            reopen = state.closed(failure)
            if reopen is None:
                return
            if reopen.refresh is not None:
                log.info("subscription to %s/%d lost (%s); resubscribing", stream, partition, failure)
                await asyncio.sleep(reopen.delay)
                with contextlib.suppress(LiftbridgeError):
                    await self._router.refresh((), reopen.refresh)

    async def activity(
        self, *, start: StartPosition | None = None, timeout: float | None = None
    ) -> AsyncGenerator[ActivityEvent, None]:
        """The activity stream as typed events (an async generator), as :meth:`LiftbridgeClient.activity`."""
        async for message in self.subscribe(
            ACTIVITY_STREAM, 0, start=start or StartPosition.earliest(), timeout=timeout
        ):
            yield decode_activity(message)

    def consumer(
        self,
        group_id: str,
        consumer_id: str | None = None,
        *,
        auto_checkpoint: float | None = 5.0,
        auto_offset: AutoOffset = "latest",
        fetch_assignments_interval: float | None = None,
    ) -> AsyncConsumer:
        """A member of consumer group ``group_id``, as :meth:`LiftbridgeClient.consumer`; ``await
        subscribe(streams)``, then ``async for`` over ``messages()``."""
        return AsyncConsumer(
            self,
            group_id,
            consumer_id,
            auto_checkpoint=auto_checkpoint,
            auto_offset=auto_offset,
            fetch_assignments_interval=fetch_assignments_interval,
        )

    async def _group_call(
        self, method: str, request: Any, *, broker: str | None = None, timeout: float | None = None
    ) -> Any:
        """A consumer group RPC (or FetchMetadata for a group): on any broker, or on ``broker``."""
        deadline = self._router.deadline(timeout)
        rpc: plans.Rpc = lambda stub, t: getattr(stub, method)(request, timeout=t)  # noqa: E731
        if broker is None:
            return await self._router.run(plans.any_broker(self.config, self._router.snapshot, rpc, deadline))
        return await self._router.run(plans.broker_call(self.config, self._router.snapshot, rpc, deadline, broker))

    async def _open_and_read(self, state: SubscriptionState) -> AsyncIterator[api.Message]:
        """One Subscribe call as the state asks, without its empty confirmation message."""
        snapshot = self._router.snapshot
        if not state.established:
            snapshot = await self._router.run(plans.knowing(Deadline(state.request_budget()), snapshot, state.stream))
        step = state.open(snapshot)
        if step.moved_from is not None:
            log.info(
                "subscription to %s/%d moves from %s to %s",
                state.stream,
                state.partition,
                step.moved_from,
                step.address,
            )
        if step.confirm_running:
            await self._partition_running(state.stream, state.partition, state.request_budget())
        if step.address is None:
            raise NoLeaderYet()
        call = AsyncSubscribeCall(step.timeout)
        with self._router.tracked(call):
            try:
                tls, server_name = self._router.direct_tls()
                await call.open(
                    step.address,
                    step.request,
                    tls=tls,
                    server_name=server_name,
                    max_response_bytes=self.config.max_message_bytes,
                )
                confirmed = False
                parse = api.Message.FromString
                async with contextlib.aclosing(call.messages()) as messages:
                    async for data in messages:
                        if confirmed:
                            try:
                                yield parse(data)
                            except DecodeError as exc:  # as grpc ends a call whose response does not deserialize
                                details = f"Exception deserializing response! ({exc})"
                                raise CallFailed(grpc.StatusCode.INTERNAL, details) from exc
                        else:
                            confirmed = True
                            state.confirmed()
                            HEALTH.answered(step.address)
            finally:
                call.close()

    async def _partition_running(self, stream: str, partition: int, timeout: float) -> None:
        """Raise PartitionPausedError if the partition is paused (its metadata flag sticks after a resume)."""
        await self._router.run(
            partition_plans.running(self.config, self._router.snapshot, Deadline(timeout), stream, partition)
        )

    async def _cursor_request(self, request: Any, rpc: plans.Rpc, timeout: float | None, *, read: bool = False) -> Any:
        deadline = self._router.deadline(timeout)
        snapshot = self._router.snapshot
        return await self._router.run(
            cursor_plans.cursor_request(self.config, snapshot, deadline, request, rpc, read=read)
        )
