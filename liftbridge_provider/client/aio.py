"""AsyncLiftbridgeClient: the asyncio side, for Airflow triggers.

It covers what triggers need: metadata, partition metadata (from the leader),
cursors, and an endless subscription that follows the partition leader.
Request building, validation, metadata parsing, routing choices and the retry
policy are the sync client's own functions; only the waiting (``await``) differs.
One ``grpc.aio`` channel per broker, closed by ``close()``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from types import TracebackType
from typing import Any, TypeVar

import grpc
import grpc.aio

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider._proto import liftbridge_api_pb2_grpc as api_grpc
from liftbridge_provider.client import requests as build
from liftbridge_provider.client.errors import (
    ClientClosedError,
    NoSuchPartitionError,
    NoSuchStreamError,
    UnavailableError,
    error_from_rpc,
)
from liftbridge_provider.client.messages import Message, StartPosition
from liftbridge_provider.client.metadata import EMPTY, Metadata, PartitionInfo, metadata_from_response
from liftbridge_provider.client.options import ClientConfig, check_timeout
from liftbridge_provider.client.retry import Action, Deadline, RetryState, backoff_delay
from liftbridge_provider.client.routing import broker_addresses, replica_address
from liftbridge_provider.client.subscription import NoLeaderYet, resubscribable

log = logging.getLogger(__name__)

T = TypeVar("T")


class AsyncLiftbridgeClient:
    """Asyncio client for metadata and cursors. Arguments as for :class:`LiftbridgeClient`."""

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

    async def fetch_metadata(self, streams: Iterable[str] = ()) -> Metadata:
        """Ask the cluster for metadata (all streams, or only ``streams``); the result is also cached."""
        names = build.check_stream_names(streams)
        request = api.FetchMetadataRequest(streams=names)
        response = await self._call_any(lambda stub, remaining: stub.FetchMetadata(request, timeout=remaining))
        self._snapshot = metadata_from_response(response, self._snapshot, names)
        return self._snapshot

    async def fetch_partition_metadata(
        self, stream: str, partition: int = 0, *, timeout: float | None = None
    ) -> PartitionInfo:
        """Authoritative partition metadata (high watermark, newest offset, ISR), from the leader."""
        check_timeout("timeout", timeout)
        request = build.partition_metadata_request(stream, partition)
        response = await self._call_leader(
            stream, partition, lambda stub, remaining: stub.FetchPartitionMetadata(request, timeout=remaining), timeout
        )
        return PartitionInfo.from_proto(stream, response.metadata)

    async def fetch_cursor(self, cursor_id: str, stream: str, partition: int, *, timeout: float | None = None) -> int:
        """The cursor's stored offset, or -1 if it was never set.

        Raises NoSuchStreamError / NoSuchPartitionError for a partition that does not exist,
        CursorsDisabledError when the server keeps no cursors (as the sync client).
        """
        check_timeout("timeout", timeout)
        request = build.fetch_cursor_request(cursor_id, stream, partition)
        await self._check_cursor_target(stream, partition)
        response = await self._cursor_call(request, lambda stub, t: stub.FetchCursor(request, timeout=t), timeout)
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

    async def subscribe(self, stream: str, partition: int, start_offset: int) -> AsyncIterator[Message]:
        """Messages of one partition from ``start_offset`` on, without end; an async generator.

        When the leader goes away the subscription moves to the new leader and
        continues after the last offset it yielded (never repeating one); it raises
        UnavailableError after ``resubscribe_wait`` seconds without a leader.
        """
        build.check_stream_name(stream)
        build.check_partition(partition, stream=stream)
        next_offset = build.check_offset(start_offset, "start_offset")
        lost_since: float | None = None
        attempt = 0
        while True:
            failure: grpc.RpcError | None = None
            try:
                async for raw in self._subscribe_once(stream, partition, next_offset):
                    lost_since, attempt = None, 0
                    if raw.offset < next_offset:
                        continue  # a new leader may start below the requested offset
                    next_offset = raw.offset + 1
                    yield Message(raw)
            except grpc.RpcError as exc:
                if not (isinstance(exc, NoLeaderYet) or resubscribable(exc)):
                    raise error_from_rpc(exc, stream=stream, partition=partition) from exc
                failure = exc
            lost_since = lost_since or time.monotonic()
            if time.monotonic() - lost_since > self.config.resubscribe_wait:
                raise UnavailableError(
                    f"no leader served {stream}/{partition} for {self.config.resubscribe_wait:g}s ({failure})",
                    stream=stream,
                )
            log.info("subscription to %s/%d lost (%s); resubscribing at %d", stream, partition, failure, next_offset)
            await asyncio.sleep(backoff_delay(attempt))
            attempt += 1
            await self.fetch_metadata()

    async def _subscribe_once(self, stream: str, partition: int, offset: int) -> AsyncIterator[api.Message]:
        """One Subscribe call on the current leader, without its empty confirmation message."""
        snapshot = await self._snapshot_with(stream)
        address = replica_address(self.config, snapshot, stream, partition, any_isr_replica=False)
        if address is None:
            raise NoLeaderYet()
        request = build.subscribe_request(stream, partition, StartPosition.at_offset(offset), None)
        call = self._stub(address).Subscribe(request)
        try:
            confirmed = False
            async for raw in call:
                if confirmed:
                    yield raw
                confirmed = True
        finally:
            call.cancel()

    async def _check_cursor_target(self, stream: str, partition: int) -> None:
        """Cursors are enabled and the partition exists (metadata refreshed once if unknown)."""
        if not build.knows_cursor_target(self._snapshot, stream, partition):
            await self.fetch_metadata()
        build.check_cursor_target(self._snapshot, stream, partition)

    async def _cursor_call(self, request: Any, rpc: Callable[[Any, float], Awaitable[T]], timeout: float | None) -> T:
        snapshot = await self._snapshot_with(build.CURSORS_STREAM)
        count = len(snapshot.stream(build.CURSORS_STREAM).partitions)
        target = build.cursor_partition(request.cursorId, request.stream, request.partition, count)
        return await self._call_leader(build.CURSORS_STREAM, target, rpc, timeout)

    async def _snapshot_with(self, stream: str) -> Metadata:
        if stream not in self._snapshot.streams:
            await self.fetch_metadata()
        self._snapshot.stream(stream)  # raises NoSuchStreamError
        return self._snapshot

    def _stub(self, address: str) -> Any:
        if self._closed:
            raise ClientClosedError("the Liftbridge client is closed")
        channel = self._channels.get(address)
        if channel is None:
            options = self.config.channel_options()
            if self._credentials is not None:
                channel = grpc.aio.secure_channel(address, self._credentials, options=options)
            else:
                channel = grpc.aio.insecure_channel(address, options=options)
            self._channels[address] = channel
        return api_grpc.APIStub(channel)

    async def _call_any(self, rpc: Callable[[Any, float], Awaitable[T]], timeout: float | None = None) -> T:
        state = RetryState(Deadline(timeout or self.config.request_timeout), leader_directed=False)
        while True:
            for address in broker_addresses(self.config, self._snapshot):
                try:
                    return await rpc(self._stub(address), state.deadline.remaining())
                except grpc.aio.AioRpcError as exc:
                    action, delay = state.after_failure(exc)
                if action is not Action.NEXT_BROKER:
                    await asyncio.sleep(delay)
                    break
            else:
                await asyncio.sleep(state.pause())

    async def _call_leader(
        self, stream: str, partition: int, rpc: Callable[[Any, float], Awaitable[T]], timeout: float | None
    ) -> T:
        state = RetryState(
            Deadline(timeout or self.config.request_timeout), leader_directed=True, stream=stream, partition=partition
        )
        snapshot = await self._snapshot_with(stream)
        while True:
            try:
                address = replica_address(self.config, snapshot, stream, partition, any_isr_replica=False)
            except (NoSuchStreamError, NoSuchPartitionError):
                snapshot = await self.fetch_metadata()
                address = replica_address(self.config, snapshot, stream, partition, any_isr_replica=False)
            if address is not None:
                try:
                    return await rpc(self._stub(address), state.deadline.remaining())
                except grpc.aio.AioRpcError as exc:
                    _action, delay = state.after_failure(exc)
            else:
                delay = state.pause()
            await asyncio.sleep(delay)
            snapshot = await self.fetch_metadata()
