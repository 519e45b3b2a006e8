"""Immutable cluster metadata snapshots, and the cache that keeps the current one.

A :class:`Metadata` snapshot is built from a FetchMetadata response and never
changes; the :class:`MetadataCache` swaps in a new snapshot when the client
learns the old one is stale (unknown leader, "not leader" answers, unknown
stream) or when asked. Concurrent refreshes share one RPC.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client.errors import LiftbridgeTimeoutError, NoSuchStreamError
from liftbridge_provider.client.options import format_address
from liftbridge_provider.core.errors import NoSuchPartitionError


@dataclass(frozen=True)
class BrokerInfo:
    """A broker as the cluster advertises it, with how many partitions it holds (as a replica) and leads."""

    id: str
    host: str
    port: int
    partition_count: int = 0
    leader_count: int = 0

    @property
    def address(self) -> str:
        return format_address(self.host, self.port)


@dataclass(frozen=True)
class EventTimes:
    """When an event first and last happened on a partition, as its leader saw it (nanoseconds since the
    epoch; None: not since the leader took over, or never). Kept in the leader's memory only."""

    first: int | None = None
    latest: int | None = None

    @classmethod
    def from_proto(cls, pb: api.PartitionEventTimestamps) -> EventTimes:
        return cls(pb.firstTimestamp or None, pb.latestTimestamp or None)


@dataclass(frozen=True)
class PartitionInfo:
    """One partition of a stream.

    ``high_watermark`` is the last committed offset (-1: nothing committed);
    ``newest_offset`` the last offset appended on the leader. Both come from the
    broker that answered; only :meth:`LiftbridgeClient.fetch_partition_metadata`
    (asked of the leader) is authoritative.
    """

    stream: str
    id: int
    leader: str | None
    replicas: tuple[str, ...]
    isr: tuple[str, ...]
    high_watermark: int
    newest_offset: int
    paused: bool
    readonly: bool
    messages_received: EventTimes = EventTimes()
    paused_at: EventTimes = EventTimes()
    readonly_at: EventTimes = EventTimes()

    @classmethod
    def from_proto(cls, stream: str, pb: api.PartitionMetadata) -> PartitionInfo:
        return cls(
            stream=stream,
            id=pb.id,
            leader=pb.leader or None,
            replicas=tuple(pb.replicas),
            isr=tuple(pb.isr),
            high_watermark=pb.highWatermark,
            newest_offset=pb.newestOffset,
            paused=pb.paused,
            readonly=pb.readonly,
            messages_received=EventTimes.from_proto(pb.messagesReceivedTimestamps),
            paused_at=EventTimes.from_proto(pb.pauseTimestamps),
            readonly_at=EventTimes.from_proto(pb.readonlyTimestamps),
        )


@dataclass(frozen=True)
class StreamInfo:
    """A stream and its partitions (keyed by partition id)."""

    name: str
    subject: str
    partitions: Mapping[int, PartitionInfo]
    creation_timestamp: int  # nanoseconds since the epoch

    @classmethod
    def from_proto(cls, pb: api.StreamMetadata) -> StreamInfo:
        partitions = {pid: PartitionInfo.from_proto(pb.name, p) for pid, p in sorted(pb.partitions.items())}
        return cls(pb.name, pb.subject, MappingProxyType(partitions), pb.creationTimestamp)

    def partition(self, partition: int) -> PartitionInfo:
        try:
            return self.partitions[partition]
        except KeyError:
            raise NoSuchPartitionError(
                f"no partition {partition}; stream {self.name!r} has partitions 0-{len(self.partitions) - 1}",
                stream=self.name,
                partition=partition,
            ) from None


