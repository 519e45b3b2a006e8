"""Long-lived PublishAsync streams shared by a client's single publishes, one per broker.

``publish`` waits for one ack. A unary Publish call costs the broker a NATS
inbox subscription per message; like go-liftbridge's ``Publish``, the client
instead keeps one PublishAsync stream per broker open and matches acks to
callers by correlation id, which roughly halves the time to an ack.

Guarantees, as for a unary publish:

- a broker that does not connect within ``CONNECT_TRY`` s is skipped before
  anything is sent to it (the next broker gets the message);
- once written, a message is never re-sent: a stream that breaks fails every
  message awaiting its ack with ``may_be_stored=True``, and a missing ack
  fails at the caller's deadline with AckTimeoutError (``may_be_stored``).
  A broker whose ack timed out goes last in the order for ``SUSPECT_FOR`` s,
  so a frozen broker does not take every publish until keepalive notices it;
- a stream with nothing to do for ``idle_close`` s half-closes itself (before
  the server's keepalive policy would complain about pings on an idle stream).
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

import grpc

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client.connections import ConnectionPool, PooledChannel
from liftbridge_provider.client.errors import AckTimeoutError, ClientClosedError, LiftbridgeError, UnavailableError
from liftbridge_provider.client.plans import CONNECT_TRY, Connection, NotSent

log = logging.getLogger(__name__)
SUSPECT_FOR = 30.0  # seconds a broker whose ack timed out or whose stream broke is tried last


class StreamClosed(Exception):
    """The stream is closing or broken: open a new one (nothing was sent on it)."""


def sticky_order(addresses: Sequence[str], stream: str, partition: int, suspects: set[str]) -> list[str]:
    """Brokers in the order a partition's publishes try them: the same first broker every time (a hash of
    stream and partition, as go-liftbridge's ring), brokers suspected of being frozen last."""
    ordered = sorted(addresses)
    if not ordered:
        return []
    start = zlib.crc32(f"{stream}:{partition}".encode()) % len(ordered)
    rotated = ordered[start:] + ordered[:start]
    return [a for a in rotated if a not in suspects] + [a for a in rotated if a in suspects]


class BrokerStream:
    """One PublishAsync call to one broker: requests from a queue, acks handed to waiting callers."""

    def __init__(self, address: str, lease: AbstractContextManager[PooledChannel], idle_close: float) -> None:
        self.address = address
        self._lease = lease
        self._idle_close = idle_close
        self._requests: queue.SimpleQueue[api.PublishRequest | None] = queue.SimpleQueue()
        self._pending: dict[str, concurrent.futures.Future[api.PublishResponse]] = {}
        self._lock = threading.Lock()
        self._closing = False
        pooled = lease.__enter__()
        self._call: Any = pooled.stub.PublishAsync(self._outgoing())
        self._reader = threading.Thread(target=self._read, name=f"liftbridge-publish-{address}", daemon=True)
        self._reader.start()

    @property
    def usable(self) -> bool:
        return not self._closing

    def send(self, request: api.PublishRequest) -> concurrent.futures.Future[api.PublishResponse]:
        """Queue ``request``; the future gets its response. StreamClosed when this stream takes no more."""
        answer: concurrent.futures.Future[api.PublishResponse] = concurrent.futures.Future()
        with self._lock:
            if self._closing:
                raise StreamClosed(self.address)
            self._pending[request.correlationId] = answer
            self._requests.put(request)
        return answer

    def forget(self, correlation_id: str) -> None:
        """The caller stopped waiting (its deadline passed); a late ack is dropped."""
        with self._lock:
            self._pending.pop(correlation_id, None)

    def close(self, error: Callable[[], LiftbridgeError]) -> None:
        """Stop taking requests, cancel the call, fail what still waits with a new ``error()`` each."""
        with self._lock:
            self._closing = True
        self._requests.put(None)
        self._call.cancel()
        self._fail_pending(error)

    def _outgoing(self) -> Iterator[api.PublishRequest]:
        """The requests, as gRPC's sending thread asks for them; ends (half-closes) when idle or closed."""
        while True:
            try:
                request = self._requests.get(timeout=self._idle_close)
            except queue.Empty:
                with self._lock:
                    if self._pending or not self._requests.empty():
                        continue
                    self._closing = True  # idle: end the stream; the next publish opens a new one
                return
            if request is None:
                return
            yield request

    def _read(self) -> None:
        try:
            for response in self._call:
                failed = response.HasField("asyncError")
                correlation_id = response.correlationId if failed else response.ack.correlationId
                with self._lock:
                    answer = self._pending.pop(correlation_id, None)
                if answer is not None:
                    answer.set_result(response)
            reason = "the server ended the stream"
        except grpc.RpcError as exc:
            reason = f"{exc.code().name}: {exc.details()}"
        finally:
            with self._lock:
                self._closing = True
            self._lease.__exit__(None, None, None)
        self._fail_pending(
            lambda: UnavailableError(
                f"PublishAsync stream to {self.address} ended before the ack ({reason}); "
                "the message may or may not have been stored",
                code=grpc.StatusCode.UNAVAILABLE,
                may_be_stored=True,
            )
        )

    def _fail_pending(self, error: Callable[[], LiftbridgeError]) -> None:
        with self._lock:
            waiting, self._pending = self._pending, {}
        for answer in waiting.values():
            if not answer.done():
                answer.set_exception(error())


