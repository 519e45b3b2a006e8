"""A consumer group member's decisions, without I/O (the server's protocol, as go-liftbridge runs it).

A member joins its group (any broker: the metadata leader decides), then asks
the group's coordinator for its assignments every ``fetch_interval`` seconds;
that fetch is also its heartbeat (the coordinator drops a member it has not
heard from for the consumer timeout, 15 s by default). Every change of the
group (a member joins, leaves or times out; a new coordinator) bumps the
group's epoch; a member subscribes to its partitions with the epoch it was
given, and the server refuses an older epoch's subscription when a newer one
holds the partition. :class:`Membership` is told what happened and answers
what to do next:

- an assignment answer: which partitions to start reading and which to stop
  (all of them again when the epoch changed);
- a failed fetch: learn the group's coordinator and epoch again (the broker
  was not the coordinator, or the epoch moved), report the coordinator as
  unresponsive once it has not answered for the coordinator timeout (the
  server elects another when most members do), join again when the group
  forgot this member (it timed out, or the group is gone), or just try again;
- a failed join that crossed another member's first join of a new group (the
  server creates a group on its first join and refuses a second create): join
  again at once, it now joins the existing group;
- a failed join (after the group seemed to forget the member): when the server
  answers that the member belongs to the group already (a node answered a fetch
  before it had applied the new group: NOT_FOUND, common right after joining a
  cluster), learn the group's coordinator and epoch and go on as a member;
  otherwise stay out and join again at the next round;
- closing: the member stops its readers, checkpoints and leaves while its
  heartbeat goes on (a member whose heartbeat stopped first could be dropped by
  the group before its checkpoint, and its partitions read by another member
  from the older one); meanwhile answers and failures change nothing, and a
  member that left does not join again.

Positions are kept in cursors named ``__group:<group id>`` (as go-liftbridge).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import grpc

from liftbridge_provider.client.errors import LiftbridgeTimeoutError
from liftbridge_provider.client.messages import StartPosition
from liftbridge_provider.core.errors import LiftbridgeError

GROUP_CURSOR_PREFIX = "__group:"
JOIN_ATTEMPTS = 3
"""Joins per call when each crosses another member's join that created the group (one more suffices)."""
FETCH_SHARE = 0.4  # of the consumer timeout: the default time between assignment fetches


def group_cursor(group_id: str) -> str:
    """The cursor id that holds a group's positions."""
    return f"{GROUP_CURSOR_PREFIX}{group_id}"


Partition = tuple[str, int]


class Call(enum.Enum):
    """The heartbeat's next call."""

    FETCH = "fetch"  # fetch the assignments (also while closing, until the member left)
    JOIN = "join"  # the member is out of its group: join it (again)
    NONE = "none"  # closing, and out of the group: nothing more


class AfterFailure(enum.Enum):
    """What a member does after an assignment fetch failed."""

    RETRY = "retry"  # a transient failure: try again at the next fetch
    RELEARN = "relearn"  # ask the metadata for the group's coordinator and epoch, then fetch
    REPORT = "report"  # tell the metadata leader the coordinator is unresponsive
    REJOIN = "rejoin"  # the group forgot this member: join again


@dataclass(frozen=True)
class Rebalance:
    """Partitions to stop reading and to start reading (with the epoch the member now holds)."""

    stop: frozenset[Partition]
    start: frozenset[Partition]
    epoch: int


