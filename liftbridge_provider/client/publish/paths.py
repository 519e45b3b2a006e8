"""PublishPaths: every way a message leaves the client, behind one face.

:class:`~liftbridge_provider.client.client.LiftbridgeClient` makes one with
its config, connection pool and router; its ``publish``, ``publish_batch``
and ``publish_to_subject`` (whose docstrings say what callers get) delegate
here. The face checks the arguments, builds the requests
(:mod:`~liftbridge_provider.client.publish.prepare`) and picks the path:

- ``publish``: a unary Publish (:func:`~liftbridge_provider.client.publish.plans.send_once`)
  with ack policy NONE, a TLS client certificate, an ack inbox, a
  correlation id or a request over :data:`SHARED_STREAM_MAX_BYTES`; otherwise the shared PublishAsync streams
  (:func:`~liftbridge_provider.client.publish.plans.on_shared_streams` over
  ``publish_stream.py``);
- ``publish_batch``: NATS when the client has a NATS config
  (``nats_publisher.py``), otherwise the pipelined HTTP/2 call (``publisher.py``);
- ``publish_to_subject``: a unary PublishToSubject, sent once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from typing import Any

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client import partition_plans, plans
from liftbridge_provider.client import requests as build
from liftbridge_provider.client.connections import ConnectionPool
from liftbridge_provider.client.errors import MessageTooLargeError, ReadonlyPartitionError
from liftbridge_provider.client.messages import Ack, AckPolicy
from liftbridge_provider.client.metadata import PartitionInfo
from liftbridge_provider.client.options import ClientConfig
from liftbridge_provider.client.partitioners import Partitioner, PartitionerName, resolve_partitioner
from liftbridge_provider.client.publish import plans as publish_plans
from liftbridge_provider.client.publish.batch_result import BatchResult, Failures
from liftbridge_provider.client.publish.dropping import drop_in_background
from liftbridge_provider.client.publish.nats_publisher import NatsBatchPublisher, partition_subject
from liftbridge_provider.client.publish.prepare import (
    PreparedTooLong,
    PublishMessage,
    batch_requests,
    choose_partition,
    sized,
    to_partition,
)
from liftbridge_provider.client.publish.publish_stream import PublishStreams
from liftbridge_provider.client.publish.publisher import BatchPublisher, async_error
from liftbridge_provider.client.retry import Deadline
from liftbridge_provider.client.routing import Router
from liftbridge_provider.core import checks
from liftbridge_provider.core.checks import check_timeout
from liftbridge_provider.core.errors import InvalidArgumentError, LiftbridgeError

SHARED_STREAM_MAX_BYTES = 4 * 1024 * 1024
"""Largest request (bytes) a publish sends on the shared PublishAsync streams: grpc-go's default receive limit,
which the Liftbridge server keeps. A larger one ends the whole call, and with it the publishes of every other
caller waiting on the stream; it goes as a unary Publish instead, whose refusal is its own."""


class PublishPaths:
    """The client's ways of sending (see the module's docstring); ``shared_streams`` are the PublishAsync
    streams of single publishes, one per broker, closed by :meth:`close`."""

    def __init__(self, config: ClientConfig, pool: ConnectionPool, router: Router) -> None:
        self.config = config
        self._router = router
        self.shared_streams = PublishStreams(pool, idle_close=config.keep_alive_time)

    def close(self) -> None:
        """Close the shared streams (a publish still waiting for its ack fails as may-be-stored)."""
        self.shared_streams.close()

    def publish(
        self,
        stream: str,
        value: bytes,
        *,
        key: bytes | None,
        headers: Mapping[str, bytes] | None,
        partition: int | None,
        partitioner: Partitioner | PartitionerName | None,
        ack_policy: AckPolicy | str,
        expected_offset: int | None,
        ack_inbox: str | None,
        correlation_id: str | None,
        timeout: float | None,
    ) -> Ack | None:
        """One message, its ack awaited (as :meth:`LiftbridgeClient.publish`)."""
        check_timeout("timeout", timeout)
        policy = AckPolicy.parse(ack_policy)
        if correlation_id is not None and (
            not isinstance(correlation_id, str) or not correlation_id or not checks.is_utf8(correlation_id)
        ):
            raise InvalidArgumentError(f"correlation_id must be a non-empty string (UTF-8), got {correlation_id!r}")
        chooser = resolve_partitioner(partitioner)
        if partition is not None:
            checks.check_partition(partition, stream=stream)
        # every check that needs no cluster first: bad input fails at once, even with no broker reachable
        request = build.publish_request(
            build.check_not_reserved(checks.check_stream_name(stream), "publish to"),
            value,
            partition=0,
            key=key,
            headers=headers,
            ack_policy=policy,
            expected_offset=expected_offset,
            correlation_id=correlation_id or "",
            ack_inbox=ack_inbox or "",
        )
        size = request.ByteSize()
        if size > self.config.max_message_bytes:  # gRPC would refuse it on the way out, ending a shared stream
            too_large = MessageTooLargeError(
                f"message of {size} bytes is over the client's max_message_bytes ({self.config.max_message_bytes}); "
                "nothing was sent",
                stream=stream,
            )
            too_large.size = size
            raise too_large
        deadline = self._router.deadline(timeout)  # one for the whole call, the partition lookup included
        chosen = choose_partition(
            self._router,
            stream,
            key,
            value,
            partition=partition,
            partitioner=chooser,
            timeout=deadline.left("publish", stream=stream),
        )
        request.partition = chosen

        try:
            unary = size > SHARED_STREAM_MAX_BYTES or policy == AckPolicy.NONE or self._may_be_authorized()
            if unary or ack_inbox or correlation_id:
                response = self._send_once(
                    "Publish", request, deadline.left("publish", stream=stream, partition=chosen), stream, chosen
                )
                return None if policy == AckPolicy.NONE or not response.HasField("ack") else Ack(response.ack, chosen)
            response = self._on_shared_streams(request, deadline.left("publish", stream=stream, partition=chosen))
            if response.HasField("asyncError"):
                raise async_error(response, stream, chosen)
        except MessageTooLargeError as exc:
            raise exc.with_size(request.ByteSize()) from exc
        return Ack(response.ack, chosen)

    def publish_batch(
        self,
        stream: str,
        messages: Iterable[PublishMessage | bytes],
        *,
        partition: int | None,
        partitioner: Partitioner | PartitionerName | None,
        ack_policy: AckPolicy | str,
        window: int,
        ack_wait: float | None,
        timeout: float | None,
        raise_on_error: bool,
    ) -> BatchResult:
        """Many messages, pipelined, acks in input order (as :meth:`LiftbridgeClient.publish_batch`)."""
        check_timeout("ack_wait", ack_wait)
        check_timeout("timeout", timeout)
        checks.check_flag(raise_on_error, "raise_on_error")
        checks.check_batch_messages(messages)
        chooser = resolve_partitioner(partitioner)
        if partition is not None:
            if chooser is not None:
                raise InvalidArgumentError("give either partition or partitioner, not both", stream=stream)
            chooser = to_partition(checks.check_offset(partition, "partition"))
        policy = AckPolicy.parse(ack_policy)
        if not isinstance(window, int) or isinstance(window, bool) or window < 1:
            raise InvalidArgumentError(f"window must be a whole number >= 1, got {window!r}")
        deadline = Deadline(timeout) if timeout is not None else None
        over_grpc = self.config.nats is None
        limit = min(self.config.max_message_bytes, SHARED_STREAM_MAX_BYTES) if over_grpc else None
        too_large: dict[int, int] = {}
        try:
            requests = batch_requests(
                self._router,
                stream,
                messages,
                chooser,
                policy=policy,
                deadline=deadline,
                size_limit=limit,
                too_large=too_large,
            )
        except PreparedTooLong as late:
            result = late.result(stream, timeout or 0.0)
        else:
            if not requests:
                return BatchResult([])
            wait = ack_wait if ack_wait is not None else self.config.ack_wait
            if not over_grpc:
                result = self._over_nats(stream, requests, window=window, ack_wait=wait, deadline=deadline)
            else:
                refused = {i: self._too_large(size, stream, requests[i].partition) for i, size in too_large.items()}
                publisher = BatchPublisher(
                    self._router, requests, window=window, ack_wait=wait, deadline=deadline, refused=refused
                )
                result = publisher.run()
            if isinstance(result.failures, Failures):
                result.failures = result.failures.with_listed(partial(sized, requests=requests))
            drop_in_background(requests)
        if raise_on_error:
            result.raise_for_failures()
        return result

    def publish_to_subject(
        self,
        subject: str,
        value: bytes,
        *,
        key: bytes | None,
        headers: Mapping[str, bytes] | None,
        ack_policy: AckPolicy | str,
        timeout: float | None,
    ) -> Ack | None:
        """One message to a NATS subject, the first ack awaited (as :meth:`LiftbridgeClient.publish_to_subject`)."""
        check_timeout("timeout", timeout)
        policy = AckPolicy.parse(ack_policy)
        checks.check_subject(subject)
        deadline = self._router.deadline(timeout)  # one deadline for the metadata a fresh client fetches and the send
        known = self._router.with_any_stream(deadline)
        request = api.PublishToSubjectRequest(
            subject=build.check_not_reserved_subject(subject, known, "publish to"),
            value=checks.check_bytes(value, "value"),
            key=b"" if key is None else checks.check_bytes(key, "key"),
            headers=checks.check_headers(headers),
            ackPolicy=policy.value,
        )

        try:
            response = self._send_once("PublishToSubject", request, deadline.left("publish_to_subject"), None, None)
        except MessageTooLargeError as exc:
            raise exc.with_size(request.ByteSize()) from exc
        if policy == AckPolicy.NONE or not response.HasField("ack"):
            return None
        return Ack(response.ack, -1)

    def _too_large(self, size: int, stream: str, partition: int | None) -> MessageTooLargeError:
        """A message refused before sending: over the client's ``max_message_bytes`` or the server's gRPC limit."""
        limit = min(self.config.max_message_bytes, SHARED_STREAM_MAX_BYTES)
        whose = (
            "the client's max_message_bytes" if limit == self.config.max_message_bytes else "the server's gRPC limit"
        )
        error = MessageTooLargeError(
            f"message of {size} bytes is over {whose} ({limit} bytes); nothing was sent",
            stream=stream,
            partition=partition,
        )
        error.size = size
        return error

    def _may_be_authorized(self) -> bool:
        """A client certificate is given, so the server may check authorization (it needs one to name the
        client): unary Publish then, since v1.9.0 stores a message PublishAsync was denied (docs/tls.md)."""
        return self.config.tls is not None and self.config.tls.cert is not None

    def _send_once(
        self, method: str, request: Any, timeout: float | None, stream: str | None, partition: int | None
    ) -> Any:
        """Send a publish to one broker: re-sent elsewhere only if it could not connect (nothing was sent)."""

        def send(stub: Any, remaining: float) -> Any:
            return getattr(stub, method)(request, timeout=remaining)

        deadline = self._router.deadline(timeout)
        snapshot = self._router.metadata.snapshot
        return self._router.run(
            publish_plans.send_once(self.config, snapshot, send, deadline, stream=stream, partition=partition)
        )

    def _on_shared_streams(self, request: api.PublishRequest, timeout: float | None) -> api.PublishResponse:
        """Publish on a broker's shared PublishAsync stream; brokers that do not connect are tried again, with
        backoff, until ``timeout`` (seconds, default ``request_timeout``; see ``plans.on_shared_streams``)."""
        request.correlationId = self.shared_streams.next_correlation_id()
        deadline = self._router.deadline(timeout)

        def send(addresses: Sequence[str]) -> api.PublishResponse:
            return self.shared_streams.publish(addresses, request, deadline.end)

        response: api.PublishResponse = self._router.run(
            publish_plans.on_shared_streams(send, deadline, stream=request.stream, partition=request.partition)
        )
        return response

    def _over_nats(
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
        router = self._router
        fresh = plans.knowing(router.deadline(None if deadline is None else deadline.remaining()),
                              router.metadata.snapshot, stream, fresh=True)  # fmt: skip
        info = router.run(fresh).stream(stream)
        used = sorted({request.partition for request in requests})
        blocked = {partition: self._ready_for_nats(info.partition(partition), deadline) for partition in used}
        refused = {
            index: error for index, request in enumerate(requests) if (error := blocked[request.partition]) is not None
        }
        subjects = {partition: partition_subject(info.subject, partition) for partition in used}
        publisher = NatsBatchPublisher(
            self.config.nats, requests, subjects, window=window, ack_wait=ack_wait, deadline=deadline, refused=refused
        )
        pool = self._router.pool
        return publisher.run(closed=lambda: pool.closed)

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
        resume = partition_plans.resume_rpc(stream, partition)
        snapshot = self._router.metadata.snapshot
        try:
            self._router.run(
                plans.leader_call(self.config, snapshot, resume, budget, stream=stream, partition=partition)
            )
        except LiftbridgeError as exc:
            message = f"could not resume the paused partition: {exc.message}; nothing was sent"
            return type(exc)(message, stream=stream, partition=partition, code=exc.code)
        return None
