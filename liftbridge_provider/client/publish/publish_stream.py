"""Long-lived PublishAsync streams shared by a client's single publishes, one per broker.

``publish`` waits for one ack. A unary Publish call costs the broker a NATS
inbox subscription per message; like go-liftbridge's ``Publish``, the client
instead keeps one PublishAsync stream per broker open and matches acks to
callers by correlation id, which roughly halves the time to an ack. Each
stream is the client's own HTTP/2 call (:mod:`~liftbridge_provider.client.publish.broker_stream`
on :mod:`~liftbridge_provider.client.h2.blocking`), written and read by the
callers themselves: no thread hand-off between an ack's arrival and its caller.

Guarantees, as for a unary publish:

- a broker with no open stream that does not connect (TCP, TLS and its HTTP/2
  settings) within ``CONNECT_TRY`` s is skipped before anything is sent to it
  (the next broker gets the message), and so is a stream whose connection was
  found ended when what waited on its socket was read before the write (a
  broker killed, or restarted on the same address, since the last publish);
- once written, a message is never re-sent: a stream that breaks fails every
  message awaiting its ack with ``may_be_stored=True`` (one none of whose bytes
  went out goes to the next broker), and a missing ack fails at the caller's
  deadline with AckTimeoutError (``may_be_stored``); a message that could not
  be written by the deadline (the previous one still being written to a
  stalled broker, or the broker's window closed) fails as not sent and is never
  written later; a broker whose ack timed out, whose write stalled, whose
  stream broke or that stayed silent while connecting is told to the
  process's broker health model (:mod:`~liftbridge_provider.client.health`)
  and goes last for every path, so a frozen broker does not take every
  publish until keepalive notices it;
- a stream with nothing to do for ``idle_close`` s is half-closed and ended
  by the connection pool's janitor (or by the next publish to its broker);
  one replaced after its broker restarted ends once its callers have their
  answers; :meth:`PublishStreams.close` ends them all, and no stream has a
  thread, so nothing outlives the client.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import zlib
from collections.abc import Sequence
from collections.abc import Set as AbstractSet

import grpc

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client.connections import ConnectionPool
from liftbridge_provider.client.errors import (
    AckTimeoutError,
    ClientClosedError,
    LiftbridgeTimeoutError,
    UnavailableError,
)
from liftbridge_provider.client.h2.aio_transport import NotConnected
from liftbridge_provider.client.h2.grpc_status import CallFailed
from liftbridge_provider.client.health import HEALTH, SUSPECT_FOR, Signal, silence_counts
from liftbridge_provider.client.not_sent import CONNECT_TRY, Connection, NotSent
from liftbridge_provider.client.publish.broker_stream import (
    PUBLISH_ASYNC,
    Answer,
    BrokerStream,
    NoAnswer,
    SendStalled,
    StreamClosed,
    Unsent,
)
from liftbridge_provider.core.errors import LiftbridgeError

log = logging.getLogger(__name__)


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
        pool.on_idle_check(self.close_idle)

    @property
    def closed(self) -> bool:
        """:meth:`close` was called."""
        return self._closed

    def next_correlation_id(self) -> str:
        return f"p{next(self._ids)}"

    def publish(self, addresses: Sequence[str], request: api.PublishRequest, deadline: float) -> api.PublishResponse:
        """Send ``request`` on the first broker's stream that connects (``addresses``: sorted, no repeats) and
        wait (until ``deadline``, ``time.monotonic()``) for its response; errors name whether the message may be
        stored. NotSent when no broker took it (nothing was sent)."""
        order = _sticky_order(tuple(addresses), request.stream, request.partition, HEALTH.suspects())
        last: NotSent | None = None
        for address in order:
            try:
                answer, stream = self._send(address, request, deadline)
            except NotSent as exc:
                last = exc
                continue
            try:
                return self._wait(answer, stream, request, deadline, sent=time.monotonic())
            except Unsent:  # its stream broke before any byte of it went out: the next broker may take it
                HEALTH.tell(address, Signal.BROKEN)
                last = NotSent(address, Connection.REFUSED)
        assert last is not None, "no broker address to publish to"
        raise last

    def close(self) -> None:
        """End every stream (a publish waiting for its ack fails with ClientClosedError); later publishes raise
        ClientClosedError."""
        with self._lock:
            self._closed = True
            streams, self._streams = list(self._streams.values()) + self._retired, {}
            self._retired = []
        for stream in streams:
            stream.close(_closed_while_waiting)

    def close_idle(self) -> int:
        """End the streams idle for ``idle_close`` s (run by the pool's janitor); how many ended."""
        now = time.monotonic()
        with self._lock:
            self._retired = [s for s in self._retired if not s.ended]
            streams = list(self._streams.items())
        idle = [(address, stream) for address, stream in streams if stream.close_if_idle(now)]
        with self._lock:
            for address, stream in idle:
                if self._streams.get(address) is stream:
                    del self._streams[address]
        return len(idle)

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
        """The open stream to ``address``, opened (after it connected) when there is none that takes requests."""
        with self._lock:
            if self._closed:
                raise ClientClosedError("the Liftbridge client is closed")
            stream = self._streams.get(address)
            if stream is not None and stream.usable:
                return stream
        opened = self._open(address, deadline)
        late: BrokerStream | None = None  # opened after close() took the streams it knew: nothing was sent on it
        replaced: BrokerStream | None = None
        with self._lock:
            if self.closed:
                late = opened
            else:
                current = self._streams.get(address)
                if current is not None and current.usable:  # another thread opened one meanwhile: use that
                    opened.retire()  # nothing was sent on it: it ends at once
                    return current
                self._streams[address] = opened
                if current is not None:  # not usable: it ends now, or once its callers have their answers
                    replaced = current
                    self._retired = [s for s in self._retired if not s.ended] + [current]
        if replaced is not None:
            replaced.retire()
        if late is not None:
            late.retire()
            raise ClientClosedError("the Liftbridge client was closed; nothing was sent")
        return opened

    def _open(self, address: str, deadline: float) -> BrokerStream:
        """A new stream to ``address``, connected within ``CONNECT_TRY`` s and the deadline; NotSent otherwise
        (nothing was sent), the broker told to the health model."""
        call = self._pool.open_call(
            address, PUBLISH_ASYNC, timeout=None, lazy_acks=True
        )  # ClientClosedError once closed
        started = time.monotonic()
        within = max(min(CONNECT_TRY, deadline - started), 0.001)
        try:
            call.connect(within)
        except NotConnected as exc:
            self._pool.release_call(call)
            if exc.silent and silence_counts(within):
                HEALTH.tell(address, Signal.SILENT)
            connection = Connection.SILENT if exc.silent else Connection.REFUSED
            raise NotSent(address, connection, waited=within) from None
        except CallFailed:  # cancelled while it connected: the client's close() ran meanwhile
            self._pool.release_call(call)
            raise ClientClosedError("the Liftbridge client was closed; nothing was sent") from None
        except BaseException:
            self._pool.release_call(call)
            raise
        HEALTH.note_connect_time(address, time.monotonic() - started)
        return BrokerStream(address, call, idle_close=self._idle_close, release=self._pool.release_call)

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
        except NoAnswer as exc:
            if silence_counts(deadline - sent):
                HEALTH.tell(stream.address, Signal.SILENT)
                log.warning("no ack from %s in time; it goes last for %gs", stream.address, SUSPECT_FOR)
            if exc.sent:
                raise _no_ack_in_time(request) from None
            raise LiftbridgeTimeoutError(
                f"the deadline came before this message could be written on the PublishAsync stream to "
                f"{stream.address} (the broker's flow-control window stayed closed: a frozen or slow broker); this "
                "message was not sent",
                stream=request.stream,
                partition=request.partition,
                code=grpc.StatusCode.DEADLINE_EXCEEDED,
            ) from None
        except LiftbridgeError as exc:
            exc.stream, exc.partition = request.stream, request.partition
            if isinstance(exc, UnavailableError):  # its connection broke: the next publishes try others first
                HEALTH.tell(stream.address, Signal.BROKEN)
            raise


def _no_ack_in_time(request: api.PublishRequest) -> AckTimeoutError:
    return AckTimeoutError(
        "no ack before the deadline; the message may have been stored",
        stream=request.stream,
        partition=request.partition,
        code=grpc.StatusCode.DEADLINE_EXCEEDED,
        may_be_stored=True,
    )


def _closed_while_waiting(sent: bool) -> LiftbridgeError:
    if not sent:
        return ClientClosedError(
            "the Liftbridge client was closed before this message was written; it was not sent", may_be_stored=False
        )
    return ClientClosedError(
        "the Liftbridge client was closed while a publish waited for its ack; it may have been stored",
        may_be_stored=True,
    )
