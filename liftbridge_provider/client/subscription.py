"""Subscriptions: an iterator of messages from one partition.

The subscription is opened on the partition leader (or an ISR replica when
asked). The server's first, empty message only confirms it and is never shown.
When the broker goes away or leadership moves, the subscription resubscribes
from the last offset + 1, for up to ``resubscribe_wait`` seconds. It ends
cleanly at its stop position (also checked here, in case compaction removed
the stop offset), and can be cancelled from any thread or by a timeout.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Generator, Iterator
from types import TracebackType
from typing import Any

import grpc

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client import requests as build
from liftbridge_provider.client.connections import PooledChannel
from liftbridge_provider.client.errors import (
    LiftbridgeTimeoutError,
    UnavailableError,
    error_from_rpc,
)
from liftbridge_provider.client.messages import Message
from liftbridge_provider.client.retry import Deadline, backoff_delay
from liftbridge_provider.client.routing import Router

log = logging.getLogger(__name__)

_ENDS_CLEANLY = ("stop offset reached", "end of readonly partition", "stream is empty")


def _ends_cleanly(exc: grpc.RpcError) -> bool:
    """ResourceExhausted at a stop position, at the end of a readonly partition, or STOP_LATEST on an empty one."""
    details = (exc.details() or "").lower()
    return exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and details.startswith(_ENDS_CLEANLY)


def resubscribable(exc: grpc.RpcError) -> bool:
    """The broker went away or stopped leading the partition: try again elsewhere."""
    code, details = exc.code(), (exc.details() or "").lower()
    if code == grpc.StatusCode.UNAVAILABLE:
        return True
    if code == grpc.StatusCode.FAILED_PRECONDITION and "leader" in details:
        return True
    return code == grpc.StatusCode.INTERNAL and ("closed" in details or "no known metadata leader" in details)


class Subscription(Iterator[Message]):
    """Messages of one partition, in offset order. Use as an iterator and, ideally, a context manager.

    :param stop_offset: the inclusive offset after which the subscription ends,
        when known (STOP_OFFSET), so it can end even if that offset is missing.
    :param timeout: seconds after which iteration raises LiftbridgeTimeoutError
        (None: no limit).
    """

    def __init__(
        self,
        router: Router,
        request: api.SubscribeRequest,
        *,
        stop_offset: int | None,
        timeout: float | None,
        resubscribe_wait: float,
    ) -> None:
        self._router = router
        self._request = request
        self._stop_offset = stop_offset
        self._deadline = Deadline(timeout) if timeout is not None else None
        self._resubscribe_wait = resubscribe_wait
        self._cancelled = threading.Event()
        self._lock = threading.Lock()
        self._call: Any = None
        self.last_offset: int | None = None
        self._messages: Generator[Message, None, None] = self._run()

    @property
    def stream(self) -> str:
        return self._request.stream

    @property
    def partition(self) -> int:
        return self._request.partition

    def __next__(self) -> Message:
        return next(self._messages)

    def cancel(self) -> None:
        """End the subscription; a blocked ``next`` returns (iteration stops). Thread-safe."""
        self._cancelled.set()
        with self._lock:
            if self._call is not None:
                self._call.cancel()

    close = cancel

    def __enter__(self) -> Subscription:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cancel()
        with contextlib.suppress(ValueError):  # "generator already executing": another thread iterates
            self._messages.close()  # release the channel now, not whenever the garbage collector runs

    def _run(self) -> Generator[Message, None, None]:
        lost_since: float | None = None
        attempt = 0
        while not self._cancelled.is_set():
            failure: grpc.RpcError | None = None
            try:
                for raw in self._open_and_read():
                    lost_since, attempt = None, 0
                    if raw.offset < self._first_wanted():
                        continue  # a server may start below the requested offset (e.g. a new leader)
                    self.last_offset = raw.offset
                    yield Message(raw)
                    if self._stop_offset is not None and raw.offset >= self._stop_offset:
                        return
            except grpc.RpcError as exc:
                if self._cancelled.is_set() or _ends_cleanly(exc):
                    return
                self._raise_if_final(exc)
                failure = exc
            finally:
                with self._lock:
                    if self._call is not None:
                        self._call.cancel()
                    self._call = None
            # The stream broke, or the server ended it without reaching a stop position.
            if self._cancelled.is_set():
                return
            self._raise_if_timed_out(None)
            lost_since = lost_since or time.monotonic()
            if time.monotonic() - lost_since > self._resubscribe_wait:
                if failure is not None:
                    raise error_from_rpc(failure, stream=self.stream, partition=self.partition) from failure
                raise UnavailableError("the server kept ending the subscription", stream=self.stream)
            log.info("subscription to %s/%d lost (%s); resubscribing", self.stream, self.partition, failure)
            time.sleep(backoff_delay(attempt))
            attempt += 1
            self._router.metadata.refresh()

    def _first_wanted(self) -> int:
        """Offsets below this were delivered already, or lie before a requested start offset."""
        if self.last_offset is not None:
            return self.last_offset + 1
        return self._request.startOffset if self._request.startPosition == api.OFFSET else 0

    def _open_and_read(self) -> Iterator[api.Message]:
        """Subscribe once (from last offset + 1 after a loss), skip the handshake, yield raw messages."""
        request = self._request
        if self.last_offset is not None:
            request = api.SubscribeRequest()
            request.CopyFrom(self._request)
            request.startPosition = api.OFFSET
            request.startOffset = self.last_offset + 1
        snapshot = self._router.snapshot_with(self.stream)
        if snapshot.partition(self.stream, self.partition).paused and not request.resume:
            self._refuse_if_paused()
        address = self._router.replica_address(snapshot, self.stream, self.partition, request.readISRReplica)
        if address is None:
            raise NoLeaderYet()
        with self._router.pool.lease(address) as pooled:
            with self._lock:
                if self._cancelled.is_set():
                    return
                self._call = pooled.stub.Subscribe(request, timeout=self._remaining())
            next(self._call)  # the empty message that confirms the subscription
            yield from self._call

    def _refuse_if_paused(self) -> None:
        """Raise PartitionPausedError if the partition really is paused (the server would block, not fail).

        The metadata flag can stay set after a resume, so ask the leader: a paused
        partition refuses FetchPartitionMetadata.
        """
        request = build.partition_metadata_request(self.stream, self.partition)

        def attempt(pooled: PooledChannel, remaining: float) -> object:
            return pooled.stub.FetchPartitionMetadata(request, timeout=remaining)

        self._router.call_leader(self.stream, self.partition, attempt, timeout=self._remaining())

    def _remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return self._deadline.remaining()

    def _raise_if_timed_out(self, exc: grpc.RpcError | None) -> None:
        if self._deadline is not None and (self._deadline.expired or exc is not None):
            raise LiftbridgeTimeoutError(
                f"subscription timed out after {self._deadline.timeout:g}s (last offset {self.last_offset})",
                stream=self.stream,
                partition=self.partition,
                code=grpc.StatusCode.DEADLINE_EXCEEDED,
            ) from exc

    def _raise_if_final(self, exc: grpc.RpcError) -> None:
        if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            self._raise_if_timed_out(exc)
        if isinstance(exc, NoLeaderYet) or resubscribable(exc):
            return
        raise error_from_rpc(exc, stream=self.stream, partition=self.partition) from exc


class NoLeaderYet(grpc.RpcError):
    """No leader known for the partition right now (an election is running)."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "no leader known for the partition yet"
