"""A consumer group member (the synchronous front end of :class:`~liftbridge_provider.client.groups.Membership`).

``client.consumer("billing")`` returns a :class:`Consumer`; ``subscribe(streams)``
joins the group and starts a thread that fetches the member's assignments
(the heartbeat) and reads each assigned partition on a thread of its own;
``messages()`` hands the messages over in one iterator. A message counts as
processed once the iterator is asked for the next one (or the ``with`` block
ends without an error); processed offsets are checkpointed to the group's
cursors every ``auto_checkpoint`` seconds, before a partition moves to another
member, and on close. Delivery is at least once: what was read but not
checkpointed when a member stops is read again by the partition's next owner.

A reader hands its messages over through a bounded queue (10,000 messages);
when the queue is full it waits for room, looking every ``POLL_SECONDS``
whether it was stopped, so stopping it (a rebalance, :meth:`Consumer.close`)
never waits on a backlog. ``close()`` stops the readers, checkpoints and
leaves while the heartbeat goes on, then ends the heartbeat.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType

from liftbridge_provider.client import group_requests as ask
from liftbridge_provider.client.errors import CursorMovedError
from liftbridge_provider.client.group_ports import GroupClient
from liftbridge_provider.client.group_requests import AutoOffset
from liftbridge_provider.client.groups import (
    JOIN_ATTEMPTS,
    POLL_SECONDS,
    READER_STOP_WAIT,
    AfterFailure,
    Call,
    ConsumerError,
    Membership,
    Partition,
    Progress,
    ReadBudget,
    group_cursor,
    start_of,
)
from liftbridge_provider.client.messages import Message, StartPosition
from liftbridge_provider.client.subscription import Subscription
from liftbridge_provider.core.checks import check_seconds, check_timeout
from liftbridge_provider.core.errors import LiftbridgeError

log = logging.getLogger(__name__)

__all__ = ["AutoOffset", "Consumer", "ConsumerError"]


@dataclass
class _Reader:
    """One assigned partition being read: its subscription, thread, and a token that tells its messages apart."""

    token: int
    thread: threading.Thread | None = None  # None: the member does not read (``read=False``)
    subscription: Subscription | None = None
    cancelled: bool = False


class Consumer:
    """One member of a consumer group; see the module docstring and :meth:`LiftbridgeClient.consumer`."""

    def __init__(
        self,
        client: GroupClient,
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
        self._membership: Membership | None = None
        self._fetch_interval = fetch_assignments_interval
        self._reads = read  # False: only follow the assignments (the caller reads the partitions itself)
        self._settled_since = time.monotonic()
        self._lock = threading.RLock()
        self._readers: dict[Partition, _Reader] = {}
        self._tokens = iter(range(1, 2**62))
        self._arrivals: queue.Queue[tuple[Partition, int, Message | BaseException]] = queue.Queue(maxsize=10_000)
        self._progress = Progress()
        self._checkpointing = threading.Lock()  # one checkpoint at a time (the heartbeat's, close's, the user's)
        self._closing = threading.Event()  # close() began: messages() ends, no reader starts
        self._closed = threading.Event()  # the heartbeat ends (close() sets it once the member left)
        self._protocol: threading.Thread | None = None
        self._last_checkpoint = time.monotonic()
        self._handed: tuple[Partition, int] | None = None  # handed over, not yet known to be processed

    # -- the user's side -------------------------------------------------------------------------

    @property
    def assignments(self) -> frozenset[Partition]:
        """The partitions this member reads now."""
        with self._lock:
            return frozenset(self._readers)

    def subscribe(self, streams: Sequence[str]) -> None:
        """Join the group for ``streams`` and start following its assignments (once per consumer)."""
        names = ask.check_subscribe(streams, self._membership is not None, closed=self._closing.is_set())
        for name in names:
            self._client.stream_info(name)  # a missing stream fails here (NoSuchStreamError)
        self._membership = Membership(self.group_id, self.consumer_id, names, self._fetch_interval)
        self._join()
        self._protocol = threading.Thread(target=self._follow, name=f"liftbridge-group-{self.group_id}", daemon=True)
        self._protocol.start()

    def messages(self, *, timeout: float | None = None, idle_timeout: float | None = None) -> Iterator[Message]:
        """The messages of every assigned partition, as they arrive, until closed (or a budget, in seconds,
        runs out: LiftbridgeTimeoutError). Asking for the next message marks the last one processed."""
        budget = ReadBudget(check_timeout("timeout", timeout), check_timeout("idle_timeout", idle_timeout),
                            time.monotonic())  # fmt: skip
        while not self._closing.is_set() and not self._closed.is_set():
            try:
                partition, token, item = self._arrivals.get(timeout=budget.wait(time.monotonic()))
            except queue.Empty:
                budget.check(time.monotonic())
                continue
            if isinstance(item, BaseException):
                raise item
            with self._lock:
                reader = self._readers.get(partition)
                if reader is None or reader.token != token:
                    continue  # read before the partition moved: its next owner reads it again
            self._handed = (partition, item.offset)
            yield item
            self._mark(partition, item.offset)
            budget.delivered(time.monotonic())  # idle from when the next message is asked for

    def wait_for_assignments(self, *, settle: float, timeout: float) -> frozenset[Partition]:
        """The member's partitions once they stayed the same for ``settle`` seconds (members joining at
        about the same time settle the group), or as they are when ``timeout`` seconds passed."""
        check_seconds("settle", settle)
        check_seconds("timeout", timeout)
        ends = time.monotonic() + timeout
        while time.monotonic() < ends and time.monotonic() - self._settled_since < settle:
            self._closed.wait(0.1)
        return self.assignments

    def checkpoint(self) -> None:
        """Store the processed offsets of every partition read (the group's cursors), never moving one back:
        a cursor another writer moved is left where it is (logged), and moved on from there next time."""
        with self._checkpointing:
            with self._lock:
                due = self._progress.due()
            for (stream, partition), (offset, seen) in due.items():
                try:
                    self._client.advance_cursor(group_cursor(self.group_id), stream, partition, offset, expected=seen)
                except CursorMovedError as moved:
                    log.warning("consumer %s: %s (another member read it meanwhile)", self.consumer_id, moved)
                    with self._lock:
                        self._progress.moved((stream, partition), moved.found)
                else:
                    with self._lock:
                        self._progress.stored((stream, partition), offset)
            self._last_checkpoint = time.monotonic()

    def close(self, *, last_processed: bool = True) -> None:
        """Stop reading, checkpoint what was processed (with ``last_processed``, the last message handed
        over too), and leave the group; the heartbeat goes on until the member left.

        Returns once the readers and the heartbeat ended: at once but for calls in flight, each of
        which ends by its deadline (``request_timeout``)."""
        if self._closing.is_set():
            return
        if last_processed and self._handed is not None:
            self._mark(*self._handed)
        membership = self._membership
        with self._lock:
            self._closing.set()
            if membership is not None:
                membership.close()
        self._stop_readers(self.assignments, wait=self._client.config.request_timeout)
        try:
            self.checkpoint()
        finally:
            try:
                if membership is not None and membership.joined:
                    self._leave()
            finally:
                self._closed.set()
                if self._protocol is not None:
                    self._protocol.join(timeout=self._client.config.request_timeout + POLL_SECONDS)
                if membership is not None and membership.joined:  # joined again before it saw the close
                    self._leave()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close(last_processed=exc_type is None)  # an error while handling it: read it again

    def _mark(self, partition: Partition, offset: int) -> None:
        self._handed = None
        with self._lock:
            self._progress.mark(partition, offset)

    # -- the group protocol (on the protocol thread) ---------------------------------------------

    def _join(self) -> None:
        membership = self._membership
        assert membership is not None
        for attempt in range(1, JOIN_ATTEMPTS + 1):
            try:
                response = self._client._group_call("JoinConsumerGroup", ask.join(membership))
                break
            except LiftbridgeError as exc:
                decision = membership.after_join_failure(exc.code, exc.message, attempt)
                if decision is AfterFailure.RELEARN:
                    log.info("consumer %s: %s; learning the group's coordinator", self.consumer_id, exc)
                    self._relearn(membership)
                    return
                if decision is not AfterFailure.REJOIN:
                    raise
                log.info("consumer %s: %s (another member created the group); joining again", self.consumer_id, exc)
        membership.on_joined(
            response.coordinator,
            response.epoch,
            response.consumerTimeout,
            response.coordinatorTimeout,
            time.monotonic(),
        )
        log.info("consumer %s joined group %s (coordinator %s, epoch %d)", self.consumer_id, self.group_id,
                 response.coordinator, response.epoch)  # fmt: skip

    def _leave(self) -> None:
        assert self._membership is not None
        try:
            self._client._group_call("LeaveConsumerGroup", ask.leave(self._membership))
        except LiftbridgeError as exc:  # the group drops a silent member after its timeout anyway
            log.warning("consumer %s could not leave group %s: %s", self.consumer_id, self.group_id, exc)
        self._membership.left()

    def _follow(self) -> None:
        """Fetch assignments (the heartbeat), rebalance, checkpoint, until closed."""
        membership = self._membership
        assert membership is not None
        while not self._closed.is_set():
            with self._lock:
                call = membership.next_call()
            try:
                if call is Call.FETCH:
                    self._fetch_assignments(membership)
                elif call is Call.JOIN:
                    self._rejoin(membership)
            except LiftbridgeError as exc:
                self._after_failure(membership, exc)
            except Exception:  # keep following: a bug here must not silently stop the member's heartbeat
                log.exception("consumer %s: assignment fetch failed", self.consumer_id)
            due = self.auto_checkpoint is not None and time.monotonic() - self._last_checkpoint >= self.auto_checkpoint
            if due and not self._closing.is_set():  # close() checkpoints itself
                self._checkpoint_logged()
            self._closed.wait(min(membership.interval(), self.auto_checkpoint or membership.interval()))

    def _fetch_assignments(self, membership: Membership) -> None:
        assert membership.coordinator is not None
        timeout = min(self._client.config.request_timeout, membership.interval())
        response = self._client._group_call("FetchConsumerGroupAssignments", ask.fetch_assignments(membership),
                                            broker=membership.coordinator, timeout=timeout)  # fmt: skip
        assignments = ask.assignments_of(response)
        with self._lock:
            rebalance = membership.on_assignments(response.epoch, assignments, time.monotonic(), self.assignments)
        if rebalance.stop or rebalance.start:
            self._settled_since = time.monotonic()
            log.info("consumer %s (epoch %d): stop %s, start %s", self.consumer_id, rebalance.epoch,
                     sorted(rebalance.stop), sorted(rebalance.start))  # fmt: skip
        if rebalance.stop:
            self._stop_readers(rebalance.stop, wait=READER_STOP_WAIT)
            self._checkpoint_logged()
        for partition in sorted(rebalance.start):
            self._start_reader(partition, rebalance.epoch)

    def _rejoin(self, membership: Membership) -> None:
        """Join again; when the group holds this member already, learn its coordinator and epoch instead.
        Not once closing (close() leaves again should a join cross it)."""
        with self._lock:
            if membership.next_call() is not Call.JOIN:
                return
        self._join()

    def _after_failure(self, membership: Membership, exc: LiftbridgeError) -> None:
        if not membership.joined:
            log.info("consumer %s: joining group %s failed (tried again): %s", self.consumer_id, self.group_id, exc)
            return
        with self._lock:
            decision = membership.on_fetch_failed(exc.code, exc.message, time.monotonic())
            if decision is AfterFailure.REJOIN:
                membership.left()
        log.info("consumer %s: assignment fetch failed (%s): %s", self.consumer_id, exc, decision.value)
        try:
            if decision is AfterFailure.REJOIN:
                self._stop_readers(self.assignments, wait=READER_STOP_WAIT)
                self._checkpoint_logged()
                self._rejoin(membership)
            elif decision is AfterFailure.RELEARN:
                self._relearn(membership)
            elif decision is AfterFailure.REPORT:
                self._client._group_call("ReportConsumerGroupCoordinator", ask.report_coordinator(membership))
                log.warning("consumer %s reported coordinator %s of group %s as unresponsive",
                            self.consumer_id, membership.coordinator, self.group_id)  # fmt: skip
        except LiftbridgeError as again:
            log.info("consumer %s: %s failed too: %s", self.consumer_id, decision.value, again)

    def _relearn(self, membership: Membership) -> None:
        response = self._client._unary("FetchMetadata", ask.group_metadata(membership), timeout=None, stream=None)
        ask.learn_group(membership, response)

    def _checkpoint_logged(self) -> None:
        try:
            self.checkpoint()
        except LiftbridgeError as exc:
            log.warning("consumer %s: checkpoint failed (tried again later): %s", self.consumer_id, exc)

    # -- the partitions' readers -----------------------------------------------------------------

    def _start_reader(self, partition: Partition, epoch: int) -> None:
        reader = _Reader(next(self._tokens))
        with self._lock:
            if self._closing.is_set():
                return
            if self._reads:
                name = f"liftbridge-group-{self.group_id}-{partition[0]}-{partition[1]}"
                reader.thread = threading.Thread(target=self._read, args=(partition, reader, epoch), daemon=True,
                                                 name=name)  # fmt: skip
                reader.thread.start()
            self._readers[partition] = reader

    def _stop_readers(self, partitions: frozenset[Partition], *, wait: float) -> None:
        """Stop the partitions' readers, and wait for them up to ``wait`` seconds in all."""
        with self._lock:
            readers = [self._readers.pop(p) for p in partitions if p in self._readers]
            for reader in readers:
                reader.cancelled = True
                if reader.subscription is not None:
                    reader.subscription.cancel()
        ends = time.monotonic() + wait
        for reader in readers:
            if reader.thread is not None:
                reader.thread.join(timeout=max(ends - time.monotonic(), 0.0))

    def _read(self, partition: Partition, reader: _Reader, epoch: int) -> None:
        stream, number = partition
        try:
            start = self._start_of(stream, number)
            assert self._membership is not None
            request = ask.subscribe_as_member(self._membership, partition, start, epoch)
            subscription = self._client._subscription(request, None)
            with self._lock:
                if reader.cancelled:
                    return
                reader.subscription = subscription
            for message in subscription:
                if not self._hand_over(reader, (partition, reader.token, message)):
                    return
        except LiftbridgeError as exc:
            log.info("consumer %s: reading %s/%d ended: %s", self.consumer_id, stream, number, exc)
            with self._lock:
                if self._readers.get(partition) is reader:
                    del self._readers[partition]  # the next fetch starts it again if it is still ours
            if isinstance(exc, ConsumerError):
                self._hand_over(reader, (partition, reader.token, exc))

    def _hand_over(self, reader: _Reader, item: tuple[Partition, int, Message | BaseException]) -> bool:
        """Queue ``item`` for ``messages()``, waiting for room while the reader runs; False: it was stopped."""
        while not reader.cancelled:
            try:
                self._arrivals.put(item, timeout=POLL_SECONDS)
                return True
            except queue.Full:
                continue
        return False

    def _start_of(self, stream: str, partition: int) -> StartPosition:
        """After the group's committed position, else ``auto_offset`` (``none``: an error for the reader)."""
        committed = self._client.fetch_cursor(group_cursor(self.group_id), stream, partition)
        with self._lock:
            self._progress.resumed((stream, partition), committed)
        return start_of(committed, self.auto_offset, self.group_id, (stream, partition))
