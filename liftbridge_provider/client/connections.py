"""A pool of gRPC channels per broker address, and the data plane's calls of the client.

Each broker gets up to ``max_conns_per_broker`` channels (each its own TCP
connection) for the unary control calls. A lease picks the least busy channel,
opening another only when every open one is in use and the limit allows.
Channels unused for ``keep_alive_time`` seconds are closed by a background
janitor. The streaming calls (:mod:`~liftbridge_provider.client.h2`) each have a
connection of their own, made here with the client's TLS settings and known to
the pool while they run. ``close()`` closes every channel, ends every such call
(a reader waiting on one returns at once) and is idempotent. The janitor also
runs the idle checks others hand it (the shared publish streams close theirs).
"""

from __future__ import annotations

import contextlib
import logging
import math
import ssl
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio

from liftbridge_provider._proto import liftbridge_api_pb2_grpc as api_grpc
from liftbridge_provider.client.aio_timeout import within
from liftbridge_provider.client.errors import ClientClosedError
from liftbridge_provider.client.h2.aio_transport import DirectStream, NotConnected, OnInput, open_call
from liftbridge_provider.client.h2.blocking import BlockingCall
from liftbridge_provider.client.h2.grpc_status import CallFailed
from liftbridge_provider.client.health import HEALTH
from liftbridge_provider.client.not_sent import Connection
from liftbridge_provider.client.options import ClientConfig

log = logging.getLogger(__name__)


@dataclass
class PooledChannel:
    """One channel, its stub, how many calls use it, when it was last released and when a call on it last got
    its broker's answer."""

    address: str
    channel: grpc.Channel
    stub: Any  # api_grpc.APIStub (the generated stub module is untyped)
    in_use: int = 0
    last_used: float = field(default_factory=time.monotonic)
    answered_at: float = -math.inf  # time.monotonic() of the last answer a call on it got, -inf: none or doubted

    def ready(self) -> bool:
        """Whether the channel is known to reach its broker: a call on it got the broker's answer less than
        :data:`PROOF_FRESH` seconds ago and none failed on the connection since (:meth:`answered`,
        :meth:`doubted`). Read from the calls' own outcomes, not from grpc: grpc's sync API has no public way
        to read a channel's state but ``Channel.subscribe``, which keeps a thread inside grpc for the channel's
        life, and a process that forks while one is there skips grpc's fork handlers, so its child crashes at
        its first call (tests/server/test_event_publisher.py, the forked children of an Airflow process).
        A broker that went away since the proof is still found before anything is sent: grpc fails a call it
        could not connect for with words of its own (:func:`~liftbridge_provider.client.not_sent.never_sent`)."""
        return time.monotonic() - self.answered_at < PROOF_FRESH

    def answered(self) -> None:
        """A call on the channel got its broker's answer (any status the broker itself sent)."""
        self.answered_at = time.monotonic()

    def doubted(self) -> None:
        """A call on the channel failed on its connection: the next call checks the broker first."""
        self.answered_at = -math.inf


PROOF_FRESH = 2.0
"""Seconds an answer on a channel vouches for its connection: a call later than that checks the broker with a
connection of its own first (:meth:`ConnectionPool.connect`), so a client that idled finds a broker that froze
or went away meanwhile within the attempt's connect budget, before it sends."""

PROBE_PATH = "/proto.API/FetchMetadata"
"""The method named by the headers of a connection check (:meth:`ConnectionPool.connect`): no request follows
them, and the stream is reset as soon as the broker's HTTP/2 SETTINGS came."""

_AIO_SETTLED = {
    grpc.ChannelConnectivity.READY: Connection.READY,
    grpc.ChannelConnectivity.TRANSIENT_FAILURE: Connection.REFUSED,
    grpc.ChannelConnectivity.SHUTDOWN: Connection.REFUSED,
}


async def aio_connect(channel: grpc.aio.Channel, timeout: float) -> Connection:
    """Wait at most ``timeout`` s for an asyncio channel to connect; how the wait ended (at once if refused)."""

    async def settled() -> Connection:
        state = channel.get_state(try_to_connect=True)
        while state not in _AIO_SETTLED:
            await channel.wait_for_state_change(state)
            state = channel.get_state(try_to_connect=True)
        return _AIO_SETTLED[state]

    try:
        return await within(max(timeout, 0.001), settled())
    except TimeoutError:
        return Connection.SILENT


