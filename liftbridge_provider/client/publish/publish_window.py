"""The window of a pipelined batch publish, without I/O.

A batch of ``size`` messages is published with at most ``window`` of them
awaiting their ack. :class:`PublishWindow` decides which message goes next and
records how each one ended (acked, refused, timed out, lost with its
connection, not sent); the publishers drive it from their own transport (NATS
today), calling it with the current ``time.monotonic()``. It never sends,
sleeps or reads a clock itself, so the rules are tested as plain logic.

Rules:

- an ack that arrives after its message timed out still counts; one after an
  error does not;
- a message whose connection broke before its ack may be stored
  (``may_be_stored``); it is reported, never re-sent;
- a message the server refused without storing it, for a reason that passes
  (:meth:`PublishWindow.hold`: the metadata leader is being replaced), is held;
  nothing new is sent while one is held. Once nothing awaits an ack, the
  driver calls :meth:`~PublishWindow.release`: each held message goes again,
  before the messages not sent yet, unless a later message of its partition
  may be stored (sending it again would store the two out of order) or it was
  first sent ``ack_wait`` seconds ago or more; then it fails with its refusal.
  From a release until a message sent alone after it is acked, messages go
  one at a time (those sent again first) and nothing else goes out while one
  awaits its answer (a late ack of a message sent before says nothing): a broker that takes requests
  again part-way through a window would refuse some and store later ones of
  the same partition, which could then never go again in order;
- a message refused as unknown (NOT_FOUND, nothing stored) is held the same way
  (``hold(..., unknown=True)``), and the driver asks fresh metadata about its
  partition before it releases it (:class:`UnknownWord`): metadata that does
  not list it fails it with its refusal at once (NoSuchStreamError /
  NoSuchPartitionError); metadata that lists it (or could not be asked) makes
  it a broker behind the metadata leader, and it goes again while the batch's
  deadline leaves time (without one: ``ack_wait`` from its first send), by
  :func:`~liftbridge_provider.client.retry.after_unknown`. Out of time it fails
  with a LiftbridgeTimeoutError naming the refusal; when a later message of
  its partition may be stored, or the batch ends otherwise, with an
  UnavailableError naming it (transient: the stream exists); never stored;
- with ack policy NONE a message is resolved when it is sent, unless the
  server refuses it (:meth:`PublishWindow.on_error` takes the refusal) or
  its call breaks before the server confirmed the batch
  (:meth:`PublishWindow.lose_sent`: it may be stored);
- a message's ack_wait runs from when it was written: a driver that queues
  messages before it can write them takes them ``written=False`` and says
  when they went out (:meth:`PublishWindow.mark_written`), so one held back by
  a full flow-control window never times out as "may be stored".
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import grpc

from liftbridge_provider.client.errors import AckTimeoutError, UnavailableError
from liftbridge_provider.client.messages import Ack
from liftbridge_provider.client.publish.batch_result import BatchResult, Failures
from liftbridge_provider.client.retry import Listing, Unknown, after_unknown, unknown_timeout
from liftbridge_provider.core.errors import LiftbridgeError

UNWRITTEN = math.inf  # the "time sent" of a message taken but not written yet: it never times out
ErrorFor = Callable[[int], LiftbridgeError]
"""Builds the error of message ``index`` (the publisher knows its stream and partition)."""
PartitionOf = Callable[[int], int]
"""The partition of message ``index``."""


@dataclass(frozen=True)
class UnknownWord:
    """What the driver learnt before a :meth:`PublishWindow.release` of messages held after a NOT_FOUND refusal.

    :param listings: partition -> what fresh metadata said of it (a partition missing here: UNANSWERED).
    :param time_left: the batch's deadline leaves time to send them again (True when it has none).
    :param timeout: the batch's timeout in seconds, which the timeout error names; None (default) when the
        batch has none: then each message may be refused for ``ack_wait`` s from its first send.
    """

    listings: Mapping[int, Listing]
    time_left: bool = True
    timeout: float | None = None


class PublishWindow:
    """Bookkeeping of one batch: what to send next, what awaits an ack, how each message ended.

    :param size: messages in the batch, indexed 0..size-1.
    :param window: most messages awaiting an ack at once (>= 1).
    :param ack_wait: seconds a sent message may wait for its ack.
    :param expects_ack: False for ack policy NONE (a sent message is done).
    """

    def __init__(self, size: int, *, window: int, ack_wait: float, expects_ack: bool) -> None:
        self.size = size
        self._window = window
        self._ack_wait = ack_wait
        self._expects_ack = expects_ack
        self._next = 0
        self._in_flight: dict[int, float] = {}  # index -> monotonic time written (UNWRITTEN: not yet), oldest first
        self._acks: list[Ack | None] = [None] * size
        self._failures: dict[int, LiftbridgeError] = {}
        self._unsent_from = size  # from here on, messages never sent fail with _unsent_error (see fail_unsent)
        self._unsent_error: LiftbridgeError | None = None
        self._held: list[int] = []  # refused for a passing reason, not stored: awaiting release, in index order
        self._resend: deque[int] = deque()  # released: sent again before index _next, in index order
        self._refusals: dict[int, LiftbridgeError] = {}  # index -> its last passing refusal (held or resent)
        self._first_sent: dict[int, float] = {}  # index -> when a held or resent message was first sent
        self._unknown: dict[int, Listing] = {}  # held or resent after NOT_FOUND -> what the metadata last said
        self._probing = False  # from a release until the ack of a message sent alone after it: one at a time
        self._probe: int | None = None  # the message sent alone while probing
        self.acked = 0  # acks counted so far (a driver resets its retry count when this moves)

    # -- state -------------------------------------------------------------------

    @property
    def all_sent(self) -> bool:
        """No message is left to send: none new, none held or to be sent again."""
        self._skip_refused()
        return self._next >= self.size and not self._held and not self._resend

    @property
    def done(self) -> bool:
        """Every message resolved: acked, failed, or sent with ack policy NONE."""
        return self.all_sent and not self._in_flight

    @property
    def holding(self) -> bool:
        """Some refused message awaits :meth:`release`; nothing is taken until then."""
        return bool(self._held)

    @property
    def unknown_held(self) -> list[int]:
        """The held messages refused as unknown (NOT_FOUND), in index order: the driver asks fresh metadata about
        their partitions before :meth:`release`."""
        return [index for index in self._held if index in self._unknown]

    @property
    def has_room(self) -> bool:
        return not self.all_sent and len(self._in_flight) < self._window and not self._probe_waits

    @property
    def _probe_waits(self) -> bool:
        """A message sent again alone awaits its answer: nothing else is taken."""
        return self._probe is not None and self._probe in self._in_flight

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def unsent(self) -> int:
        return self.size - self._next

    def is_waiting(self, index: int) -> bool:
        return index in self._in_flight

    def next_expiry(self, now: float) -> float | None:
        """Seconds until the oldest message awaiting its ack times out (0 if overdue); None if none waits, or the
        oldest is not written yet."""
        for sent in self._in_flight.values():
            return None if sent == UNWRITTEN else max(sent + self._ack_wait - now, 0.0)
        return None

    # -- events ------------------------------------------------------------------

    def take(self, now: float) -> int | None:
        """The index of the next message to send, marked as sent at ``now``; None when the window is full."""
        if self._held or self._resend or self._probing:
            taken = self.take_many(now, 1)
            return taken[0] if taken else None
        if not self.has_room:  # (skips refused messages)
            return None
        index, self._next = self._next, self._next + 1
        if self._expects_ack:
            self._in_flight[index] = now
        return index

    def take_many(self, now: float, most: int, *, written: bool = True) -> Sequence[int]:
        """Up to ``most`` next messages to send, marked as sent at ``now``: :meth:`take` as often as the window
        allows, without refused messages (the range stops before the next refused one). Released messages
        come first, on their own; none while a message is held. ``written=False``: they are only queued, and
        their ack_wait starts at :meth:`mark_written`."""
        if not written:
            now = UNWRITTEN
        if self._held or self._probe_waits:
            return ()
        if self._resend:
            resent = self._take_resends(now, most)
            if resent or self._resend:  # (the window is full) or more resends wait
                return resent
            # every queued resend had failed meanwhile: on to the new messages
        self._skip_refused()
        room = self.size - self._next
        if self._expects_ack:
            room = min(room, self._window - len(self._in_flight), 1 if self._probing else room)
        end = self._next + max(min(room, most), 0)
        failures = self._failures
        if failures:
            end = next((index for index in range(self._next, end) if index in failures), end)
        taken = range(self._next, end)
        self._next = end
        self._await_acks(taken, now)
        return taken

    def _await_acks(self, taken: Sequence[int], now: float) -> None:
        """``taken`` went out at ``now`` (UNWRITTEN: queued): they await their acks; while probing, the one
        message taken is the probe."""
        if self._expects_ack:
            self._in_flight.update(dict.fromkeys(taken, now))
            if self._probing and taken:
                self._probe = taken[0]

    def _take_resends(self, now: float, most: int) -> list[int]:
        room = most if not self._expects_ack else min(most, self._window - len(self._in_flight))
        if self._probing:
            room = min(room, 1)
        taken: list[int] = []
        while self._resend and len(taken) < room:
            index = self._resend.popleft()
            if index not in self._failures:
                taken.append(index)
        self._await_acks(taken, now)
        return taken

    def mark_written(self, indices: Sequence[int], now: float) -> None:
        """Messages taken ``written=False`` were written in full at ``now``: their ack_wait starts. Give them
        in the order taken (the order they are written in)."""
        in_flight = self._in_flight
        for index in indices:
            if in_flight.get(index) == UNWRITTEN:
                in_flight[index] = now  # (keeps its place: the oldest stay first)

    def on_ack(self, index: int, ack: Ack) -> bool:
        """Message ``index`` was acked; False when the ack is not counted (unknown index, or after an error)."""
        if not 0 <= index < self._next:
            return False
        waiting = self._in_flight.pop(index, None) is not None
        if not waiting and not isinstance(self._failures.get(index), AckTimeoutError):
            return False
        if self._refusals:
            self._refusals.pop(index, None)
            self._first_sent.pop(index, None)
            self._unknown.pop(index, None)
        self._failures.pop(index, None)
        self._acks[index] = ack
        self.acked += 1
        if index == self._probe:
            self._probing = False  # sent alone after a release and stored: the broker takes requests again
        return True

    def on_error(self, index: int, error: LiftbridgeError) -> bool:
        """The server refused message ``index`` (also after its ack timed out: the refusal is the
        more precise answer; with ack policy NONE, any message sent and not failed yet); False for an
        unknown index or one acked or refused already."""
        waiting = self._in_flight.pop(index, None) is not None
        sent_without_ack = not self._expects_ack and 0 <= index < self._next and index not in self._failures
        if not waiting and not isinstance(self._failures.get(index), AckTimeoutError) and not sent_without_ack:
            return False
        self._unknown.pop(index, None)
        self._failures[index] = error
        return True

    def lose_sent(self, indices: Sequence[int], error_for: ErrorFor) -> int:
        """Ack policy NONE: the call that carried ``indices`` broke (or ran out of time) before the server
        confirmed it by ending it: each not refused already may be stored; how many."""
        lost = 0
        for index in indices:
            if index not in self._failures and 0 <= index < self._next:
                self._failures[index] = error_for(index)
                lost += 1
        return lost

    def hold(self, index: int, refusal: LiftbridgeError, *, unknown: bool = False) -> bool:
        """The server refused message ``index`` without storing it, for a reason that passes (see the module
        docstring): held for :meth:`release`; ``unknown`` (default False): the refusal was NOT_FOUND, and
        fresh metadata decides at the release. After its ack timed out it is not held but failed with the
        refusal, the more precise answer (as :meth:`on_error`). False for a message neither awaiting an ack
        nor timed out."""
        sent = self._in_flight.pop(index, None)
        if sent is None:
            if not isinstance(self._failures.get(index), AckTimeoutError):
                return False
            if unknown:
                self._unknown.setdefault(index, Listing.UNANSWERED)
            self._fail_refused(index, refusal, f"the answer came after ack_wait ({self._ack_wait:g}s)")
            return True
        if unknown:
            self._unknown.setdefault(index, Listing.UNANSWERED)
        self._first_sent.setdefault(index, sent)
        self._refusals[index] = refusal
        bisect.insort(self._held, index)
        return True

    def release(self, now: float, partition_of: PartitionOf, word: UnknownWord | None = None) -> tuple[int, int]:
        """Decide on every held message (call once nothing awaits an ack): to be sent again next, or failed
        with its refusal when a later message of its partition may be stored, or when it was first sent
        ``ack_wait`` s or more before ``now``; one refused as unknown by what ``word`` says of its partition
        (see the module docstring; None: nothing was learnt); (sent again, failed)."""
        held, self._held = self._held, []
        stored_after = self._possibly_stored_after(held[0], partition_of) if held else {}
        again: list[int] = []
        for index in held:
            refusal = self._refusals.pop(index)
            sent = self._first_sent.get(index, now)
            if index in self._unknown:
                word = word or UnknownWord({})
                listing = self._unknown[index] = word.listings.get(partition_of(index), Listing.UNANSWERED)
                time_left = word.time_left and (word.timeout is not None or now - sent < self._ack_wait)
                verdict = after_unknown(listing, time_left=time_left)
                if verdict is Unknown.MISSING:
                    self._fail_refused(index, refusal, "the cluster's metadata does not list it either")
                elif verdict is Unknown.TIMED_OUT:
                    self._fail_unknown_timeout(index, refusal, self._ack_wait if word.timeout is None else word.timeout)
                elif stored_after.get(partition_of(index), -1) > index:
                    self._fail_refused(index, refusal, "a later message of its partition may be stored")
                else:
                    self._refusals[index] = refusal
                    again.append(index)
            elif stored_after.get(partition_of(index), -1) > index:
                self._fail_refused(index, refusal, "a later message of its partition may be stored")
            elif now - sent >= self._ack_wait:
                self._fail_refused(index, refusal, f"refused for {self._ack_wait:g}s (ack_wait)")
            else:
                self._refusals[index] = refusal
                again.append(index)
        self._resend = deque(sorted([*self._resend, *again]))
        if again and self._expects_ack:
            self._probing = True
        return len(again), len(held) - len(again)

    def _possibly_stored_after(self, first: int, partition_of: PartitionOf) -> dict[int, int]:
        """partition -> the highest index from ``first`` on that was acked, awaits its ack, or failed in a way
        that may have stored it."""
        highest: dict[int, int] = {}
        for index in range(first, self._next):
            failure = self._failures.get(index)
            if (
                self._acks[index] is not None
                or index in self._in_flight
                or (failure is not None and failure.may_be_stored)
            ):
                highest[partition_of(index)] = index
        return highest

    def _fail_refused(self, index: int, refusal: LiftbridgeError, why: str) -> None:
        """Fail a refused message that is not sent again (``why``): with its refusal, or, refused as unknown
        while the metadata did not say it is missing, with an UnavailableError naming it (the stream exists)."""
        self._first_sent.pop(index, None)
        listing = self._unknown.pop(index, None)
        kind: type[LiftbridgeError] = type(refusal)
        message = f"{refusal.message}; not sent again: {why}"
        if listing is not None and listing is not Listing.UNLISTED:
            said = "lists it" if listing is Listing.LISTED else "was not asked or did not answer"
            kind = UnavailableError
            message = (
                f"refused as unknown ({refusal.message}) while the cluster's metadata {said}: a broker behind the "
                f"metadata leader; not sent again: {why}"
            )
        self._failures[index] = kind(
            message, stream=refusal.stream, partition=refusal.partition, code=refusal.code, may_be_stored=False
        )

    def _fail_unknown_timeout(self, index: int, refusal: LiftbridgeError, timeout: float) -> None:
        """A message refused as unknown ran out of time (``timeout`` s): the timeout error naming the refusal."""
        self._first_sent.pop(index, None)
        listing = self._unknown.pop(index, Listing.UNANSWERED)
        refusal.may_be_stored = False
        self._failures[index] = unknown_timeout(refusal, timeout, listing)

    def expire(self, now: float, error_for: ErrorFor) -> int:
        """Fail the messages whose ack is overdue at ``now``; how many."""
        cutoff = now - self._ack_wait
        expired = []
        for index, sent in self._in_flight.items():
            if sent > cutoff:
                break  # sent in order: the rest are younger
            expired.append(index)
        for index in expired:
            del self._in_flight[index]
            self._failures[index] = error_for(index)
        return len(expired)

    def lose_in_flight(self, error_for: ErrorFor) -> int:
        """The connection broke: every message awaiting an ack is failed (it may be stored); how many."""
        lost = list(self._in_flight)
        for index in lost:
            self._failures[index] = error_for(index)
        self._in_flight.clear()
        return len(lost)

    def fail_unsent(self, error: LiftbridgeError) -> int:
        """Fail every message not sent yet with ``error`` (nothing of them reached the server); how many.
        Refused ones keep their own error; held ones and those to be sent again fail with their refusal. No
        work per message for those never sent: they are kept as one range."""
        waiting = [index for index in (*self._held, *self._resend) if index not in self._failures]
        self._held, self._resend = [], deque()
        for index in waiting:
            refusal = self._refusals.pop(index, None)
            if refusal is None:  # a new message untaken behind a refused one (see untake): never sent
                self._failures[index] = error
            else:
                self._fail_refused(index, refusal, f"the batch ended first ({error.message})")
        self._skip_refused()
        if self._next >= self.size:
            return len(waiting)
        count = self.size - self._next - sum(1 for index in self._failures if index >= self._next)
        self._unsent_from, self._unsent_error = self._next, error
        self._next = self.size
        return count + len(waiting)

    def end_at_deadline(self, errors: BatchErrors, timeout: float) -> None:
        """The batch deadline (``timeout`` s) passed: what awaits an ack may be stored; the rest was not sent
        (held or to be sent again after NOT_FOUND: the timeout error naming the refusal)."""
        self.lose_in_flight(errors.deadline_in_flight(timeout))
        for index in [*self._held, *self._resend]:
            if index in self._unknown and index not in self._failures:
                self._fail_unknown_timeout(index, self._refusals.pop(index), timeout)
        self.fail_unsent(errors.deadline_unsent(timeout))

    def untake(self, indices: Sequence[int]) -> int:
        """``indices``, the last messages taken (in the order taken), were never written in full, so not sent
        after all: they go back to be taken again (those that already failed, e.g. timed out, stay failed);
        how many."""
        if not indices:
            return 0
        for index in indices:
            if not 0 <= index < self._next:
                raise ValueError(f"message #{index} was not taken")
        returned = set(indices)
        for index in returned:
            self._in_flight.pop(index, None)
        while self._next - 1 in returned:  # the tail of new messages: taken again from where it began
            returned.discard(self._next - 1)  # (one that failed meanwhile is skipped when taken)
            self._next -= 1
        returned -= self._failures.keys()  # timed out while unwritten: stays failed, never sent again
        if returned:  # messages being sent again, or new ones behind a refused one: first in line again
            self._resend = deque(sorted([*returned, *self._resend]))
        return len(indices)

    def refuse(self, index: int, error: LiftbridgeError) -> None:
        """Fail message ``index`` before it is sent (e.g. its partition is readonly); it is skipped by :meth:`take`."""
        if index < self._next:
            raise ValueError(f"message #{index} was already taken")
        self._failures[index] = error

    def _skip_refused(self) -> None:
        while self._next < self.size and self._next in self._failures:
            self._next += 1

    def result(self) -> BatchResult:
        """The outcome so far; complete once :attr:`done`."""
        failures = Failures(
            self._failures, unsent_from=self._unsent_from, size=self.size, unsent_error=self._unsent_error
        )
        return BatchResult(self._acks, failures)


class BatchErrors:
    """The errors a batch publisher reports, naming the batch's stream and each message's partition.

    :param stream: the batch's stream.
    :param partition_of: the partition of message ``index``.
    """

    def __init__(self, stream: str, partition_of: Callable[[int], int]) -> None:
        self.stream = stream
        self._partition_of = partition_of

    def ack_timeout(self, ack_wait: float) -> ErrorFor:
        return lambda index: AckTimeoutError(
            f"no ack within {ack_wait:g}s", stream=self.stream, partition=self._partition_of(index), may_be_stored=True
        )

    def lost(self, reason: str, code: grpc.StatusCode | None = None) -> ErrorFor:
        """The connection broke before the ack (``reason``): the message may or may not be stored."""
        return lambda index: UnavailableError(
            f"connection lost before the ack ({reason}); the message may or may not have been stored",
            stream=self.stream,
            partition=self._partition_of(index),
            code=code,
            may_be_stored=True,
        )

    def deadline_in_flight(self, timeout: float) -> ErrorFor:
        return lambda index: AckTimeoutError(
            f"no ack before the batch deadline ({timeout:g}s)",
            stream=self.stream,
            partition=self._partition_of(index),
            may_be_stored=True,
        )

    def deadline_unsent(self, timeout: float) -> LiftbridgeError:
        return AckTimeoutError(f"not sent: the batch deadline ({timeout:g}s) passed first", stream=self.stream)
