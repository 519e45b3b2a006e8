"""A pool of gRPC channels per broker address, and the data plane's calls of the client.

Each broker gets up to ``max_conns_per_broker`` channels (each its own TCP
connection) for the unary control calls. A lease picks the least busy channel,
opening another only when every open one is in use and the limit allows.
Channels unused for ``keep_alive_time`` seconds are closed by a background
janitor. The streaming calls (:mod:`~liftbridge_provider.client.h2`) each have a
connection of their own, made here with the client's TLS settings and known to
the pool while they run. ``close()`` closes every channel, ends every such call
(a reader waiting on one returns at once) and is idempotent.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
import grpc.experimental

from liftbridge_provider._proto import liftbridge_api_pb2_grpc as api_grpc
from liftbridge_provider.client.aio_timeout import within
from liftbridge_provider.client.channel_state import SETTLED, ChannelState, close_in_background, close_quietly
from liftbridge_provider.client.errors import ClientClosedError
from liftbridge_provider.client.h2.aio_transport import DirectStream, NotConnected, OnInput, open_call
from liftbridge_provider.client.h2.blocking import BlockingCall
from liftbridge_provider.client.health import HEALTH
from liftbridge_provider.client.options import ClientConfig
from liftbridge_provider.client.plans import Connection

log = logging.getLogger(__name__)


@dataclass
class PooledChannel:
    """One channel, its stub, how many calls use it and when it was last released."""

    address: str
    channel: grpc.Channel
    stub: Any  # api_grpc.APIStub (the generated stub module is untyped)
    in_use: int = 0
    last_used: float = field(default_factory=time.monotonic)
    # Each "no" of ready(): with the breaks grpc reported (see `breaks`).
    _not_ready_seen: int = 0
    # What grpc reports of the channel's connectivity, watched from the first ready() or connect() on: a channel
    # only used by calls that wait for nothing never starts grpc's watching thread (client/channel_state.py).
    _watch: ChannelState | None = field(default=None, init=False, repr=False, compare=False)
    _closed: bool = field(default=False, init=False, repr=False, compare=False)
    _watch_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    @property
    def _state(self) -> ChannelState:
        watch = self._watch
        if watch is None:
            with self._watch_lock:
                if self._watch is None:  # a closed channel is not watched: grpc's thread would fail on it
                    self._watch = ChannelState(self.channel, watch=not self._closed)
                watch = self._watch
        return watch

    @property
    def breaks(self) -> int:
        """Grows each time the channel is seen not connected (by :meth:`ready`, or a connection that grpc
        reported broken): a call opened at another value may have been on a connection that broke since, even
        if the channel is connected again (to a broker restarted meanwhile)."""
        watch = self._watch
        return self._not_ready_seen + (watch.breaks if watch is not None else 0)

    def ready(self) -> bool:
        """Whether the channel is connected right now: the latest state grpc reported, which follows every
        change (a broker that died since the last call shows as soon as gRPC reads the connection's reset);
        a no counts in :attr:`breaks`."""
        ready = self._state.ready
        if not ready:
            self._not_ready_seen += 1
        return ready

    def connect(self, timeout: float) -> Connection:
        """Wait at most ``timeout`` s for the channel to connect; how the wait ended.

        Nothing is remembered from an earlier connection: the state is the
        one grpc reports now (the broker may have died since). The wait ends
        at once when the broker refuses (the channel reports a transient
        failure) or the channel is closed meanwhile, and with SILENT at
        ``timeout`` while it is still connecting (a frozen broker). A channel
        that lost its connection reconnects by itself (round_robin), so no
        wait has to ask it to.
        """
        if self.ready():
            return Connection.READY
        started = time.monotonic()
        connection = self._state.wait_settled(max(timeout, 0.001))
        if connection is Connection.READY:
            HEALTH.note_connect_time(self.address, time.monotonic() - started)
        return connection

    def _closing(self) -> ChannelState | None:
        """Mark the channel closed; its watch, or None when it was never watched."""
        with self._watch_lock:
            self._closed = True
            return self._watch


def close_unused(channels: list[PooledChannel]) -> None:
    """Close channels no lease uses: waits end now; a watched channel closes a moment later, when grpc's thread
    behind the watch has ended (it would fail on a channel closed under it), the others at once."""
    watched = []
    for pooled in channels:
        watch = pooled._closing()
        if watch is None:
            pooled.channel.close()
        else:
            watched.append(watch)
    close_quietly(watched)


def close_busy(channels: list[PooledChannel]) -> None:
    """Close channels that calls may be using, at once: their calls end CANCELLED. A watched channel is closed on
    a thread of its own (closing it waits for grpc's watching thread, up to 0.2 s), and may, rarely, leave
    grpc's "Channel closed!" traceback (client/channel_state.py)."""
    watched = []
    for pooled in channels:
        watch = pooled._closing()
        if watch is None:
            pooled.channel.close()
        else:
            watched.append(watch)
    close_in_background(watched)


async def aio_connect(channel: grpc.aio.Channel, timeout: float) -> Connection:
    """Wait at most ``timeout`` s for an asyncio channel to connect; how the wait ended (at once if refused)."""

    async def settled() -> Connection:
        state = channel.get_state(try_to_connect=True)
        while state not in SETTLED:
            await channel.wait_for_state_change(state)
            state = channel.get_state(try_to_connect=True)
        return SETTLED[state]

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
        context, server_name = self.direct_tls()
        call = BlockingCall(
            address,
            path=path,
            tls=context,
            server_name=server_name,
            max_response_bytes=self._config.max_message_bytes,
            timeout=timeout,
        )
        with self._lock:
            if self._closed.is_set():
                raise ClientClosedError("the Liftbridge client is closed")
            self._calls.add(call)
        try:
            yield call
        finally:
            call.close()
            with self._lock:
                self._calls.discard(call)

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
        busy: list[PooledChannel] = []
        unused: list[PooledChannel] = []
        for pooled in channels:  # decided once per channel: leases may end meanwhile
            (busy if pooled.in_use > 0 else unused).append(pooled)
        close_unused(unused)
        close_busy(busy)
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
        close_unused(idle)
        return len(idle)
