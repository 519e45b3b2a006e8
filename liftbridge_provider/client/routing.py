"""The synchronous driver of call plans: it carries out what :mod:`~liftbridge_provider.client.plans` decides.

:class:`Router` leases channels from the pool for attempts, sleeps, and
refreshes the metadata cache, each bounded by the time the plan gives it. It
makes no decision of its own; the asyncio client drives the same plans.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any, TypeVar

import grpc

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client import plans, watermarks
from liftbridge_provider.client.addresses import broker_addresses
from liftbridge_provider.client.connections import ConnectionPool
from liftbridge_provider.client.errors import UnavailableError
from liftbridge_provider.client.health import HEALTH
from liftbridge_provider.client.metadata import Metadata, MetadataCache, PartitionInfo
from liftbridge_provider.client.options import ClientConfig
from liftbridge_provider.client.retry import Deadline
from liftbridge_provider.core.errors import LiftbridgeError

T = TypeVar("T")


class Router:
    """Runs call plans over the connection pool and owns the metadata cache."""

    def __init__(self, config: ClientConfig, pool: ConnectionPool) -> None:
        self.config = config
        self.pool = pool
        self.metadata = MetadataCache(self._fetch_metadata)

    def deadline(self, timeout: float | None) -> Deadline:
        """One deadline for a call: ``timeout`` seconds, or the client's request_timeout."""
        return Deadline(timeout if timeout is not None else self.config.request_timeout)

    def run(self, plan: plans.Plan[T]) -> T:
        """Carry out ``plan`` until it returns (or raises)."""
        outcome: Any = None
        failure: BaseException | None = None
        while True:
            try:
                action = plan.throw(failure) if failure is not None else plan.send(outcome)
            except StopIteration as done:
                result: T = done.value
                return result
            outcome, failure = None, None
            try:
                outcome = self._execute(action)
            except (grpc.RpcError, LiftbridgeError) as exc:
                failure = exc

    def _execute(self, action: plans.PlanAction) -> Any:
        if isinstance(action, plans.Attempt):
            with self.pool.lease(action.address) as pooled:
                timeout, budget = action.timeout, action.connect_budget()
                if budget is not None:
                    started = time.monotonic()
                    action.after_connect(pooled.connect(budget))
                    timeout = max(timeout - (time.monotonic() - started), 0.001)
                answer = action.rpc(pooled.stub, timeout)
                HEALTH.answered(action.address)
                return answer
        if isinstance(action, plans.Sleep):
            time.sleep(action.seconds)
            return None
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
        snapshot = self.metadata.snapshot
        if broker_id not in snapshot.brokers:
            snapshot = self.metadata.refresh(timeout=deadline.remaining())
        broker = snapshot.brokers.get(broker_id)
        if broker is None:
            raise UnavailableError(f"broker {broker_id!r} is not in the cluster's metadata")
        return self.run(plans.any_broker(self.config, snapshot, rpc, deadline, addresses=[broker.address]))

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

    def cursor_call(self, partition: int, rpc: plans.Rpc, *, timeout: float | None = None, read: bool = False) -> Any:
        """SetCursor (``read``: FetchCursor, once the high watermark settled) on the leader of a ``__cursors``
        partition that a majority of brokers name (plans.cursor_call, plans.cursor_read)."""
        deadline = self.deadline(timeout)
        plan = plans.cursor_read if read else plans.cursor_call
        return self.run(plan(self.config, self.metadata.snapshot, rpc, deadline, partition=partition))

    def partition_metadata(
        self, stream: str, partition: int, *, timeout: float | None = None, settle: bool = True
    ) -> PartitionInfo:
        deadline = self.deadline(timeout)
        return self.run(
            plans.partition_metadata(self.config, self.metadata.snapshot, deadline, stream, partition, settle=settle)
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
        request = api.FetchPartitionMetadataRequest(stream=stream, partition=partition)

        def fetch(stub: Any, remaining: float) -> Any:
            return stub.FetchPartitionMetadata(request, timeout=remaining)

        self.run(
            plans.leader_call(
                self.config, self.metadata.snapshot, fetch, self.deadline(timeout), stream=stream, partition=partition
            )
        )

    def snapshot_with(self, stream: str, *, timeout: float | None = None) -> Metadata:
        """A snapshot that knows ``stream``: refreshed once if the cached one does not."""
        snapshot = self.metadata.snapshot
        if stream in snapshot.streams:  # the common case, without a plan to run (each publish asks)
            return snapshot
        return self.run(plans.knowing(self.deadline(timeout), snapshot, stream))

    def partition_count(self, stream: str) -> int:
        return len(self.snapshot_with(stream).stream(stream).partitions)

    def broker_addresses(self) -> list[str]:
        return broker_addresses(self.config, self.metadata.snapshot)

    def _fetch_metadata(self, streams: Iterable[str], timeout: float | None) -> api.FetchMetadataResponse:
        request = api.FetchMetadataRequest(streams=list(streams))

        def fetch(stub: Any, remaining: float) -> Any:
            return stub.FetchMetadata(request, timeout=remaining)

        response: api.FetchMetadataResponse = self.run(
            plans.any_broker(self.config, self.metadata.snapshot, fetch, self.deadline(timeout))
        )
        return response
