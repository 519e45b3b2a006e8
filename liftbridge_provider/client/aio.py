"""AsyncLiftbridgeClient: the asyncio side, for Airflow triggers.

It covers what triggers need: metadata, partition metadata (from the leader,
paused partitions included), cursors, and subscriptions that follow the
partition leader. It is a second front end over the same cores as the sync
client: request building and validation (:mod:`requests`), call plans
(:mod:`plans`: routing, retries, deadlines) and the subscription state
machine (:mod:`reading`). Only the waiting (``await``) differs. One
``grpc.aio`` channel per broker, closed by ``close()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

import grpc
import grpc.aio
import grpc.experimental

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider._proto import liftbridge_api_pb2_grpc as api_grpc
from liftbridge_provider.client import cursor_advance, plans
from liftbridge_provider.client import requests as build
from liftbridge_provider.client.activity import ACTIVITY_STREAM, ActivityEvent, decode_activity
from liftbridge_provider.client.aio_consumer import AsyncConsumer
from liftbridge_provider.client.connections import aio_connect
from liftbridge_provider.client.cursor_advance import CursorMove, Fetch
from liftbridge_provider.client.errors import ClientClosedError, UnavailableError
from liftbridge_provider.client.group_requests import AutoOffset
from liftbridge_provider.client.health import HEALTH
from liftbridge_provider.client.messages import Message, StartPosition, StopPosition
from liftbridge_provider.client.metadata import EMPTY, Metadata, PartitionInfo, metadata_from_response
from liftbridge_provider.client.options import ClientConfig, check_timeout
from liftbridge_provider.client.reading import NoLeaderYet, SubscriptionState, Verdict
from liftbridge_provider.client.retry import Deadline
from liftbridge_provider.core import checks
from liftbridge_provider.core.errors import LiftbridgeError

log = logging.getLogger(__name__)

T = TypeVar("T")


class AsyncLiftbridgeClient:
    """Asyncio client for metadata, cursors and subscriptions. Arguments as for :class:`LiftbridgeClient`."""

    def __init__(self, brokers: str | Sequence[str] | ClientConfig, **options: Any) -> None:
        self.config = ClientConfig.of(brokers, **options)
        self._credentials = self.config.tls.credentials() if self.config.tls is not None else None
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._snapshot = EMPTY
        self._closed = False

    async def close(self) -> None:
        """Close every channel; idempotent."""
        self._closed = True
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()

    async def __aenter__(self) -> AsyncLiftbridgeClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def open_channels(self) -> int:
        return len(self._channels)

    # -- calls -------------------------------------------------------------------------------------

    async def fetch_metadata(self, streams: Iterable[str] = (), *, timeout: float | None = None) -> Metadata:
        """Ask the cluster for metadata (all streams, or only ``streams``); the result is also cached."""
        check_timeout("timeout", timeout)
        names = checks.check_stream_names(streams)
        return await self._refresh(names, timeout)

    async def fetch_partition_metadata(
        self, stream: str, partition: int = 0, *, timeout: float | None = None, settle: bool = True
    ) -> PartitionInfo:
        """Authoritative partition metadata (high watermark, newest offset, ISR), from the leader;
        a paused partition answers too, resumed only when unsettled (as for the sync client)."""
        check_timeout("timeout", timeout)
        build.partition_metadata_request(stream, partition)
        deadline = self._deadline(timeout)
        return await self._run(
            plans.partition_metadata(self.config, self._snapshot, deadline, stream, partition, settle=settle)
        )

    async def fetch_cursor(self, cursor_id: str, stream: str, partition: int, *, timeout: float | None = None) -> int:
        """The cursor's stored offset, or -1 if it was never set.

        Raises NoSuchStreamError / NoSuchPartitionError for a partition that does not exist,
        CursorsDisabledError when the server keeps no cursors (as the sync client).
        """
        check_timeout("timeout", timeout)
        request = build.fetch_cursor_request(cursor_id, stream, partition)
        await self._check_cursor_target(stream, partition)
        response = await self._cursor_call(
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
        await self._check_cursor_target(stream, partition)
        await self._cursor_call(request, lambda stub, t: stub.SetCursor(request, timeout=t), timeout)

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
        answer: int | None = None
        while True:
            try:
                action = plan.send(answer)
            except StopIteration as done:
                moves: dict[int, CursorMove] = done.value
                return moves
            if isinstance(action, Fetch):
                left = max(deadline.remaining(), 0.001)
                answer = await self.fetch_cursor(cursor_id, stream, action.partition, timeout=left)
            else:
                left = max(deadline.remaining(), 0.001)
                await self.set_cursor(cursor_id, stream, action.partition, action.offset, timeout=left)
                answer = None

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
            start = StartPosition.at_offset(checks.check_offset(start_offset, "start_offset"))
        replica = self.config.read_isr_replica if read_isr_replica is None else read_isr_replica
        request = build.subscribe_request(
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
                    await self._refresh((), reopen.refresh)

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
        deadline = self._deadline(timeout)
        addresses = None
        if broker is not None:
            if broker not in self._snapshot.brokers:
                await self._refresh((), deadline.remaining())
            known = self._snapshot.brokers.get(broker)
            if known is None:
                raise UnavailableError(f"broker {broker!r} is not in the cluster's metadata")
            addresses = [known.address]
        rpc: plans.Rpc = lambda stub, t: getattr(stub, method)(request, timeout=t)  # noqa: E731
        return await self._run(plans.any_broker(self.config, self._snapshot, rpc, deadline, addresses=addresses))

    async def _open_and_read(self, state: SubscriptionState) -> AsyncIterator[api.Message]:
        """One Subscribe call as the state asks, without its empty confirmation message."""
        snapshot = self._snapshot
        if not state.established:
            snapshot = await self._run(plans.knowing(Deadline(state.request_budget()), snapshot, state.stream))
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
        call = self._stub(step.address).Subscribe(step.request, timeout=step.timeout)
        try:
            confirmed = False
            async for raw in call:
                if confirmed:
                    yield raw
                else:
                    confirmed = True
                    state.confirmed()
                    HEALTH.answered(step.address)
        finally:
            call.cancel()

    async def _partition_running(self, stream: str, partition: int, timeout: float) -> None:
        """Raise PartitionPausedError if the partition is paused (its metadata flag sticks after a resume)."""
        request = api.FetchPartitionMetadataRequest(stream=stream, partition=partition)
        await self._run(
            plans.leader_call(
                self.config,
                self._snapshot,
                lambda stub, t: stub.FetchPartitionMetadata(request, timeout=t),
                Deadline(timeout),
                stream=stream,
                partition=partition,
            )
        )

    async def _check_cursor_target(self, stream: str, partition: int) -> None:
        """Cursors are enabled and the partition exists (metadata refreshed once if unknown)."""
        if not build.knows_cursor_target(self._snapshot, stream, partition):
            await self.fetch_metadata()
        build.check_cursor_target(self._snapshot, stream, partition)

    async def _cursor_call(self, request: Any, rpc: plans.Rpc, timeout: float | None, *, read: bool = False) -> Any:
        deadline = self._deadline(timeout)
        snapshot = await self._run(plans.knowing(deadline, self._snapshot, build.CURSORS_STREAM))
        count = len(snapshot.stream(build.CURSORS_STREAM).partitions)
        target = build.cursor_partition(request.cursorId, request.stream, request.partition, count)
        cursor_plan = plans.cursor_read if read else plans.cursor_call
        plan = cursor_plan(self.config, snapshot, rpc, deadline, partition=target)
        try:
            return await self._run(plan)
        except LiftbridgeError as exc:
            exc.stream, exc.partition = request.stream, request.partition
            raise

    # -- the driver of call plans ------------------------------------------------------------------

    def _deadline(self, timeout: float | None) -> Deadline:
        return Deadline(timeout if timeout is not None else self.config.request_timeout)

    async def _run(self, plan: plans.Plan[T]) -> T:
        """Carry out ``plan`` until it returns (or raises)."""
        outcome: Any = None
        failure: BaseException | None = None
        while True:
            try:
                action = plan.throw(failure) if failure is not None else plan.send(outcome)
            except StopIteration as done:
                result: T = done.value
                return result
            outcome, failure = None, None
            try:
                outcome = await self._execute(action)
            except (grpc.RpcError, LiftbridgeError) as exc:
                failure = exc

    async def _execute(self, action: plans.PlanAction) -> Any:
        if isinstance(action, plans.Attempt):
            stub = self._stub(action.address)
            timeout, budget = action.timeout, action.connect_budget()
            if budget is not None:
                started = time.monotonic()
                action.after_connect(await aio_connect(self._channels[action.address], budget))
                timeout = max(timeout - (time.monotonic() - started), 0.001)
            answer = await action.rpc(stub, timeout)
            HEALTH.answered(action.address)
            return answer
        if isinstance(action, plans.Sleep):
            await asyncio.sleep(action.seconds)
            return None
        return await self._refresh(action.streams, action.timeout)

    async def _refresh(self, streams: Iterable[str], timeout: float | None) -> Metadata:
        request = api.FetchMetadataRequest(streams=list(streams))
        response = await self._run(
            plans.any_broker(
                self.config,
                self._snapshot,
                lambda stub, t: stub.FetchMetadata(request, timeout=t),
                self._deadline(timeout),
            )
        )
        self._snapshot = metadata_from_response(response, self._snapshot, list(streams))
        return self._snapshot

    def _stub(self, address: str) -> Any:
        if self._closed:
            raise ClientClosedError("the Liftbridge client is closed")
        channel = self._channels.get(address)
        if channel is None:
            sync_only = grpc.experimental.ChannelOptions.SingleThreadedUnaryStream
            options = [o for o in self.config.channel_options() if o[0] != sync_only]
            if self._credentials is not None:
                channel = grpc.aio.secure_channel(address, self._credentials, options=options)
            else:
                channel = grpc.aio.insecure_channel(address, options=options)
            self._channels[address] = channel
        return api_grpc.APIStub(channel)
