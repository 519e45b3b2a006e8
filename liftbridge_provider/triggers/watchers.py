"""The readers behind LiftbridgeMessageTrigger: one per group of watchers with equal settings.

Airflow's triggerer runs one reader (a ``SharedStreamProducer``) per shared
stream key and broadcasts what it yields to every watcher of the group. It
calls :meth:`advance` once the events that watchers derived from a raw event
are resolved: stored in the metadata database, failed (not stored), or refused
by a watcher. Only stored events, and refused ones once dead-lettered, move the
cursors (:func:`~liftbridge_provider.core.watching.decide_advance`); anything else
stops the group, and the triggerer restarts it from the cursors. So after a
crash a watcher resumes from its cursors and loses nothing; what Airflow
stored but the cursor had not recorded yet is sent again (message mode: up to
``max_in_flight`` events per partition; batch mode: the one batch, identical).

Every cursor write follows the cursor-advance rule (``client/cursor_advance.py``)
from what this reader last saw: a reader that finds the cursor moved by another
writer (a second triggerer running the same watchers) stops instead of
overwriting it, and no cursor moves back.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Hashable, Iterable, Sequence
from typing import Any

from liftbridge_provider import fault_points
from liftbridge_provider.client import (
    AsyncLiftbridgeClient,
    CursorMovedError,
    InvalidArgumentError,
    LiftbridgeError,
    Message,
    PartitionPausedError,
)
from liftbridge_provider.client.cursor_advance import CursorMove, CursorStep, decide
from liftbridge_provider.client.errors import past_a_readonly_end
from liftbridge_provider.core.ranges import OffsetRange, check_chosen_partitions
from liftbridge_provider.core.watching import (
    CursorNames,
    Outcome,
    ResumePoint,
    WatchSettings,
    batch_document,
    batch_due,
    decide_advance,
    resume_point,
)
from liftbridge_provider.hooks.liftbridge import LiftbridgeHook
from liftbridge_provider.telemetry import cursor_lag, report_watcher_lag
from liftbridge_provider.triggers.dead_letters import DeadLetters
from liftbridge_provider.version_compat import AdvanceItem, SharedStreamProducer

log = logging.getLogger(__name__)

LAG_INTERVAL = 15.0  # seconds between two lag reports of a reader
PAUSED_POLL_INTERVAL = 2.0  # seconds between two high-watermark checks of a paused partition (message mode)

# Readers alive in this process, by (connection, stream, cursor id): two readers
# with different settings must not move the same cursors.
_ACTIVE_POSITIONS: dict[tuple[str, str, str], Hashable] = {}

# Subscriptions opened by message readers in this process, by (stream, partition).
SUBSCRIPTIONS_OPENED: collections.Counter[tuple[str, int]] = collections.Counter()

# Why watchers refused messages, by group key and (partition, offset); read by the group's reader.
_REFUSALS: dict[Hashable, dict[tuple[int, int], list[str]]] = collections.defaultdict(dict)


class WatcherError(LiftbridgeError):
    """A watcher cannot go on; the triggerer restarts it from its cursors."""


def record_refusal(settings: WatchSettings, partition: int, offset: int, error: str) -> None:
    """Note why a watcher refused a message, for the reader that dead-letters it."""
    _REFUSALS[settings.group_key()].setdefault((partition, offset), []).append(error)


def reader_for(settings: WatchSettings) -> MessageReader | BatchReader:
    """The reader for a group of watchers with these settings."""
    return MessageReader(settings) if settings.mode == "message" else BatchReader(settings)


class _Reader(SharedStreamProducer):
    """What both readers share: the client, the watched partitions, fenced cursor writes and lag reports."""

    def __init__(self, settings: WatchSettings) -> None:
        self.settings = settings
        self.cursors = CursorNames(settings.cursor)
        self._client: AsyncLiftbridgeClient | None = None
        self._registered = False
        self._seen: dict[tuple[str, int], int] = {}  # (cursor, partition) -> value this reader last read or wrote
        self._committed: dict[int, int] = {}  # partition -> last offset passed (for the lag)
        self._lag_task: asyncio.Task[None] | None = None

    async def _open(self) -> tuple[AsyncLiftbridgeClient, list[int]]:
        self._claim_position()
        hook = LiftbridgeHook(liftbridge_conn_id=self.settings.liftbridge_conn_id)
        self._client = client = await hook.aget_async_client()
        metadata = await client.fetch_metadata([self.settings.stream])
        count = len(metadata.stream(self.settings.stream).partitions)
        partitions = check_chosen_partitions(self.settings.partitions, count, self.settings.stream)
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

    async def _read_cursor(self, client: AsyncLiftbridgeClient, cursor: str, partition: int) -> int:
        """The cursor's value, remembered as what the next write of it expects to find."""
        value = await client.fetch_cursor(cursor, self.settings.stream, partition)
        self._seen[(cursor, partition)] = value
        return value

    async def _write_cursor(self, client: AsyncLiftbridgeClient, cursor: str, partition: int, value: int) -> None:
        """Move the cursor to ``value`` by the cursor-advance rule, from what this reader last read or wrote:
        a cursor another writer moved stops the reader (WatcherError) instead of being overwritten."""
        seen = self._seen.get((cursor, partition))
        try:
            await client.advance_cursor(cursor, self.settings.stream, partition, value, expected=seen)
        except CursorMovedError as moved:
            raise self._moved(moved) from moved
        self._seen[(cursor, partition)] = value

    async def _fence(self, client: AsyncLiftbridgeClient, cursor: str, partition: int, target: int) -> None:
        """Raise WatcherError unless the cursor may move to ``target`` by the cursor-advance rule (checked
        only, for writes that must come before the cursor's own: a batch's slots before its planned mark)."""
        found = await client.fetch_cursor(cursor, self.settings.stream, partition)
        seen = self._seen.get((cursor, partition))
        move = CursorMove(cursor, self.settings.stream, partition, found, target, seen, decide(found, target, seen))
        if move.step is CursorStep.MOVED:
            raise self._moved(move.refusal())

    def _moved(self, moved: CursorMovedError) -> WatcherError:
        if moved.expected is not None and moved.found != moved.expected:
            how = f"from {moved.expected} to {moved.found}"
        else:
            how = f"to {moved.found}, past {moved.target}"
        return WatcherError(
            f"cursor {moved.cursor_id!r} of {self.settings.stream}/{moved.partition} was moved by another writer "
            f"{how}; this watcher stops rather than overwrite it and restarts from there. "
            f"If another triggerer runs a different watcher with cursor_id {self.settings.cursor!r}, this "
            "watcher's assets miss what that one passed: watchers that share a cursor_id must run in one "
            "triggerer, so with several triggerers give each watcher its own cursor_id"
        )

    async def _first_offset(self, client: AsyncLiftbridgeClient, partition: int) -> int:
        """After the stored position; with none, 0 (earliest) or the start recorded on the first run (latest)."""
        stored = await self._read_cursor(client, self.cursors.position, partition)
        if stored >= 0:
            return stored + 1
        if self.settings.start_from == "earliest":
            return 0
        start = await self._read_cursor(client, self.cursors.start, partition)
        if start < 0:
            start = (await client.fetch_partition_metadata(self.settings.stream, partition)).high_watermark + 1
            await self._write_cursor(client, self.cursors.start, partition, start)
        return start

    def _start_lag_reports(self, client: AsyncLiftbridgeClient, partitions: list[int]) -> None:
        self._lag_task = asyncio.create_task(self._report_lag(client, partitions))

    async def _report_lag(self, client: AsyncLiftbridgeClient, partitions: list[int]) -> None:
        """Every LAG_INTERVAL s: offsets between each partition's last passed offset and its high watermark.

        Sent to the metrics every time; logged at INFO when it changed, else at DEBUG.
        """
        stream = self.settings.stream
        reported: dict[int, int] = {}
        while True:
            for partition in partitions:
                try:
                    info = await client.fetch_partition_metadata(stream, partition, settle=False)
                except LiftbridgeError as exc:
                    log.info("Liftbridge watcher could not read the lag of %s/%d: %s", stream, partition, exc)
                    continue
                lag = cursor_lag(info.high_watermark, self._committed.get(partition, -1))
                report_watcher_lag(self.settings, partition, lag)
                changed = reported.get(partition) != lag
                reported[partition] = lag
                log.log(
                    logging.INFO if changed else logging.DEBUG,
                    "Liftbridge watcher %s/%d (cursor %s): %d offsets behind the high watermark %d",
                    stream,
                    partition,
                    self.settings.cursor,
                    lag,
                    info.high_watermark,
                )
            await asyncio.sleep(LAG_INTERVAL)

    async def aclose(self) -> None:
        if self._lag_task is not None:
            self._lag_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._lag_task
            self._lag_task = None
        if self._registered and _ACTIVE_POSITIONS.get(self.settings.position_key()) == self.settings.group_key():
            del _ACTIVE_POSITIONS[self.settings.position_key()]
        self._registered = False
        if self._client is not None:
            await self._client.close()
            self._client = None