class ConnectionPool:
    """Channels per broker address, shared by every thread of one client."""

    def __init__(self, config: ClientConfig) -> None:
        self._config = config
        self._credentials = config.tls.credentials() if config.tls is not None else None
        self._options = config.channel_options()
        self._channels: dict[str, list[PooledChannel]] = {}
        self._direct_open = 0  # connections of running batches (direct_call)
        self._calls: set[BlockingCall] = set()  # the synchronous data plane's running calls (blocking_call)
        self._ssl: ssl.SSLContext | None = None  # their TLS context, made at first use
        self._idle_checks: list[Callable[[], object]] = []  # run by the janitor after closing idle channels
        # Reentrant: a subscription finalised by the garbage collector while this thread holds the
        # lock (say, inside _acquire) releases its lease through the same lock.
        self._lock = threading.RLock()
        self._closed = threading.Event()
        self._janitor = threading.Thread(target=self._close_idle_loop, name="liftbridge-pool-janitor", daemon=True)
        self._janitor.start()

    @property
    def closed(self) -> bool:
        """The client that owns the pool was closed: no call may start, and running ones were ended."""
        return self._closed.is_set()

    @contextlib.contextmanager
    def lease(self, address: str) -> Iterator[PooledChannel]:
        """Use a channel to ``address`` for the duration of the ``with`` block."""
        pooled = self._acquire(address)
        try:
            yield pooled
        finally:
            with self._lock:
                pooled.in_use -= 1
                pooled.last_used = time.monotonic()

    def connect(self, pooled: PooledChannel, timeout: float) -> Connection:
        """Whether ``pooled``'s broker takes connections, found within ``timeout`` seconds: READY at once for a
        channel a recent answer vouches for (:meth:`PooledChannel.ready`); else a connection of the data plane's
        own is made and closed (:class:`BlockingCall`: the dial, TLS, and the broker's HTTP/2 SETTINGS, which
        a frozen broker never sends although its kernel accepts the connection): READY when it came up, REFUSED
        when the broker refused, reset or failed the handshake (a call would fail at once), SILENT when it was
        still coming up at ``timeout``. Nothing of grpc's is read, and nothing is sent on the channel."""
        if pooled.ready():
            return Connection.READY
        within = max(timeout, 0.001)
        started = time.monotonic()
        try:
            with self.blocking_call(pooled.address, PROBE_PATH, timeout=within) as call:
                call.connect(within)
        except NotConnected as exc:
            return Connection.SILENT if exc.silent else Connection.REFUSED
        except (CallFailed, ClientClosedError):  # the client was closed meanwhile
            return Connection.REFUSED
        HEALTH.note_connect_time(pooled.address, time.monotonic() - started)
        return Connection.READY

    def direct_tls(self) -> tuple[ssl.SSLContext | None, str | None]:
        """The TLS context (ALPN ``h2``) and server name of the client's own HTTP/2 connections; (None, None)
        for plaintext. Made at first use."""
        tls = self._config.tls
        if tls is None:
            return None, None
        if self._ssl is None:
            self._ssl = tls.ssl_context(alpn=("h2",))
        return self._ssl, tls.server_name

    @property
    def max_message_bytes(self) -> int:
        return self._config.max_message_bytes

    @contextlib.asynccontextmanager
    async def direct_call(
        self, address: str, path: str, on_input: OnInput, timeout: float
    ) -> AsyncIterator[DirectStream]:
        """A gRPC call of this client's own to ``address`` (batch publishing, on the data plane's asyncio driver),
        on a connection of its own opened within ``timeout`` seconds (else NotConnected) and closed after the
        ``async with``."""
        if self._closed.is_set():
            raise ClientClosedError("the Liftbridge client is closed")
        context, server_name = self.direct_tls()
        opening = open_call(
            address,
            path=path,
            on_input=on_input,
            tls=context,
            server_name=server_name,
            max_response_bytes=self._config.max_message_bytes,
        )
        try:
            stream = await within(max(timeout, 0.001), opening)
        except TimeoutError:
            raise NotConnected(address, f"no connection within {timeout:g}s", refused=False) from None
        with self._lock:
            self._direct_open += 1
        try:
            yield stream
        finally:
            stream.close()
            with self._lock:
                self._direct_open -= 1

    @contextlib.contextmanager
    def blocking_call(self, address: str, path: str, *, timeout: float) -> Iterator[BlockingCall]:
        """A call of the synchronous data plane to ``address`` (:class:`BlockingCall`: not connected yet, its
        deadline ``timeout`` seconds from now), with the client's TLS settings and limits; closed after the
        ``with`` block, and cancelled by :meth:`close` while it runs (ClientClosedError when the pool is closed).
        The caller may cancel it from another thread as soon as it has it, also while it connects."""
        call = self.open_call(address, path, timeout=timeout)
        try:
            yield call
        finally:
            self.release_call(call)

    def open_call(self, address: str, path: str, *, timeout: float | None, lazy_acks: bool = False) -> BlockingCall:
        """:meth:`blocking_call` for an owner that keeps the call beyond one block (a shared publish stream;
        ``timeout=None``: no deadline of its own; ``lazy_acks``: see :class:`BlockingCall`): it must
        :meth:`release_call` it on every exit."""
        context, server_name = self.direct_tls()
        call = BlockingCall(
            address,
            path=path,
            tls=context,
            server_name=server_name,
            max_response_bytes=self._config.max_message_bytes,
            timeout=timeout,
            lazy_acks=lazy_acks,
        )
        with self._lock:
            if self._closed.is_set():
                call.close()
                raise ClientClosedError("the Liftbridge client is closed")
            self._calls.add(call)
        return call

    def release_call(self, call: BlockingCall) -> None:
        """Close a call :meth:`open_call` made (RST_STREAM if it still runs, the socket closed) and forget it."""
        call.close()
        with self._lock:
            self._calls.discard(call)

    def on_idle_check(self, check: Callable[[], object]) -> None:
        """Have the janitor run ``check`` on each of its rounds (every ``min(keep_alive_time / 2, 5)`` seconds)."""
        with self._lock:
            self._idle_checks.append(check)

    def open_channels(self) -> int:
        """How many channels and data-plane connections are open now (all brokers)."""
        with self._lock:
            channels = sum(len(channels) for channels in self._channels.values())
            return channels + self._direct_open + len(self._calls)

    def close(self) -> None:
        """Close every channel; later leases raise ClientClosedError. Safe to call twice."""
        self._closed.set()
        with self._lock:
            channels = [c for group in self._channels.values() for c in group]
            self._channels.clear()
            calls = list(self._calls)
        for call in calls:
            call.cancel("the Liftbridge client was closed")  # its owner closes it and leaves the set
        for pooled in channels:
            pooled.channel.close()
        if self._janitor is not threading.current_thread():
            self._janitor.join(timeout=5)

    def _acquire(self, address: str) -> PooledChannel:
        with self._lock:
            if self._closed.is_set():
                raise ClientClosedError("the Liftbridge client is closed")
            group = self._channels.setdefault(address, [])
            least_busy = min(group, key=lambda c: c.in_use, default=None)
            if least_busy is None or (least_busy.in_use > 0 and len(group) < self._config.max_conns_per_broker):
                least_busy = self._open(address)
                group.append(least_busy)
            least_busy.in_use += 1
            return least_busy

    def _open(self, address: str) -> PooledChannel:
        if self._credentials is not None:
            channel = grpc.secure_channel(address, self._credentials, options=self._options)
        else:
            channel = grpc.insecure_channel(address, options=self._options)
        pooled = PooledChannel(address, channel, api_grpc.APIStub(channel))
        log.debug("opened channel to %s", address)
        return pooled

    def _close_idle_loop(self) -> None:
        interval = min(self._config.keep_alive_time / 2, 5.0)
        while not self._closed.wait(interval):
            self.close_idle()
            with self._lock:
                checks = list(self._idle_checks)
            for check in checks:
                try:
                    check()
                except Exception:  # logged: the janitor goes on with its other duties
                    log.exception("an idle check failed; the janitor goes on")

    def close_idle(self) -> int:
        """Close channels unused for keep_alive_time seconds; return how many were closed."""
        cutoff = time.monotonic() - self._config.keep_alive_time
        idle: list[PooledChannel] = []
        with self._lock:
            for address, group in list(self._channels.items()):
                keep = [c for c in group if c.in_use > 0 or c.last_used > cutoff]
                idle.extend(c for c in group if c not in keep)
                if keep:
                    self._channels[address] = keep
                else:
                    del self._channels[address]
        for pooled in idle:
            log.debug("closing idle channel to %s", pooled.address)
            pooled.channel.close()
        return len(idle)
