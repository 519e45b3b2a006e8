"""The asyncio driver of the data plane: a connection that carries one
:class:`~liftbridge_provider.client.h2.call_state.CallState`.

:func:`open_call` dials a broker (TCP, or TLS with ALPN ``h2``), and the
returned :class:`DirectStream` writes what the call state says and feeds it
what is read. Each read hands the responses it completed to ``on_input`` in
one call (also with none, when only flow-control credit or a setting came, so
the owner can queue more); the owner queues requests with :meth:`send`.
A timer keeps the call's keepalive rule (:meth:`CallState.keepalive`: PINGs to
a silent server, the call ended when one goes unanswered), so a frozen
broker ends the call within ``KEEPALIVE_IDLE + KEEPALIVE_TIMEOUT`` seconds of
its last frame whatever the owner does, unless the owner paused reading
(:meth:`DirectStream.pause_reading`: its consumer is behind; the keepalive
waits too, and counts the silence from the resume). Everything runs on the
event loop's thread. ``publish_batch`` and the asyncio client's subscriptions
use it; :mod:`blocking` is the same call on the calling thread.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable, Sequence
from typing import cast

import grpc

from liftbridge_provider.client.h2.call_state import CallState
from liftbridge_provider.client.h2.grpc_status import CallFailed
from liftbridge_provider.client.options import parse_broker

OnInput = Callable[[list[bytes]], None]
"""Receives the responses one read completed (possibly none)."""


class NotConnected(grpc.RpcError):
    """The broker could not be reached, so nothing was sent to it; ``refused`` when it said so at once.

    ``silent``: it accepted nothing or answered nothing within the bound (a frozen broker's kernel accepts the
    connection): the code is DEADLINE_EXCEEDED, as grpc's for a call that never connected; otherwise
    UNAVAILABLE, as grpc's for a broker that refused or reset the connection.
    """

    def __init__(self, address: str, reason: str, *, refused: bool, silent: bool = False) -> None:
        super().__init__(f"could not connect to {address}: {reason}")
        self.address = address
        self.reason = reason
        self.refused = refused
        self.silent = silent

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.DEADLINE_EXCEEDED if self.silent else grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return f"could not connect to {self.address}: {self.reason}"


class DirectStream(asyncio.Protocol):
    """The connection of one call. ``ended`` resolves when the call ends: None for status OK, else CallFailed."""

    def __init__(self, state: CallState, on_input: OnInput, address: str) -> None:
        self.state = state
        self._on_input = on_input
        self._address = address
        self._transport: asyncio.Transport | None = None
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()  # the server's SETTINGS came
        self.paused = False  # the transport's write buffer is full: queue nothing more until it drains
        self.reading_paused = False  # the owner's consumer is behind: nothing is read (nor kept alive) meanwhile
        self._keepalive_timer: asyncio.TimerHandle | None = None

    # -- the owner's side ------------------------------------------------------------------------------------

    def send(self, messages: Sequence[bytes]) -> None:
        """Queue serialized requests and write what the peer's windows allow now."""
        self.state.queue(messages)
        self._flush()

    def close_sending(self) -> None:
        """Half-close once every queued request is written."""
        self.state.close_sending()
        self._flush()

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        """End the call from this side (``code``, ``details``), e.g. for a response that does not parse."""
        if self.state.ended is None:
            self._write(self.state.fail(code, details))
        self._check_end()

    def pause_reading(self) -> None:
        """Read nothing more until :meth:`resume_reading` (the server's flow-control window then bounds what
        it sends); the keepalive waits meanwhile: the server is not silent, we are not listening."""
        if not self.reading_paused and self._transport is not None and not self._transport.is_closing():
            self.reading_paused = True
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        """Read again after :meth:`pause_reading`; the keepalive counts the server's silence from now."""
        if self.reading_paused:
            self.reading_paused = False
            self.state.resumed()
            if self._transport is not None and not self._transport.is_closing():
                self._transport.resume_reading()

    def close(self) -> None:
        """Cancel the call if it is still open, and close the connection."""
        if self.state.ended is None:
            self._write(self.state.fail(grpc.StatusCode.CANCELLED, "cancelled by the client"))
        self._check_end()
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()
        self._stop_keepalive()

    # -- asyncio's side --------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports are not its subclasses
        raw = transport.get_extra_info("socket")
        if raw is not None and raw.family in (socket.AF_INET, socket.AF_INET6):
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._flush()
        self._keepalive()

    def data_received(self, data: bytes) -> None:
        responses = self.state.receive(data)
        if self.state.peer_ready and not self.ready.done():
            self.ready.set_result(None)
        if not self.ended.done():
            self._on_input(responses)
        self._flush()
        self._check_end()

    def connection_lost(self, exc: Exception | None) -> None:
        reason = f"connection to {self._address} lost" + (f": {exc}" if exc is not None else "")
        self.state.connection_lost(reason)
        self._check_end()
        self._stop_keepalive()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if not self.ended.done():
            self._on_input([])

    # -- inside ----------------------------------------------------------------------------------------------

    def _keepalive(self) -> None:
        """Keep the call's keepalive rule now, write its PING if it sent one, and look again when it says."""
        self._keepalive_timer = None
        if self.reading_paused:  # nothing is read now: silence says nothing of the server
            self._keepalive_timer = asyncio.get_running_loop().call_later(1.0, self._keepalive)
            return
        delay = self.state.keepalive()
        self._flush()
        self._check_end()
        if delay is not None and not self.ended.done():
            self._keepalive_timer = asyncio.get_running_loop().call_later(delay, self._keepalive)

    def _stop_keepalive(self) -> None:
        if self._keepalive_timer is not None:
            self._keepalive_timer.cancel()
            self._keepalive_timer = None

    def _flush(self) -> None:
        out = self.state.outgoing()
        if out:
            self._write(out)

    def _write(self, data: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    def _check_end(self) -> None:
        ended = self.state.ended
        if ended is None or self.ended.done():
            return
        self._resolve(None if ended.code is grpc.StatusCode.OK else CallFailed(ended.code, ended.details))
        self._stop_keepalive()
        if self._transport is not None:
            self._transport.close()

    def _resolve(self, error: CallFailed | None) -> None:
        if self.ended.done():
            return
        if error is None:
            self.ended.set_result(None)
        else:
            self.ended.set_exception(error)
            self.ended.exception()  # retrieved here: an owner that stopped listening leaves no warning behind


async def open_call(
    address: str,
    *,
    path: str,
    on_input: OnInput,
    tls: ssl.SSLContext | None,
    server_name: str | None,
    max_response_bytes: int,
    timeout: float | None = None,
) -> DirectStream:
    """Connect to ``address`` (``host:port``) and start the call to ``path``; NotConnected if that fails.

    The stream is returned once the server's HTTP/2 settings came (it is alive and speaks HTTP/2); the
    caller bounds the wait (a silent host accepts nothing and refuses nothing; a frozen one accepts and
    never answers). ``timeout``: seconds the server is told the call may last (``grpc-timeout``), None for
    none; the caller ends the call at its deadline itself.
    """
    host, port = parse_broker(address)
    authority = server_name if tls is not None and server_name else address
    state = CallState(
        authority=authority, path=path, tls=tls is not None, max_response_bytes=max_response_bytes, timeout=timeout
    )
    loop = asyncio.get_running_loop()
    try:
        _, stream = await loop.create_connection(
            lambda: DirectStream(state, on_input, address),
            host,
            port,
            ssl=tls,
            server_hostname=(server_name or host) if tls is not None else None,
        )
    except ConnectionRefusedError as exc:
        raise NotConnected(address, str(exc), refused=True) from None
    except (OSError, ssl.SSLError) as exc:
        raise NotConnected(address, str(exc) or type(exc).__name__, refused=False) from None
    try:  # no request goes out before the server's SETTINGS (h2_call): wait for them, bounded by the caller
        await asyncio.wait({stream.ready, stream.ended}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        stream.close()  # the caller's bound passed (a frozen broker accepts and never answers): nothing was sent
        raise
    if not stream.ready.done():
        stream.close()
        raise NotConnected(address, "the connection ended before the server's HTTP/2 settings", refused=False)
    return stream
