"""The decisions of a subscription, without I/O: shared by the sync and asyncio clients.

:class:`SubscriptionState` is told what happens to a subscription (a call is
opened, the server confirms it, a message arrives, the call ends with or
without an error) and answers what to do: which request to send where and for
how long, whether a message is delivered, skipped or ends the subscription,
and whether to reopen (after how long, with fresh metadata) or give up with
which error. The sync :class:`~liftbridge_provider.client.subscription.Subscription`
and :meth:`AsyncLiftbridgeClient.subscribe` only carry that out.

Rules:

- Each Subscribe call lives at most ``liveness_interval`` seconds; then it is
  reopened after the last offset. A leader that froze or vanished without a
  reset is thereby noticed, and a quiet healthy one costs one call per interval.
- Offsets below the next wanted one are skipped (a new leader may start
  earlier). An offset past the stop offset ends the subscription without
  being delivered (compaction may have removed the stop offset itself).
- A lost call (broker gone, leadership moved, an unresponsive server) is
  reopened with jittered backoff and fresh metadata, for up to
  ``resubscribe_wait`` seconds counted from the first loss since the last call
  the server confirmed.
- A call refused as unknown (NOT_FOUND) is reopened like a lost one while
  the refreshed metadata lists the partition (a broker that has not applied
  the stream, or loaded the partition after a restart, yet); when the metadata
  does not list it either, :data:`~liftbridge_provider.client.plans.UNKNOWN_STREAM_ASKS`
  times in a row, the refusal ends the subscription (a stream deleted, a
  partition that does not exist): :func:`~liftbridge_provider.client.retry.after_unknown`.
- ``timeout`` bounds the whole subscription; ``idle_timeout`` the time without
  a new message. Both raise LiftbridgeTimeoutError.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client.addresses import replica_address
from liftbridge_provider.client.errors import (
    ClientClosedError,
    LiftbridgeTimeoutError,
    UnavailableError,
    error_from_rpc,
)
from liftbridge_provider.client.health import Signal
from liftbridge_provider.client.metadata import Metadata
from liftbridge_provider.client.options import ClientConfig
from liftbridge_provider.client.plans import UNKNOWN_STREAM_ASKS, UNKNOWN_STREAM_PAUSE, is_refusal, lists, paused_error
from liftbridge_provider.client.retry import (
    backoff_delay,
    leader_changing,
    refused_as_unknown,
)
from liftbridge_provider.core.errors import LiftbridgeError

_ENDS_CLEANLY = ("stop offset reached", "end of readonly partition", "stream is empty")
_NOTHING_BEFORE_THE_STOP_TIME = (
    "timestamp is before the beginning of the log",
    "failed to find log segment for timestamp",
)


class Verdict(enum.IntEnum):
    """What to do with a received message."""

    SKIP = 0  # already delivered, or before the requested start
    DELIVER = 1
    DELIVER_LAST = 2  # deliver it; it is the stop offset
    END = 3  # past the stop offset: end without delivering it


_SKIP, _DELIVER, _DELIVER_LAST, _END = Verdict.SKIP, Verdict.DELIVER, Verdict.DELIVER_LAST, Verdict.END
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class Open:
    """Open a Subscribe call: ``request`` to ``address`` for at most ``timeout`` seconds.

    ``address`` None: no leader is known right now (report it with ``closed(NoLeaderYet())``).
    ``confirm_running``: the partition carries the paused flag (it sticks after a
    resume); ask its leader first whether it is really paused.
    ``moved_from``: the broker that served the last confirmed call, when this call goes
    elsewhere (the leader moved: worth a log line); None otherwise.
    """

    address: str | None
    request: api.SubscribeRequest
    timeout: float
    confirm_running: bool
    moved_from: str | None = None


@dataclass(frozen=True)
class Reopen:
    """Open again after ``delay`` seconds; first refresh the metadata within ``refresh`` seconds, if given."""

    delay: float
    refresh: float | None


def closed_while_reading(stream: str, partition: int) -> ClientClosedError:
    """The error that ends a subscription whose client closed its channels under it (from another thread or
    task): the call ended CANCELLED, or grpc.aio cancelled the read, which is neither the server's answer nor
    the reader's own cancellation."""
    return ClientClosedError(
        "the Liftbridge client was closed while the subscription read", stream=stream, partition=partition
    )


def ends_cleanly(exc: grpc.RpcError) -> bool:
    """ResourceExhausted at a stop position, at the end of a readonly partition, or STOP_LATEST on an empty one."""
    details = (exc.details() or "").lower()
    return exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and details.startswith(_ENDS_CLEANLY)