class MessageReader(_Reader):
    """Message mode: one subscription per partition; raw events are :class:`Message` objects."""

    def __init__(self, settings: WatchSettings) -> None:
        super().__init__(settings)
        self._in_flight: dict[tuple[int, int], Message] = {}  # sent, not yet advanced (for dead letters)
        self._dead_letters: DeadLetters | None = None

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        client, partitions = await self._open()
        if self.settings.dlq_stream is not None:
            self._dead_letters = await DeadLetters.open(client.config, self.settings, partitions)
        self._windows = {p: asyncio.Semaphore(self.settings.max_in_flight) for p in partitions}
        arrivals: asyncio.Queue[tuple[Message, int] | BaseException] = asyncio.Queue()
        starts = {p: await self._first_offset(client, p) for p in partitions}
        self._committed = {p: start - 1 for p, start in starts.items()}
        self._start_lag_reports(client, partitions)
        readers = [asyncio.create_task(self._read(client, p, starts[p], arrivals)) for p in partitions]
        try:
            while True:
                item = await arrivals.get()
                if isinstance(item, BaseException):
                    raise item
                message, partition = item
                self._in_flight[(partition, message.offset)] = message
                yield message, (partition, message.offset)
        finally:
            for reader in readers:
                reader.cancel()
            await asyncio.gather(*readers, return_exceptions=True)

    async def _read(
        self, client: AsyncLiftbridgeClient, partition: int, start: int, arrivals: asyncio.Queue[Any]
    ) -> None:
        """Read the partition from ``start`` into ``arrivals``; an error ends the group (handed to open_stream).

        A paused partition (``auto_pause_time``, ``pause_stream``) is a quiet one: its subscription ends
        (or is refused) with PartitionPausedError, and the reader then waits without resuming it until its
        high watermark shows a message it has not read (a publish resumes a partition), and subscribes
        again from there, resuming it: only a read that needs data resumes a partition. A readonly one is
        quiet too: the server ends its subscription at its end (or refuses one that starts past it), and
        the reader waits the same way for a message published once it is writable again.
        """
        stream, resume = self.settings.stream, False
        SUBSCRIPTIONS_OPENED[(stream, partition)] += 1
        log.info("Liftbridge watcher subscribed to %s/%d at offset %d (cursor %s)", stream, partition, start,
                 self.settings.cursor)  # fmt: skip
        try:
            while True:
                try:
                    async for message in client.subscribe(stream, partition, start, resume=resume):
                        start = message.offset + 1
                        await self._windows[partition].acquire()
                        await arrivals.put((message, partition))
                    log.info("Liftbridge watcher: %s/%d ended at offset %d (readonly); waiting for more",
                             stream, partition, start)  # fmt: skip
                    await self._wait_for_offset(client, partition, start)
                except InvalidArgumentError as exc:
                    if not past_a_readonly_end(exc):
                        raise
                    await self._wait_for_offset(client, partition, start)
                except PartitionPausedError:
                    log.info("Liftbridge watcher: %s/%d is paused; waiting for offset %d without resuming it",
                             stream, partition, start)  # fmt: skip
                    await self._wait_for_offset(client, partition, start)
                    resume = True
                    log.info("Liftbridge watcher: %s/%d has offset %d; subscribing again", stream, partition, start)
        except Exception as exc:  # handed to open_stream, which fails the group
            await arrivals.put(exc)

    async def _wait_for_offset(self, client: AsyncLiftbridgeClient, partition: int, offset: int) -> None:
        """Return once the partition's high watermark reaches ``offset``, asking every PAUSED_POLL_INTERVAL s."""
        while (await client.fetch_partition_metadata(self.settings.stream, partition)).high_watermark < offset:
            await asyncio.sleep(PAUSED_POLL_INTERVAL)

    def get_advance_lane(self, broker_payload: Any) -> Hashable:
        partition: int = broker_payload[0]
        return partition

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """Dead-letter refused messages, store the last offset that may be passed; stop the group before the rest."""
        partition = batch[0].broker_payload[0]
        outcomes = [
            Outcome(item.broker_payload[1], item.outcome.acked, item.outcome.failed, item.outcome.rejected)
            for item in batch
        ]
        refusals = _REFUSALS[self.settings.group_key()]
        messages = {offset: self._in_flight.pop((partition, offset), None) for offset in (o.offset for o in outcomes)}
        try:
            decision = decide_advance(outcomes, can_dead_letter=self._dead_letters is not None)
            for offset in decision.dead_letter:
                errors = refusals.pop((partition, offset), ["refused by a watcher"])
                message = messages[offset]
                assert self._dead_letters is not None
                assert message is not None
                await self._dead_letters.publish(message, "; ".join(errors))
            client = self._client
            if decision.last is not None and client is not None:
                await self._write_cursor(client, self.cursors.position, partition, decision.last)
                self._committed[partition] = decision.last
        finally:  # only now may more events of the partition go out: at most max_in_flight are not stored
            for _ in batch:
                self._windows[partition].release()
        if decision.stop is not None:
            raise WatcherError(f"{self.settings.stream}/{partition} {decision.stop}; reading it again")

    async def aclose(self) -> None:
        if self._dead_letters is not None:
            await self._dead_letters.close()
            self._dead_letters = None
        self._in_flight.clear()
        _REFUSALS.pop(self.settings.group_key(), None)  # the next reader reads those messages again
        await super().aclose()


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
        self._committed = {p: start - 1 for p, start in starts.items()}
        self._start_lag_reports(client, partitions)
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
            fault_points.reached("watcher.planned")
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
        planned = await self._read_cursor(client, self.cursors.planned, first)
        recorded = await self._read_cursor(client, self.cursors.recorded, first)
        slots = {}
        for batch in {planned, recorded} - {-1}:
            starts = {p: await client.fetch_cursor(self.cursors.slot_start(batch), stream, p) for p in partitions}
            ends = {p: await client.fetch_cursor(self.cursors.slot_end(batch), stream, p) for p in partitions}
            slots[batch % 2] = (starts, ends)
        return resume_point(stream, self.settings.cursor, planned=planned, recorded=recorded, slots=slots)

    async def _plan(
        self, client: AsyncLiftbridgeClient, batch: int, starts: dict[int, int], ends: dict[int, int]
    ) -> None:
        """Write the batch into its slot, then mark it planned (the single write that makes it count).

        The slot is written only while ``planned`` still holds what this reader last saw.
        """
        stream, first = self.settings.stream, self._partitions[0]
        await self._fence(client, self.cursors.planned, first, batch)
        for partition in self._partitions:
            await client.set_cursor(self.cursors.slot_start(batch), stream, partition, starts[partition])
            await client.set_cursor(self.cursors.slot_end(batch), stream, partition, ends[partition])
        await self._write_cursor(client, self.cursors.planned, first, batch)

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """Record the batch once Airflow stored it; then move the per-partition positions."""
        for item in batch:
            number, last_offsets = item.broker_payload
            if not item.outcome.is_clean:
                raise WatcherError(f"batch {number} of {self.settings.stream} was not stored; sending it again")
            await self._record(number, last_offsets)
        self._recorded.set()

    async def _record(self, number: int, last_offsets: dict[int, int]) -> None:
        """Mark batch ``number`` recorded (Airflow stored it), then store each partition's last offset of it."""
        client, stream = self._client, self.settings.stream
        assert client is not None
        fault_points.reached("watcher.stored")
        await self._write_cursor(client, self.cursors.recorded, self._partitions[0], number)
        fault_points.reached("watcher.recorded")
        for partition, last in last_offsets.items():
            await client.set_cursor(self.cursors.position, stream, partition, last)
            self._committed[partition] = last
