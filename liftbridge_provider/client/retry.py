"""When a failed RPC is retried, and how long to wait: one policy for the sync and asyncio clients.

- UNAVAILABLE: try the next broker (any-broker calls) or refresh metadata and
  find the leader again (leader-directed calls).
- INTERNAL "no known metadata leader": an election is running; back off.
- INTERNAL "nats: no responders available for request": the broker forwarded the
  request to a metadata leader that is gone (nobody received it, so nothing was
  applied) and the next one is not listening yet; back off.
- FAILED_PRECONDITION "not leader" on leader-directed calls: refresh metadata,
  back off, retry.
- NOT_FOUND from a call on a stream's data or partition (publish, partition
  metadata, cursors, Subscribe): the broker may not have applied the stream's
  creation, or loaded the partition after a restart, yet. Fresh metadata
  decides (:func:`after_unknown`): it does not list the stream or partition,
  the typed error at once; it does, back off and ask again within the call's
  deadline, and a LiftbridgeTimeoutError naming the refusal when that ends.
- Anything else is final and raised as its typed error.

Backoff is exponential with full jitter between 10 ms and 500 ms. Every call
has one deadline covering all its attempts, its metadata refreshes and its
backoffs. One attempt may use at most half of it (but at least
:data:`MIN_ATTEMPT`), so an attempt that hangs on a frozen broker leaves time
to try another: DEADLINE_EXCEEDED of one attempt is retried like UNAVAILABLE
when the call is idempotent and time is left.
"""

from __future__ import annotations

import enum
import random
import time

import grpc

from liftbridge_provider.client.errors import LiftbridgeTimeoutError, error_from_rpc
from liftbridge_provider.client.not_sent import NotSent
from liftbridge_provider.core.errors import LiftbridgeError

MIN_BACKOFF = 0.010  # seconds
MAX_BACKOFF = 0.500  # seconds
MIN_ATTEMPT = 4.0  # seconds: FetchMetadata may poll peers for 3 s on the server when a broker is down


# gRPC's words for a TLS handshake that failed (wrong CA, wrong name, missing client certificate).
_TLS_FAILURES = ("handshake failed", "certificate_verify_failed", "hostname verification", "tsi_")


# The server's words (INTERNAL) for a metadata leader that is being replaced, so nothing was applied: none is
# elected yet, or the new one does not yet listen for the requests other brokers forward to it. Unary calls
# back off and retry; subscriptions read again.
_LEADER_CHANGING = ("no known metadata leader", "no responders available for request")
# A broker that must resume a paused partition before it publishes asks the metadata leader; when that wait
# ends (the forwarded request's context, or the leader's Raft apply), it refuses the publish "failed to resume
# stream: ..." and stores nothing (server/api.go, PublishAsync and Subscribe's resume): the leadership moves.
_RESUME_REFUSED = "failed to resume stream"
_RESUME_WAIT_ENDED = ("context deadline exceeded", "raft operation timed out")


def leader_changing(code: grpc.StatusCode, details: str) -> bool:
    """An INTERNAL answer that says the metadata leadership is moving (``details`` lowercased): no known leader,
    nobody answering for it, or a resume of a paused partition whose wait for the leader ended."""
    if code != grpc.StatusCode.INTERNAL:
        return False
    if any(marker in details for marker in _LEADER_CHANGING):
        return True
    return _RESUME_REFUSED in details and any(marker in details for marker in _RESUME_WAIT_ENDED)


class RetryableFailure(grpc.RpcError):
    """A failure the call's own plan knows to be worth retrying (the server's wait for an idempotent change ended,
    say): backed off and retried while the call has time; its code and details are the server's."""

    def __init__(self, cause: grpc.RpcError) -> None:
        self.cause = cause

    def code(self) -> grpc.StatusCode:
        return self.cause.code()

    def details(self) -> str:
        return self.cause.details() or ""


class Action(enum.Enum):
    NEXT_BROKER = "next broker"  # nothing to wait for: another broker may answer
    REFRESH = "refresh metadata, back off, retry"
    BACK_OFF = "back off, retry"
    FAIL = "fail"


def classify(exc: grpc.RpcError, *, leader_directed: bool, attempt_expired: bool = False) -> Action:
    """What to do about a failed attempt. ``attempt_expired``: the attempt ran out of its own time
    (not the call's), so a broker that stopped answering is left for another."""
    code = exc.code()
    details = (exc.details() or "").lower()
    if isinstance(exc, RetryableFailure):
        return Action.BACK_OFF
    if code == grpc.StatusCode.DEADLINE_EXCEEDED and attempt_expired:
        return Action.REFRESH if leader_directed else Action.NEXT_BROKER
    if code == grpc.StatusCode.UNAVAILABLE:
        if any(marker in details for marker in _TLS_FAILURES):
            return Action.FAIL  # a TLS mismatch does not heal by retrying
        return Action.REFRESH if leader_directed else Action.NEXT_BROKER
    if leader_changing(code, details):
        return Action.BACK_OFF
    if leader_directed and code == grpc.StatusCode.FAILED_PRECONDITION and "leader" in details:
        return Action.REFRESH
    return Action.FAIL


