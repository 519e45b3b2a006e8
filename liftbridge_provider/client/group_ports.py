"""What a consumer group member needs of its client: the sync and the asyncio side.

:class:`~liftbridge_provider.client.consumer.Consumer` and
:class:`~liftbridge_provider.client.aio_consumer.AsyncConsumer` are made by
their client (``LiftbridgeClient.consumer`` and its asyncio twin) and call back
into it for group RPCs, cursor reads and moves, and subscriptions. They name
the client by these protocols rather than by its class, so a member's module
does not import the client that imports it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Any, Protocol

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client.cursor_advance import CursorMove
from liftbridge_provider.client.messages import Message, StopPosition
from liftbridge_provider.client.metadata import Metadata, StreamInfo
from liftbridge_provider.client.options import ClientConfig
from liftbridge_provider.client.subscription import Subscription


class GroupClient(Protocol):
    """The parts of ``LiftbridgeClient`` a :class:`Consumer` uses."""

    config: ClientConfig

    def stream_info(self, stream: str) -> StreamInfo: ...

    def fetch_cursor(self, cursor_id: str, stream: str, partition: int) -> int: ...

    def advance_cursor(
        self, cursor_id: str, stream: str, partition: int, offset: int, *, expected: int | None = None
    ) -> CursorMove: ...

    def _group_call(self, method: str, request: Any, *, broker: str | None = None, timeout: float | None = None) -> Any:
        """A consumer group RPC on any broker, or on ``broker`` (the coordinator)."""
        ...

    def _unary(self, method: str, request: Any, *, timeout: float | None, stream: str | None) -> Any:
        """A unary RPC on any broker."""
        ...

    def _subscription(self, request: api.SubscribeRequest, stop: StopPosition | None) -> Subscription:
        """A subscription for a checked Subscribe request."""
        ...


class AsyncGroupClient(Protocol):
    """The parts of ``AsyncLiftbridgeClient`` an :class:`AsyncConsumer` uses."""

    config: ClientConfig

    async def fetch_metadata(self, streams: Iterable[str] = ()) -> Metadata: ...

    async def fetch_cursor(self, cursor_id: str, stream: str, partition: int) -> int: ...

    async def advance_cursor(
        self, cursor_id: str, stream: str, partition: int, offset: int, *, expected: int | None = None
    ) -> CursorMove: ...

    async def _group_call(
        self, method: str, request: Any, *, broker: str | None = None, timeout: float | None = None
    ) -> Any:
        """A consumer group RPC on any broker, or on ``broker`` (the coordinator)."""
        ...

    def _subscription(self, request: api.SubscribeRequest) -> AsyncIterator[Message]:
        """The messages of a checked Subscribe request."""
        ...
