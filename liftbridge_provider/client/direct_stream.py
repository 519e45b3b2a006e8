"""A broker's shared PublishAsync call on a socket of the client's own, for single publishes: whoever waits reads.

``publish`` writes its request and waits for its ack. Over grpc, the ack
was read by grpc's channel thread and handed to the caller: a thread wake-up
on top of the socket's own. :class:`DirectBrokerStream` keeps one gRPC call
per broker (:class:`~liftbridge_provider.client.h2_call.CallState`, the same
HTTP/2 call as ``publish_batch``'s) on a non-blocking socket: the caller's
thread writes, and the first caller to wait becomes the reader: it reads the
socket until its own ack came, handing every other caller's ack to it on the
way, then hands the reading over to the next caller still waiting. With one
publishing thread, a publish is one write and one read on that thread.

Every read and write of the socket happens under the stream's lock and
never blocks (TLS sockets must not be used by two threads at once); one
waiting caller at a time waits for the socket without the lock (``poll``),
the others on the stream's condition, so a writer never waits behind a reader.

Guarantees, as :class:`~liftbridge_provider.client.publish_stream.BrokerStream`'s:
a request goes out only once every earlier one is on the wire, and one that
is not on the wire in full by its deadline was not sent (taken back if none
of it left; else the connection is closed, so the server drops its
beginning); once written, it is never re-sent, and when the call ends every
caller still waiting fails with ``may_be_stored=True``. A stream idle for
``idle_close`` s, or whose peer closed the connection, takes no more requests
(the next publish opens another).
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable

import grpc
from google.protobuf.message import DecodeError

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client.errors import LiftbridgeError, UnavailableError
from liftbridge_provider.client.h2_call import CallState
from liftbridge_provider.client.health import HEALTH
from liftbridge_provider.client.options import parse_broker

PUBLISH_ASYNC = "/proto.API/PublishAsync"
READ_BYTES = 256 * 1024  # most bytes read from the socket at once
_WOULD_BLOCK = (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


class StreamBroken(Exception):
    """The request was not sent: the stream is closed, or (``stalled``) the deadline came before it was on the
    wire in full."""

    def __init__(self, reason: str, *, stalled: bool) -> None:
        super().__init__(reason)
        self.stalled = stalled


class Waiter:
    """The answer to one request: the response, or the error the stream failed it with. Set once, under the
    stream's lock; read by the caller under the same lock."""

    __slots__ = ("error", "response")

    def __init__(self) -> None:
        self.response: api.PublishResponse | None = None
        self.error: LiftbridgeError | None = None

    @property
    def done(self) -> bool:
        return self.response is not None or self.error is not None


def connect(address: str, timeout: float, tls: ssl.SSLContext | None, server_name: str | None) -> socket.socket:
    """A connected socket to ``address`` (TLS handshake done), non-blocking; OSError (ConnectionRefusedError,
    TimeoutError, ssl.SSLError) when that fails within ``timeout`` s."""
    host, port = parse_broker(address)
    deadline = time.monotonic() + timeout
    raw = socket.create_connection((host, port), timeout=timeout)
    try:
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock = raw
        if tls is not None:
            raw.settimeout(max(deadline - time.monotonic(), 0.001))
            sock = tls.wrap_socket(raw, server_hostname=server_name or host)
        sock.setblocking(False)
        return sock
    except BaseException:
        raw.close()
        raise


