"""Long-lived PublishAsync streams shared by a client's single publishes, one per broker.

``publish`` waits for one ack. A unary Publish call costs the broker a NATS
inbox subscription per message; like go-liftbridge's ``Publish``, the client
instead keeps one PublishAsync stream per broker open and matches acks to
callers by correlation id, which roughly halves the time to an ack. The
stream is driven by the callers that wait for its acks where grpcio allows
(``polled_call.py``): no thread hand-off between an ack's arrival and its
caller.

Guarantees, as for a unary publish:

- a broker whose channel is not connected right now (its live state: one
  that died since the last publish shows at once) and does not connect
  within ``CONNECT_TRY`` s is skipped before anything is sent to it (the next
  broker gets the message), and so is a stream on a channel that is no
  longer connected;
- once written, a message is never re-sent: a stream that breaks fails every
  message awaiting its ack with ``may_be_stored=True``, and a missing ack
  fails at the caller's deadline with AckTimeoutError (``may_be_stored``);
  a message that could not be written by the deadline (the previous one
  still being written to a stalled broker) fails as not sent;
  a broker whose ack timed out, whose write stalled, whose stream broke or
  that stayed silent while connecting is told to the process's broker
  health model (:mod:`~liftbridge_provider.client.health`) and goes last for
  every path, so a frozen broker does not take every publish until
  keepalive notices it;
- a stream with nothing to do for ``idle_close`` s half-closes itself (before
  the server's keepalive policy would complain about pings on an idle stream).
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from contextlib import AbstractContextManager
from typing import Any

import grpc

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client.connections import ConnectionPool, PooledChannel
from liftbridge_provider.client.errors import (
    AckTimeoutError,
    ClientClosedError,
    LiftbridgeTimeoutError,
    UnavailableError,
)
from liftbridge_provider.client.health import HEALTH, SUSPECT_FOR, Signal, silence_counts
from liftbridge_provider.client.plans import CONNECT_TRY, Connection, NotSent
from liftbridge_provider.client.publish.polled_call import CallEnded, PolledCall, SendStalled, open_polled_call
from liftbridge_provider.core.errors import LiftbridgeError

log = logging.getLogger(__name__)
LATE_ANSWER_WAIT = 1.0  # seconds to wait for an answer taken to be set just as the caller's wait ended


class StreamClosed(Exception):
    """The stream is closing or broken: open a new one (nothing was sent on it)."""


def sticky_order(addresses: Sequence[str], stream: str, partition: int, suspects: AbstractSet[str]) -> list[str]:
    """Brokers in the order a partition's publishes try them: the same first broker every time (a hash of
    stream and partition, as go-liftbridge's ring), brokers suspected of being frozen last."""
    return list(_sticky_order(tuple(sorted(set(addresses))), stream, partition, frozenset(suspects)))


@functools.lru_cache(maxsize=4096)
def _sticky_order(ordered: tuple[str, ...], stream: str, partition: int, suspects: frozenset[str]) -> tuple[str, ...]:
    """:func:`sticky_order` of sorted addresses, remembered: a publish asks it for the same few partitions over
    and over."""
    if not ordered:
        return ()
    start = zlib.crc32(f"{stream}:{partition}".encode()) % len(ordered)
    rotated = ordered[start:] + ordered[:start]
    return tuple(a for a in rotated if a not in suspects) + tuple(a for a in rotated if a in suspects)


class Answer:
    """The response to one request, handed from the thread that reads it to the one caller waiting for it.

    One lock, released once (a ``concurrent.futures.Future`` wakes its waiter through a condition, which
    can wake it twice). Each answer is set or failed once: the stream pops it from its pending map first.
    """

    __slots__ = ("_error", "_ready", "_response")

    def __init__(self) -> None:
        self._ready = threading.Lock()
        self._ready.acquire()
        self._response: api.PublishResponse | None = None
        self._error: LiftbridgeError | None = None

    def set(self, response: api.PublishResponse) -> None:
        self._response = response
        self._ready.release()

    def fail(self, error: LiftbridgeError) -> None:
        self._error = error
        self._ready.release()

    @property
    def ready(self) -> bool:
        """Set or failed: :meth:`result` returns at once."""
        return self._response is not None or self._error is not None

    def result(self, timeout: float) -> api.PublishResponse:
        """The response, or the error it failed with; TimeoutError after ``timeout`` s."""
        if not self._ready.acquire(timeout=timeout):
            raise TimeoutError()
        if self._error is not None:
            raise self._error
        assert self._response is not None
        return self._response