def refused_as_unknown(code: grpc.StatusCode) -> bool:
    """The broker answered that it does not know the stream or partition (NOT_FOUND): true of a missing one, and
    of one a lagging broker has not applied or loaded yet. Only fresh metadata tells which (:func:`after_unknown`)."""
    return code == grpc.StatusCode.NOT_FOUND


class Listing(enum.Enum):
    """What a fresh metadata fetch said of the stream and partition a broker refused as unknown."""

    LISTED = "the metadata lists it"
    UNLISTED = "the metadata does not list it"
    UNANSWERED = "no broker answered the metadata request"


class Unknown(enum.Enum):
    """What to do about a NOT_FOUND answer (see :func:`after_unknown`)."""

    ASK_AGAIN = "back off and ask again: a broker that has not caught up with the metadata"
    MISSING = "raise NoSuchStreamError / NoSuchPartitionError: it does not exist"
    TIMED_OUT = "raise LiftbridgeTimeoutError naming the refusal: brokers kept refusing what the metadata lists"


def after_unknown(listing: Listing, *, time_left: bool) -> Unknown:
    """The one rule for NOT_FOUND on a data or partition call, given what fresh metadata said (``listing``) and
    whether the call's deadline leaves time for another attempt (``time_left``).

    Only metadata that does not list the stream (or partition) makes it missing: bad input fails at once with
    its typed error, never as a timeout. Metadata that lists it, or that could not be fetched (nothing says it
    is missing), makes the refusal a broker behind the metadata leader: asked again while time is left. A
    refused publish stored nothing, so sending it again is safe.
    """
    if listing is Listing.UNLISTED:
        return Unknown.MISSING
    return Unknown.ASK_AGAIN if time_left else Unknown.TIMED_OUT


def unknown_timeout(refusal: LiftbridgeError, timeout: float, listing: Listing) -> LiftbridgeTimeoutError:
    """The error of a call whose ``timeout`` (seconds) ended while brokers refused as unknown (``refusal``, the
    last one) a stream and partition the metadata lists (or could not be asked about: ``listing``). Transient,
    unlike NoSuchStreamError: the same call may succeed once the brokers catch up. ``may_be_stored`` is the
    refusal's (a refused publish stored nothing)."""
    said = "lists them" if listing is Listing.LISTED else "could not be fetched"
    return LiftbridgeTimeoutError(
        f"no answer within {timeout:g}s: brokers kept refusing the stream or partition as unknown "
        f"({refusal.message}) while the cluster's metadata {said}: brokers behind the metadata leader",
        stream=refusal.stream,
        partition=refusal.partition,
        code=refusal.code,
        may_be_stored=refusal.may_be_stored,
    )


def backoff_delay(attempt: int) -> float:
    """Seconds to wait before retry number ``attempt`` (0-based): full jitter, 10-500 ms."""
    ceiling = min(MAX_BACKOFF, MIN_BACKOFF * 2 ** min(attempt, 16))  # 2**1024 would overflow a float
    return random.uniform(MIN_BACKOFF, max(MIN_BACKOFF, ceiling))


class Deadline:
    """A point in time shared by every attempt of one call."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._end = time.monotonic() + timeout

    @property
    def end(self) -> float:
        """When the deadline passes, as a ``time.monotonic()`` reading."""
        return self._end

    def remaining(self) -> float:
        return max(self._end - time.monotonic(), 0.0)

    def left(self, what: str, *, stream: str | None = None, partition: int | None = None) -> float:
        """The seconds left, for a call made on this deadline's behalf; LiftbridgeTimeoutError naming
        ``what`` (and the ``stream`` and ``partition`` the call concerns, when given) when none are (the next
        call would refuse a timeout of 0 as bad input)."""
        remaining = self.remaining()
        if remaining <= 0.0:
            raise LiftbridgeTimeoutError(
                f"{what}: no time left of the {self.timeout:g}s timeout", stream=stream, partition=partition
            )
        return remaining

    def attempt_budget(self) -> float:
        """Seconds for the next attempt: half the call's time (at least MIN_ATTEMPT), never past the end."""
        return min(self.remaining(), max(MIN_ATTEMPT, self.timeout / 2))

    @property
    def expired(self) -> bool:
        return self.remaining() <= 0.0


def left_of(
    deadline: Deadline | None, what: str, *, stream: str | None = None, partition: int | None = None
) -> float | None:
    """The seconds left of ``deadline`` for a call made on its behalf, or None (the callee's default) when
    the call has no deadline; LiftbridgeTimeoutError naming ``what`` (and ``stream`` and ``partition``)
    when none are left."""
    return deadline.left(what, stream=stream, partition=partition) if deadline is not None else None


