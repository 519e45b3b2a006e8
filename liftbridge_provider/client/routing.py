"""The drivers of call plans: they carry out what :mod:`~liftbridge_provider.client.plans` decides.

:class:`Router` (synchronous) leases channels from the pool for attempts,
sleeps, refreshes the metadata cache and hands a dispatch the brokers it
knows; :class:`AsyncRouter` does the same on ``grpc.aio`` channels for the
asyncio client. Each action is bounded by
the time the plan gives it. Both step a plan through :class:`PlanRun`, so
they agree on what goes back into it; neither makes a decision of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Iterable, Iterator
from typing import Any, Generic, Protocol, TypeVar

import grpc
import grpc.aio

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider._proto import liftbridge_api_pb2_grpc as api_grpc
from liftbridge_provider.client import partition_plans, plans, watermarks
from liftbridge_provider.client.addresses import KnownAddresses, broker_addresses
from liftbridge_provider.client.connections import ConnectionPool, aio_connect
from liftbridge_provider.client.errors import ClientClosedError
from liftbridge_provider.client.health import HEALTH
from liftbridge_provider.client.metadata import EMPTY, Metadata, MetadataCache, PartitionInfo, metadata_from_response
from liftbridge_provider.client.not_sent import CONNECTION_FAILURES, never_sent
from liftbridge_provider.client.options import ClientConfig
from liftbridge_provider.client.retry import Deadline
from liftbridge_provider.core.errors import LiftbridgeError

T = TypeVar("T")

PLAN_FAILURES = (grpc.RpcError, LiftbridgeError)
"""What a driver throws back into the plan: a failed attempt or refresh. Anything else ends the call as it is."""


class PlanRun(Generic[T]):
    """One plan being carried out: :meth:`next_action` sends the last outcome in (or throws the last
    failure) and returns the next action, or None once the plan returned (its value: :attr:`result`)."""

    def __init__(self, plan: plans.AnyPlan[T]) -> None:
        self._plan = plan
        self._outcome: Any = None
        self._failure: BaseException | None = None
        self.result: T

    def next_action(self) -> plans.DriverAction | None:
        outcome, failure = self._outcome, self._failure
        self._outcome, self._failure = None, None
        try:
            return self._plan.throw(failure) if failure is not None else self._plan.send(outcome)
        except StopIteration as done:
            self.result = done.value
            return None

    def answered(self, outcome: Any) -> None:
        """The last action's outcome, sent in by the next :meth:`next_action`."""
        self._outcome = outcome

    def failed(self, failure: BaseException) -> None:
        """The last action's failure (one of :data:`PLAN_FAILURES`), thrown in by the next :meth:`next_action`."""
        self._failure = failure


def call_deadline(config: ClientConfig, timeout: float | None) -> Deadline:
    """One deadline for a call: ``timeout`` seconds, or the client's request_timeout."""
    return Deadline(timeout if timeout is not None else config.request_timeout)