class PublishStreams:
    """A client's shared streams, one per broker, opened on first use and reopened after they end."""

    def __init__(self, pool: ConnectionPool, *, idle_close: float) -> None:
        self._pool = pool
        self._idle_close = idle_close
        self._streams: dict[str, BrokerStream] = {}
        self._suspects: dict[str, float] = {}  # address -> until when it goes last
        self._lock = threading.Lock()
        self._closed = False
        self._ids = iter(range(1, 2**63))

    def next_correlation_id(self) -> str:
        return f"p{next(self._ids)}"

    def publish(self, addresses: Sequence[str], request: api.PublishRequest, deadline: float) -> api.PublishResponse:
        """Send ``request`` on the first broker's stream that connects and wait (until ``deadline``,
        ``time.monotonic()``) for its response; errors name whether the message may be stored."""
        now = time.monotonic()
        suspects = {a for a, until in list(self._suspects.items()) if until > now}
        order = sticky_order(addresses, request.stream, request.partition, suspects)
        last: NotSent | None = None
        for address in order:
            try:
                answer, stream = self._send(address, request, deadline)
            except NotSent as exc:
                last = exc
                continue
            return self._wait(answer, stream, request, deadline)
        assert last is not None, "no broker address to publish to"
        raise last

    def close(self) -> None:
        with self._lock:
            self._closed = True
            streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            stream.close(_closed_while_waiting)

    def _send(
        self, address: str, request: api.PublishRequest, deadline: float
    ) -> tuple[concurrent.futures.Future[api.PublishResponse], BrokerStream]:
        for _ in range(3):  # a stream may close between taking it and sending: take a fresh one
            stream = self._stream(address, deadline)
            try:
                return stream.send(request), stream
            except StreamClosed:
                continue
        raise NotSent(address)

    def _stream(self, address: str, deadline: float) -> BrokerStream:
        """The open stream to ``address``, opened (after its channel connected) when there is none."""
        with self._lock:
            if self._closed:
                raise ClientClosedError("the Liftbridge client is closed")
            stream = self._streams.get(address)
            if stream is not None and stream.usable:
                return stream
        lease = self._pool.lease(address)
        pooled = lease.__enter__()
        try:
            connection = pooled.connect(min(CONNECT_TRY, max(deadline - time.monotonic(), 0.001)))
        except BaseException:
            lease.__exit__(None, None, None)
            raise
        if connection is not Connection.READY:
            lease.__exit__(None, None, None)
            raise NotSent(address, connection)
        opened = BrokerStream(address, _Held(lease, pooled), self._idle_close)
        with self._lock:
            current = self._streams.get(address)
            if current is not None and current.usable:  # another thread opened one meanwhile: use that
                opened.close(_closed_while_waiting)  # nothing was sent on it
                return current
            self._streams[address] = opened
        return opened

    def _wait(
        self,
        answer: concurrent.futures.Future[api.PublishResponse],
        stream: BrokerStream,
        request: api.PublishRequest,
        deadline: float,
    ) -> api.PublishResponse:
        try:
            return answer.result(timeout=max(deadline - time.monotonic(), 0.0))
        except concurrent.futures.TimeoutError:
            stream.forget(request.correlationId)
            self._suspects[stream.address] = time.monotonic() + SUSPECT_FOR
            log.warning("no ack from %s in time; it goes last for %gs", stream.address, SUSPECT_FOR)
            raise AckTimeoutError(
                "no ack before the deadline; the message may have been stored",
                stream=request.stream,
                partition=request.partition,
                code=grpc.StatusCode.DEADLINE_EXCEEDED,
                may_be_stored=True,
            ) from None
        except LiftbridgeError as exc:
            exc.stream, exc.partition = request.stream, request.partition
            if isinstance(exc, UnavailableError):  # its connection broke: the next publishes try others first
                self._suspects[stream.address] = time.monotonic() + SUSPECT_FOR
            raise


def _closed_while_waiting() -> LiftbridgeError:
    return ClientClosedError(
        "the Liftbridge client was closed while a publish waited for its ack; it may have been stored",
        may_be_stored=True,
    )


class _Held(AbstractContextManager[PooledChannel]):
    """A lease already entered: the stream exits it when it ends."""

    def __init__(self, lease: AbstractContextManager[PooledChannel], pooled: PooledChannel) -> None:
        self._lease = lease
        self._pooled = pooled

    def __enter__(self) -> PooledChannel:
        return self._pooled

    def __exit__(self, *exc_info: object) -> None:
        self._lease.__exit__(None, None, None)
