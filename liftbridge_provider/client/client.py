"""LiftbridgeClient: the thread-safe synchronous client."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence, Sized
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from types import TracebackType
from typing import Any, Literal

import grpc

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client import cursor_advance, offset_lookup, plans, watermarks
from liftbridge_provider.client import requests as build
from liftbridge_provider.client.activity import ACTIVITY_STREAM, ActivityEvent, decode_activity
from liftbridge_provider.client.connections import ConnectionPool
from liftbridge_provider.client.consumer import AutoOffset, Consumer
from liftbridge_provider.client.cursor_advance import CursorMove
from liftbridge_provider.client.errors import (
    AckTimeoutError,
    BeyondHighWatermarkError,
    MessageTooLargeError,
    ReadonlyPartitionError,
    UnavailableError,
)
from liftbridge_provider.client.messages import Ack, AckPolicy, Message, StartPosition, StopPosition
from liftbridge_provider.client.metadata import Metadata, PartitionInfo, StreamInfo
from liftbridge_provider.client.nats_publisher import NatsBatchPublisher, partition_subject
from liftbridge_provider.client.options import ClientConfig, check_seconds, check_timeout
from liftbridge_provider.client.partitioners import Partitioner, PartitionerName, resolve_partitioner
from liftbridge_provider.client.plans import NotSent
from liftbridge_provider.client.publish_stream import PublishStreams
from liftbridge_provider.client.publish_window import BatchResult, Failures, PublishFailure
from liftbridge_provider.client.publisher import BatchPublisher, async_error
from liftbridge_provider.client.reading import SubscriptionState
from liftbridge_provider.client.retry import Deadline, backoff_delay
from liftbridge_provider.client.routing import Router
from liftbridge_provider.client.subscription import Subscription
from liftbridge_provider.core import checks
from liftbridge_provider.core.errors import InvalidArgumentError, LiftbridgeError

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


class _PreparedTooLong(Exception):
    """The batch deadline passed while the messages were checked: nothing was sent."""

    def __init__(self, count: int) -> None:
        self.count = count

    def result(self, stream: str, timeout: float) -> BatchResult:
        error = AckTimeoutError(
            f"not sent: the batch deadline ({timeout:g}s) passed while the messages were checked", stream=stream
        )
        return BatchResult([None] * self.count, Failures(size=self.count, unsent_error=error))


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
        self._publish_streams = PublishStreams(self._pool, idle_close=self.config.keep_alive_time)

    # -- lifecycle -------------------------------------------------------------

    def close(self) -> None:
        """Close every channel. Idempotent; the client cannot be used afterwards."""
        self._publish_streams.close()
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
        self, stream: str, partition: int = 0, *, timeout: float | None = None, settle: bool = True
    ) -> PartitionInfo:
        """Authoritative partition metadata (high watermark, newest offset, ISR), from the leader.

        A paused partition answers too, without being resumed: its high watermark
        cannot move while it is paused, and the leader's metadata view gives it.
        One exception, when ``settle`` is on (default): a partition that paused
        while its leader held offsets above the high watermark (right after a
        failover) would hide them until it runs again, so it is resumed and the
        call waits up to 5 s, within ``timeout``, for the leader to commit them.
        """
        check_timeout("timeout", timeout)
        build.partition_metadata_request(stream, partition)
        return self._router.partition_metadata(stream, partition, timeout=timeout, settle=settle)

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

        def create(stub: Any, remaining: float) -> Any:
            return stub.CreateStream(request, timeout=remaining)

        ours = plans.stream_created_as(request.subject, request.partitions, self.config, deadline, name)
        snapshot = self._router.metadata.snapshot
        self._router.run(plans.ambiguous_admin(self.config, snapshot, create, deadline, stream=name, already_done=ours))
        self._router.metadata.refresh(timeout=max(deadline.remaining(), 0.001))

    def delete_stream(self, name: str, *, timeout: float | None = None) -> None:
        """Delete a stream and its data. Raises NoSuchStreamError if there is none.

        If the answer to a delete is lost after sending, the delete is sent again;
        a NotFound then means the first one did it, and the call succeeds.
        """
        check_timeout("timeout", timeout)
        request = api.DeleteStreamRequest(name=checks.check_stream_name(name))
        deadline = self._router.deadline(timeout)

        def delete(stub: Any, remaining: float) -> Any:
            return stub.DeleteStream(request, timeout=remaining)

        snapshot = self._router.metadata.snapshot
        self._router.run(
            plans.ambiguous_admin(self.config, snapshot, delete, deadline, stream=name, already_done=plans.stream_gone)
        )
        self._router.metadata.refresh(timeout=max(deadline.remaining(), 0.001))

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
        checks.check_flag(readonly, "readonly")
        ids = self._partition_list(name, partitions)
        if ids == []:
            return
        request = api.SetStreamReadonlyRequest(name=name, partitions=ids or [], readonly=readonly)
        self._unary("SetStreamReadonly", request, timeout=timeout, stream=name)

    def _partition_list(self, name: str, partitions: Iterable[int] | None) -> list[int] | None:
        checks.check_stream_name(name)
        if partitions is None:
            return None
        return checks.check_partition_selection(partitions, self._router.partition_count(name), name)

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
        ack_inbox: str | None = None,
        correlation_id: str | None = None,
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

        The message rides a PublishAsync stream per broker that every publish of
        this client shares (as go-liftbridge's Publish; no call is set up per
        message, so the ack comes sooner than a unary call's). With ack policy
        NONE, or with a TLS client certificate (the server may then check
        authorization, and v1.9.0 stores a message PublishAsync was denied), it
        is one unary Publish call instead.

        ``ack_inbox`` (a NATS subject) and ``correlation_id`` are go-liftbridge's
        ``AckInbox`` and ``CorrelationID``: the server publishes the ack to that
        inbox, carrying that id, for whoever listens there (the call still waits
        for it and returns it). With either the message goes by a unary Publish:
        the server ignores a client's inbox on PublishAsync.
        """
        check_timeout("timeout", timeout)
        policy = AckPolicy.parse(ack_policy)
        if correlation_id is not None and (not isinstance(correlation_id, str) or not correlation_id):
            raise InvalidArgumentError(f"correlation_id must be a non-empty string, got {correlation_id!r}")
        chosen = self._choose_partition(stream, key, value, partition, resolve_partitioner(partitioner))
        request = build.publish_request(
            stream,
            value,
            partition=chosen,
            key=key,
            headers=headers,
            ack_policy=policy,
            expected_offset=expected_offset,
            correlation_id=correlation_id or "",
            ack_inbox=ack_inbox or "",
        )

        try:
            if policy == AckPolicy.NONE or self._may_be_authorized() or ack_inbox or correlation_id:
                response = self._send_once("Publish", request, timeout, stream, chosen)
                return None if policy == AckPolicy.NONE or not response.HasField("ack") else Ack(response.ack, chosen)
            response = self._publish_on_stream(request, timeout)
            if response.HasField("asyncError"):
                raise async_error(response, stream, chosen)
        except MessageTooLargeError as exc:
            raise exc.with_size(request.ByteSize()) from exc
        return Ack(response.ack, chosen)

    def _may_be_authorized(self) -> bool:
        """A client certificate is given, so the server may check authorization (it needs one to name the
        client): unary Publish then, since v1.9.0 stores a message PublishAsync was denied (docs/tls.md)."""
        return self.config.tls is not None and self.config.tls.cert is not None

    def _publish_on_stream(self, request: api.PublishRequest, timeout: float | None) -> api.PublishResponse:
        """Publish on a broker's shared PublishAsync stream (see ``publish_stream.py``); brokers that do not
        connect are tried again, with backoff, until ``timeout`` (nothing was sent to them)."""
        request.correlationId = self._publish_streams.next_correlation_id()
        seconds = timeout if timeout is not None else self.config.request_timeout
        deadline = time.monotonic() + seconds
        attempt = 0
        while True:
            try:
                return self._publish_streams.publish(self._router.broker_addresses(), request, deadline)
            except NotSent as exc:
                attempt += 1
                pause = backoff_delay(attempt)
                if time.monotonic() + pause >= deadline:
                    raise UnavailableError(
                        f"no broker connected within {seconds:g}s ({exc.details()}); nothing was sent",
                        stream=request.stream,
                        partition=request.partition,
                        code=grpc.StatusCode.UNAVAILABLE,
                    ) from exc
                time.sleep(pause)

    def publish_batch(
        self,
        stream: str,
        messages: Iterable[PublishMessage | bytes],
        *,
        partition: int | None = None,
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
        Messages are never re-sent automatically (see ``may_be_stored``). ``partition``
        sends every message to that partition (as :meth:`publish`); else
        ``partitioner``, a callable or ``"key"`` / ``"round_robin"``, chooses for
        each message without a ``partition`` of its own (default: partition 0).
        """
        check_timeout("ack_wait", ack_wait)
        check_timeout("timeout", timeout)
        checks.check_flag(raise_on_error, "raise_on_error")
        checks.check_batch_messages(messages)
        chooser = resolve_partitioner(partitioner)
        if partition is not None:
            if chooser is not None:
                raise InvalidArgumentError("give either partition or partitioner, not both", stream=stream)
            chooser = _to_partition(checks.check_offset(partition, "partition"))
        policy = AckPolicy.parse(ack_policy)
        if not isinstance(window, int) or isinstance(window, bool) or window < 1:
            raise InvalidArgumentError(f"window must be a whole number >= 1, got {window!r}")
        deadline = Deadline(timeout) if timeout is not None else None
        try:
            requests = self._batch_requests(stream, messages, chooser, policy, deadline)
        except _PreparedTooLong as late:
            result = late.result(stream, timeout or 0.0)
        else:
            if not requests:
                return BatchResult([])
            wait = ack_wait if ack_wait is not None else self.config.ack_wait
            if self.config.nats is not None:
                result = self._publish_over_nats(stream, requests, window=window, ack_wait=wait, deadline=deadline)
            else:
                publisher = BatchPublisher(self._router, requests, window=window, ack_wait=wait, deadline=deadline)
                result = publisher.run()
            if isinstance(result.failures, Failures):
                result.failures = result.failures.with_listed(partial(_sized, requests=requests))
        if raise_on_error:
            result.raise_for_failures()
        return result

    def _publish_over_nats(
        self,
        stream: str,
        requests: Sequence[api.PublishRequest],
        *,
        window: int,
        ack_wait: float,
        deadline: Deadline | None,
    ) -> BatchResult:
        """The NATS fast path: fresh metadata names each partition's subject; readonly partitions are refused
        and paused ones resumed before anything is sent, as the server's own publish does."""
        assert self.config.nats is not None
        budget = deadline.remaining() if deadline is not None else None
        info = self._router.metadata.refresh([stream], timeout=budget).stream(stream)
        used = sorted({request.partition for request in requests})
        blocked = {partition: self._ready_for_nats(info.partition(partition), deadline) for partition in used}
        refused = {
            index: error for index, request in enumerate(requests) if (error := blocked[request.partition]) is not None
        }
        subjects = {partition: partition_subject(info.subject, partition) for partition in used}
        publisher = NatsBatchPublisher(
            self.config.nats, requests, subjects, window=window, ack_wait=ack_wait, deadline=deadline, refused=refused
        )
        return publisher.run()

    def _ready_for_nats(self, info: PartitionInfo, deadline: Deadline | None) -> LiftbridgeError | None:
        """None when messages may go to the partition's subject; else why not (nothing is sent to it)."""
        stream, partition = info.stream, info.id
        if info.readonly:
            return ReadonlyPartitionError(
                "the partition is readonly: publishes are refused; nothing was sent", stream=stream, partition=partition
            )
        if not info.paused:
            return None
        # A paused partition does not listen on its subject; a resume subscription wakes it, as a gRPC publish would.
        budget = self._router.deadline(deadline.remaining() if deadline is not None else None)
        resume = plans.resume_rpc(stream, partition)
        snapshot = self._router.metadata.snapshot
        try:
            self._router.run(
                plans.leader_call(self.config, snapshot, resume, budget, stream=stream, partition=partition)
            )
        except LiftbridgeError as exc:
            message = f"could not resume the paused partition: {exc.message}; nothing was sent"
            return type(exc)(message, stream=stream, partition=partition, code=exc.code)
        return None

    def _batch_requests(
        self,
        stream: str,
        messages: Iterable[PublishMessage | bytes],
        partitioner: Partitioner | None,
        policy: AckPolicy,
        deadline: Deadline | None,
    ) -> list[api.PublishRequest]:
        """Every message checked and built, before anything is sent; _PreparedTooLong past the deadline."""
        count = self._router.partition_count(checks.check_stream_name(stream))
        requests = []
        items = iter(messages)
        plain = partial(api.PublishRequest, stream=stream, ackPolicy=policy.value, expectedOffset=-1)
        for index, item in enumerate(items):
            if deadline is not None and index % 1024 == 0 and deadline.expired:
                left = sum(1 for _ in items) if not isinstance(messages, Sized) else len(messages) - index - 1
                raise _PreparedTooLong(index + 1 + left)
            if type(item) is bytes and partitioner is None:  # a bare value for partition 0: nothing else to check
                requests.append(plain(value=item, correlationId=str(index)))
                continue
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
        count = self._router.partition_count(checks.check_stream_name(stream))
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
        return checks.check_partition(partition, count, stream)

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
            subject=checks.check_subject(subject),
            value=checks.check_bytes(value, "value"),
            key=b"" if key is None else checks.check_bytes(key, "key"),
            headers=checks.check_headers(headers),
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

        def send(stub: Any, remaining: float) -> Any:
            return getattr(stub, method)(request, timeout=remaining)

        deadline = self._router.deadline(timeout)
        snapshot = self._router.metadata.snapshot
        return self._router.run(
            plans.send_once(self.config, snapshot, send, deadline, stream=stream, partition=partition)
        )

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
        checks.check_flag(resume, "resume")
        if read_isr_replica is not None:
            checks.check_flag(read_isr_replica, "read_isr_replica")
        count = self._router.partition_count(checks.check_stream_name(stream))
        checks.check_partition(partition, count, stream)
        replica = self.config.read_isr_replica if read_isr_replica is None else read_isr_replica
        request = build.subscribe_request(
            stream, partition, start or StartPosition.new_only(), stop, read_isr_replica=replica, resume=resume
        )
        return self._subscription(
            request, stop, timeout=timeout, idle_timeout=idle_timeout, resubscribe_wait=resubscribe_wait
        )

    def _subscription(
        self,
        request: api.SubscribeRequest,
        stop: StopPosition | None,
        *,
        timeout: float | None = None,
        idle_timeout: float | None = None,
        resubscribe_wait: float | None = None,
    ) -> Subscription:
        """A Subscription for a checked request (also a consumer group member's, with its ``consumer``)."""
        state = SubscriptionState(
            self.config,
            request,
            stop_offset=stop.offset if stop is not None and stop.kind == api.STOP_OFFSET else None,
            timeout=timeout,
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
        subscription = self.range_subscription(
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
        return iter(()) if subscription is None else _closing(subscription)

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
        check_timeout("timeout", timeout)
        check_timeout("idle_timeout", idle_timeout)
        checks.check_flag(resume, "resume")
        if read_isr_replica is not None:
            checks.check_flag(read_isr_replica, "read_isr_replica")
        checks.check_stream_name(stream)
        checks.check_offset(start, "start")
        checks.check_offset(end, "end")
        if end < start:
            raise InvalidArgumentError(f"range end {end} is before start {start}", stream=stream, partition=partition)
        if beyond_high_watermark not in ("refuse", "wait", "truncate"):
            raise InvalidArgumentError(
                f"beyond_high_watermark must be 'refuse', 'wait' or 'truncate', got {beyond_high_watermark!r}"
            )
        if start == end:
            return None
        deadline = Deadline(timeout) if timeout is not None else None
        last = end - 1
        if beyond_high_watermark != "wait":
            wait = max(deadline.remaining(), 0.001) if deadline is not None else self.config.request_timeout
            if beyond_high_watermark == "refuse":
                info = self.wait_for_commit(stream, partition, last, timeout=wait)
            else:
                info = self.fetch_partition_metadata(stream, partition)
            high_watermark = info.high_watermark
            if last > high_watermark and beyond_high_watermark == "refuse":
                raise BeyondHighWatermarkError(
                    f"range [{start}, {end}) goes beyond the committed high watermark {high_watermark}: "
                    f"{watermarks.why_not_committed(info, last, wait)} (retry later, or read with "
                    "beyond_high_watermark='wait')",
                    stream=stream,
                    partition=partition,
                )
            last = min(last, high_watermark)
            if start > last:
                return None
        return self.subscribe(
            stream,
            partition=partition,
            start=StartPosition.at_offset(start),
            stop=StopPosition.at_offset(last),
            read_isr_replica=read_isr_replica,
            resume=resume,
            timeout=deadline.remaining() if deadline is not None else None,
            idle_timeout=idle_timeout,
        )

    def wait_for_high_watermark(self, stream: str, partition: int, offset: int, *, timeout: float | None = None) -> int:
        """The leader's committed high watermark once it reaches ``offset``, or the last one seen when
        ``timeout`` (seconds, default ``request_timeout``, for every question asked) passes. Asked again
        with jittered 10-500 ms backoff, also for messages nobody has published yet; to wait only for a
        commit already on its way, use :meth:`wait_for_commit`."""
        check_timeout("timeout", timeout)
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
        response: api.FetchCursorResponse = self._cursor_call("FetchCursor", request, timeout, read=True)
        return response.offset

    def advance_cursor(
        self,
        cursor_id: str,
        stream: str,
        partition: int,
        offset: int,
        *,
        expected: int | None = None,
        verify: bool = False,
        timeout: float | None = None,
    ) -> CursorMove:
        """Move the cursor forward to ``offset``: the one cursor-advance rule (``client/cursor_advance.py``).

        Fetches the cursor, and sets it only when it is below ``offset`` and, with ``expected``, still
        where this writer last saw it; a cursor already at ``offset`` is left alone. Raises
        CursorMovedError (nothing written) when it is elsewhere or past ``offset``, and with ``verify``
        reads it back (CursorMovedError ``overwritten`` when another writer set it meanwhile). The whole
        move ends within ``timeout`` (seconds, default ``request_timeout``). Returns the decision taken.
        """
        moves = self.advance_cursors(
            cursor_id, stream, {partition: offset}, expected={partition: expected}, verify=verify, timeout=timeout
        )
        return moves[partition]

    def advance_cursors(
        self,
        cursor_id: str,
        stream: str,
        offsets: Mapping[int, int],
        *,
        expected: Mapping[int, int | None] | None = None,
        verify: bool = False,
        timeout: float | None = None,
    ) -> dict[int, CursorMove]:
        """:meth:`advance_cursor` for several partitions ``{partition: offset}`` at once: every partition is
        checked before any is written, and one that moved refuses the whole move."""
        check_timeout("timeout", timeout)
        plan = cursor_advance.advance(cursor_id, stream, offsets, expected, verify=verify)
        deadline = Deadline(timeout if timeout is not None else self.config.request_timeout)
        return cursor_advance.run(
            plan,
            lambda partition: self.fetch_cursor(cursor_id, stream, partition, timeout=_left(deadline)),
            lambda partition, offset: self.set_cursor(cursor_id, stream, partition, offset, timeout=_left(deadline)),
        )

    def _check_cursor_target(self, stream: str, partition: int) -> None:
        """Cursors are enabled and the partition exists (metadata refreshed once if unknown)."""
        snapshot = self._router.metadata.get()
        if not build.knows_cursor_target(snapshot, stream, partition):
            snapshot = self._router.metadata.refresh()
        build.check_cursor_target(snapshot, stream, partition)

    def _cursor_call(self, method: str, request: Any, timeout: float | None, *, read: bool = False) -> Any:
        cursors = self._router.partition_count(build.CURSORS_STREAM)
        target = build.cursor_partition(request.cursorId, request.stream, request.partition, cursors)

        def call(stub: Any, remaining: float) -> Any:
            return getattr(stub, method)(request, timeout=remaining)

        try:
            return self._router.cursor_call(target, call, timeout=timeout, read=read)
        except LiftbridgeError as exc:
            exc.stream, exc.partition = request.stream, request.partition
            raise

    # -- consumer groups -------------------------------------------------------

    def consumer(
        self,
        group_id: str,
        consumer_id: str | None = None,
        *,
        auto_checkpoint: float | None = 5.0,
        auto_offset: AutoOffset = "latest",
        fetch_assignments_interval: float | None = None,
        read: bool = True,
    ) -> Consumer:
        """A member of consumer group ``group_id`` (as go-liftbridge's ``CreateConsumer``); call its
        ``subscribe(streams)``, then iterate ``messages()``.

        The group's coordinator spreads the streams' partitions over its members,
        moving them as members join, leave or time out. Each partition is read
        from the group's committed position (cursor ``__group:<group_id>``), or,
        with none, from ``auto_offset``: ``"latest"`` (default, new messages only),
        ``"earliest"``, or ``"none"`` (an error). Processed offsets are
        checkpointed every ``auto_checkpoint`` seconds (default 5; None: only by
        ``checkpoint()``, before a partition moves, and on close). Assignments are
        fetched every ``fetch_assignments_interval`` seconds (default 0.4 x the
        server's consumer timeout); an unresponsive coordinator is reported. The
        server needs cursors (``cursors.stream.partitions`` > 0). ``read=False``:
        the member only follows its assignments and the caller reads them.
        """
        return Consumer(
            self,
            group_id,
            consumer_id,
            auto_checkpoint=auto_checkpoint,
            auto_offset=auto_offset,
            fetch_assignments_interval=fetch_assignments_interval,
            read=read,
        )

    def _group_call(self, method: str, request: Any, *, broker: str | None = None, timeout: float | None = None) -> Any:
        """A consumer group RPC: on any broker (join, leave, report), or on ``broker`` (the coordinator)."""

        def call(stub: Any, remaining: float) -> Any:
            return getattr(stub, method)(request, timeout=remaining)

        if broker is None:
            return self._router.call_any(call, timeout=timeout)
        return self._router.call_broker(broker, call, timeout=timeout)

    # -- plumbing --------------------------------------------------------------

    def _unary(self, method: str, request: Any, *, timeout: float | None, stream: str | None) -> Any:
        def call(stub: Any, remaining: float) -> Any:
            return getattr(stub, method)(request, timeout=remaining)

        return self._router.call_any(call, timeout=timeout, stream=stream)


def _to_partition(partition: int) -> Partitioner:
    """A partitioner that sends every message to ``partition`` (checked against the stream's count later)."""

    def chosen(stream: str, key: bytes | None, value: bytes, partitions: int) -> int:
        return partition

    return chosen


def _sized(failure: PublishFailure, requests: Sequence[api.PublishRequest]) -> PublishFailure:
    """A too-large failure names the message's size."""
    if isinstance(failure.error, MessageTooLargeError) and failure.error.size is None:
        return PublishFailure(failure.index, failure.error.with_size(requests[failure.index].ByteSize()))
    return failure


def _closing(subscription: Subscription) -> Iterator[Message]:
    """The subscription's messages; the subscription is cancelled when iteration ends or stops early."""
    with subscription:
        yield from subscription


def _left(deadline: Deadline) -> float:
    """Seconds left for the next call of a multi-call operation (a call given no time fails as timed out)."""
    return max(deadline.remaining(), 0.001)