def resubscribable(exc: grpc.RpcError) -> bool:
    """The broker went away, stopped answering or stopped leading the partition, the metadata leadership is
    moving (a paused partition cannot be resumed until it settles), or its reader met a segment the cleaner had
    just closed: try again (from the next offset), elsewhere if need be."""
    code, details = exc.code(), (exc.details() or "").lower()
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return True
    if code == grpc.StatusCode.FAILED_PRECONDITION and "leader" in details:
        return True
    if code == grpc.StatusCode.UNKNOWN and "segment has been closed" in details:
        return True  # the server's reader met a segment the cleaner had just closed (compaction, retention)
    return leader_changing(code, details) or (code == grpc.StatusCode.INTERNAL and "closed" in details)


class NoLeaderYet(grpc.RpcError):
    """No leader known for the partition right now (an election is running)."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "no leader known for the partition yet"


class SubscriptionState:
    """One subscription's position, budgets and loss accounting; see the module docstring.

    :param request: the first SubscribeRequest (start and stop positions, replica, resume).
    :param stop_offset: the inclusive stop offset when known (STOP_OFFSET).
    :param timeout: seconds for the whole subscription (None: no limit).
    :param idle_timeout: seconds without a new message (None: no limit).
    :param clock: monotonic seconds (injectable for tests).
    :param begun: when ``timeout`` began, on ``clock``, if before now (what the caller did before subscribing
        counted against it); errors name the whole ``timeout``.
    """

    def __init__(
        self,
        config: ClientConfig,
        request: api.SubscribeRequest,
        *,
        stop_offset: int | None,
        timeout: float | None,
        idle_timeout: float | None,
        resubscribe_wait: float,
        clock: Callable[[], float] = time.monotonic,
        begun: float | None = None,
    ) -> None:
        self.config = config
        self.request = request
        self.stop_offset = stop_offset
        self.next_offset: int | None = request.startOffset if request.startPosition == api.OFFSET else None
        self.last_offset: int | None = None
        self._clock = clock
        started = clock()
        self._ends = (started if begun is None else begun) + timeout if timeout is not None else None
        self.timeout = timeout
        self.idle_timeout = idle_timeout
        self.resubscribe_wait = resubscribe_wait
        self._last_progress = started
        self._lost_since: float | None = None
        self._attempt = 0
        self._opened_at = started
        self._call_timeout = 0.0
        self._confirmed = False
        self._established = False
        self._delivered_in_call = False
        self._refused_by: str | None = None
        self._unknown_to: grpc.RpcError | None = None  # the last NOT_FOUND, until metadata settles what it means
        self._unlisted = 0  # snapshots in a row since then that did not list the partition
        self._address: str | None = None
        self._served_by: str | None = None  # the broker of the last confirmed call
        self.ended = False
        # The stop offset itself was delivered: the server ends the call right after it ("Stop offset reached"),
        # so its end can be waited for (and taken, which releases the call). Past a stop offset compaction
        # removed, the server goes on sending.
        self.reached_stop = False

    @property
    def stream(self) -> str:
        return self.request.stream

    @property
    def partition(self) -> int:
        return self.request.partition

    # -- opening -----------------------------------------------------------------------------------

    @property
    def established(self) -> bool:
        """The server has confirmed a call of this subscription at least once."""
        return self._established

    def open(self, snapshot: Metadata) -> Open:
        """The next call to open; raises when a budget is spent or the partition is paused.

        Once established, a snapshot that does not know the stream (a broker
        replaying its log after a restart) only means no leader is known yet.
        The server's own NotFound ends the subscription once
        :data:`~liftbridge_provider.client.plans.UNKNOWN_STREAM_ASKS` refreshed
        snapshots in a row, :data:`~liftbridge_provider.client.plans.UNKNOWN_STREAM_PAUSE`
        s apart, do not list the partition (a broker behind the metadata answers
        NotFound for what exists).
        """
        self._check_budgets()
        self._opened_at = self._clock()
        self._confirmed = False
        self._delivered_in_call = False
        if self._unknown_to is not None and not self._listed_after_refusal(snapshot):
            self._address = None  # asked again before it counts: the refresh may have reached a lagging broker
            self._call_timeout = self._next_call_timeout()
            return Open(None, self.request, self._call_timeout, False)
        if self._established and self.stream not in snapshot.streams:
            self._address = None
            self._call_timeout = self._next_call_timeout()
            return Open(None, self.request, self._call_timeout, False)
        info = snapshot.partition(self.stream, self.partition)
        address = replica_address(self.config, snapshot, self.stream, self.partition, self.request.readISRReplica)
        if self._refused_by is not None and address == self._refused_by and info.paused and not self.request.resume:
            raise paused_error(self.stream, self.partition)
        self._refused_by = None
        self._address = address
        self._call_timeout = self._next_call_timeout()
        confirm = info.paused and not self.request.resume
        moved_from = self._served_by if address not in (None, self._served_by) else None
        return Open(address, self._next_request(), self._call_timeout, confirm, moved_from)

    def _listed_after_refusal(self, snapshot: Metadata) -> bool:
        """After a NOT_FOUND, whether ``snapshot`` lists the partition; raises the refusal once
        :data:`UNKNOWN_STREAM_ASKS` snapshots in a row did not (see :func:`after_unknown`)."""
        refusal = self._unknown_to
        assert refusal is not None
        if lists(snapshot, self.stream, self.partition):
            self._unknown_to, self._unlisted = None, 0
            return True
        self._unlisted += 1
        if self._unlisted < UNKNOWN_STREAM_ASKS:
            return False
        # after_unknown(Listing.UNLISTED) is MISSING: metadata that does not list it makes it missing
        raise error_from_rpc(refusal, stream=self.stream, partition=self.partition) from refusal

    def confirmed(self) -> None:
        """The server sent its empty first message: the call is established."""
        self._confirmed = True
        self._established = True
        self._served_by = self._address
        self._lost_since = None
        self._attempt = 0

    def _next_request(self) -> api.SubscribeRequest:
        if self.next_offset is None or (
            self.request.startPosition == api.OFFSET and self.next_offset == self.request.startOffset
        ):
            return self.request
        request = api.SubscribeRequest()
        request.CopyFrom(self.request)
        request.startPosition = api.OFFSET
        request.startOffset = self.next_offset
        return request

    def remaining(self) -> float | None:
        """Seconds before ``timeout`` or ``idle_timeout`` runs out (None: unbounded)."""
        now = self._clock()
        limits = []
        if self._ends is not None:
            limits.append(self._ends - now)
        if self.idle_timeout is not None:
            limits.append(self._last_progress + self.idle_timeout - now)
        return max(min(limits), 0.001) if limits else None

    def request_budget(self) -> float:
        """Seconds for a metadata request made for this subscription: request_timeout, within the budgets."""
        remaining = self.remaining()
        timeout = self.config.request_timeout
        return timeout if remaining is None else min(timeout, remaining)

    def _next_call_timeout(self) -> float:
        remaining = self.remaining()
        interval = self.config.liveness_interval
        return interval if remaining is None else min(interval, remaining)

    # -- receiving ---------------------------------------------------------------------------------

    def on_message(self, offset: int) -> Verdict:
        """Decide about one received message (the hot path: no clock, no allocation)."""
        wanted = self.next_offset
        if wanted is not None and offset < wanted:
            return _SKIP
        stop = self.stop_offset
        if stop is not None and offset >= stop:
            self.ended = True
            if offset > stop:
                return _END
            self.reached_stop = True
        self.next_offset = offset + 1
        self.last_offset = offset
        self._delivered_in_call = True
        return _DELIVER_LAST if self.ended else _DELIVER

    def progressed(self) -> None:
        """A message was delivered now (called by the front end after delivering)."""
        self._last_progress = self._clock()

    # -- receiving many messages at once -----------------------------------------------------------

    def window(self) -> tuple[int, int]:
        """:meth:`on_message`'s rule as bounds, for a reader that applies it to many messages itself
        (a column builder): offsets below ``low`` are skipped, one equal to ``high`` is delivered and
        ends the subscription, one above ``high`` ends it undelivered. Unset bounds are the int64 limits."""
        low = self.next_offset if self.next_offset is not None else _INT64_MIN
        high = self.stop_offset if self.stop_offset is not None else _INT64_MAX
        return low, high

    def took(self, offset: int, *, last: bool) -> None:
        """Messages up to ``offset`` were delivered now through :meth:`window` (``last``: it is the stop offset)."""
        self.next_offset = offset + 1
        self.last_offset = offset
        self._delivered_in_call = True
        self._last_progress = self._clock()
        if last:
            self.ended = self.reached_stop = True

    def passed_stop(self) -> None:
        """A message above :meth:`window`'s ``high`` arrived: the subscription is over."""
        self.ended = True

    # -- a call ended ------------------------------------------------------------------------------

    def broker_signal(self, error: grpc.RpcError | None) -> tuple[str, Signal] | None:
        """What the call's end says of the broker it went to, for the health model (asked before
        :meth:`closed`): its connection broke (UNAVAILABLE), or it never confirmed the call in its time."""
        if error is None or self._address is None or isinstance(error, NoLeaderYet):
            return None
        if error.code() == grpc.StatusCode.UNAVAILABLE:
            return self._address, Signal.BROKEN
        if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED and not self._confirmed:
            return self._address, Signal.SILENT
        return None

    def closed(self, error: grpc.RpcError | None) -> Reopen | None:
        """The call ended (``error`` None: the server ended it without a status error).

        Returns None when the subscription is over, a :class:`Reopen` otherwise; raises
        the error that ends it (timeouts, a final server error, a partition paused).
        """
        if self.ended or (error is not None and ends_cleanly(error)):
            self.ended = True
            return None
        if error is not None and self._stop_already_passed(error):
            self.ended = True
            return None
        now = self._clock()
        self._check_budgets(cause=error)
        ran = now - self._opened_at
        healthy = self._confirmed and (self._delivered_in_call or ran >= 0.9 * self._call_timeout)
        if healthy and (error is None or error.code() == grpc.StatusCode.DEADLINE_EXCEEDED):
            return Reopen(0.0, refresh=None)  # the call's own liveness time is up: open the next one
        if error is not None and refused_as_unknown(error.code()):
            self._unknown_to = error  # the next open decides, on refreshed metadata
        elif error is not None and not isinstance(error, NoLeaderYet) and not resubscribable(error):
            raise error_from_rpc(error, stream=self.stream, partition=self.partition) from error
        if error is not None and is_refusal(error):
            self._refused_by = self._address
        if self._lost_since is None:
            self._lost_since = now
        if now - self._lost_since > self.resubscribe_wait:
            reason = "the server kept ending the subscription" if error is None else str(error.details())
            if self._unknown_to is not None:
                reason = f"refused as unknown while the metadata lists it: {self._unknown_to.details()}"
            raise UnavailableError(
                f"no leader served the partition for {self.resubscribe_wait:g}s ({reason})",
                stream=self.stream,
                partition=self.partition,
                code=None if error is None else error.code(),
            )
        delay = backoff_delay(self._attempt)
        if self._unknown_to is not None:  # the metadata is asked again this much later, as plans.listed does
            delay = max(delay, UNKNOWN_STREAM_PAUSE)
        self._attempt += 1
        return Reopen(delay, refresh=self.request_budget())

    def _stop_already_passed(self, error: grpc.RpcError) -> bool:
        """The server puts the stop before where it would start, or finds no message at or before a stop time:
        nothing is left to read, the subscription is done.

        For a reopened STOP_LATEST/STOP_TIMESTAMP subscription the stop lies
        before the next offset. With a stop offset (checked against an explicit
        start before sending) the log starts past it: retention or compaction
        removed everything up to the stop, e.g. a compacted log that kept only
        offsets above a high watermark restored from its checkpoint.
        """
        details = (error.details() or "").lower()
        if error.code() == grpc.StatusCode.INTERNAL and self.request.stopPosition == api.STOP_TIMESTAMP:
            # The server looks a stop time up in the log as it subscribes: a time before the log's first message,
            # or a log that holds none, fails the lookup (commitlog.LatestOffsetBeforeTimestamp). No message is at
            # or before that stop time: the subscription is over, empty.
            return any(marker in details for marker in _NOTHING_BEFORE_THE_STOP_TIME)
        return (
            error.code() == grpc.StatusCode.INVALID_ARGUMENT
            and "stop offset is before start offset" in details
            and (self.last_offset is not None or self.stop_offset is not None)
        )

    def _check_budgets(self, cause: grpc.RpcError | None = None) -> None:
        now = self._clock()
        if self._ends is not None and now >= self._ends:
            raise self._timeout_error(f"subscription timed out after {self.timeout:g}s", cause)
        if self.idle_timeout is not None and now - self._last_progress >= self.idle_timeout:
            raise self._timeout_error(f"no new message for {self.idle_timeout:g}s", cause)

    def _timeout_error(self, message: str, cause: grpc.RpcError | None) -> LiftbridgeError:
        error = LiftbridgeTimeoutError(
            f"{message} (last offset {self.last_offset})",
            stream=self.stream,
            partition=self.partition,
            code=grpc.StatusCode.DEADLINE_EXCEEDED,
        )
        error.__cause__ = cause
        return error