class Router:
    """Runs call plans over the connection pool and owns the metadata cache."""

    def __init__(self, config: ClientConfig, pool: ConnectionPool) -> None:
        self.config = config
        self.pool = pool
        self.metadata = MetadataCache(self._fetch_metadata)
        self._known = KnownAddresses(config)

    def deadline(self, timeout: float | None) -> Deadline:
        """One deadline for a call: ``timeout`` seconds, or the client's request_timeout."""
        return call_deadline(self.config, timeout)

    def run(self, plan: plans.AnyPlan[T]) -> T:
        """Carry out ``plan`` until it returns (or raises). A call that ``close()`` cut short (grpc cancels a
        closed channel's calls) ends with ClientClosedError, keeping what the plan said of ``may_be_stored``."""
        steps = PlanRun(plan)
        try:
            while (action := steps.next_action()) is not None:
                try:
                    steps.answered(self._execute(action))
                except PLAN_FAILURES as exc:
                    steps.failed(exc)
        except LiftbridgeError as exc:
            if self.pool.closed and exc.code is grpc.StatusCode.CANCELLED and not isinstance(exc, ClientClosedError):
                raise ClientClosedError(
                    f"the Liftbridge client was closed during the call ({exc.message})",
                    stream=exc.stream,
                    partition=exc.partition,
                    code=exc.code,
                    may_be_stored=exc.may_be_stored,
                ) from exc
            raise
        return steps.result

    def _execute(self, action: plans.DriverAction) -> Any:
        if isinstance(action, plans.Attempt):
            with self.pool.lease(action.address) as pooled:
                timeout, budget = action.timeout, action.connect_budget()
                if budget is not None:
                    started = time.monotonic()
                    action.after_connect(self.pool.connect(pooled, budget))
                    timeout = action.rpc_timeout(started)
                try:
                    answer = action.rpc(pooled.stub, timeout)
                except grpc.RpcError as exc:
                    if exc.code() in CONNECTION_FAILURES:
                        pooled.doubted()
                    else:
                        pooled.answered()
                    unsent = never_sent(exc, action.address)
                    if unsent is not None:
                        raise unsent from exc
                    raise
                pooled.answered()
                HEALTH.answered(action.address)
                return answer
        if isinstance(action, plans.Sleep):
            time.sleep(action.seconds)
            return None
        if isinstance(action, plans.Dispatch):
            return action.send(self._known.of(self.metadata.snapshot))
        return self.metadata.refresh(action.streams, timeout=action.timeout)

    # -- shortcuts for the client ------------------------------------------------------------------

    def call_any(self, rpc: plans.Rpc, *, timeout: float | None = None, stream: str | None = None) -> Any:
        """``rpc`` on any broker, retried by the shared policy."""
        return self.run(
            plans.any_broker(self.config, self.metadata.snapshot, rpc, self.deadline(timeout), stream=stream)
        )

    def call_broker(self, broker_id: str, rpc: plans.Rpc, *, timeout: float | None = None) -> Any:
        """``rpc`` on the broker ``broker_id`` (e.g. a consumer group's coordinator), retried there only."""
        deadline = self.deadline(timeout)
        return self.run(plans.broker_call(self.config, self.metadata.snapshot, rpc, deadline, broker_id))

    def call_leader(
        self,
        stream: str,
        partition: int,
        rpc: plans.Rpc,
        *,
        timeout: float | None = None,
        any_isr_replica: bool = False,
    ) -> Any:
        """``rpc`` on the partition leader (or a random ISR member), following leader changes."""
        deadline = self.deadline(timeout)
        return self.run(
            plans.leader_call(
                self.config,
                self.metadata.snapshot,
                rpc,
                deadline,
                stream=stream,
                partition=partition,
                any_isr_replica=any_isr_replica,
            )
        )

    def partition_metadata(
        self, stream: str, partition: int, *, timeout: float | None = None, settle: bool = True, agreed: bool = False
    ) -> PartitionInfo:
        deadline = self.deadline(timeout)
        vote = plans.KeptVote() if agreed else None
        return self.run(
            partition_plans.partition_metadata(
                self.config, self.metadata.snapshot, deadline, stream, partition, settle=settle, agreed=vote
            )
        )

    def high_watermark_reaching(
        self, stream: str, partition: int, offset: int, *, timeout: float | None = None, held_only: bool
    ) -> PartitionInfo:
        """The leader's partition metadata once ``offset`` is committed (watermarks.high_watermark_reaching)."""
        deadline = self.deadline(timeout)
        return self.run(
            watermarks.high_watermark_reaching(
                self.config, self.metadata.snapshot, deadline, stream, partition, offset=offset, held_only=held_only
            )
        )

    def partition_running(self, stream: str, partition: int, *, timeout: float | None = None) -> None:
        """Raise PartitionPausedError if the partition is paused (its metadata flag sticks after a resume)."""
        deadline = self.deadline(timeout)
        self.run(partition_plans.running(self.config, self.metadata.snapshot, deadline, stream, partition))

    def snapshot_with(self, stream: str, *, timeout: float | None = None) -> Metadata:
        """A snapshot that knows ``stream``: refreshed once if the cached one does not."""
        snapshot = self.metadata.snapshot
        if stream in snapshot.streams:  # the common case, without a plan to run (each publish asks)
            return snapshot
        return self.run(plans.knowing(self.deadline(timeout), snapshot, stream))

    def with_any_stream(self, deadline: Deadline) -> Metadata:
        """The cached snapshot, fetched once within ``deadline`` when it holds no stream yet (a fresh client):
        what a check of the server's own streams (their subjects) looks at."""
        snapshot = self.metadata.snapshot
        if snapshot.streams:
            return snapshot
        return self.metadata.refresh(timeout=deadline.left("fetching the metadata"))

    def partition_count(self, stream: str, *, timeout: float | None = None) -> int:
        """How many partitions ``stream`` has; asking the cluster (when the cache does not know it) takes at
        most ``timeout`` seconds (default ``request_timeout``)."""
        return len(self.snapshot_with(stream, timeout=timeout).stream(stream).partitions)

    def broker_addresses(self) -> list[str]:
        return broker_addresses(self.config, self.metadata.snapshot)

    def _fetch_metadata(self, streams: Iterable[str], timeout: float | None) -> api.FetchMetadataResponse:
        deadline = self.deadline(timeout)
        return self.run(plans.fetch_metadata(self.config, self.metadata.snapshot, list(streams), deadline))


class Closable(Protocol):
    """A call the router ends when it closes."""

    def close(self) -> None:
        """End the call and close its connection."""


