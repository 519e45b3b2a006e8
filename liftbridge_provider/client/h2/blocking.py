"""The synchronous driver of the data plane: one :class:`~liftbridge_provider.client.h2.call_state.CallState` on
a socket of its own, driven by the threads that use it (no thread of its own).

:class:`BlockingCall` is written from any thread (:meth:`send`, under a lock) and read by one waiting caller
at a time (:meth:`receive`), on the caller's thread: the sync client's Subscribe (reads, subscriptions, the
Spark task's column batches), and a stream shared by several publishing threads that take turns reading.
Its rules, each kept on every path:

- **Connect within a bound** (:meth:`connect`): the dial, the TLS handshake (Python's ``ssl`` with ALPN
  ``h2`` and the client's ``TLSConfig``, :mod:`tls_pipe`) and the server's HTTP/2 SETTINGS, all within
  ``within`` seconds (and the call's deadline). A frozen broker's kernel accepts the connection and answers
  nothing: no request is written before the SETTINGS came, and the call fails as :class:`NotConnected`
  (``silent``: DEADLINE_EXCEEDED) with nothing sent. A refused or reset connection fails at once
  (UNAVAILABLE).
- **A deadline on every exit path**: the call ends DEADLINE_EXCEEDED ("Deadline Exceeded", as grpc says) at
  ``timeout`` seconds after it was made, whatever the server does, and the server is told the same deadline
  (``grpc-timeout``); a read may also return earlier by its own ``until``, the call going on.
- **Keepalive**: every wait is bounded by the call's next keepalive tick (:meth:`CallState.keepalive`), so
  a reader waiting on a broker that froze sees the call end UNAVAILABLE within ``KEEPALIVE_IDLE +
  KEEPALIVE_TIMEOUT`` (20 s) of the broker's last frame; what was read is always taken before the rule is
  applied (an answer to a PING may have waited unread while the consumer was busy).
- **Ended on every exit**: :meth:`cancel` (any thread: RST_STREAM, then the socket shut down, which wakes a
  waiting reader at once) and :meth:`close` (the owner, after its last read: cancel, then the socket closed).
  Nothing outlives the call: no grpc core call, no completion queue, no thread.

Bounded in flight: the socket is read only when a caller asks for the next responses, so what the server
may send ahead is its flow-control window (16 MiB) and the socket buffers.
"""

from __future__ import annotations

import contextlib
import errno
import math
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence

import grpc

from liftbridge_provider.client.h2.aio_transport import NotConnected
from liftbridge_provider.client.h2.call_state import CallState
from liftbridge_provider.client.h2.grpc_status import CallFailed, as_grpc_ends_it
from liftbridge_provider.client.h2.inbound import Segments
from liftbridge_provider.client.h2.tls_pipe import TlsPipe
from liftbridge_provider.client.options import parse_broker

RECEIVE_BYTES = 256 * 1024  # bytes asked of one read of the socket
CONNECT_WAIT = 5.0  # seconds to dial, shake hands and get the server's SETTINGS, by default
_READABLE = select.POLLIN | select.POLLHUP | select.POLLERR
DEADLINE_DETAILS = "Deadline Exceeded"  # grpc's own words for a call past its deadline