@dataclass
class Membership:
    """One member's view of its group; see the module docstring.

    :param group_id: the group.
    :param consumer_id: this member.
    :param streams: the streams the member consumes.
    :param fetch_interval: seconds between assignment fetches (None: 0.4 x the server's consumer timeout).
    """

    group_id: str
    consumer_id: str
    streams: tuple[str, ...]
    fetch_interval: float | None = None
    coordinator: str | None = None
    epoch: int = 0  # the group's epoch as this member last learned it (sent with every fetch)
    subscribed_epoch: int | None = None  # the epoch the member's subscriptions carry
    consumer_timeout: float = 15.0
    coordinator_timeout: float = 15.0
    assigned: frozenset[Partition] = frozenset()
    last_answer: float | None = None  # monotonic time of the coordinator's last answer
    closing: bool = False  # set by close(): only heartbeats until the member left
    _reported: set[tuple[str, int]] = field(default_factory=set)

    @property
    def joined(self) -> bool:
        return self.coordinator is not None

    def close(self) -> None:
        """The member is closing: it keeps fetching (its heartbeat) until it left, and nothing it is
        told from now on starts a reader, stops one, or joins again."""
        self.closing = True

    def next_call(self) -> Call:
        """What the heartbeat does next: fetch while joined, join when out of the group (never once closing)."""
        if self.joined:
            return Call.FETCH
        return Call.NONE if self.closing else Call.JOIN

    def on_joined(
        self, coordinator: str, epoch: int, consumer_timeout_ns: int, coordinator_timeout_ns: int, now: float
    ) -> None:
        """The join answer: the coordinator, the epoch, and the server's timeouts (nanoseconds)."""
        self.coordinator, self.epoch = coordinator, epoch
        self.consumer_timeout = consumer_timeout_ns / 1e9 or self.consumer_timeout
        self.coordinator_timeout = coordinator_timeout_ns / 1e9 or self.coordinator_timeout
        self.last_answer = now

    def interval(self) -> float:
        """Seconds until the next assignment fetch."""
        return self.fetch_interval if self.fetch_interval is not None else FETCH_SHARE * self.consumer_timeout

    def on_assignments(
        self, epoch: int, assignments: Mapping[str, Sequence[int]], now: float, running: frozenset[Partition]
    ) -> Rebalance:
        """The coordinator's answer, against the partitions being read now: what to stop and start
        (everything again when the epoch changed: subscriptions carry it; nothing while closing)."""
        if self.closing:
            self.last_answer = now
            return Rebalance(frozenset(), frozenset(), self.epoch)
        wanted = frozenset((stream, p) for stream, partitions in assignments.items() for p in partitions)
        changed_epoch = epoch != self.subscribed_epoch
        stop = running if changed_epoch else running - wanted
        start = wanted if changed_epoch else wanted - running
        self.epoch = self.subscribed_epoch = epoch
        self.assigned, self.last_answer = wanted, now
        return Rebalance(stop, start, epoch)

    def on_fetch_failed(self, code: enum.Enum | None, details: str, now: float) -> AfterFailure:
        """Decide after a failed assignment fetch (``code`` None: the coordinator is unknown); while
        closing, nothing (RETRY: the member is about to leave anyway)."""
        if self.closing:
            return AfterFailure.RETRY
        text = details.lower()
        if code == grpc.StatusCode.NOT_FOUND or "not a member" in text:
            return AfterFailure.REJOIN
        if code == grpc.StatusCode.FAILED_PRECONDITION:
            return AfterFailure.RELEARN  # not the coordinator, or the epoch moved
        silent_for = now - (self.last_answer if self.last_answer is not None else now)
        if self.coordinator is not None and silent_for >= self.coordinator_timeout:
            report = (self.coordinator, self.epoch)
            if report not in self._reported:
                self._reported.add(report)
                return AfterFailure.REPORT
            return AfterFailure.RELEARN
        return AfterFailure.RETRY

    def on_join_failed(self, code: enum.Enum | None, details: str) -> AfterFailure:
        """Decide after a failed (re)join: REJOIN at once when another member's join created the group
        at the same moment (the server refuses the second create; a join of an existing group succeeds),
        RELEARN when the group holds this member already, else RETRY (the member stays out; the next
        round joins again)."""
        if code == grpc.StatusCode.FAILED_PRECONDITION and "consumer group already exists" in details.lower():
            return AfterFailure.REJOIN
        if code == grpc.StatusCode.FAILED_PRECONDITION and "already a member" in details.lower():
            return AfterFailure.RELEARN
        return AfterFailure.RETRY

    def after_join_failure(self, code: enum.Enum | None, details: str, attempt: int) -> AfterFailure:
        """After failed join number ``attempt`` (from 1), the first join or a later one: REJOIN at once when
        it crossed another member's first join of the group (at most :data:`JOIN_ATTEMPTS` joins in all);
        RELEARN when the group holds this member already (a join the server applied whose answer was lost,
        sent again): it is a member, and learns the coordinator and epoch from the metadata; else RETRY
        (the join failed: raised to the first join's caller, tried again by the heartbeat)."""
        decision = self.on_join_failed(code, details)
        if decision is AfterFailure.REJOIN and attempt >= JOIN_ATTEMPTS:
            return AfterFailure.RETRY
        return decision

    def on_group_metadata(self, coordinator: str, epoch: int) -> bool:
        """The metadata's view of the group ("": no coordinator now); True when it differs from this
        member's (then fetch again)."""
        known = coordinator or None
        changed = (known, epoch) != (self.coordinator, self.epoch)
        self.coordinator, self.epoch = known, epoch
        return changed

    def left(self) -> frozenset[Partition]:
        """This member left (or is leaving): every partition to stop reading."""
        stopped, self.assigned, self.coordinator, self.subscribed_epoch = self.assigned, frozenset(), None, None
        return stopped