class DirectBrokerStream:
    """One PublishAsync call to one broker, shared by the threads that publish there (see the module docstring).

    :param address: the broker (``host:port``), also the request's ``:authority`` unless ``server_name``.
    :param sock: a connected non-blocking socket (:func:`connect`).
    :param idle_close: seconds without a request after which the stream takes no more.
    :param max_response_bytes: largest response accepted.
    :param server_name: the TLS server name, when it is not the address's host.
    """

    direct = True  # no thread hand-off per message (as BrokerStream.direct)

    def __init__(
        self,
        address: str,
        sock: socket.socket,
        *,
        idle_close: float,
        max_response_bytes: int,
        server_name: str | None = None,
    ) -> None:
        self.address = address
        self._sock = sock
        self._tls = isinstance(sock, ssl.SSLSocket)
        self._idle_close = idle_close
        self._state = CallState(
            authority=server_name or address, path=PUBLISH_ASYNC, tls=self._tls, max_response_bytes=max_response_bytes
        )
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # the socket was served: answers, bytes out, an end
        self._polling = False  # one waiting caller waits for the socket; the others for the condition
        self._out = bytearray()  # bytes the call produced that the socket has not taken yet
        self._out_total = 0  # bytes the call produced since the start
        self._sent_total = 0  # bytes the socket took since the start
        self._marks: deque[tuple[int, int]] = deque()  # (requests produced in full, bytes produced by then)
        self._queued = 0  # requests queued since the start
        self._on_wire = 0  # requests the socket took in full since the start
        self._pending: dict[str, Waiter] = {}
        self._closing = False
        self._last_sent = time.monotonic()
        self._answered = False
        with self._lock:
            self._pump()  # the preface, settings and headers

    # -- the publishing side ---------------------------------------------------------------------------------

    @property
    def usable(self) -> bool:
        """Takes requests: not closing or ended, used within ``idle_close`` s, and its peer has not closed the
        connection (what waits on the socket is read first: a broker that died shows at once)."""
        with self._lock:
            if not self._closing:
                self._pump()
            idle = not self._pending and time.monotonic() - self._last_sent >= self._idle_close
            if idle and not self._closing:
                self._closing = True
                self._close_socket()
            return not self._closing and self._state.ended is None

    def send(self, request: api.PublishRequest, deadline: float) -> Waiter:
        """Write ``request``; its waiter gets the answer (see :meth:`wait`). StreamBroken when it was not sent."""
        data = request.SerializeToString()
        waiter = Waiter()
        with self._lock:
            ahead = self._queued
            if not self._wait_for(lambda: self._on_wire >= ahead, deadline):
                raise StreamBroken("an earlier message was still being written at the deadline", stalled=True)
            if self._closing or self._state.ended is not None:
                raise StreamBroken("the stream is closed", stalled=False)
            self._pending[request.correlationId] = waiter
            self._state.queue([data])
            self._queued += 1
            mine = self._queued
            self._pump(read=False)  # the ack cannot be there yet
            if self._wait_for(lambda: self._on_wire >= mine, deadline):
                self._last_sent = time.monotonic()
                return waiter  # on the wire (an end since then already failed it as may-be-stored)
            self._pending.pop(request.correlationId, None)
            if self._closing or self._state.ended is not None:
                raise StreamBroken("the stream ended before the message was written", stalled=False)
            if self._state.withdraw():  # none of it left: the stream goes on without it
                self._queued -= 1
            else:  # partly written: only closing the connection keeps the server from storing it
                self._state.connection_lost("a message could not be written by its deadline")
                self._end()
            raise StreamBroken("the broker took too little of the message before the deadline", stalled=True)

    def wait(self, waiter: Waiter, deadline: float) -> api.PublishResponse:
        """The response for ``waiter`` (read by this caller when no one else reads); its error if the stream
        failed it; TimeoutError at ``deadline`` (``time.monotonic()``)."""
        with self._lock:
            self._wait_for(lambda: waiter.done, deadline)
            if waiter.error is not None:
                raise waiter.error
            if waiter.response is None:
                raise TimeoutError()
            return waiter.response

    def forget(self, correlation_id: str) -> bool:
        """The caller stopped waiting; False when its answer was already set."""
        with self._lock:
            return self._pending.pop(correlation_id, None) is not None

    def close(self, error: Callable[[], LiftbridgeError]) -> None:
        """Take no more requests, close the connection, fail every waiting caller with a new ``error()``."""
        with self._lock:
            self._closing = True
            self._close_socket()
            self._fail_pending(error)
            self._changed.notify_all()

    # -- inside (under the lock) -----------------------------------------------------------------------------

    def _wait_for(self, done: Callable[[], bool], deadline: float) -> bool:
        """Serve the socket until ``done()``, the stream's end or ``deadline``; whether ``done()``."""
        while not done():
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._closing or self._state.ended is not None:
                return done()
            if self._polling:
                self._changed.wait(remaining)
                continue
            events = select.POLLIN | (select.POLLOUT if self._out else 0)
            poller = select.poll()
            poller.register(self._sock.fileno(), events)
            self._polling = True
            self._lock.release()
            try:
                poller.poll(max(int(remaining * 1000), 1))
            finally:
                self._lock.acquire()
                self._polling = False
            self._after_poll()
        return True

    def _after_poll(self) -> None:
        """Closed while this caller polled: close the socket now; else serve it."""
        if self._closing:
            self._close_socket()
            self._changed.notify_all()
        else:
            self._pump()

    def _pump(self, *, read: bool = True) -> None:
        """Without blocking: read what the socket holds (answering the callers it completes), move what the
        call may write to the socket, and end the stream if the call ended; then wake every waiting caller."""
        if read and self._state.ended is None:
            self._read()
        if self._state.ended is None:
            out = self._state.outgoing()
            if out:
                self._out += out
                self._out_total += len(out)
                self._marks.append((self._state.written_messages, self._out_total))
            self._write()
        if self._state.ended is not None:
            self._end()
        self._changed.notify_all()

    def _read(self) -> None:
        while True:
            try:
                data = self._sock.recv(READ_BYTES)
            except _WOULD_BLOCK:
                return
            except OSError as exc:
                self._state.connection_lost(f"connection to {self.address} lost: {exc}")
                return
            if not data:
                self._state.connection_lost(f"connection to {self.address} closed by the server")
                return
            self._answer(self._state.receive(data))
            if self._state.ended is not None or (len(data) < READ_BYTES and not self._tls):
                return

    def _write(self) -> None:
        out = self._out
        while out:
            try:
                sent = self._sock.send(out)
            except _WOULD_BLOCK:
                break
            except OSError as exc:
                self._state.connection_lost(f"a write to {self.address} failed: {exc}")
                return
            del out[:sent]
            self._sent_total += sent
        marks = self._marks
        while marks and marks[0][1] <= self._sent_total:
            self._on_wire = marks.popleft()[0]

    def _answer(self, responses: list[bytes]) -> None:
        if not responses:
            return
        if not self._answered:
            HEALTH.answered(self.address)
            self._answered = True
        for data in responses:
            try:
                response = api.PublishResponse.FromString(data)
            except DecodeError:
                self._state.fail(grpc.StatusCode.INTERNAL, "a PublishAsync response did not parse")
                return
            failed = response.HasField("asyncError")
            correlation_id = response.correlationId if failed else response.ack.correlationId
            waiter = self._pending.pop(correlation_id, None)
            if waiter is not None:
                waiter.response = response

    def _end(self) -> None:
        ended = self._state.ended
        reason = "the stream ended" if ended is None else f"{ended.code.name}: {ended.details}"
        self._closing = True
        self._close_socket()
        self._fail_pending(
            lambda: UnavailableError(
                f"PublishAsync stream to {self.address} ended before the ack ({reason}); "
                "the message may or may not have been stored",
                code=grpc.StatusCode.UNAVAILABLE,
                may_be_stored=True,
            )
        )
        self._changed.notify_all()

    def _fail_pending(self, error: Callable[[], LiftbridgeError]) -> None:
        waiting, self._pending = self._pending, {}
        for waiter in waiting.values():
            waiter.error = error()

    def _close_socket(self) -> None:
        """Shut the connection down; close the socket unless a caller is polling it (it closes it on waking)."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        if not self._polling:
            with contextlib.suppress(OSError):
                self._sock.close()