class AsyncRouter:
    """The asyncio driver of the same plans (for :class:`~liftbridge_provider.client.aio.AsyncLiftbridgeClient`):
    one ``grpc.aio`` channel per broker, opened on first use, and the metadata snapshot it refreshes; and the
    data plane's calls (subscriptions) it knows while they run, so :meth:`close` ends them too."""

    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self.snapshot = EMPTY
        self._known = KnownAddresses(config)
        self._credentials = config.tls.credentials() if config.tls is not None else None
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._calls: set[Closable] = set()
        self._ssl: ssl.SSLContext | None = None
        self._closed = False

    async def close(self) -> None:
        """Close every channel and end every data-plane call; later calls raise ClientClosedError. Idempotent."""
        self._closed = True
        calls, self._calls = list(self._calls), set()
        for call in calls:
            call.close()
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()

    def open_channels(self) -> int:
        """How many channels and data-plane connections are open now."""
        return len(self._channels) + len(self._calls)

    def direct_tls(self) -> tuple[ssl.SSLContext | None, str | None]:
        """The TLS context (ALPN ``h2``) and server name of the data plane's connections; (None, None) for
        plaintext. Made at first use."""
        tls = self.config.tls
        if tls is None:
            return None, None
        if self._ssl is None:
            self._ssl = tls.ssl_context(alpn=("h2",))
        return self._ssl, tls.server_name

    @contextlib.contextmanager
    def tracked(self, call: Closable) -> Iterator[None]:
        """Know ``call`` (a data-plane call) for the ``with`` block: :meth:`close` closes it meanwhile
        (ClientClosedError when the router is closed already)."""
        if self._closed:
            raise ClientClosedError("the Liftbridge client is closed")
        self._calls.add(call)
        try:
            yield
        finally:
            self._calls.discard(call)

    def deadline(self, timeout: float | None) -> Deadline:
        """One deadline for a call: ``timeout`` seconds, or the client's request_timeout."""
        return call_deadline(self.config, timeout)

    async def run(self, plan: plans.AnyPlan[T]) -> T:
        """Carry out ``plan`` until it returns (or raises). A call that :meth:`close` cancelled (grpc.aio
        cancels a closed channel's calls) ends with ClientClosedError, not a CancelledError in a task nobody
        cancelled; a task that is itself cancelled still gets its CancelledError."""
        steps = PlanRun(plan)
        while (action := steps.next_action()) is not None:
            try:
                steps.answered(await self._execute(action))
            except PLAN_FAILURES as exc:
                steps.failed(exc)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if self._closed and (task is None or not task.cancelling()):
                    raise ClientClosedError(
                        "the Liftbridge client was closed during the call; a change it made may have been applied"
                    ) from None
                raise
        return steps.result

    async def _execute(self, action: plans.DriverAction) -> Any:
        if isinstance(action, plans.Attempt):
            stub = self.stub(action.address)
            timeout, budget = action.timeout, action.connect_budget()
            if budget is not None:
                started = time.monotonic()
                action.after_connect(await aio_connect(self._channels[action.address], budget))
                timeout = action.rpc_timeout(started)
            try:
                answer = await action.rpc(stub, timeout)
            except grpc.RpcError as exc:
                unsent = never_sent(exc, action.address)
                if unsent is not None:
                    raise unsent from exc
                raise
            HEALTH.answered(action.address)
            return answer
        if isinstance(action, plans.Sleep):
            await asyncio.sleep(action.seconds)
            return None
        if isinstance(action, plans.Dispatch):
            return await action.send(self._known.of(self.snapshot))
        return await self.refresh(action.streams, action.timeout)

    async def refresh(self, streams: Iterable[str], timeout: float | None) -> Metadata:
        """Ask the cluster (all streams, or ``streams``) within ``timeout`` s (None: the client's) and install the
        new snapshot."""
        names = list(streams)
        response = await self.run(plans.fetch_metadata(self.config, self.snapshot, names, self.deadline(timeout)))
        self.snapshot = metadata_from_response(response, self.snapshot, names)
        return self.snapshot

    @property
    def closed(self) -> bool:
        """The client was closed: no call may start, and running ones were cancelled."""
        return self._closed

    def stub(self, address: str) -> Any:
        """The API stub on the channel to ``address`` (opened now if there is none)."""
        if self._closed:
            raise ClientClosedError("the Liftbridge client is closed")
        channel = self._channels.get(address)
        if channel is None:
            options = self.config.channel_options()
            if self._credentials is not None:
                channel = grpc.aio.secure_channel(address, self._credentials, options=options)
            else:
                channel = grpc.aio.insecure_channel(address, options=options)
            self._channels[address] = channel
        return api_grpc.APIStub(channel)
