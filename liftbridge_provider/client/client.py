"""LiftbridgeClient: the thread-safe synchronous client."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

import grpc

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client import requests as build
from liftbridge_provider.client.connections import ConnectionPool, PooledChannel
from liftbridge_provider.client.errors import (
    AckTimeoutError,
    InvalidArgumentError,
    LiftbridgeError,
    LiftbridgeTimeoutError,
    MessageTooLargeError,
    UnavailableError,
    error_from_rpc,
)
from liftbridge_provider.client.messages import Ack, AckPolicy, Message, StartPosition, StopPosition
from liftbridge_provider.client.metadata import Metadata, PartitionInfo, StreamInfo
from liftbridge_provider.client.options import ClientConfig, check_seconds, check_timeout
from liftbridge_provider.client.partitioners import Partitioner, PartitionerName, resolve_partitioner
from liftbridge_provider.client.publisher import BatchPublisher, BatchResult, PublishFailure
from liftbridge_provider.client.routing import Router
from liftbridge_provider.client.subscription import Subscription

log = logging.getLogger(__name__)

BeyondHighWatermark = Literal["refuse", "wait", "truncate"]


@dataclass(frozen=True)
class PublishMessage:
    """One message of a batch. ``partition`` None means: ask the batch's partitioner (else 0)."""

    value: bytes
    key: bytes | None = None
    headers: Mapping[str, bytes] | None = None
    partition: int | None = None
    expected_offset: int | None = None


