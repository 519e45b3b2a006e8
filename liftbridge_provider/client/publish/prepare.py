"""Messages checked and turned into requests before anything is sent: the partition each one goes to, a
batch's requests, and the size a too-large message's error names."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Sized
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client import requests as build
from liftbridge_provider.client.errors import AckTimeoutError, MessageTooLargeError
from liftbridge_provider.client.messages import AckPolicy
from liftbridge_provider.client.partitioners import Partitioner
from liftbridge_provider.client.publish.batch_result import BatchResult, Failures, PublishFailure
from liftbridge_provider.client.publish.dropping import drop_in_background
from liftbridge_provider.client.retry import Deadline, left_of
from liftbridge_provider.core import checks
from liftbridge_provider.core.errors import InvalidArgumentError, NoSuchPartitionError


@dataclass(frozen=True)
class PublishMessage:
    """One message of a batch. ``partition`` None means: ask the batch's partitioner (else 0)."""

    value: bytes
    key: bytes | None = None
    headers: Mapping[str, bytes] | None = None
    partition: int | None = None
    expected_offset: int | None = None


class Partitions(Protocol):
    """Where a stream's partition count comes from (the client's router: its metadata, refreshed if needed)."""

    def partition_count(self, stream: str, *, timeout: float | None = None) -> int: ...


class PreparedTooLong(Exception):
    """The batch deadline passed while the messages were checked: nothing was sent."""

    def __init__(self, count: int) -> None:
        self.count = count

    def result(self, stream: str, timeout: float) -> BatchResult:
        error = AckTimeoutError(
            f"not sent: the batch deadline ({timeout:g}s) passed while the messages were checked", stream=stream
        )
        return BatchResult([None] * self.count, Failures(size=self.count, unsent_error=error))


def choose_partition(
    partitions: Partitions,
    stream: str,
    key: bytes | None,
    value: bytes,
    *,
    partition: int | None,
    partitioner: Partitioner | None,
    timeout: float | None = None,
) -> int:
    """The partition of a single publish (see :func:`partition_for`) of a checked stream name; the partition
    count asked of the cluster within ``timeout`` seconds when the cache does not know it."""
    count = partitions.partition_count(stream, timeout=timeout)
    return partition_for(stream, count, key, value, partition, partitioner)


def partition_for(  # noqa: PLR0917
    stream: str,
    count: int,
    key: bytes | None,
    value: bytes,
    partition: int | None,
    partitioner: Partitioner | None,
) -> int:
    """``partition``, else ``partitioner(stream, key, value, count)``, else 0; checked against ``count``."""
    if partition is not None and partitioner is not None:
        raise InvalidArgumentError("give either partition or partitioner, not both", stream=stream)
    if partition is None:
        partition = partitioner(stream, key, value, count) if partitioner is not None else 0
    return checks.check_partition(partition, count, stream)


def batch_requests(
    partitions: Partitions,
    stream: str,
    messages: Iterable[PublishMessage | bytes],
    partitioner: Partitioner | None,
    *,
    policy: AckPolicy,
    deadline: Deadline | None,
    size_limit: int | None = None,
    too_large: dict[int, int] | None = None,
) -> list[api.PublishRequest]:
    """Every message checked and built, before anything is sent; PreparedTooLong past the deadline.

    With ``size_limit`` (bytes), the index and size of each request larger than it go into ``too_large``
    (a bare value is measured only when its length comes near the limit: one length test per message).
    """
    near = size_limit - _FIELDS_SLACK if size_limit is not None else None
    stream = build.check_not_reserved(checks.check_stream_name(stream), "publish to")
    count = partitions.partition_count(stream, timeout=left_of(deadline, "publish_batch", stream=stream))
    requests: list[api.PublishRequest] = []
    items = iter(messages)
    plain = partial(api.PublishRequest, stream=stream, ackPolicy=policy.value, expectedOffset=-1)
    for index, item in enumerate(items):
        if deadline is not None and index % 1024 == 0 and deadline.expired:
            left = sum(1 for _ in items) if not isinstance(messages, Sized) else len(messages) - index - 1
            drop_in_background(requests)  # freeing what was built would make the late call later still
            raise PreparedTooLong(index + 1 + left)
        if type(item) is bytes and partitioner is None:  # a bare value for partition 0: nothing else to check
            requests.append(plain(value=item, correlationId=str(index)))
            if near is not None and len(item) > near:
                _note_size(requests[-1], index, size_limit, too_large)
            continue
        message = item if isinstance(item, PublishMessage) else PublishMessage(value=item)
        try:
            partition = partition_for(stream, count, message.key, message.value, message.partition, partitioner)
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
            if near is not None:
                _note_size(requests[-1], index, size_limit, too_large)
        except InvalidArgumentError as exc:  # NoSuchPartitionError included, and kept as such
            kind = NoSuchPartitionError if isinstance(exc, NoSuchPartitionError) else InvalidArgumentError
            raise kind(
                f"message #{index}: {exc.message}; nothing was sent", stream=stream, partition=exc.partition
            ) from exc
    return requests


_FIELDS_SLACK = 4096
"""Bytes a request adds to its value at most without headers (stream name, ids, numbers, key framing): a bare
value shorter than the limit by more than this is under it."""


def _note_size(request: api.PublishRequest, index: int, limit: int | None, too_large: dict[int, int] | None) -> None:
    size = request.ByteSize()
    if limit is not None and too_large is not None and size > limit:
        too_large[index] = size


def to_partition(partition: int) -> Partitioner:
    """A partitioner that sends every message to ``partition`` (checked against the stream's count later)."""

    def chosen(stream: str, key: bytes | None, value: bytes, partitions: int) -> int:
        return partition

    return chosen


def sized(failure: PublishFailure, requests: Sequence[api.PublishRequest]) -> PublishFailure:
    """A too-large failure names the message's size."""
    if isinstance(failure.error, MessageTooLargeError) and failure.error.size is None:
        return PublishFailure(failure.index, failure.error.with_size(requests[failure.index].ByteSize()))
    return failure
