"""A consumer group member on asyncio (the asyncio front end of :class:`~liftbridge_provider.client.groups.Membership`).

``client.consumer("billing")`` on an :class:`AsyncLiftbridgeClient` returns an
:class:`AsyncConsumer`: ``await subscribe(streams)`` joins the group and starts
a task that fetches the member's assignments (the heartbeat) and a task per
assigned partition; ``messages()`` is one async iterator over them. Processing,
checkpoints and delivery are as for the sync :class:`~liftbridge_provider.client.consumer.Consumer`
(at least once; a message counts as processed once the next one is asked for).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from types import TracebackType

from liftbridge_provider.client import group_requests as ask
from liftbridge_provider.client.aio_timeout import within
from liftbridge_provider.client.errors import CursorMovedError
from liftbridge_provider.client.group_ports import AsyncGroupClient
from liftbridge_provider.client.group_requests import AutoOffset
from liftbridge_provider.client.groups import (
    JOIN_ATTEMPTS,
    AfterFailure,
    ConsumerError,
    Membership,
    Partition,
    Progress,
    ReadBudget,
    group_cursor,
    start_of,
)
from liftbridge_provider.client.messages import Message
from liftbridge_provider.core.checks import check_seconds, check_timeout
from liftbridge_provider.core.errors import LiftbridgeError

log = logging.getLogger(__name__)


@dataclass
class _Reader:
    """One assigned partition: its reading task (None: ``read=False``) and the token its messages carry."""

    token: int
    task: asyncio.Task[None] | None


class AsyncConsumer:
    """One member of a consumer group on asyncio; see the module docstring."""

    def __init__(
        self,
        client: AsyncGroupClient,
        group_id: str,
        consumer_id: str | None = None,
        *,
        auto_checkpoint: float | None = 5.0,
        auto_offset: AutoOffset = "latest",
        fetch_assignments_interval: float | None = None,
        read: bool = True,
    ) -> None:
        ask.check_consumer(
            group_id,
            consumer_id,
            auto_offset=auto_offset,
            auto_checkpoint=auto_checkpoint,
            fetch_assignments_interval=fetch_assignments_interval,
            read=read,
        )
        self._client = client
        self.group_id = group_id
        self.consumer_id = consumer_id or uuid.uuid4().hex
        self.auto_checkpoint = auto_checkpoint
        self.auto_offset = auto_offset
        self._fetch_interval = fetch_assignments_interval
        self._reads = read
        self._membership: Membership | None = None
        self._readers: dict[Partition, _Reader] = {}
        self._tokens = iter(range(1, 2**62))
        self._arrivals: asyncio.Queue[tuple[Partition, int, Message | BaseException]] = asyncio.Queue(maxsize=10_000)
        self._progress = Progress()
        self._closed = asyncio.Event()
        self._protocol: asyncio.Task[None] | None = None
        self._last_checkpoint = time.monotonic()
        self._settled_since = time.monotonic()
        self._handed: tuple[Partition, int] | None = None

    # -- the user's side -------------------------------------------------------------------------

    @property
    def assignments(self) -> frozenset[Partition]:
        """The partitions this member reads now."""
        return frozenset(self._readers)

    async def subscribe(self, streams: Sequence[str]) -> None:
        """Join the group for ``streams`` and start following its assignments (once per consumer)."""
        names = ask.check_subscribe(streams, self._membership is not None, closed=self._closed.is_set())
        metadata = await self._client.fetch_metadata(names)
        for name in names:
            metadata.stream(name)  # a missing stream fails here (NoSuchStreamError)
        self._membership = Membership(self.group_id, self.consumer_id, names, self._fetch_interval)
        await self._join()
        self._protocol = asyncio.create_task(self._follow(), name=f"liftbridge-group-{self.group_id}")

    async def messages(
        self, *, timeout: float | None = None, idle_timeout: float | None = None
    ) -> AsyncIterator[Message]:
        """The messages of every assigned partition, as they arrive, until closed (or a budget, in seconds,
        runs out: LiftbridgeTimeoutError). Asking for the next message marks the last one processed."""
        budget = ReadBudget(check_timeout("timeout", timeout), check_timeout("idle_timeout", idle_timeout),
                            time.monotonic())  # fmt: skip
        while not self._closed.is_set():
            try:
                partition, token, item = await within(budget.wait(time.monotonic()), self._arrivals.get())
            except TimeoutError:
                budget.check(time.monotonic())
                continue
            if isinstance(item, BaseException):
                raise item
            reader = self._readers.get(partition)
            if reader is None or reader.token != token:
                continue  # read before the partition moved: its next owner reads it again
            self._handed = (partition, item.offset)
            yield item
            self._mark(partition, item.offset)
            budget.delivered(time.monotonic())

    async def wait_for_assignments(self, *, settle: float, timeout: float) -> frozenset[Partition]:
        """The member's partitions once they stayed the same for ``settle`` seconds, or as they are
        when ``timeout`` seconds passed."""
        check_seconds("settle", settle)
        check_seconds("timeout", timeout)
        ends = time.monotonic() + timeout
        while time.monotonic() < ends and time.monotonic() - self._settled_since < settle:
            await asyncio.sleep(0.1)
        return self.assignments

    async def checkpoint(self) -> None:
        """Store the processed offsets of every partition read (the group's cursors), never moving one back
        (as the sync member's)."""
        for (stream, partition), (offset, seen) in self._progress.due().items():
            cursor = group_cursor(self.group_id)
            try:
                await self._client.advance_cursor(cursor, stream, partition, offset, expected=seen)
            except CursorMovedError as moved:
                log.warning("consumer %s: %s (another member read it meanwhile)", self.consumer_id, moved)
                self._progress.moved((stream, partition), moved.found)
            else:
                self._progress.stored((stream, partition), offset)
        self._last_checkpoint = time.monotonic()

    async def close(self, *, last_processed: bool = True) -> None:
        """Stop reading, checkpoint what was processed (with ``last_processed``, the last message handed
        over too), and leave the group."""
        if self._closed.is_set():
            return
        if last_processed and self._handed is not None:
            self._mark(*self._handed)
        self._closed.set()
        if self._protocol is not None:
            try:
                await self._protocol
            except asyncio.CancelledError:  # the heartbeat task's own end; a cancel of this task goes on
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise
        await self._stop_readers(self.assignments)
        try:
            await self.checkpoint()
        finally:
            if self._membership is not None and self._membership.joined:
                await self._leave()

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close(last_processed=exc_type is None)  # an error while handling it: read it again

    def _mark(self, partition: Partition, offset: int) -> None:
        self._handed = None
        self._progress.mark(partition, offset)

    # -- the group protocol (on the protocol task) -----------------------------------------------

    async def _join(self) -> None:
        membership = self._membership
        assert membership is not None
        for attempt in range(1, JOIN_ATTEMPTS + 1):
            try:
                response = await self._client._group_call("JoinConsumerGroup", ask.join(membership))
                break
            except LiftbridgeError as exc:
                decision = membership.after_join_failure(exc.code, exc.message, attempt)
                if decision is AfterFailure.RELEARN:
                    log.info("consumer %s: %s; learning the group's coordinator", self.consumer_id, exc)
                    await self._relearn(membership)
                    return
                if decision is not AfterFailure.REJOIN:
                    raise
                log.info("consumer %s: %s (another member created the group); joining again", self.consumer_id, exc)
        membership.on_joined(response.coordinator, response.epoch, response.consumerTimeout,
                             response.coordinatorTimeout, time.monotonic())  # fmt: skip
        log.info("consumer %s joined group %s (coordinator %s, epoch %d)", self.consumer_id, self.group_id,
                 response.coordinator, response.epoch)  # fmt: skip

    async def _leave(self) -> None:
        assert self._membership is not None
        try:
            await self._client._group_call("LeaveConsumerGroup", ask.leave(self._membership))
        except LiftbridgeError as exc:  # the group drops a silent member after its timeout anyway
            log.warning("consumer %s could not leave group %s: %s", self.consumer_id, self.group_id, exc)
        self._membership.left()

    async def _follow(self) -> None:
        """Fetch assignments (the heartbeat), rebalance, checkpoint, until closed."""
        membership = self._membership
        assert membership is not None
        while not self._closed.is_set():
            try:
                if membership.joined:
                    await self._fetch_assignments(membership)
                else:
                    await self._rejoin(membership)
            except LiftbridgeError as exc:
                await self._after_failure(membership, exc)
            except Exception:  # keep following: a bug here must not silently stop the member's heartbeat
                log.exception("consumer %s: assignment fetch failed", self.consumer_id)
            if self.auto_checkpoint is not None and time.monotonic() - self._last_checkpoint >= self.auto_checkpoint:
                await self._checkpoint_logged()
            with contextlib.suppress(TimeoutError):
                pause = min(membership.interval(), self.auto_checkpoint or membership.interval())
                await within(pause, self._closed.wait())

    async def _fetch_assignments(self, membership: Membership) -> None:
        assert membership.coordinator is not None
        timeout = min(self._client.config.request_timeout, membership.interval())
        response = await self._client._group_call("FetchConsumerGroupAssignments", ask.fetch_assignments(membership),
                                                  broker=membership.coordinator, timeout=timeout)  # fmt: skip
        assignments = ask.assignments_of(response)
        rebalance = membership.on_assignments(response.epoch, assignments, time.monotonic(), self.assignments)
        if rebalance.stop or rebalance.start:
            self._settled_since = time.monotonic()
            log.info("consumer %s (epoch %d): stop %s, start %s", self.consumer_id, rebalance.epoch,
                     sorted(rebalance.stop), sorted(rebalance.start))  # fmt: skip
        if rebalance.stop:
            await self._stop_readers(rebalance.stop)
            await self._checkpoint_logged()
        for partition in sorted(rebalance.start):
            self._start_reader(partition, rebalance.epoch)

    async def _rejoin(self, membership: Membership) -> None:
        """Join again (when the group holds this member already, :meth:`_join` learns its coordinator)."""
        await self._join()

    async def _relearn(self, membership: Membership) -> None:
        answer = await self._client._group_call("FetchMetadata", ask.group_metadata(membership))
        ask.learn_group(membership, answer)

    async def _after_failure(self, membership: Membership, exc: LiftbridgeError) -> None:
        if not membership.joined:
            log.info("consumer %s: joining group %s failed (tried again): %s", self.consumer_id, self.group_id, exc)
            return
        decision = membership.on_fetch_failed(exc.code, exc.message, time.monotonic())
        log.info("consumer %s: assignment fetch failed (%s): %s", self.consumer_id, exc, decision.value)
        try:
            if decision is AfterFailure.REJOIN:
                await self._stop_readers(self.assignments)
                await self._checkpoint_logged()
                membership.left()
                await self._rejoin(membership)
            elif decision is AfterFailure.RELEARN:
                await self._relearn(membership)
            elif decision is AfterFailure.REPORT:
                await self._client._group_call("ReportConsumerGroupCoordinator", ask.report_coordinator(membership))
                log.warning("consumer %s reported coordinator %s of group %s as unresponsive",
                            self.consumer_id, membership.coordinator, self.group_id)  # fmt: skip
        except LiftbridgeError as again:
            log.info("consumer %s: %s failed too: %s", self.consumer_id, decision.value, again)

    async def _checkpoint_logged(self) -> None:
        try:
            await self.checkpoint()
        except LiftbridgeError as exc:
            log.warning("consumer %s: checkpoint failed (tried again later): %s", self.consumer_id, exc)

    # -- the partitions' readers -----------------------------------------------------------------

    def _start_reader(self, partition: Partition, epoch: int) -> None:
        token = next(self._tokens)
        task = None
        if self._reads:
            name = f"liftbridge-group-{self.group_id}-{partition[0]}-{partition[1]}"
            task = asyncio.create_task(self._read(partition, token, epoch), name=name)
        self._readers[partition] = _Reader(token, task)

    async def _stop_readers(self, partitions: frozenset[Partition]) -> None:
        readers = [self._readers.pop(p) for p in partitions if p in self._readers]
        tasks = [r.task for r in readers if r.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _read(self, partition: Partition, token: int, epoch: int) -> None:
        assert self._membership is not None
        stream, number = partition
        try:
            committed = await self._client.fetch_cursor(group_cursor(self.group_id), stream, number)
            self._progress.resumed(partition, committed)
            start = start_of(committed, self.auto_offset, self.group_id, partition)
            request = ask.subscribe_as_member(self._membership, partition, start, epoch)
            async for message in self._client._subscription(request):
                await self._arrivals.put((partition, token, message))
        except LiftbridgeError as exc:
            log.info("consumer %s: reading %s/%d ended: %s", self.consumer_id, stream, number, exc)
            reader = self._readers.get(partition)
            if reader is not None and reader.token == token:
                del self._readers[partition]  # the next fetch starts it again if it is still ours
            if isinstance(exc, ConsumerError):
                await self._arrivals.put((partition, token, exc))