class _NotConnected(grpc.RpcError):
    """The channel could not connect, so nothing was sent: safe to try another broker."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "could not connect to the broker"


class LiftbridgeClient:
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

    # -- lifecycle -------------------------------------------------------------

    def close(self) -> None:
        """Close every channel. Idempotent; the client cannot be used afterwards."""
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
        names = build.check_stream_names(streams)
        return self._router.metadata.refresh(names)

    def metadata(self) -> Metadata:
        """The cached metadata snapshot (fetched on first use)."""
        return self._router.metadata.get()

    def stream_info(self, stream: str) -> StreamInfo:
        """A stream's partitions and leaders; refreshes the cache once if the stream is unknown."""
        return self._router.snapshot_with(build.check_stream_name(stream)).stream(stream)

    def fetch_partition_metadata(
        self, stream: str, partition: int = 0, *, timeout: float | None = None
    ) -> PartitionInfo:
        """Authoritative partition metadata (high watermark, newest offset, ISR), from the leader."""
        check_timeout("timeout", timeout)
        request = build.partition_metadata_request(stream, partition)

        def attempt(pooled: PooledChannel, remaining: float) -> api.FetchPartitionMetadataResponse:
            response: api.FetchPartitionMetadataResponse = pooled.stub.FetchPartitionMetadata(
                request, timeout=remaining
            )
            return response

        response = self._router.call_leader(stream, partition, attempt, timeout=timeout)
        return PartitionInfo.from_proto(stream, response.metadata)

    # -- streams ---------------------------------------------------------------

    def create_stream(self, subject: str, name: str, *, timeout: float | None = None, **options: Any) -> None:
        """Create a stream. Options (all optional, None keeps the server default):

        ``group``, ``partitions`` (1), ``replication_factor`` (1; ``ALL_BROKERS`` = -1
        for every broker), ``retention_max_bytes``, ``retention_max_messages``,
        ``retention_max_age``, ``cleaner_interval``, ``segment_max_bytes``,
        ``segment_max_age``, ``compact_enabled``, ``compact_max_goroutines``,
        ``auto_pause_time``, ``auto_pause_disable_if_subscribers``, ``min_isr``,
        ``optimistic_concurrency_control``, ``encryption``. Durations are
        ``timedelta`` or seconds. Raises StreamExistsError if the name is taken.
        Names, subjects and groups that the server cannot hold are refused
        (InvalidArgumentError) before anything is sent; see docs/client.md.
        """
        check_timeout("timeout", timeout)
        request = build.create_stream_request(subject, name, **options)
        self._unary("CreateStream", request, timeout=timeout, stream=name)
        self._router.metadata.refresh()

    def delete_stream(self, name: str, *, timeout: float | None = None) -> None:
        """Delete a stream and its data. Raises NoSuchStreamError if there is none."""
        check_timeout("timeout", timeout)
        request = api.DeleteStreamRequest(name=build.check_stream_name(name))
        self._unary("DeleteStream", request, timeout=timeout, stream=name)
        self._router.metadata.refresh()

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
        build.check_flag(resume_all, "resume_all")
        ids = self._partition_list(name, partitions)
        if ids == []:
            return
        request = api.PauseStreamRequest(name=name, partitions=ids or [], resumeAll=resume_all)
        self._unary("PauseStream", request, timeout=timeout, stream=name)

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
        build.check_flag(readonly, "readonly")
        ids = self._partition_list(name, partitions)
        if ids == []:
            return
        request = api.SetStreamReadonlyRequest(name=name, partitions=ids or [], readonly=readonly)
        self._unary("SetStreamReadonly", request, timeout=timeout, stream=name)

    def _partition_list(self, name: str, partitions: Iterable[int] | None) -> list[int] | None:
        build.check_stream_name(name)
        if partitions is None:
            return None
        return build.check_partition_selection(partitions, self._router.partition_count(name), name)

    # -- publishing ------------------------------------------------------------

    def publish(
        self,
        stream: str,
        value: bytes,
        *,
        key: bytes | None = None,
        headers: Mapping[str, bytes] | None = None,
        partition: int | None = None,
        partitioner: Partitioner | PartitionerName | None = None,
        ack_policy: AckPolicy | str = AckPolicy.LEADER,
        expected_offset: int | None = None,
        timeout: float | None = None,
    ) -> Ack | None:
        """Publish one message and wait for its ack (None with ack policy NONE).

        The partition is ``partition``, else ``partitioner(stream, key, value, n)``
        (or the partitioner named ``"key"`` or ``"round_robin"``), else 0.
        ``expected_offset`` (streams with optimistic concurrency control)
        must be the offset the message will get; None means "next". ``timeout``
        bounds the wait for the ack (default ``request_timeout``); an expired
        wait raises AckTimeoutError. A publish that may have reached the server
        is never re-sent: errors after sending carry ``may_be_stored=True``. A message over
        the server's size limit raises MessageTooLargeError naming its size.
        """
        check_timeout("timeout", timeout)
        policy = AckPolicy.parse(ack_policy)
        chosen = self._choose_partition(stream, key, value, partition, resolve_partitioner(partitioner))
        request = build.publish_request(
            stream,
            value,
            partition=chosen,
            key=key,
            headers=headers,
            ack_policy=policy,
            expected_offset=expected_offset,
        )

        try:
            response = self._send_once("Publish", request, timeout, stream, chosen)
        except MessageTooLargeError as exc:
            raise exc.with_size(request.ByteSize()) from exc
        if policy == AckPolicy.NONE or not response.HasField("ack"):
            return None
        return Ack(response.ack, chosen)

    def publish_batch(
        self,
        stream: str,
        messages: Iterable[PublishMessage | bytes],
        *,
        partitioner: Partitioner | PartitionerName | None = None,
        ack_policy: AckPolicy | str = AckPolicy.LEADER,
        window: int = 1024,
        ack_wait: float | None = None,
        timeout: float | None = None,
        raise_on_error: bool = True,
    ) -> BatchResult:
        """Publish many messages over one pipelined PublishAsync stream; acks come back in input order.

        ``messages`` are values (bytes) or :class:`PublishMessage`. At most
        ``window`` messages (default 1024) await their ack at any time. Every
        message is validated before the first is sent. ``ack_wait`` is the
        per-message ack timeout (default ``config.ack_wait``, 5 s); ``timeout``
        bounds the whole batch (default: none). Failed messages are listed in
        ``BatchResult.failures`` with their error; with ``raise_on_error``
        (default) a BatchPublishError carrying that result is raised instead.
        Messages are never re-sent automatically (see ``may_be_stored``). ``partitioner``
        is a callable or ``"key"`` / ``"round_robin"``.
        """
        check_timeout("ack_wait", ack_wait)
        check_timeout("timeout", timeout)
        build.check_flag(raise_on_error, "raise_on_error")
        build.check_batch_messages(messages)
        chooser = resolve_partitioner(partitioner)
        policy = AckPolicy.parse(ack_policy)
        if not isinstance(window, int) or isinstance(window, bool) or window < 1:
            raise InvalidArgumentError(f"window must be a whole number >= 1, got {window!r}")
        requests = self._batch_requests(stream, messages, chooser, policy)
        if not requests:
            return BatchResult([])
        publisher = BatchPublisher(
            self._router,
            requests,
            window=window,
            ack_wait=ack_wait if ack_wait is not None else self.config.ack_wait,
            timeout=timeout,
        )
        result = publisher.run()
        result.failures = [_sized(failure, requests) for failure in result.failures]
        if raise_on_error:
            result.raise_for_failures()
        return result

    def _batch_requests(
        self,
        stream: str,
        messages: Iterable[PublishMessage | bytes],
        partitioner: Partitioner | None,
        policy: AckPolicy,
    ) -> list[api.PublishRequest]:
        count = self._router.partition_count(build.check_stream_name(stream))
        requests = []
        for index, item in enumerate(messages):
            message = item if isinstance(item, PublishMessage) else PublishMessage(value=item)
            try:
                partition = self._partition_for(
                    stream, count, message.key, message.value, message.partition, partitioner
                )
                requests.append(
                    build.publish_request(
                        stream,
                        message.value,
                        partition=partition,
                        key=message.key,
                        headers=message.headers,
                        ack_policy=policy,
                        expected_offset=message.expected_offset,
                        correlation_id=str(index),
                    )
                )
            except InvalidArgumentError as exc:
                raise InvalidArgumentError(f"message #{index}: {exc.message}; nothing was sent", stream=stream) from exc
        return requests

    def _choose_partition(
        self,
        stream: str,
        key: bytes | None,
        value: bytes,
        partition: int | None,
        partitioner: Partitioner | None,
    ) -> int:
        count = self._router.partition_count(build.check_stream_name(stream))
        return self._partition_for(stream, count, key, value, partition, partitioner)

    @staticmethod
    def _partition_for(  # noqa: PLR0917
        stream: str,
        count: int,
        key: bytes | None,
        value: bytes,
        partition: int | None,
        partitioner: Partitioner | None,
    ) -> int:
        if partition is not None and partitioner is not None:
            raise InvalidArgumentError("give either partition or partitioner, not both", stream=stream)
        if partition is None:
            partition = partitioner(stream, key, value, count) if partitioner is not None else 0
        return build.check_partition(partition, count, stream)

    def publish_to_subject(
        self,
        subject: str,
        value: bytes,
        *,
        key: bytes | None = None,
        headers: Mapping[str, bytes] | None = None,
        ack_policy: AckPolicy | str = AckPolicy.LEADER,
        timeout: float | None = None,
    ) -> Ack | None:
        """Publish to a NATS subject; every stream attached to it stores the message.

        Returns the first ack (None with ack policy NONE). Its ``partition`` is -1:
        the subject alone does not say which stream partition stored it.
        """
        check_timeout("timeout", timeout)
        policy = AckPolicy.parse(ack_policy)
        request = api.PublishToSubjectRequest(
            subject=build.check_subject(subject),
            value=build.check_bytes(value, "value"),
            key=b"" if key is None else build.check_bytes(key, "key"),
            headers=build.check_headers(headers),
            ackPolicy=policy.value,
        )

        try:
            response = self._send_once("PublishToSubject", request, timeout, None, None)
        except MessageTooLargeError as exc:
            raise exc.with_size(request.ByteSize()) from exc
        if policy == AckPolicy.NONE or not response.HasField("ack"):
            return None
        return Ack(response.ack, -1)

    def _send_once(
        self, method: str, request: Any, timeout: float | None, stream: str | None, partition: int | None
    ) -> Any:
        """Send a publish to one broker: re-sent elsewhere only if it could not connect (nothing was sent)."""

        def attempt(pooled: PooledChannel, remaining: float) -> Any:
            if not pooled.wait_ready(min(remaining, 2.0)):
                raise _NotConnected()
            try:
                return getattr(pooled.stub, method)(request, timeout=remaining)
            except grpc.RpcError as exc:
                pooled.connected = exc.code() != grpc.StatusCode.UNAVAILABLE
                raise _after_send_error(exc, stream, partition) from exc

        return self._router.call_any(attempt, timeout=timeout, stream=stream)

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
        resubscribe_wait: float | None = None,
    ) -> Subscription:
        """Subscribe to one partition; iterate the returned Subscription for messages.

        ``start`` defaults to new messages only; ``stop`` to none (runs until
        cancelled). ``read_isr_replica`` reads from any in-sync replica
        (default ``config.read_isr_replica``). ``resume`` resumes a paused
        partition. ``timeout`` (seconds) makes iteration raise
        LiftbridgeTimeoutError when it expires. The partition is checked
        against the stream's metadata before subscribing.
        """
        check_timeout("timeout", timeout)
        check_timeout("resubscribe_wait", resubscribe_wait)
        build.check_flag(resume, "resume")
        if read_isr_replica is not None:
            build.check_flag(read_isr_replica, "read_isr_replica")
        count = self._router.partition_count(build.check_stream_name(stream))
        build.check_partition(partition, count, stream)
        replica = self.config.read_isr_replica if read_isr_replica is None else read_isr_replica
        request = build.subscribe_request(
            stream, partition, start or StartPosition.new_only(), stop, read_isr_replica=replica, resume=resume
        )
        return Subscription(
            self._router,
            request,
            stop_offset=stop.offset if stop is not None and stop.kind == api.STOP_OFFSET else None,
            timeout=timeout,
            resubscribe_wait=resubscribe_wait if resubscribe_wait is not None else self.config.resubscribe_wait,
        )

    def read_range(
        self,
        stream: str,
        partition: int,
        start: int,
        end: int,
        *,
        beyond_high_watermark: BeyondHighWatermark = "refuse",
        timeout: float | None = None,
        read_isr_replica: bool | None = None,
        resume: bool = False,
    ) -> Iterator[Message]:
        """Messages with ``start <= offset < end`` of one partition, in order.

        When ``end - 1`` is beyond the committed high watermark:
        ``"refuse"`` (default) raises InvalidArgumentError before reading,
        ``"wait"`` waits for the missing messages (``timeout`` bounds the whole
        read; LiftbridgeTimeoutError when it expires), ``"truncate"`` reads up
        to the high watermark (nothing at all if ``start`` is beyond it).
        Offsets removed by compaction are simply absent. A paused partition
        raises PartitionPausedError unless ``resume`` is true.
        """
        check_timeout("timeout", timeout)
        build.check_flag(resume, "resume")
        if read_isr_replica is not None:
            build.check_flag(read_isr_replica, "read_isr_replica")
        build.check_stream_name(stream)
        build.check_offset(start, "start")
        build.check_offset(end, "end")
        if end < start:
            raise InvalidArgumentError(f"range end {end} is before start {start}", stream=stream, partition=partition)
        if beyond_high_watermark not in ("refuse", "wait", "truncate"):
            raise InvalidArgumentError(
                f"beyond_high_watermark must be 'refuse', 'wait' or 'truncate', got {beyond_high_watermark!r}"
            )
        if start == end:
            return iter(())
        if resume:
            self._resume(stream, partition)
        last = end - 1
        if beyond_high_watermark != "wait":
            high_watermark = self.fetch_partition_metadata(stream, partition).high_watermark
            if last > high_watermark and beyond_high_watermark == "refuse":
                raise InvalidArgumentError(
                    f"range [{start}, {end}) goes beyond the high watermark {high_watermark}",
                    stream=stream,
                    partition=partition,
                )
            last = min(last, high_watermark)
            if start > last:
                return iter(())
        subscription = self.subscribe(
            stream,
            partition=partition,
            start=StartPosition.at_offset(start),
            stop=StopPosition.at_offset(last),
            read_isr_replica=read_isr_replica,
            resume=resume,
            timeout=timeout,
        )
        return _closing(subscription)

    def _resume(self, stream: str, partition: int) -> None:
        """Resume a paused partition (a no-op otherwise): subscribe with resume, wait for the handshake, cancel."""
        request = api.SubscribeRequest(stream=stream, partition=partition, startPosition=api.NEW_ONLY, resume=True)

        def attempt(pooled: PooledChannel, remaining: float) -> None:
            call = pooled.stub.Subscribe(request, timeout=remaining)
            try:
                next(call)
            finally:
                call.cancel()

        self._router.call_leader(stream, partition, attempt)

    def earliest_offset(
        self, stream: str, partition: int = 0, *, timeout: float | None = None, probe: float = 2.0
    ) -> int | None:
        """The oldest offset still stored (retention and compaction remove older ones); None if the
        partition never held a message.

        Reads the first message from the earliest position up to the leader's high
        watermark. Committed messages are readable at once, so when that read
        stays silent for ``probe`` seconds (default 2) retention has removed every
        message, and the answer is high watermark + 1 (the next offset to be written).
        """
        check_timeout("timeout", timeout)
        check_seconds("probe", probe)
        info = self.fetch_partition_metadata(stream, partition, timeout=timeout)
        if info.high_watermark < 0:
            return None
        subscription = self.subscribe(
            stream,
            partition=partition,
            start=StartPosition.earliest(),
            stop=StopPosition.at_offset(info.high_watermark),
            timeout=probe,
        )
        try:
            with subscription:
                first = next(subscription, None)
        except LiftbridgeTimeoutError:
            first = None
        if first is None:
            log.warning("%s/%d: no message retained up to offset %d", stream, partition, info.high_watermark)
            return info.high_watermark + 1
        return first.offset

    # -- cursors ---------------------------------------------------------------

    def set_cursor(
        self, cursor_id: str, stream: str, partition: int, offset: int, *, timeout: float | None = None
    ) -> None:
        """Store ``offset`` (by convention the last processed offset; -1: none) for the cursor.

        Raises NoSuchStreamError / NoSuchPartitionError for a partition that does not exist,
        CursorsDisabledError when the server keeps no cursors.
        """
        check_timeout("timeout", timeout)
        request = build.set_cursor_request(cursor_id, stream, partition, offset)
        self._check_cursor_target(stream, partition)
        self._cursor_call("SetCursor", request, timeout)

    def fetch_cursor(self, cursor_id: str, stream: str, partition: int, *, timeout: float | None = None) -> int:
        """The cursor's stored offset, or -1 if it was never set (errors as for :meth:`set_cursor`)."""
        check_timeout("timeout", timeout)
        request = build.fetch_cursor_request(cursor_id, stream, partition)
        self._check_cursor_target(stream, partition)
        response: api.FetchCursorResponse = self._cursor_call("FetchCursor", request, timeout)
        return response.offset

    def _check_cursor_target(self, stream: str, partition: int) -> None:
        """Cursors are enabled and the partition exists (metadata refreshed once if unknown)."""
        snapshot = self._router.metadata.get()
        if not build.knows_cursor_target(snapshot, stream, partition):
            snapshot = self._router.metadata.refresh()
        build.check_cursor_target(snapshot, stream, partition)

    def _cursor_call(self, method: str, request: Any, timeout: float | None) -> Any:
        cursors = self._router.partition_count(build.CURSORS_STREAM)
        target = build.cursor_partition(request.cursorId, request.stream, request.partition, cursors)

        def attempt(pooled: PooledChannel, remaining: float) -> Any:
            return getattr(pooled.stub, method)(request, timeout=remaining)

        try:
            return self._router.call_leader(build.CURSORS_STREAM, target, attempt, timeout=timeout)
        except LiftbridgeError as exc:
            exc.stream, exc.partition = request.stream, request.partition
            raise

    # -- plumbing --------------------------------------------------------------

    def _unary(self, method: str, request: Any, *, timeout: float | None, stream: str | None) -> Any:
        def attempt(pooled: PooledChannel, remaining: float) -> Any:
            return getattr(pooled.stub, method)(request, timeout=remaining)

        return self._router.call_any(attempt, timeout=timeout, stream=stream)


def _after_send_error(exc: grpc.RpcError, stream: str | None, partition: int | None) -> Exception:
    """A publish failed after it was sent: never retried, since it may have been stored."""
    code = exc.code()
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return AckTimeoutError(
            "no ack before the deadline; the message may have been stored",
            stream=stream,
            partition=partition,
            code=code,
            may_be_stored=True,
        )
    if code == grpc.StatusCode.UNAVAILABLE:
        return UnavailableError(
            f"connection lost during publish ({exc.details()}); the message may have been stored",
            stream=stream,
            partition=partition,
            code=code,
            may_be_stored=True,
        )
    return error_from_rpc(exc, stream=stream, partition=partition)


def _sized(failure: PublishFailure, requests: Sequence[api.PublishRequest]) -> PublishFailure:
    """A too-large failure names the message's size."""
    if isinstance(failure.error, MessageTooLargeError) and failure.error.size is None:
        return PublishFailure(failure.index, failure.error.with_size(requests[failure.index].ByteSize()))
    return failure


def _closing(subscription: Subscription) -> Iterator[Message]:
    """The subscription's messages; the subscription is cancelled when iteration ends or stops early."""
    with subscription:
        yield from subscription