@dataclass(frozen=True)
class Metadata:
    """A snapshot of brokers and streams at ``fetched_at`` (``time.monotonic()`` seconds)."""

    brokers: Mapping[str, BrokerInfo]
    streams: Mapping[str, StreamInfo]
    fetched_at: float

    def stream(self, name: str) -> StreamInfo:
        try:
            return self.streams[name]
        except KeyError:
            raise NoSuchStreamError(f"no stream named {name!r}", stream=name) from None

    def partition(self, stream: str, partition: int) -> PartitionInfo:
        return self.stream(stream).partition(partition)

    def leader(self, stream: str, partition: int) -> BrokerInfo | None:
        """The partition leader, or None if it has none or the leader is not among the known brokers."""
        leader_id = self.partition(stream, partition).leader
        return self.brokers.get(leader_id) if leader_id else None


EMPTY = Metadata(MappingProxyType({}), MappingProxyType({}), 0.0)


def metadata_from_response(
    response: api.FetchMetadataResponse, previous: Metadata, requested: Iterable[str] = ()
) -> Metadata:
    """A new snapshot from a FetchMetadata response.

    When only some streams were ``requested``, the others are kept from
    ``previous``; requested streams the server does not know are dropped.
    """
    requested = set(requested)
    streams = {n: s for n, s in previous.streams.items() if requested and n not in requested}
    for pb in response.streamMetadata:
        if pb.error == api.StreamMetadata.OK:
            streams[pb.name] = StreamInfo.from_proto(pb)
    brokers = _known_brokers(response, previous, streams)
    return Metadata(MappingProxyType(brokers), MappingProxyType(streams), time.monotonic())


def _known_brokers(
    response: api.FetchMetadataResponse, previous: Metadata, streams: Mapping[str, StreamInfo]
) -> dict[str, BrokerInfo]:
    """The answer's brokers, plus the last known address of a replica the answer leaves out.

    A server keeps its broker list for ``metadata.cache.max.age`` (2 min) while
    the Raft membership stays the same, so a broker that was down when the list
    was cached is missing from its answers for up to 2 min after it is back,
    even as it leads partitions.
    """
    brokers = {b.id: BrokerInfo(b.id, b.host, b.port, b.partitionCount, b.leaderCount) for b in response.brokers}
    named = {r for s in streams.values() for p in s.partitions.values() for r in (*p.replicas, p.leader or "")}
    for broker_id in named - brokers.keys():
        if broker_id in previous.brokers:
            brokers[broker_id] = previous.brokers[broker_id]
    return brokers


class MetadataCache:
    """Holds the current snapshot; ``refresh`` replaces it, sharing one RPC among concurrent callers.

    ``fetch(streams, timeout)`` asks the cluster within ``timeout`` seconds. A
    caller that joins a refresh already running waits at most its own timeout.
    """

    def __init__(self, fetch: Callable[[list[str], float | None], api.FetchMetadataResponse]) -> None:
        self._fetch = fetch
        self._snapshot = EMPTY
        self._lock = threading.Lock()
        self._refreshing: threading.Event | None = None

    @property
    def snapshot(self) -> Metadata:
        return self._snapshot

    def get(self, timeout: float | None = None) -> Metadata:
        """The current snapshot, fetched first if there is none yet."""
        return self._snapshot if self._snapshot is not EMPTY else self.refresh(timeout=timeout)

    def refresh(self, streams: Iterable[str] = (), *, timeout: float | None = None) -> Metadata:
        """Ask the cluster, install and return the new snapshot (within ``timeout`` s; None: the client's)."""
        streams = list(streams)
        with self._lock:
            running = self._refreshing
            if running is None and not streams:
                self._refreshing = threading.Event()
        if running is not None and not streams:
            # another thread is fetching everything: use its result
            if not running.wait(timeout):
                raise LiftbridgeTimeoutError(f"no metadata within {timeout:g}s")
            return self._snapshot
        try:
            response = self._fetch(streams, timeout)
            snapshot = metadata_from_response(response, self._snapshot, streams)
            self._snapshot = snapshot
            return snapshot
        finally:
            if not streams:
                with self._lock:
                    done, self._refreshing = self._refreshing, None
                if done is not None:
                    done.set()
