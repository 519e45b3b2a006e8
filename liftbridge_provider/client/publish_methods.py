"""The sync client's publishing methods: what a caller gets from each way of publishing.

:class:`~liftbridge_provider.client.client.LiftbridgeClient` takes them in;
each hands its arguments to the client's
:class:`~liftbridge_provider.client.publish.paths.PublishPaths`, which checks
them and picks the way the message goes out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from liftbridge_provider.client.messages import Ack, AckPolicy
from liftbridge_provider.client.partitioners import Partitioner, PartitionerName
from liftbridge_provider.client.publish.batch_result import BatchResult
from liftbridge_provider.client.publish.paths import PublishPaths
from liftbridge_provider.client.publish.prepare import PublishMessage


class PublishMethods:
    """``publish``, ``publish_batch`` and ``publish_to_subject`` of :class:`LiftbridgeClient`."""

    _publishing: PublishPaths

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
        bounds the whole call (default ``request_timeout``): the stream's partition count, when the cache
        does not know it, and the wait for the ack; an expired ack wait raises AckTimeoutError, a deadline
        spent before sending LiftbridgeTimeoutError (nothing sent). A publish that may have reached the server
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
        return self._publishing.publish(
            stream,
            value,
            key=key,
            headers=headers,
            partition=partition,
            partitioner=partitioner,
            ack_policy=ack_policy,
            expected_offset=expected_offset,
            ack_inbox=ack_inbox,
            correlation_id=correlation_id,
            timeout=timeout,
        )

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
        A message is re-sent only when the server said it stored nothing for a reason that passes (a
        metadata leader change; NOT_FOUND while fresh metadata lists the stream), never once it may be stored
        (see ``may_be_stored`` and docs/client.md). ``partition``
        sends every message to that partition (as :meth:`publish`); else
        ``partitioner``, a callable or ``"key"`` / ``"round_robin"``, chooses for
        each message without a ``partition`` of its own (default: partition 0).
        """
        return self._publishing.publish_batch(
            stream,
            messages,
            partition=partition,
            partitioner=partitioner,
            ack_policy=ack_policy,
            window=window,
            ack_wait=ack_wait,
            timeout=timeout,
            raise_on_error=raise_on_error,
        )

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
        return self._publishing.publish_to_subject(
            subject, value, key=key, headers=headers, ack_policy=ack_policy, timeout=timeout
        )
