"""LiftbridgeClient: the thread-safe synchronous client."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client import admin_plans, offset_lookup, range_read
from liftbridge_provider.client import requests as build
from liftbridge_provider.client.activity import ACTIVITY_STREAM, ActivityEvent, decode_activity
from liftbridge_provider.client.connections import ConnectionPool
from liftbridge_provider.client.cursor_methods import CursorMethods
from liftbridge_provider.client.messages import Message, StartPosition, StopPosition
from liftbridge_provider.client.metadata import Metadata, PartitionInfo, StreamInfo
from liftbridge_provider.client.options import ClientConfig
from liftbridge_provider.client.publish.paths import PublishPaths
from liftbridge_provider.client.publish_methods import PublishMethods
from liftbridge_provider.client.range_read import BeyondHighWatermark
from liftbridge_provider.client.reading import SubscriptionState
from liftbridge_provider.client.retry import Deadline, left_of
from liftbridge_provider.client.routing import Router
from liftbridge_provider.client.subscription import Subscription
from liftbridge_provider.core import checks
from liftbridge_provider.core.checks import check_seconds, check_timeout

log = logging.getLogger(__name__)


class LiftbridgeClient(PublishMethods, CursorMethods):
    """A Liftbridge client: pooled channels per broker, leader routing, retries, batches, bounded reads.

    ``LiftbridgeClient("host:9292")``, ``LiftbridgeClient(["a:9292", "b:9292"], request_timeout=5)``
    or ``LiftbridgeClient(ClientConfig(...))``. Keyword options are the fields
    of :class:`ClientConfig`. Thread-safe; use it as a context manager or call
    :meth:`close`.
    """

    def __init__(self, brokers: str | Sequence[str] | ClientConfig, **options: Any) -> None:
        self.config = ClientConfig.of(brokers, **options)
        self._pool = ConnectionPool(self.config)
        self._router = Router(self.config, self._pool)
        self._publishing = PublishPaths(self.config, self._pool, self._router)

    # -- lifecycle -------------------------------------------------------------

    def close(self) -> None:
        """Close every channel. Idempotent; the client cannot be used afterwards."""
        self._publishing.close()
        self._pool.close()

    def __enter__(self) -> LiftbridgeClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def open_channels(self) -> int:
        """How many gRPC channels are open (all brokers)."""
        return self._pool.open_channels()

    # -- metadata --------------------------------------------------------------

    def fetch_metadata(self, streams: Iterable[str] = ()) -> Metadata:
        """Ask the cluster for metadata (all streams, or only ``streams``) and cache the result."""
        names = checks.check_stream_names(streams)
        return self._router.metadata.refresh(names)

    def metadata(self) -> Metadata:
        """The cached metadata snapshot (fetched on first use)."""
        return self._router.metadata.get()

    def stream_info(self, stream: str) -> StreamInfo:
        """A stream's partitions and leaders; refreshes the cache once if the stream is unknown."""
        return self._router.snapshot_with(checks.check_stream_name(stream)).stream(stream)

    def fetch_partition_metadata(
        self,
        stream: str,
        partition: int = 0,
        *,
        timeout: float | None = None,
        settle: bool = True,
        agreed: bool = False,
    ) -> PartitionInfo:
        """Authoritative partition metadata (high watermark, newest offset, ISR), from the leader.

        A paused partition answers too, without being resumed: its high watermark
        cannot move while it is paused, and the leader's metadata view gives it.
        One exception, when ``settle`` is on (default): a partition that paused
        while its leader held offsets above the high watermark (right after a
        failover) would hide them until it runs again, so it is resumed and the
        call waits up to 5 s, within ``timeout``, for the leader to commit them.
        ``agreed``: ask the leader that more than half of the brokers name, not the one the client's
        metadata names (one FetchMetadata per broker more): a leader frozen past a failover still answers
        as leader with its old log, and so an old high watermark, for a moment after it thaws.
        """
        check_timeout("timeout", timeout)
        build.partition_metadata_request(stream, partition, settle=settle)
        return self._router.partition_metadata(stream, partition, timeout=timeout, settle=settle, agreed=agreed)

    # -- streams ---------------------------------------------------------------

    def create_stream(self, subject: str, name: str, *, timeout: float | None = None, **options: Any) -> None:
        """Create a stream. Options (all optional, None keeps the server default):

        ``group``, ``partitions`` (1), ``replication_factor`` (1; ``ALL_BROKERS`` = -1
        for every broker), ``retention_max_bytes``, ``retention_max_messages``,
        ``retention_max_age``, ``cleaner_interval``, ``segment_max_bytes``,
        ``segment_max_age``, ``compact_enabled``, ``compact_max_goroutines``,
        ``auto_pause_time``, ``auto_pause_disable_if_subscribers``, ``min_isr``,
        ``optimistic_concurrency_control``, ``encryption`` (as keyword arguments,
        or together as ``options=StreamOptions(...)``). Durations are
        ``timedelta`` or seconds. Raises StreamExistsError if the name is taken.
        If the answer is lost after sending, the create is sent again; an
        AlreadyExists then counts as success only if the stream has this
        subject and partition count (the lost attempt made it).
        Names, subjects and groups that the server cannot hold are refused
        (InvalidArgumentError) before anything is sent; see docs/client.md.
        """
        check_timeout("timeout", timeout)
        request = build.create_stream_request(subject, name, **options)
        deadline = self._router.deadline(timeout)
        build.check_not_reserved_subject(request.subject, self._router.with_any_stream(deadline), "create a stream on")
        self._router.run(admin_plans.create_stream(self.config, self._router.metadata.snapshot, request, deadline))

    def delete_stream(self, name: str, *, timeout: float | None = None) -> None:
        """Delete a stream and its data. Raises NoSuchStreamError if there is none.

        If the answer to a delete is lost after sending, the delete is sent again;
        a NotFound then means the first one did it, and the call succeeds.
        """
        check_timeout("timeout", timeout)
        request = api.DeleteStreamRequest(name=build.check_not_reserved(checks.check_stream_name(name), "delete"))
        deadline = self._router.deadline(timeout)
        self._router.run(admin_plans.delete_stream(self.config, self._router.metadata.snapshot, request, deadline))

    def pause_stream(
        self,
        name: str,
        *,
        partitions: Iterable[int] | None = None,
        resume_all: bool = False,
        timeout: float | None = None,
    ) -> None:
        """Pause some partitions (None, the default: all). An empty selection pauses nothing (no
        PauseStream request is sent). A publish or ``resume=True`` subscribe resumes one; with ``resume_all``
        any resume resumes every paused partition of the stream."""
        check_timeout("timeout", timeout)
        checks.check_flag(resume_all, "resume_all")
        deadline = Deadline(timeout) if timeout is not None else None
        ids = self._partition_list(name, partitions, "pause", deadline)
        if ids == []:
            return
        request = api.PauseStreamRequest(name=name, partitions=ids or [], resumeAll=resume_all)
        self._unary(
            "PauseStream", request, timeout=left_of(deadline, "pause_stream", stream=name), stream=name, idempotent=True
        )

    def set_stream_readonly(
        self,
        name: str,
        *,
        partitions: Iterable[int] | None = None,
        readonly: bool = True,
        timeout: float | None = None,
    ) -> None:
        """Make some partitions (None, the default: all) readonly, or writable again with
        ``readonly=False``. An empty selection changes nothing (no SetStreamReadonly request is sent)."""
        check_timeout("timeout", timeout)
        checks.check_flag(readonly, "readonly")
        # making __cursors writable again is the way out of a readonly one, so only readonly=True is refused
        deadline = Deadline(timeout) if timeout is not None else None
        ids = self._partition_list(name, partitions, "make readonly" if readonly else None, deadline)
        if ids == []:
            return
        request = api.SetStreamReadonlyRequest(name=name, partitions=ids or [], readonly=readonly)
        self._unary(
            "SetStreamReadonly",
            request,
            timeout=left_of(deadline, "set_stream_readonly", stream=name),
            stream=name,
            idempotent=True,
        )

    def _partition_list(
        self, name: str, partitions: Iterable[int] | None, action: str | None, deadline: Deadline | None
    ) -> list[int] | None:
        """The checked selection; the partition count is looked up (within the call's deadline) only for a
        well-formed, non-empty list."""
        checks.check_stream_name(name)
        if action is not None:
            build.check_not_reserved(name, action)

        def count() -> int:
            return self._router.partition_count(name, timeout=left_of(deadline, "the partition lookup", stream=name))

        return checks.check_partition_selection(partitions, count, name)

    # -- reading ---------------------------------------------------------------

    def subscribe(
        self,
        stream: str,
        *,
        partition: int = 0,
        start: StartPosition | None = None,
        stop: StopPosition | None = None,
        read_isr_replica: bool | None = None,
        resume: bool = False,
        timeout: float | None = None,
        idle_timeout: float | None = None,
        resubscribe_wait: float | None = None,
    ) -> Subscription:
        """Subscribe to one partition; iterate the returned Subscription for messages.

        ``start`` defaults to new messages only; ``stop`` to none (runs until
        cancelled). ``read_isr_replica`` reads from any in-sync replica
        (default ``config.read_isr_replica``). ``resume`` resumes a paused
        partition. ``timeout`` (seconds, default none) bounds the whole
        subscription and ``idle_timeout`` (seconds, default none) the time
        without a new message; either raises LiftbridgeTimeoutError. A broker
        lost, frozen or no longer leading is left for the new leader
        (``resubscribe_wait``, default ``config.resubscribe_wait``). The
        partition is checked against the stream's metadata before subscribing.
        """
        check_timeout("timeout", timeout)
        check_timeout("idle_timeout", idle_timeout)
        check_timeout("resubscribe_wait", resubscribe_wait)
        replica = self.config.read_isr_replica if read_isr_replica is None else read_isr_replica
        request = build.subscribe_request(  # checks the positions and the flags
            stream, partition, start or StartPosition.new_only(), stop, read_isr_replica=replica, resume=resume
        )
        started = Deadline(timeout) if timeout is not None else None  # the lookup counts against ``timeout``
        left = left_of(started, "subscribe", stream=stream, partition=partition)
        lookup = min(left, self.config.request_timeout) if left is not None else None
        checks.check_partition(partition, self._router.partition_count(stream, timeout=lookup), stream)
        left_of(started, "subscribe", stream=stream, partition=partition)  # LiftbridgeTimeoutError: none left
        return self._subscription(
            request,
            stop,
            timeout=timeout,
            begun=started.end - started.timeout if started is not None else None,
            idle_timeout=idle_timeout,
            resubscribe_wait=resubscribe_wait,
        )

    def _subscription(
        self,
        request: api.SubscribeRequest,
        stop: StopPosition | None,
        *,
        timeout: float | None = None,
        idle_timeout: float | None = None,
        resubscribe_wait: float | None = None,
        begun: float | None = None,
    ) -> Subscription:
        """A Subscription for a checked request (also a consumer group member's, with its ``consumer``);
        ``begun``: when ``timeout`` began (``time.monotonic()``), if before now."""
        state = SubscriptionState(
            self.config,
            request,
            stop_offset=stop.offset if stop is not None and stop.kind == api.STOP_OFFSET else None,
            timeout=timeout,
            begun=begun,
            idle_timeout=idle_timeout,
            resubscribe_wait=resubscribe_wait if resubscribe_wait is not None else self.config.resubscribe_wait,
        )
        return Subscription(self._router, state)

    def activity(
        self,
        *,
        start: StartPosition | None = None,
        stop: StopPosition | None = None,
        timeout: float | None = None,
        idle_timeout: float | None = None,
    ) -> Iterator[ActivityEvent]:
        """The activity stream (``__activity``) as typed :class:`ActivityEvent` objects: streams created,
        deleted, paused, resumed, set readonly, consumer groups joined and left.

        Positions and budgets as :meth:`subscribe` (default: from the earliest
        event, until cancelled). The server must run with
        ``activity.stream.enabled`` (NoSuchStreamError otherwise).
        """
        subscription = self.subscribe(
            ACTIVITY_STREAM,
            start=start or StartPosition.earliest(),
            stop=stop,
            timeout=timeout,
            idle_timeout=idle_timeout,
        )
        return (decode_activity(message) for message in _closing(subscription))

    def read_range(
        self,
        stream: str,
        partition: int,
        start: int,
        end: int,
        *,
        beyond_high_watermark: BeyondHighWatermark = "refuse",
        timeout: float | None = None,
        idle_timeout: float | None = None,
        read_isr_replica: bool | None = None,
        resume: bool = False,
    ) -> Iterator[Message]:
        """Messages with ``start <= offset < end`` of one partition, in order.

        When ``end - 1`` is beyond the committed high watermark: ``"refuse"``
        (default) checks again until ``timeout`` (default ``request_timeout``)
        passes, since a new leader's high watermark lags for a moment after a
        failover, then raises BeyondHighWatermarkError (transient, not bad
        input); ``"wait"`` waits for the missing messages; ``"truncate"`` reads
        up to the high watermark (nothing at all if ``start`` is beyond it).
        ``timeout`` (seconds, default none) bounds the whole read,
        ``idle_timeout`` (seconds, default none) the time without a new
        message; either raises LiftbridgeTimeoutError. The read ends at
        ``end - 1`` even when compaction removed that offset. A paused
        partition raises PartitionPausedError unless ``resume`` is true.
        """
        return range_read.read_range(
            self,
            stream,
            partition,
            start,
            end,
            beyond_high_watermark=beyond_high_watermark,
            timeout=timeout,
            idle_timeout=idle_timeout,
            read_isr_replica=read_isr_replica,
            resume=resume,
        )

    def range_subscription(
        self,
        stream: str,
        partition: int,
        start: int,
        end: int,
        *,
        beyond_high_watermark: BeyondHighWatermark = "refuse",
        timeout: float | None = None,
        idle_timeout: float | None = None,
        read_isr_replica: bool | None = None,
        resume: bool = False,
    ) -> Subscription | None:
        """The subscription :meth:`read_range` iterates (same parameters, checks and errors), None for an
        empty range: for callers that manage it themselves (use it as a context manager) or want the
        received protobufs (``raw_messages()``, as the Spark source does)."""
        return range_read.range_subscription(
            self,
            stream,
            partition,
            start,
            end,
            beyond_high_watermark=beyond_high_watermark,
            timeout=timeout,
            idle_timeout=idle_timeout,
            read_isr_replica=read_isr_replica,
            resume=resume,
        )

    def wait_for_high_watermark(self, stream: str, partition: int, offset: int, *, timeout: float | None = None) -> int:
        """The leader's committed high watermark once it reaches ``offset``, or the last one seen when
        ``timeout`` (seconds, default ``request_timeout``, for every question asked) passes. Asked again
        with jittered 10-500 ms backoff, also for messages nobody has published yet; to wait only for a
        commit already on its way, use :meth:`wait_for_commit`."""
        check_timeout("timeout", timeout)
        checks.check_partition(partition, stream=checks.check_stream_name(stream))
        checks.check_offset(offset, "offset", minimum=-1)
        info = self._router.high_watermark_reaching(stream, partition, offset, timeout=timeout, held_only=False)
        return info.high_watermark

    def wait_for_commit(
        self, stream: str, partition: int, offset: int, *, timeout: float | None = None
    ) -> PartitionInfo:
        """The leader's partition metadata once ``offset`` is committed (``high_watermark >= offset``), or as
        soon as waiting cannot bring it: when the leader does not hold ``offset`` (its newest offset is
        below), nothing is on its way, and the first answer is returned.

        While the leader holds ``offset`` uncommitted (newest offset >= ``offset``
        > high watermark: a new leader whose high watermark lags after a failover,
        a follower slow to fetch), it is asked again with jittered 10-500 ms
        backoff until ``timeout`` (seconds, default ``request_timeout``, for every
        question asked) passes; the last answer then. The reads that refuse a range
        beyond the high watermark (``read_range``, the Spark source) decide by this.
        """
        check_timeout("timeout", timeout)
        checks.check_partition(partition, stream=checks.check_stream_name(stream))
        checks.check_offset(offset, "offset", minimum=-1)
        return self._router.high_watermark_reaching(stream, partition, offset, timeout=timeout, held_only=True)

    def earliest_offset(
        self,
        stream: str,
        partition: int = 0,
        *,
        timeout: float | None = None,
        resume: bool = False,
        probe: float = 2.0,
    ) -> int | None:
        """The oldest offset still stored (retention and compaction remove older ones); None if the
        partition never held a message; high watermark + 1 when retention removed every message.

        Reads the first message from the earliest position up to the leader's
        high watermark. A read that stays silent for ``probe`` seconds (default 2)
        is not taken as "nothing retained" on its own: that answer needs
        evidence (the server reports the log's only segment empty, and a second
        read is silent too); without it, a silent leader raises
        LiftbridgeTimeoutError when ``timeout`` (default ``request_timeout``)
        passes. A paused partition raises PartitionPausedError unless ``resume``
        (then it is resumed: reading needs data).
        """
        check_timeout("timeout", timeout)
        check_seconds("probe", probe)
        checks.check_flag(resume, "resume")
        return offset_lookup.earliest_offset(
            self, stream, partition, self._router.deadline(timeout), resume=resume, probe=probe
        )

    def offset_at_time(self, stream: str, partition: int, when: datetime | int, *, timeout: float | None = None) -> int:
        """The offset from which every committed message was received at or after ``when`` (an aware datetime
        or nanoseconds since the epoch): the one right after the last message received before it, the oldest
        retained offset when none is older, the high watermark + 1 when all are.

        Messages the leader holds but has not committed yet could be older than
        ``when``, so their commit is waited for first (it takes a moment; failing
        that, BeyondHighWatermarkError: retry later). For a time in the past the
        answer is then final: later messages get later times. Times are the
        leaders' clocks; the server's time index gives a first answer, which is
        checked (:mod:`~liftbridge_provider.core.time_search`). Reading
        resumes a paused partition. ``timeout``: seconds for all of it (default
        ``request_timeout``).
        """
        nanoseconds = StartPosition.at_time(when).timestamp
        check_timeout("timeout", timeout)
        return offset_lookup.offset_at_time(self, stream, partition, nanoseconds, self._router.deadline(timeout))

    # -- plumbing --------------------------------------------------------------

    def _unary(
        self, method: str, request: Any, *, timeout: float | None, stream: str | None, idempotent: bool = False
    ) -> Any:
        """``method`` on any broker; ``idempotent``: applied through Raft, and harmless when applied twice, so the
        server's own waits that ended ("raft operation timed out", "context deadline exceeded") are retried while
        the call has time (:func:`admin_plans.applied_again_on_timeout`)."""

        def call(stub: Any, remaining: float) -> Any:
            return getattr(stub, method)(request, timeout=remaining)

        rpc = admin_plans.applied_again_on_timeout(call) if idempotent else call
        return self._router.call_any(rpc, timeout=timeout, stream=stream)


def _closing(subscription: Subscription) -> Iterator[Message]:
    """The subscription's messages; the subscription is cancelled when iteration ends or stops early."""
    with subscription:
        yield from subscription