class BrokerStream:
    """One PublishAsync call to one broker: callers' requests out, each ack handed to the caller waiting for it.

    The call is driven by its callers (:mod:`~liftbridge_provider.client.publish.polled_call`: the caller's
    thread writes, and the callers waiting for acks read them) or, on a grpcio without the parts that needs,
    through grpc's iterator API (:class:`_QueuedCall`). Either way one thread named
    ``liftbridge-publish-<address>`` lives as long as the stream.
    """

    def __init__(self, address: str, lease: AbstractContextManager[PooledChannel], idle_close: float) -> None:
        self.address = address
        self._lease = lease
        self._idle_close = idle_close
        self._pending: dict[str, Answer] = {}
        self._lock = threading.Lock()
        self._closing = False
        self._ended = False
        self._last_sent = time.monotonic()
        pooled = self._pooled = lease.__enter__()
        self._breaks = pooled.breaks  # the channel was connected when this stream opened
        handlers: dict[str, Any] = {
            "name": f"liftbridge-publish-{address}",
            "idle_close": idle_close,
            "close_if_idle": self.close_if_idle,
            "on_response": self._on_response,
            "on_end": self._on_end,
        }
        polled = open_polled_call(pooled.channel, **handlers)
        self._call: PolledCall | _QueuedCall = polled or _QueuedCall(pooled.stub.PublishAsync, **handlers)

    @property
    def usable(self) -> bool:
        """Takes requests: not closing, its channel connected right now and never seen otherwise since this stream
        opened. A broker that died since the last publish shows in the channel's state before this stream's own
        end is handled; one restarted since shows only in the channel's count of breaks, as the call's end may
        come after the probe of :class:`PolledCall` on a loaded machine."""
        return not self._closing and self._pooled.ready() and self._pooled.breaks == self._breaks

    @property
    def ended(self) -> bool:
        """The call is over (its end handled, its channel lease given back)."""
        return self._ended

    @property
    def polled(self) -> bool:
        """The call is driven by its callers (no thread hand-off per ack)."""
        return isinstance(self._call, PolledCall)

    def send(self, request: api.PublishRequest, deadline: float) -> Answer:
        """Send ``request``; the answer gets its response. StreamClosed when this stream takes no more,
        SendStalled when the previous message was still being written at ``deadline`` (both: not sent)."""
        answer = Answer()
        with self._lock:
            if self._closing:
                raise StreamClosed(self.address)
            self._pending[request.correlationId] = answer
            self._last_sent = time.monotonic()
        try:
            self._call.send(request, deadline)
        except CallEnded:
            self.forget(request.correlationId)
            with self._lock:
                self._closing = True  # the next publish opens a new stream, not this dead one
            raise StreamClosed(self.address) from None
        except BaseException:  # SendStalled (not sent), or anything unexpected: nobody waits for this answer
            self.forget(request.correlationId)
            raise
        return answer

    def forget(self, correlation_id: str) -> bool:
        """The caller stopped waiting (its deadline passed); a late ack is dropped. False when the answer
        was already taken to be set (its ack or error came as the wait ended)."""
        with self._lock:
            return self._pending.pop(correlation_id, None) is not None

    def result(self, answer: Answer, deadline: float) -> api.PublishResponse:
        """``answer``'s response (or its error) once it comes; TimeoutError at ``deadline`` (``time.monotonic()``)."""
        if isinstance(self._call, PolledCall):
            self._call.drive(lambda: answer.ready, deadline)
            return answer.result(timeout=0.0)
        return answer.result(timeout=max(deadline - time.monotonic(), 0.0))

    def close(self, error: Callable[[], LiftbridgeError]) -> None:
        """Stop taking requests, fail what still waits with a new ``error()`` each, cancel the call (in that
        order: the stream's end, reported as the broker's, must not answer a waiting caller first)."""
        with self._lock:
            self._closing = True
        self._fail_pending(error)
        self._call.cancel()

    def retire(self) -> None:
        """Replaced by a new stream to the same broker: take no more requests, and cancel the call at once unless
        a caller still waits on it for an ack (that caller polls the call on to its ack or its end, and the
        keeper half-closes it once idle)."""
        with self._lock:
            self._closing = True
            waited_on = bool(self._pending)
        if not waited_on:
            self._call.cancel()

    def close_if_idle(self) -> bool:
        """Nothing sent for ``idle_close`` s and no ack awaited: stop taking requests (True)."""
        with self._lock:
            if self._pending or time.monotonic() - self._last_sent < self._idle_close:
                return False
            self._closing = True
            return True

    def _on_response(self, response: api.PublishResponse) -> None:
        HEALTH.answered(self.address)
        failed = response.HasField("asyncError")
        correlation_id = response.correlationId if failed else response.ack.correlationId
        with self._lock:
            answer = self._pending.pop(correlation_id, None)
        if answer is not None:
            answer.set(response)

    def _on_end(self, call: grpc.RpcError) -> None:
        code = call.code()
        reason = "the server ended the stream" if code is grpc.StatusCode.OK else f"{code.name}: {call.details()}"
        with self._lock:
            self._closing = True
            self._ended = True
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
            answer.fail(error())