class ConsumerError(LiftbridgeError):
    """A consumer group member cannot go on (e.g. no committed position with ``auto_offset="none"``)."""


def start_of(committed: int, auto_offset: str, group_id: str, partition: Partition) -> StartPosition:
    """Where a member starts reading a partition: after the group's committed offset (-1: none),
    else ``auto_offset`` (``earliest``, ``latest``: new messages only, ``none``: ConsumerError)."""
    if committed >= 0:
        return StartPosition.at_offset(committed + 1)
    if auto_offset == "earliest":
        return StartPosition.earliest()
    if auto_offset == "latest":
        return StartPosition.new_only()
    stream, number = partition
    raise ConsumerError(
        f"group {group_id!r} has no committed position on {stream}/{number} and auto_offset='none'",
        stream=stream,
        partition=number,
    )


@dataclass
class Progress:
    """Processed offsets per partition, and where this member last saw each partition's group cursor.

    A checkpoint moves a cursor from that view to the processed offset by the one cursor-advance rule
    (``cursor_advance``): never back, and not over another writer's move this member has not seen (a member
    dropped from its group, whose partition another member read on, must not move its cursor back).
    """

    processed: dict[Partition, int] = field(default_factory=dict)
    seen: dict[Partition, int] = field(default_factory=dict)  # the cursor as read, written or found moved

    def resumed(self, partition: Partition, committed: int) -> None:
        """The group's committed offset (-1: none), read when the partition was assigned. A view this member
        already holds that is further on stays (a read that crossed its own checkpoint)."""
        self.seen[partition] = max(committed, self.seen.get(partition, -1))

    def mark(self, partition: Partition, offset: int) -> None:
        """``offset`` of ``partition`` was processed."""
        if offset > self.processed.get(partition, -1):
            self.processed[partition] = offset

    def due(self) -> dict[Partition, tuple[int, int | None]]:
        """The moves to checkpoint, ``{partition: (processed offset, where this member last saw the cursor)}``:
        processed beyond that view (None: the member never saw the cursor)."""
        return {p: (o, self.seen.get(p)) for p, o in self.processed.items() if o > self.seen.get(p, -1)}

    def stored(self, partition: Partition, offset: int) -> None:
        """The cursor was moved to (or found at) ``offset``."""
        self.seen[partition] = max(offset, self.seen.get(partition, -1))

    def moved(self, partition: Partition, found: int) -> None:
        """Another writer moved the cursor to ``found``: the next checkpoint moves it on from there, if this
        member processed beyond it."""
        self.seen[partition] = found


POLL_SECONDS = 0.2  # how often a waiting member (or a reader waiting for room) looks whether it was stopped
READER_STOP_WAIT = 1.0
"""Seconds a rebalance waits for the readers it stops. A reader waiting for a message or for room in the
member's queue ends within POLL_SECONDS of being stopped; one still in its first cursor fetch ends when
that call returns (by its deadline), unseen by the heartbeat, which must go on."""


@dataclass
class ReadBudget:
    """The time limits of one ``messages()`` read: ``timeout`` seconds in all, ``idle_timeout`` seconds
    without a message (either None: no limit). Times are ``time.monotonic()`` values."""

    timeout: float | None
    idle_timeout: float | None
    started: float
    last_message: float = field(init=False)

    def __post_init__(self) -> None:
        self.last_message = self.started

    def delivered(self, now: float) -> None:
        self.last_message = now

    def wait(self, now: float) -> float:
        """Seconds to wait for the next message before looking again (at most POLL_SECONDS)."""
        limits = [POLL_SECONDS]
        if self.timeout is not None:
            limits.append(self.started + self.timeout - now)
        if self.idle_timeout is not None:
            limits.append(self.last_message + self.idle_timeout - now)
        return max(min(limits), 0.0)

    def check(self, now: float) -> None:
        """Raise LiftbridgeTimeoutError once a limit ran out."""
        if self.timeout is not None and now - self.started >= self.timeout:
            raise LiftbridgeTimeoutError(f"consumer timed out after {self.timeout:g}s")
        if self.idle_timeout is not None and now - self.last_message >= self.idle_timeout:
            raise LiftbridgeTimeoutError(f"no message for {self.idle_timeout:g}s")
