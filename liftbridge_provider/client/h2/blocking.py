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
  (``grpc-timeout``); a read may also return earlier by its own ``until``, the call going on. A call made
  with ``timeout=None`` (the shared publish stream, which lives as long as it is used) has no deadline of
  its own: each of its readers bounds its wait by ``until``, its owner ends it.
- **Keepalive**: every wait is bounded by the call's next keepalive tick (:meth:`CallState.keepalive`), so
  a reader waiting on a broker that froze sees the call end UNAVAILABLE within ``KEEPALIVE_IDLE +
  KEEPALIVE_TIMEOUT`` (20 s) of the broker's last frame; what was read is always taken before the rule is
  applied (an answer to a PING may have waited unread while the consumer was busy).
- **Ended on every exit**: :meth:`cancel` (any thread: RST_STREAM, then the socket shut down, which wakes a
  waiting reader at once) and :meth:`close` (the owner, after its last read: cancel, then the socket closed).
  Nothing outlives the call: no grpc core call, no completion queue, no thread.

- **Nothing written waits for a read**: a writer that leaves bytes the socket did not take wakes a reader
  waiting in ``poll()`` (an eventfd, or a pipe, registered beside the socket), which then waits for room to
  write too and writes the rest as soon as the peer reads; a reader's :meth:`receive` returns (``[]``) once
  what waited to be written has gone out (:attr:`clear`), so a writer waiting for its turn may go on.
  (Before, the rest went out only at the reader's next wake-up: a response, or its keepalive tick, 10 s.)

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
from liftbridge_provider.client.h2.waker import Waker
from liftbridge_provider.client.options import parse_broker

RECEIVE_BYTES = 256 * 1024  # bytes asked of one read of the socket
CONNECT_WAIT = 5.0  # seconds to dial, shake hands and get the server's SETTINGS, by default
_READABLE = select.POLLIN | select.POLLHUP | select.POLLERR
_DRAINED = 1 << 24  # not poll's: _wait wrote out the last of what waited for room in the socket
DEADLINE_DETAILS = "Deadline Exceeded"  # grpc's own words for a call past its deadline


class BlockingCall:
    """One call on a connection of its own (see the module docstring). Make it, :meth:`connect`, then
    :meth:`send` and :meth:`receive`; :meth:`close` on every exit (a ``with`` block does).

    :param address: ``host:port`` to dial.
    :param path: the method's path, e.g. ``/proto.API/Subscribe``.
    :param tls: the client's TLS context (ALPN ``h2``), None for plaintext.
    :param server_name: the name checked against the broker's certificate (default: the host dialled).
    :param max_response_bytes: largest response accepted; a larger one ends the call (RESOURCE_EXHAUSTED).
    :param timeout: seconds the call may last, from now (its deadline); None: no deadline of its own.
    :param clock: seconds on a monotonic clock (default ``time.monotonic``).
    :param lazy_acks: what the connection owes the server after a read that brought responses (h2's PING and
        SETTINGS acknowledgements, window grants) waits for the next write or the next wait, instead of a write
        of its own before the responses are handed over: a request-response stream (the shared publish stream,
        whose broker PINGs on every message it reads) then answers a publish one system call sooner.
    """

    def __init__(
        self,
        address: str,
        *,
        path: str,
        tls: ssl.SSLContext | None,
        server_name: str | None,
        max_response_bytes: int,
        timeout: float | None,
        clock: Callable[[], float] = time.monotonic,
        lazy_acks: bool = False,
    ) -> None:
        host, port = parse_broker(address)
        self.address = address
        self._host, self._port = host, port
        self._clock = clock
        self.deadline = math.inf if timeout is None else clock() + timeout
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
        self._waker = Waker()
        self._poll.register(self._waker.fileno(), select.POLLIN)
        self._out = bytearray()  # bytes for the socket that it did not take yet
        self._early: Segments = []  # responses read while connecting, for the first receive()
        self._keepalive_at = math.inf
        self._read_at = -math.inf  # when the socket was last read
        self._lazy_acks = lazy_acks
        self._owed = False  # a read's answers to the server were left for the next write or wait (lazy_acks)
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

    @property
    def clear(self) -> bool:
        """Every request queued so far has been handed to the socket (none waits for the peer's window or for
        room in the socket)."""
        return not self._out and not self.state.queued_bytes

    def news(self, fresh: float = 0.0) -> bool:
        """Something waits to be read (bytes, the connection's end or an error) or the keepalive rule is due: a
        look without reading (one system call), for a writer deciding whether to read first. A call read less
        than ``fresh`` seconds ago is not looked at (False): what came since is read with the next answer."""
        now = self._clock()
        if self._early or now >= self._keepalive_at:
            return True
        if now - self._read_at < fresh:
            return False
        sock = self._sock
        if sock is None:
            return True
        try:
            sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True
        return True  # a byte, or b"": the peer closed

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
        before :meth:`connect` they go out as soon as the server's settings came). What the socket does not
        take is written by the waiting reader, woken for it, or by the next one."""
        with self._lock:
            self.state.queue(messages)
            if self._connected:
                self._flush_and_wake()

    def withdraw(self, start: int) -> bool:
        """Take back the last request queued, which starts at DATA byte ``start`` (``state.queued_through``
        before it was queued), when none of it has been written: True, and it never will be (any thread)."""
        with self._lock:
            return self.state.withdraw(start)

    def close_sending(self) -> None:
        """Half-close the call once every queued request is written (any thread)."""
        with self._lock:
            self.state.close_sending()
            if self._connected:
                self._flush_and_wake()

    def receive(self, until: float | None = None) -> Segments:
        """The responses of the next read that brings any, waiting at most until ``until`` (monotonic seconds,
        default the call's deadline; one that has passed takes only what is there now); ``[]`` when the call
        is over (:attr:`over`, :meth:`error`), ``until`` passed first, or what waited to be written went out
        meanwhile (:attr:`clear`). At the deadline the call ends DEADLINE_EXCEEDED. One waiting caller at a
        time."""
        with self._reading:
            if self._early:
                early, self._early = self._early, []
                return early
            first = True
            while not self.state.over:
                now = self._clock()
                if now >= self.deadline:
                    self._end_here(grpc.StatusCode.DEADLINE_EXCEEDED, DEADLINE_DETAILS)
                    break
                if until is not None and now >= until and not first:
                    break
                first = False
                limit = min(self.deadline, self._keepalive_at, math.inf if until is None else until)
                if self._owed and limit > now:
                    with self._lock:  # about to wait: what a read left for later goes out first
                        self._flush()
                events = self._wait(limit, reading=True, drained=True)
                if events & _READABLE:
                    blocked = not self.clear
                    segments = self._read()
                    if segments:
                        return segments
                    if blocked and self.clear:
                        break  # the peer's window opened and what waited went out: a writer may go on
                elif not events and self._clock() >= self._keepalive_at:
                    with self._lock:  # nothing came: the keepalive rule, on what was read
                        delay = self.state.keepalive()
                        self._keepalive_at = math.inf if delay is None else self._clock() + delay
                        self._flush()
                if events & _DRAINED:
                    break  # what waited for room in the socket went out: a writer waiting for that may go on
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

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        """End the call with ``code`` from this side (any thread): RST_STREAM is written; the socket stays for
        the owner's :meth:`close`. Does nothing to a call that has ended."""
        self._end_here(code, details)

    def close(self) -> None:
        """Cancel the call if it is still open and close its socket (the owner, after its last read)."""
        self.cancel()
        with self._lock:
            sock, self._sock = self._sock, None
            self._waker.close()  # under the lock: a writer's wake-up never reaches a closed (or reused) descriptor
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

    def _wait(self, until: float, *, reading: bool, writing: bool = False, drained: bool = False) -> int:
        """Wait until the socket is readable (``reading``), writable (``writing``), output that waited for room
        has all gone out (``drained``: the events then carry ``_DRAINED``), or ``until`` passes: the socket's
        events (0: none in time). Output that fits is written meanwhile; a writer's wake-up makes the wait ask
        for room too."""
        sock = self._sock
        if sock is None:
            return select.POLLHUP
        waker = self._waker.fileno()
        while True:
            if sock.fileno() < 0:  # closed meanwhile (by cancel's owner)
                return select.POLLHUP
            flags = (select.POLLIN if reading else 0) | (select.POLLOUT if writing or self._out else 0)
            self._poll.register(sock, flags)  # registered again: the mask is replaced
            left = until - self._clock()
            ready = self._poll.poll(-1 if left == math.inf else max(0, math.ceil(left * 1000)))
            events = 0
            for fd, happened in ready:
                if fd == waker:
                    self._waker.drain()
                else:
                    events = happened
            if events & select.POLLOUT and self._out and not writing:
                with self._lock:
                    self._send_some()
                if drained and not self._out:
                    return events | _DRAINED  # what waited went out: the reader says so
            if events & _READABLE or (writing and events & select.POLLOUT) or self._clock() >= until:
                return events
            # room to write, or a writer's wake-up: wait on (for room too when output waits now)

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
        self._read_at = self._clock()
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
            if segments and self._lazy_acks:
                self._owed = True
            else:
                self._flush()
            return segments

    def _flush_and_wake(self) -> None:
        """:meth:`_flush` for a writer (under the lock): when output now waits for room in the socket, a reader
        waiting for input only is woken, so that it waits for room too."""
        was_waiting = bool(self._out)
        self._flush()
        if self._out and not was_waiting:
            self._waker.wake()

    def _flush(self) -> None:
        """Write what the call has to say now (under the lock)."""
        self._owed = False
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