class _QueuedCall:
    """grpc's iterator API: requests through a queue to grpc's sending thread, responses read by a thread of
    ours (three thread hand-offs per message and ack; the fallback of :class:`PolledCall`)."""

    def __init__(
        self,
        method: Callable[[Iterator[api.PublishRequest]], Any],
        *,
        name: str,
        idle_close: float,
        close_if_idle: Callable[[], bool],
        on_response: Callable[[api.PublishResponse], None],
        on_end: Callable[[grpc.RpcError], None],
    ) -> None:
        self._idle_close = idle_close
        self._close_if_idle = close_if_idle
        self._on_response, self._on_end = on_response, on_end
        self._requests: queue.SimpleQueue[api.PublishRequest | None] = queue.SimpleQueue()
        self._call: Any = method(self._outgoing())
        threading.Thread(target=self._read, name=name, daemon=True).start()

    def send(self, request: api.PublishRequest, deadline: float) -> None:
        self._requests.put(request)

    def cancel(self) -> None:
        self._requests.put(None)
        self._call.cancel()

    def _outgoing(self) -> Iterator[api.PublishRequest]:
        """The requests, as gRPC's sending thread asks for them; ends (half-closes) when idle or closed."""
        while True:
            try:
                request = self._requests.get(timeout=self._idle_close)
            except queue.Empty:
                if self._requests.empty() and self._close_if_idle():
                    return
                continue
            if request is None:
                return
            yield request

    def _read(self) -> None:
        try:
            for response in self._call:
                self._on_response(response)
        except grpc.RpcError:
            pass
        self._on_end(self._call)