class BlockingCall:
    """One call on a connection of its own (see the module docstring). Make it, :meth:`connect`, then
    :meth:`send` and :meth:`receive`; :meth:`close` on every exit (a ``with`` block does).

    :param address: ``host:port`` to dial.
    :param path: the method's path, e.g. ``/proto.API/Subscribe``.
    :param tls: the client's TLS context (ALPN ``h2``), None for plaintext.
    :param server_name: the name checked against the broker's certificate (default: the host dialled).
    :param max_response_bytes: largest response accepted; a larger one ends the call (RESOURCE_EXHAUSTED).
    :param timeout: seconds the call may last, from now (its deadline).
    :param clock: seconds on a monotonic clock (default ``time.monotonic``).
    """

    def __init__(
        self,
        address: str,
        *,
        path: str,
        tls: ssl.SSLContext | None,
        server_name: str | None,
        max_response_bytes: int,
        timeout: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        host, port = parse_broker(address)
        self.address = address
        self._host, self._port = host, port
        self._clock = clock
        self.deadline = clock() + timeout
        authority = server_name if tls is not None and server_name else address
        self.state = CallState(
            authority=authority,
            path=path,
            tls=tls is not None,
            max_response_bytes=max_response_bytes,
            timeout=timeout,
            clock=clock,
        )
        self._tls = TlsPipe(tls, server_name or host) if tls is not None else None
        self._lock = threading.Lock()  # the call state, the TLS state, the socket's writes
        self._reading = threading.Lock()  # one waiting reader at a time
        self._sock: socket.socket | None = None
        self._poll = select.poll()
        self._out = bytearray()  # bytes for the socket that it did not take yet
        self._early: Segments = []  # responses read while connecting, for the first receive()
        self._keepalive_at = math.inf
        self._cancelled = False
        self._connected = False  # the socket is up (and TLS done): our frames may be written

    def __enter__(self) -> BlockingCall:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def over(self) -> bool:
        """The call has ended (``state.ended`` says how)."""
        return self.state.over

    def error(self) -> CallFailed | None:
        """The call's end as an error, as grpc's own client reports it (None while it runs or when it ended
        OK; :func:`~liftbridge_provider.client.h2.grpc_status.as_grpc_ends_it`)."""
        return as_grpc_ends_it(self.state.ended)

    # -- connecting ------------------------------------------------------------------------------------------

    def connect(self, within: float = CONNECT_WAIT) -> None:
        """Dial, shake hands (TLS) and wait for the server's SETTINGS, within ``within`` seconds and the call's
        deadline (see the module docstring); :class:`NotConnected` otherwise, the call closed."""
        until = min(self._clock() + within, self.deadline)
        try:
            self._dial(until)
            if self._tls is not None:
                self._handshake(until)
            with self._lock:
                self._connected = True
                self._flush()  # the preface, our settings and the request's headers
            while not self.state.peer_ready:
                self._check_connecting(until, within)
                if self._wait(until, reading=True) & _READABLE:
                    self._early.extend(self._read())
            self._keepalive_at = self._clock()  # the first tick sets the real one
        except BaseException:
            self.close()
            raise

    def _check_connecting(self, until: float, within: float) -> None:
        ended = self.state.ended
        if ended is not None:
            if self._cancelled:
                raise CallFailed(ended.code, ended.details)
            raise NotConnected(self.address, ended.details, refused=False)
        if self._clock() >= until:
            raise NotConnected(
                self.address, f"no HTTP/2 settings from the broker within {within:g}s", refused=False, silent=True
            )

    def _dial(self, until: float) -> None:
        try:
            addresses = socket.getaddrinfo(self._host, self._port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise NotConnected(self.address, str(exc), refused=False) from None
        failure: NotConnected | None = None
        for family, kind, protocol, _, target in addresses:
            sock = socket.socket(family, kind, protocol)
            sock.setblocking(False)
            with self._lock:
                if self._cancelled:
                    sock.close()
                    raise CallFailed(grpc.StatusCode.CANCELLED, "cancelled by the client")
                self._sock = sock
            code = sock.connect_ex(target)
            if code in (errno.EINPROGRESS, errno.EWOULDBLOCK):
                if not self._wait(until, reading=False, writing=True):
                    raise NotConnected(self.address, "no TCP connection in time", refused=False, silent=True)
                code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if code == 0 and not self._cancelled:
                if family in (socket.AF_INET, socket.AF_INET6):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return
            with self._lock:
                self._sock = None
            sock.close()
            if self._cancelled:
                raise CallFailed(grpc.StatusCode.CANCELLED, "cancelled by the client")
            reason = errno.errorcode.get(code, str(code))
            failure = NotConnected(self.address, reason, refused=code == errno.ECONNREFUSED)
        raise failure or NotConnected(self.address, "the name resolved to no address", refused=False)

    def _handshake(self, until: float) -> None:
        assert self._tls is not None
        while True:
            with self._lock:
                try:
                    done = self._tls.handshake()
                except ssl.SSLError as exc:
                    raise NotConnected(self.address, str(exc), refused=False) from None
                self._out += self._tls.output()
                self._send_some()
            if done:
                return
            if self._cancelled:
                raise CallFailed(grpc.StatusCode.CANCELLED, "cancelled by the client")
            if not self._wait(until, reading=True) & _READABLE:
                raise NotConnected(self.address, "no TLS handshake in time", refused=False, silent=True)
            raw = self._recv()
            if raw is None:
                continue
            if not raw:
                raise NotConnected(
                    self.address, "the broker closed the connection during the TLS handshake", refused=False
                )
            with self._lock:
                try:
                    self._tls.unwrap(raw)
                except ssl.SSLError as exc:
                    raise NotConnected(self.address, str(exc), refused=False) from None

    # -- the owner's side ------------------------------------------------------------------------------------

    def send(self, messages: Sequence[bytes]) -> None:
        """Queue serialized requests and write what the peer's windows and the socket take now (any thread;
        before :meth:`connect` they go out as soon as the server's settings came)."""
        with self._lock:
            self.state.queue(messages)
            if self._connected:
                self._flush()

    def close_sending(self) -> None:
        """Half-close the call once every queued request is written (any thread)."""
        with self._lock:
            self.state.close_sending()
            if self._connected:
                self._flush()

    def receive(self, until: float | None = None) -> Segments:
        """The responses of the next read that brings any, waiting at most until ``until`` (monotonic seconds,
        default the call's deadline); ``[]`` when the call is over (:attr:`over`, :meth:`error`) or ``until``
        passed first. At the deadline the call ends DEADLINE_EXCEEDED. One waiting caller at a time."""
        with self._reading:
            if self._early:
                early, self._early = self._early, []
                return early
            while not self.state.over:
                now = self._clock()
                if now >= self.deadline:
                    self._end_here(grpc.StatusCode.DEADLINE_EXCEEDED, DEADLINE_DETAILS)
                    break
                if until is not None and now >= until:
                    break
                limit = min(self.deadline, self._keepalive_at, math.inf if until is None else until)
                events = self._wait(limit, reading=True)
                if events & _READABLE:
                    segments = self._read()
                    if segments:
                        return segments
                elif not events and self._clock() >= self._keepalive_at:
                    with self._lock:  # nothing came: the keepalive rule, on what was read
                        delay = self.state.keepalive()
                        self._keepalive_at = math.inf if delay is None else self._clock() + delay
                        self._flush()
            return []

    def cancel(self, details: str = "cancelled by the client") -> None:
        """End the call CANCELLED, from any thread: RST_STREAM is written, and the socket is shut down so a
        reader waiting on it returns at once. Does nothing to a call that has ended, but shut its socket."""
        with self._lock:
            self._cancelled = True
            self._end_locked(grpc.StatusCode.CANCELLED, details)
            if self._sock is not None:
                with contextlib.suppress(OSError):
                    self._sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Cancel the call if it is still open and close its socket (the owner, after its last read)."""
        self.cancel()
        with self._lock:
            sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._poll.unregister(sock)
            sock.close()

    # -- inside ----------------------------------------------------------------------------------------------

    def _end_here(self, code: grpc.StatusCode, details: str) -> None:
        with self._lock:
            self._end_locked(code, details)

    def _end_locked(self, code: grpc.StatusCode, details: str) -> None:
        if not self.state.over:
            reset = self.state.fail(code, details)
            if self._connected:  # else the server has not heard of the call: nothing to tell
                self._out += self._tls.wrap(reset) if self._tls is not None else reset
                self._send_some()

    def _wait(self, until: float, *, reading: bool, writing: bool = False) -> int:
        """Wait until the socket is readable (``reading``), writable (``writing``, or while output waits for
        room) or ``until`` passes: the events (0: none in time). Output that fits is written meanwhile."""
        sock = self._sock
        if sock is None:
            return select.POLLHUP
        while True:
            flags = (select.POLLIN if reading else 0) | (select.POLLOUT if writing or self._out else 0)
            self._poll.register(sock, flags)  # registered again: the mask is replaced
            left = until - self._clock()
            ready = self._poll.poll(max(0, math.ceil(left * 1000)))
            events = ready[0][1] if ready else 0
            if events & select.POLLOUT and self._out and not writing:
                with self._lock:
                    self._send_some()
                if not events & _READABLE and self._clock() < until:
                    continue  # only room to write came: wait on
            return events

    def _recv(self) -> bytes | None:
        """What the socket has: bytes, ``b""`` at its end (or when it failed), None when nothing after all."""
        sock = self._sock
        if sock is None:
            return b""
        try:
            return sock.recv(RECEIVE_BYTES)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            return b""

    def _read(self) -> Segments:
        """One read of the socket, handed to the call; the responses it completes."""
        raw = self._recv()
        if raw is None:
            return []
        with self._lock:
            if not raw:
                reason = "cancelled by the client" if self._cancelled else f"connection to {self.address} lost"
                self.state.connection_lost(reason)
                return []
            plain = raw
            if self._tls is not None:
                try:
                    plain = self._tls.unwrap(raw)
                except ssl.SSLError as exc:
                    self.state.connection_lost(f"TLS error on the connection to {self.address}: {exc}")
                    return []
            segments = self.state.receive_spans(plain) if plain else []
            self._flush()
            return segments

    def _flush(self) -> None:
        """Write what the call has to say now (under the lock)."""
        out = self.state.outgoing()
        if self._tls is not None:
            out = self._tls.wrap(out)
        if out:
            self._out += out
        if self._out:
            self._send_some()

    def _send_some(self) -> None:
        """Write what the socket takes now, without waiting (under the lock); the rest waits in ``_out``."""
        sock = self._sock
        if sock is None or not self._out:
            return
        try:
            sent = sock.send(self._out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._out.clear()
            self.state.connection_lost(f"connection to {self.address} lost: {exc}")
            return
        del self._out[:sent]
