"""The readers behind LiftbridgeMessageTrigger: one per group of watchers with equal settings.

Airflow's triggerer runs one reader (a ``SharedStreamProducer``) per shared
stream key and broadcasts what it yields to every watcher of the group. It
calls :meth:`advance` once the events that watchers derived from a raw event
are stored in the metadata database; only then do the cursors move. So after
a crash a watcher resumes from its cursors and loses nothing; what Airflow
stored but the cursor had not recorded yet is sent again (message mode: up to
``max_in_flight`` events per partition; batch mode: the one batch, identical).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import AsyncIterator, Hashable, Iterable, Sequence
from typing import Any

from airflow.triggers.shared_stream import AdvanceItem, SharedStreamProducer

from liftbridge_provider.client import AsyncLiftbridgeClient, LiftbridgeError, Message
from liftbridge_provider.hooks.liftbridge import LiftbridgeHook
from liftbridge_provider.ranges import OffsetRange, check_partitions
from liftbridge_provider.watching import (
    CursorNames,
    ResumePoint,
    WatchSettings,
    batch_document,
    batch_due,
    committable,
    resume_point,
)

log = logging.getLogger(__name__)

# Readers alive in this process, by (connection, stream, cursor id): two readers
# with different settings must not move the same cursors.
_ACTIVE_POSITIONS: dict[tuple[str, str, str], Hashable] = {}

# Subscriptions opened by message readers in this process, by (stream, partition).
SUBSCRIPTIONS_OPENED: collections.Counter[tuple[str, int]] = collections.Counter()


class WatcherError(LiftbridgeError):
    """A watcher cannot go on; the triggerer restarts it from its cursors."""


def reader_for(settings: WatchSettings) -> MessageReader | BatchReader:
    """The reader for a group of watchers with these settings."""
    return MessageReader(settings) if settings.mode == "message" else BatchReader(settings)


class _Reader(SharedStreamProducer):
    """What both readers share: the client, the watched partitions and the cursor registry."""

    def __init__(self, settings: WatchSettings) -> None:
        self.settings = settings
        self.cursors = CursorNames(settings.cursor)
        self._client: AsyncLiftbridgeClient | None = None
        self._registered = False

    async def _open(self) -> tuple[AsyncLiftbridgeClient, list[int]]:
        self._claim_position()
        hook = LiftbridgeHook(liftbridge_conn_id=self.settings.liftbridge_conn_id)
        self._client = client = await hook.aget_async_client()
        metadata = await client.fetch_metadata([self.settings.stream])
        count = len(metadata.stream(self.settings.stream).partitions)
        partitions = check_partitions(self.settings.partitions, count, self.settings.stream)
        return client, partitions

    def _claim_position(self) -> None:
        position, key = self.settings.position_key(), self.settings.group_key()
        owner = _ACTIVE_POSITIONS.get(position)
        if owner is not None and owner != key:
            raise WatcherError(
                f"cursor {self.settings.cursor!r} on stream {self.settings.stream!r} is already moved by a watcher "
                f"with other settings ({owner}); give each differently configured watcher its own cursor_id"
            )
        _ACTIVE_POSITIONS[position] = key
        self._registered = True

    async def _first_offset(self, client: AsyncLiftbridgeClient, partition: int) -> int:
        """After the stored position; for a new watcher, 0 (earliest) or after the newest offset (latest)."""
        stream = self.settings.stream
        stored = await client.fetch_cursor(self.cursors.position, stream, partition)
        if stored >= 0:
            return stored + 1
        if self.settings.start_from == "earliest":
            return 0
        newest = (await client.fetch_partition_metadata(stream, partition)).high_watermark
        await client.set_cursor(self.cursors.position, stream, partition, newest)
        return newest + 1

    async def aclose(self) -> None:
        if self._registered and _ACTIVE_POSITIONS.get(self.settings.position_key()) == self.settings.group_key():
            del _ACTIVE_POSITIONS[self.settings.position_key()]
        self._registered = False
        if self._client is not None:
            await self._client.close()
            self._client = None


class MessageReader(_Reader):
    """Message mode: one subscription per partition; raw events are :class:`Message` objects."""

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        client, partitions = await self._open()
        self._windows = {p: asyncio.Semaphore(self.settings.max_in_flight) for p in partitions}
        arrivals: asyncio.Queue[tuple[Message, int] | BaseException] = asyncio.Queue()
        starts = {p: await self._first_offset(client, p) for p in partitions}
        readers = [asyncio.create_task(self._read(client, p, starts[p], arrivals)) for p in partitions]
        try:
            while True:
                item = await arrivals.get()
                if isinstance(item, BaseException):
                    raise item
                message, partition = item
                yield message, (partition, message.offset)
        finally:
            for reader in readers:
                reader.cancel()
            await asyncio.gather(*readers, return_exceptions=True)

    async def _read(
        self, client: AsyncLiftbridgeClient, partition: int, start: int, arrivals: asyncio.Queue[Any]
    ) -> None:
        SUBSCRIPTIONS_OPENED[(self.settings.stream, partition)] += 1
        log.info(
            "Liftbridge watcher subscribed to %s/%d at offset %d (cursor %s)",
            self.settings.stream,
            partition,
            start,
            self.settings.cursor,
        )
        try:
            async for message in client.subscribe(self.settings.stream, partition, start):
                await self._windows[partition].acquire()
                await arrivals.put((message, partition))
        except Exception as exc:  # handed to open_stream, which fails the group
            await arrivals.put(exc)

    def get_advance_lane(self, broker_payload: Any) -> Hashable:
        partition: int = broker_payload[0]
        return partition

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """Store the last offset of the clean prefix; a failed event fails the group (it is read again)."""
        partition = batch[0].broker_payload[0]
        last = committable([(item.broker_payload[1], item.outcome.is_clean) for item in batch])
        if last is not None and self._client is not None:
            await self._client.set_cursor(self.cursors.position, self.settings.stream, partition, last)
        for _ in batch:
            self._windows[partition].release()
        if last is None or last != batch[-1].broker_payload[1]:
            raise WatcherError(f"{self.settings.stream}/{partition}: an event was not stored; reading it again")


class BatchReader(_Reader):
    """Batch mode: polls high watermarks; raw events are frozen ranges documents (JSON), one batch at a time."""

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        client, partitions = await self._open()
        self._partitions = partitions
        self._recorded = asyncio.Event()
        self._recorded.set()
        point = await self._resume_point(client, partitions)
        starts = point.next_starts or {}
        for partition in partitions:
            if partition not in starts:
                starts[partition] = await self._first_offset(client, partition)
        batch = point.next_batch
        if point.resend is not None:
            log.info("Liftbridge watcher sends batch %d again (planned, not recorded)", point.next_batch - 1)
            yield self._send(point.resend.to_json(), point.next_batch - 1, point.resend.ranges)
        first_seen: float | None = None
        while True:
            await self._recorded.wait()
            ends = {p: max(starts[p], await self._next_offset(client, p)) for p in partitions}
            pending = sum(ends[p] - starts[p] for p in partitions)
            if pending and first_seen is None:
                first_seen = time.monotonic()
            if not batch_due(pending, first_seen, time.monotonic(), self.settings.max_messages, self.settings.max_wait):
                await asyncio.sleep(self.settings.poll_interval)
                continue
            document = batch_document(self.settings.stream, starts, ends, batch=batch, cursor_id=self.settings.cursor)
            await self._plan(client, batch, starts, ends)
            yield self._send(document.to_json(), batch, document.ranges)
            starts, batch, first_seen = ends, batch + 1, None

    def _send(self, payload: dict[str, Any], batch: int, ranges: Iterable[OffsetRange]) -> tuple[Any, Any]:
        """The (raw event, broker payload) pair of a batch; no new batch is planned until it is recorded.

        The broker payload holds the last offset of each non-empty range: the positions to store.
        """
        self._recorded.clear()
        return payload, (batch, {r.partition: r.last for r in ranges if r.last is not None})

    async def _next_offset(self, client: AsyncLiftbridgeClient, partition: int) -> int:
        return (await client.fetch_partition_metadata(self.settings.stream, partition)).high_watermark + 1

    async def _resume_point(self, client: AsyncLiftbridgeClient, partitions: list[int]) -> ResumePoint:
        stream, first = self.settings.stream, partitions[0]
        planned = await client.fetch_cursor(self.cursors.planned, stream, first)
        recorded = await client.fetch_cursor(self.cursors.recorded, stream, first)
        slots = {}
        for batch in {planned, recorded} - {-1}:
            starts = {p: await client.fetch_cursor(self.cursors.slot_start(batch), stream, p) for p in partitions}
            ends = {p: await client.fetch_cursor(self.cursors.slot_end(batch), stream, p) for p in partitions}
            slots[batch % 2] = (starts, ends)
        return resume_point(stream, self.settings.cursor, planned=planned, recorded=recorded, slots=slots)

    async def _plan(
        self, client: AsyncLiftbridgeClient, batch: int, starts: dict[int, int], ends: dict[int, int]
    ) -> None:
        """Write the batch into its slot, then mark it planned (the single write that makes it count)."""
        stream = self.settings.stream
        for partition in self._partitions:
            await client.set_cursor(self.cursors.slot_start(batch), stream, partition, starts[partition])
            await client.set_cursor(self.cursors.slot_end(batch), stream, partition, ends[partition])
        await client.set_cursor(self.cursors.planned, stream, self._partitions[0], batch)

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """Record the batch once Airflow stored it; then move the per-partition positions."""
        for item in batch:
            number, last_offsets = item.broker_payload
            if not item.outcome.is_clean:
                raise WatcherError(f"batch {number} of {self.settings.stream} was not stored; sending it again")
            client, stream = self._client, self.settings.stream
            assert client is not None
            await client.set_cursor(self.cursors.recorded, stream, self._partitions[0], number)
            for partition, last in last_offsets.items():
                await client.set_cursor(self.cursors.position, stream, partition, last)
        self._recorded.set()