class PublishStreams:
    """A client's shared streams, one per broker, opened on first use and reopened after they end."""

    def __init__(self, pool: ConnectionPool, *, idle_close: float) -> None:
        self._pool = pool
        self._idle_close = idle_close
        self._streams: dict[str, BrokerStream] = {}
        self._retired: list[BrokerStream] = []  # replaced ones not yet seen ended: close() ends them too
        self._lock = threading.Lock()
        self._closed = False
        self._ids = iter(range(1, 2**63))

    @property
    def closed(self) -> bool:
        """:meth:`close` was called."""
        return self._closed

    def next_correlation_id(self) -> str:
        return f"p{next(self._ids)}"

    def publish(self, addresses: Sequence[str], request: api.PublishRequest, deadline: float) -> api.PublishResponse:
        """Send ``request`` on the first broker's stream that connects (``addresses``: sorted, no repeats) and
        wait (until ``deadline``, ``time.monotonic()``) for its response; errors name whether the message may be
        stored."""
        order = _sticky_order(tuple(addresses), request.stream, request.partition, HEALTH.suspects())
        last: NotSent | None = None
        for address in order:
            try:
                answer, stream = self._send(address, request, deadline)
            except NotSent as exc:
                last = exc
                continue
            return self._wait(answer, stream, request, deadline, sent=time.monotonic())
        assert last is not None, "no broker address to publish to"
        raise last

    def close(self) -> None:
        with self._lock:
            self._closed = True
            streams, self._streams = list(self._streams.values()) + self._retired, {}
            self._retired = []
        for stream in streams:
            stream.close(_closed_while_waiting)

    def _send(self, address: str, request: api.PublishRequest, deadline: float) -> tuple[Answer, BrokerStream]:
        for _ in range(3):  # a stream may close between taking it and sending: take a fresh one
            stream = self._stream(address, deadline)
            started = time.monotonic()
            try:
                return stream.send(request, deadline), stream
            except StreamClosed:
                continue
            except SendStalled:
                if silence_counts(deadline - started):
                    HEALTH.tell(address, Signal.SILENT)
                raise LiftbridgeTimeoutError(
                    f"the deadline came before this message could be written on the PublishAsync stream to {address} "
                    "(its previous write had not finished: a frozen or slow broker, or a timeout too short); this "
                    "message was not sent",
                    stream=request.stream,
                    partition=request.partition,
                    code=grpc.StatusCode.DEADLINE_EXCEEDED,
                ) from None
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
            HEALTH.tell(address, Signal.SILENT if connection is Connection.SILENT else Signal.REFUSED)
            raise NotSent(address, connection)
        try:
            opened = BrokerStream(address, _Held(lease, pooled), self._idle_close)
        except ValueError as exc:  # grpc: "Cannot invoke RPC: Channel closed!" when close() ran meanwhile
            lease.__exit__(None, None, None)
            if self.closed:
                raise ClientClosedError("the Liftbridge client was closed; nothing was sent") from exc
            raise
        except BaseException:
            lease.__exit__(None, None, None)
            raise
        late: BrokerStream | None = None  # opened after close() took the streams it knew: nothing was sent on it
        replaced: BrokerStream | None = None
        with self._lock:
            if self.closed:
                late = opened
            else:
                current = self._streams.get(address)
                if current is not None and current.usable:  # another thread opened one meanwhile: use that
                    opened.close(_closed_while_waiting)  # nothing was sent on it
                    return current
                self._streams[address] = opened
                if current is not None:  # not usable: it ends now, or once its callers have their answers
                    replaced = current
                    self._retired = [s for s in self._retired if not s.ended] + [current]
        if replaced is not None:
            replaced.retire()
        if late is not None:
            late.close(_closed_while_waiting)
            raise ClientClosedError("the Liftbridge client was closed; nothing was sent")
        return opened

    def _wait(
        self,
        answer: Answer,
        stream: BrokerStream,
        request: api.PublishRequest,
        deadline: float,
        *,
        sent: float,
    ) -> api.PublishResponse:
        try:
            return stream.result(answer, deadline)
        except TimeoutError:
            if not stream.forget(request.correlationId):  # the answer came as the wait ended: it is being set
                return self._late(answer, stream, request)
            if silence_counts(deadline - sent):
                HEALTH.tell(stream.address, Signal.SILENT)
                log.warning("no ack from %s in time; it goes last for %gs", stream.address, SUSPECT_FOR)
            raise _no_ack_in_time(request) from None
        except LiftbridgeError as exc:
            exc.stream, exc.partition = request.stream, request.partition
            if isinstance(exc, UnavailableError):  # its connection broke: the next publishes try others first
                HEALTH.tell(stream.address, Signal.BROKEN)
            raise

    def _late(self, answer: Answer, stream: BrokerStream, request: api.PublishRequest) -> api.PublishResponse:
        """The answer taken by the stream just as the caller's wait ended (set within moments)."""
        try:
            return answer.result(timeout=LATE_ANSWER_WAIT)
        except TimeoutError:  # pragma: no cover - the taker sets it right after taking it
            raise _no_ack_in_time(request) from None
        except LiftbridgeError as exc:
            exc.stream, exc.partition = request.stream, request.partition
            raise


def _no_ack_in_time(request: api.PublishRequest) -> AckTimeoutError:
    return AckTimeoutError(
        "no ack before the deadline; the message may have been stored",
        stream=request.stream,
        partition=request.partition,
        code=grpc.StatusCode.DEADLINE_EXCEEDED,
        may_be_stored=True,
    )


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
