"""Subscribe on the data plane (:mod:`~liftbridge_provider.client.h2`): one call per SubscribeRequest, its
handshake, its responses, for the synchronous and the asyncio client.

The server's first response is an empty ``Message``: the handshake that confirms the subscription (an error
before it is a refusal of the request, one after it ends the subscription; LIFTBRIDGE.md, section 4). It is
read and dropped here; whether a call confirmed is what ``reading.SubscriptionState`` needs to know. A call's
end reads as grpc's errors read (:class:`~liftbridge_provider.client.h2.grpc_status.CallFailed`, ``code()``
and ``details()`` from the trailers, a reset, a GOAWAY, the keepalive or a lost connection), so the state's
decisions are the ones it made on grpc's calls.

- :func:`open_subscribe` / :class:`SubscribeCall`: the sync client's call on
  :class:`~liftbridge_provider.client.h2.blocking.BlockingCall`; responses are read on the caller's thread, a
  read at a time, as spans of the bytes read (no copy per message: the column builder decodes them in place).
- :class:`AsyncSubscribeCall`: the asyncio client's call on
  :class:`~liftbridge_provider.client.h2.aio_transport.DirectStream`; its responses wait in a queue of at most
  :data:`MAX_BUFFERED` bytes (reading pauses above it, so the server's flow-control window bounds the rest).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections import deque
from collections.abc import AsyncGenerator, Coroutine, Iterator
from typing import Any

import grpc

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client.aio_timeout import within
from liftbridge_provider.client.connections import ConnectionPool
from liftbridge_provider.client.h2.aio_transport import DirectStream, NotConnected, open_call
from liftbridge_provider.client.h2.blocking import CONNECT_WAIT, DEADLINE_DETAILS, BlockingCall
from liftbridge_provider.client.h2.grpc_status import CallFailed, as_grpc_ends_it
from liftbridge_provider.client.h2.inbound import Segments

SUBSCRIBE = "/proto.API/Subscribe"
MAX_BUFFERED = 4 << 20  # bytes of responses an asyncio subscription holds before it stops reading (4 MiB)


@contextlib.contextmanager
def open_subscribe(
    pool: ConnectionPool, address: str, request: api.SubscribeRequest, *, timeout: float
) -> Iterator[BlockingCall]:
    """A Subscribe call to ``address`` that lives at most ``timeout`` seconds, made known to the caller (who may
    cancel it from another thread) before it connects; connected within :data:`CONNECT_WAIT` seconds (a frozen
    broker: ``NotConnected``, DEADLINE_EXCEEDED) and its request sent when the ``with`` block starts; closed on
    leaving it (RST_STREAM and the socket closed, whatever happened)."""
    with pool.blocking_call(address, SUBSCRIBE, timeout=timeout) as call:
        yield call


class SubscribeCall:
    """The responses of a connected Subscribe :class:`BlockingCall` (see the module docstring)."""

    def __init__(self, call: BlockingCall, request: api.SubscribeRequest) -> None:
        self.call = call
        self._first: Segments = []
        call.send([request.SerializeToString()])  # written as soon as the server's settings come
        call.close_sending()
        call.connect(CONNECT_WAIT)

    def confirm(self) -> bool:
        """Read the handshake: True once it came (the responses after it in the same read are kept for
        :meth:`reads`), False when the server ended the call with status OK before it; raises the call's error
        (``CallFailed``) when it ended otherwise (a refusal, the deadline, a lost connection)."""
        call = self.call
        while True:
            segments = call.receive()
            if segments:
                buffer, spans = segments[0]
                if len(spans) > 2:  # the handshake is the first message, empty: the rest is kept
                    segments[0] = (buffer, spans[2:])
                else:
                    del segments[0]
                self._first = segments
                return True
            error = call.error()
            if error is not None:
                raise error
            if call.over:
                return False

    def reads(self) -> Iterator[Segments]:
        """The responses after the handshake, a read at a time; ends when the server ends the call with status
        OK, raises its error otherwise (at the deadline: DEADLINE_EXCEEDED)."""
        if self._first:
            first, self._first = self._first, []
            yield first
        call = self.call
        while True:
            segments = call.receive()
            if segments:
                yield segments
                continue
            error = call.error()
            if error is not None:
                raise error
            if call.over:
                return


class AsyncSubscribeCall:
    """A Subscribe call on the asyncio driver; use :meth:`open`, then iterate :meth:`messages`, then
    :meth:`close` (on every exit path)."""

    def __init__(self, timeout: float) -> None:
        self._deadline = time.monotonic() + timeout
        self._timeout = timeout
        self._responses: deque[bytes] = deque()
        self._buffered = 0
        self._arrived = asyncio.Event()
        self._closed = False
        self.stream: DirectStream | None = None

    async def open(
        self,
        address: str,
        request: api.SubscribeRequest,
        *,
        tls: ssl.SSLContext | None,
        server_name: str | None,
        max_response_bytes: int,
    ) -> None:
        """Connect within :data:`CONNECT_WAIT` seconds (and the call's deadline) and send the request; a frozen
        broker fails as ``NotConnected`` with DEADLINE_EXCEEDED, a refusing one with UNAVAILABLE."""
        within_seconds = max(min(CONNECT_WAIT, self._deadline - time.monotonic()), 0.001)
        opening = open_call(
            address,
            path=SUBSCRIBE,
            on_input=self._on_input,
            tls=tls,
            server_name=server_name,
            max_response_bytes=max_response_bytes,
            timeout=self._timeout,
        )
        try:
            self.stream = await within(within_seconds, opening)
        except TimeoutError:
            reason = f"no HTTP/2 settings from the broker within {within_seconds:g}s"
            raise NotConnected(address, reason, refused=False, silent=True) from None
        if self._closed:  # closed (the client was) while it connected
            self.stream.close()
            raise CallFailed(grpc.StatusCode.CANCELLED, "cancelled by the client")
        self.stream.send([request.SerializeToString()])
        self.stream.close_sending()

    def _on_input(self, responses: list[bytes]) -> None:
        if not responses:
            return
        self._responses.extend(responses)
        self._buffered += sum(map(len, responses)) + 5 * len(responses)
        self._arrived.set()
        if self._buffered > MAX_BUFFERED and self.stream is not None:
            self.stream.pause_reading()

    async def messages(self) -> AsyncGenerator[bytes, None]:
        """The call's responses, the handshake included, until the server ends the call (status OK), else its
        error; DEADLINE_EXCEEDED at the call's deadline."""
        stream = self.stream
        assert stream is not None, "open() first"
        while True:
            while self._responses:
                response = self._responses.popleft()
                self._buffered -= len(response) + 5
                if stream.reading_paused and self._buffered <= MAX_BUFFERED // 2:
                    stream.resume_reading()
                yield response
            if stream.ended.done():
                error = as_grpc_ends_it(stream.state.ended)
                if error is not None:
                    raise error
                return
            self._arrived.clear()
            left = self._deadline - time.monotonic()
            if left <= 0:
                stream.abort(grpc.StatusCode.DEADLINE_EXCEEDED, DEADLINE_DETAILS)
                raise CallFailed(grpc.StatusCode.DEADLINE_EXCEEDED, DEADLINE_DETAILS)
            with contextlib.suppress(TimeoutError):
                await within(left, _first_of(self._arrived.wait(), stream.ended))

    def close(self) -> None:
        """Cancel the call if it runs (RST_STREAM) and close its connection; a call still connecting is closed
        as soon as it connects."""
        self._closed = True
        if self.stream is not None:
            self.stream.close()


async def _first_of(arrived: Coroutine[Any, Any, Any], ended: asyncio.Future[None]) -> None:
    """Wait until responses arrive (the coroutine ``arrived``) or the call ends."""
    waiter: asyncio.Future[Any] = asyncio.ensure_future(arrived)
    waiting: set[asyncio.Future[Any]] = {waiter, ended}
    try:
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
