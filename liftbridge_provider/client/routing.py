"""Where a call goes: any broker (random order), or the leader of a partition, with retries.

:class:`Router` runs one unary RPC with the retry policy of
:mod:`~liftbridge_provider.client.retry`, leasing channels from the pool and
refreshing the metadata cache when leadership turns out to have moved.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client.connections import ConnectionPool, PooledChannel
from liftbridge_provider.client.errors import NoSuchPartitionError, NoSuchStreamError, PartitionPausedError
from liftbridge_provider.client.metadata import Metadata, MetadataCache
from liftbridge_provider.client.options import ClientConfig, format_address
from liftbridge_provider.client.retry import Action, Deadline, RetryState

T = TypeVar("T")
Attempt = Callable[[PooledChannel, float], T]
"""One attempt of a call: gets a channel and the seconds left, returns the result or raises grpc.RpcError."""


def dial_address(config: ClientConfig, host: str, port: int) -> str:
    """The address to dial for an advertised broker (through the address resolver, if any)."""
    if config.address_resolver is not None:
        return config.address_resolver(host, port)
    return format_address(host, port)


def broker_addresses(config: ClientConfig, snapshot: Metadata) -> list[str]:
    """Known brokers (from metadata) and the seeds, shuffled, without repeats."""
    known = [dial_address(config, b.host, b.port) for b in snapshot.brokers.values()]
    addresses = list(dict.fromkeys([*known, *config.brokers]))
    random.shuffle(addresses)
    return addresses


def replica_address(
    config: ClientConfig, snapshot: Metadata, stream: str, partition: int, any_isr_replica: bool
) -> str | None:
    """Dial address of the partition leader (or a random ISR member), or None if none is known right now.

    Raises NoSuchStreamError / NoSuchPartitionError if the snapshot does not know the partition.
    """
    info = snapshot.partition(stream, partition)
    candidates = list(info.isr) if any_isr_replica else [info.leader] if info.leader else []
    random.shuffle(candidates)
    for broker_id in candidates:
        broker = snapshot.brokers.get(broker_id)
        if broker is not None:
            return dial_address(config, broker.host, broker.port)
    return None


def paused_error(stream: str, partition: int) -> PartitionPausedError:
    """A paused partition has no serving leader: it answers "not leader" (or nothing) until resumed."""
    return PartitionPausedError(
        "the partition is paused; publish to it, or read with resume=True, to resume it",
        stream=stream,
        partition=partition,
    )


class Router:
    """Sends calls to the right broker and retries them by the shared policy."""

    def __init__(self, config: ClientConfig, pool: ConnectionPool) -> None:
        self.config = config
        self.pool = pool
        self.metadata = MetadataCache(self._fetch_metadata)

    def broker_addresses(self) -> list[str]:
        return broker_addresses(self.config, self.metadata.snapshot)

    def call_any(self, attempt: Attempt[T], *, timeout: float | None = None, stream: str | None = None) -> T:
        """Run ``attempt`` on any broker: on UNAVAILABLE try the next; back off during elections."""
        state = RetryState(Deadline(timeout or self.config.request_timeout), leader_directed=False, stream=stream)
        while True:
            for address in self.broker_addresses():
                with self.pool.lease(address) as pooled:
                    try:
                        return attempt(pooled, state.deadline.remaining())
                    except grpc.RpcError as exc:
                        action, delay = state.after_failure(exc)
                if action is not Action.NEXT_BROKER:
                    time.sleep(delay)
                    break
            else:
                time.sleep(state.pause())

    def call_leader(
        self,
        stream: str,
        partition: int,
        attempt: Attempt[T],
        *,
        timeout: float | None = None,
        any_isr_replica: bool = False,
    ) -> T:
        """Run ``attempt`` on the partition leader (or a random ISR member), following leader changes."""
        state = RetryState(
            Deadline(timeout or self.config.request_timeout), leader_directed=True, stream=stream, partition=partition
        )
        snapshot = self.snapshot_with(stream)
        while True:
            address = self.replica_address(snapshot, stream, partition, any_isr_replica)
            refused = False
            if address is not None:
                with self.pool.lease(address) as pooled:
                    try:
                        return attempt(pooled, state.deadline.remaining())
                    except grpc.RpcError as exc:
                        _action, delay = state.after_failure(exc)
                        refused = exc.code() == grpc.StatusCode.FAILED_PRECONDITION
            else:
                delay = state.pause()  # no leader right now: an election is running
            time.sleep(delay)
            snapshot = self.metadata.refresh()
            if refused and snapshot.partition(stream, partition).paused:
                raise paused_error(stream, partition)

    def snapshot_with(self, stream: str) -> Metadata:
        """A snapshot that knows ``stream``: refreshed once if the cached one does not."""
        snapshot = self.metadata.get()
        if stream not in snapshot.streams:
            snapshot = self.metadata.refresh()
        snapshot.stream(stream)  # raises NoSuchStreamError
        return snapshot

    def partition_count(self, stream: str) -> int:
        return len(self.snapshot_with(stream).stream(stream).partitions)

    def replica_address(self, snapshot: Metadata, stream: str, partition: int, any_isr_replica: bool) -> str | None:
        """Like :func:`replica_address`, refreshing the snapshot once if it does not know the partition."""
        try:
            return replica_address(self.config, snapshot, stream, partition, any_isr_replica)
        except (NoSuchStreamError, NoSuchPartitionError):
            snapshot = self.metadata.refresh()
            return replica_address(self.config, snapshot, stream, partition, any_isr_replica)

    def _fetch_metadata(self, streams: list[str]) -> api.FetchMetadataResponse:
        request = api.FetchMetadataRequest(streams=streams)

        def attempt(pooled: PooledChannel, remaining: float) -> Any:
            return pooled.stub.FetchMetadata(request, timeout=remaining)

        response: api.FetchMetadataResponse = self.call_any(attempt)
        return response
