"""When a failed RPC is retried, and how long to wait: one policy for the sync and asyncio clients.

- UNAVAILABLE: try the next broker (any-broker calls) or refresh metadata and
  find the leader again (leader-directed calls).
- INTERNAL "no known metadata leader": an election is running; back off.
- FAILED_PRECONDITION "not leader" on leader-directed calls: refresh metadata,
  back off, retry.
- Anything else is final and raised as its typed error.

Backoff is exponential with full jitter between 10 ms and 500 ms. Every call
has one deadline covering all its attempts.
"""

from __future__ import annotations

import enum
import random
import time

import grpc

from liftbridge_provider.client.errors import (
    LiftbridgeError,
    LiftbridgeTimeoutError,
    error_from_rpc,
)

MIN_BACKOFF = 0.010  # seconds
MAX_BACKOFF = 0.500  # seconds


# gRPC's words for a TLS handshake that failed (wrong CA, wrong name, missing client certificate).
_TLS_FAILURES = ("handshake failed", "certificate_verify_failed", "hostname verification", "tsi_")


class Action(enum.Enum):
    NEXT_BROKER = "next broker"  # nothing to wait for: another broker may answer
    REFRESH = "refresh metadata, back off, retry"
    BACK_OFF = "back off, retry"
    FAIL = "fail"


def classify(exc: grpc.RpcError, *, leader_directed: bool) -> Action:
    """What to do about a failed attempt."""
    code = exc.code()
    details = (exc.details() or "").lower()
    if code == grpc.StatusCode.UNAVAILABLE:
        if any(marker in details for marker in _TLS_FAILURES):
            return Action.FAIL  # a TLS mismatch does not heal by retrying
        return Action.REFRESH if leader_directed else Action.NEXT_BROKER
    if code == grpc.StatusCode.INTERNAL and "no known metadata leader" in details:
        return Action.BACK_OFF
    if leader_directed and code == grpc.StatusCode.FAILED_PRECONDITION and "leader" in details:
        return Action.REFRESH
    return Action.FAIL


def backoff_delay(attempt: int) -> float:
    """Seconds to wait before retry number ``attempt`` (0-based): full jitter, 10-500 ms."""
    ceiling = min(MAX_BACKOFF, MIN_BACKOFF * 2**attempt)
    return random.uniform(MIN_BACKOFF, max(MIN_BACKOFF, ceiling))


class Deadline:
    """A point in time shared by every attempt of one call."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._end = time.monotonic() + timeout

    def remaining(self) -> float:
        return max(self._end - time.monotonic(), 0.0)

    @property
    def expired(self) -> bool:
        return self.remaining() <= 0.0


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

    def after_failure(self, exc: grpc.RpcError) -> tuple[Action, float]:
        error = error_from_rpc(exc, stream=self.stream, partition=self.partition)
        action = classify(exc, leader_directed=self.leader_directed)
        if action is Action.FAIL:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise self.timeout_error() from exc
            raise error from exc
        self.last_error = error
        return action, self.pause()

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
        if self.last_error is not None:
            error = type(self.last_error)(
                f"{message}; last error: {self.last_error.message}",
                stream=self.stream,
                partition=self.partition,
                code=self.last_error.code,
            )
            return error
        return LiftbridgeTimeoutError(message, stream=self.stream, partition=self.partition)