class RetryState:
    """Tracks attempts of one call and decides, after each failure, whether and how to go on.

    ``after_failure`` returns the action and the seconds to sleep, or raises the
    typed error when the failure is final or the deadline has passed.
    """

    def __init__(
        self, deadline: Deadline, *, leader_directed: bool, stream: str | None = None, partition: int | None = None
    ) -> None:
        self.deadline = deadline
        self.leader_directed = leader_directed
        self.stream = stream
        self.partition = partition
        self.attempt = 0
        self.last_error: LiftbridgeError | None = None
        # What may have happened when a call that is not idempotent runs out of time after sending (set by its
        # plan): the deadline then ends it in a LiftbridgeTimeoutError saying so.
        self.unknown_outcome: str | None = None
        # The timeout to end with when the last answer was a refusal as unknown of what the metadata lists
        # (after_unknown); None after any other answer.
        self.unknown_timeout: LiftbridgeTimeoutError | None = None
        self._attempt_ends = 0.0

    def attempt_timeout(self, limit: float | None = None) -> float:
        """The timeout of the attempt about to start (see :meth:`Deadline.attempt_budget`), at most ``limit`` s."""
        budget = self.deadline.attempt_budget()
        if limit is not None:
            budget = min(budget, limit)
        self._attempt_ends = time.monotonic() + budget
        return budget

    def attempt_expired(self) -> bool:
        """The last attempt's own time is up while the call still has time."""
        return not self.deadline.expired and time.monotonic() >= self._attempt_ends - 0.001

    def attempt_hung(self, exc: grpc.RpcError) -> bool:
        """The attempt that raised ``exc`` ran out its own timeout, not the call's: its broker answered nothing
        in the time an attempt gets (an attempt cut short by the call's deadline proves nothing)."""
        return exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED and self.attempt_expired()

    def action_for(self, exc: grpc.RpcError) -> Action:
        """What to do about the attempt that raised ``exc`` (see :func:`classify`)."""
        return classify(exc, leader_directed=self.leader_directed, attempt_expired=self.attempt_expired())

    def is_final(self, exc: grpc.RpcError) -> bool:
        """Retrying does not heal ``exc``."""
        return self.action_for(exc) is Action.FAIL

    def after_failure(self, exc: grpc.RpcError) -> tuple[Action, float]:
        error = error_from_rpc(exc, stream=self.stream, partition=self.partition)
        action = self.action_for(exc)
        if action is Action.FAIL:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise self.timeout_error() from exc
            raise error from exc
        if self.last_error is None or not (isinstance(exc, NotSent) and exc.cut_short):
            self.last_error = error  # a wait the deadline cut short says nothing: an earlier error stays the last
        self.unknown_timeout = None
        return action, self.pause()

    def after_unknown(self, exc: grpc.RpcError, listing: Listing) -> float:
        """A NOT_FOUND attempt (``exc``) of a data or partition call, once fresh metadata said ``listing``
        (see :func:`after_unknown`): the backoff before asking again, or the typed error raised (MISSING), or
        the timeout naming the refusal (TIMED_OUT: no time is left for another attempt)."""
        refusal = error_from_rpc(exc, stream=self.stream, partition=self.partition)
        verdict = after_unknown(listing, time_left=not self.deadline.expired)
        if verdict is Unknown.MISSING:
            raise refusal from exc
        self.last_error = refusal
        self.unknown_timeout = unknown_timeout(refusal, self.deadline.timeout, listing)
        if verdict is Unknown.TIMED_OUT:
            raise self.unknown_timeout from exc
        return self.pause()

    def pause(self) -> float:
        """The backoff before the next attempt; raises the timeout error when no time is left."""
        if self.deadline.expired:
            raise self.timeout_error()
        delay = min(backoff_delay(self.attempt), self.deadline.remaining())
        self.attempt += 1
        return delay

    def timeout_error(self) -> LiftbridgeError:
        """The error to raise when the deadline passes: the last retryable error, or a timeout."""
        message = f"no answer within {self.deadline.timeout:g}s"
        if self.unknown_outcome is not None:
            message = f"{message} after the request was sent: {self.unknown_outcome}"
            return LiftbridgeTimeoutError(message, stream=self.stream, partition=self.partition)
        if self.unknown_timeout is not None:  # the last answer was a refusal as unknown, and this says so
            return self.unknown_timeout
        if self.last_error is not None:
            error = type(self.last_error)(
                f"{message}; last error: {self.last_error.message}",
                stream=self.stream,
                partition=self.partition,
                code=self.last_error.code,
            )
            return error
        return LiftbridgeTimeoutError(message, stream=self.stream, partition=self.partition)
