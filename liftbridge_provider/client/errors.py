"""The client's typed errors, and the translation of gRPC failures into them.

Every error carries the ``stream`` and ``partition`` it concerns (None when not
applicable) and the gRPC ``code`` it came from (None for client-side errors).
Bad input found before anything is sent raises :class:`InvalidArgumentError`,
which is also a :class:`ValueError`. That one, :class:`NoSuchPartitionError` and the base class
:class:`LiftbridgeError` are defined in :mod:`liftbridge_provider.core.errors`,
so the pure checks there raise the very classes the client raises.
"""

from __future__ import annotations

import grpc

from liftbridge_provider.core.errors import InvalidArgumentError, LiftbridgeError, NoSuchPartitionError


class StreamExistsError(LiftbridgeError):
    """CreateStream of a stream name that already exists."""


class NoSuchStreamError(LiftbridgeError):
    """The stream does not exist (or was deleted)."""


class NotLeaderError(LiftbridgeError):
    """The broker asked is not the partition leader (retried internally; raised when retries run out)."""


class ReadonlyPartitionError(LiftbridgeError):
    """The partition is readonly: publishes are refused."""


class BeyondHighWatermarkError(LiftbridgeError):
    """A range ends beyond the committed high watermark (after waiting for it): retry later.

    Not InvalidArgumentError: right after a failover the new leader's high
    watermark lags, so the same range becomes readable a moment later.
    """


class PartitionPausedError(LiftbridgeError):
    """The partition is paused; subscribe with ``resume=True`` or publish to resume it."""


class IncorrectOffsetError(LiftbridgeError):
    """The expected offset of an optimistic-concurrency publish did not match the next offset."""


class MessageTooLargeError(LiftbridgeError):
    """The message exceeds the server's size limit (NATS ``max_payload`` or
    ``clustering.replication.max.bytes``, 1 MiB each by default), or gRPC's message size.

    ``size`` is the message's size in bytes as sent (value, key, headers and
    request fields), when the client knows it.
    """

    size: int | None = None

    def with_size(self, size: int) -> MessageTooLargeError:
        """This refusal, naming the message's ``size`` (bytes) and the server's limits."""
        sized = MessageTooLargeError(
            f"message of {size} bytes is over the server's size limit ({self.message}): the server's NATS "
            f"max_payload and its clustering.replication.max.bytes (1 MiB each by default) bound a whole "
            f"message with its key, headers and envelope",
            stream=self.stream,
            partition=self.partition,
            code=self.code,
            may_be_stored=self.may_be_stored,
        )
        sized.size = size
        return sized


TOO_LARGE_DETAILS = ("max replication size", "maximum payload exceeded")
"""How the server says a message is too large: the Ack TOO_LARGE text (api.go:1019, over
``clustering.replication.max.bytes``) and the NATS client's ErrMaxPayload (nats.go:110, over
NATS ``max_payload``), which Publish answers as UNKNOWN and PublishAsync as INTERNAL."""


def is_too_large(details: str) -> bool:
    """Whether a server's error text says the message was too large."""
    lowered = details.lower()
    return any(marker in lowered for marker in TOO_LARGE_DETAILS)


class EncryptionError(LiftbridgeError):
    """Encryption at rest failed, or was requested without a server key."""


class PermissionDeniedError(LiftbridgeError):
    """The server's authorization policy denies this call to this client."""


class UnavailableError(LiftbridgeError):
    """No broker could be reached (or none answered) before the deadline."""


class NoMetadataLeaderError(LiftbridgeError):
    """The cluster has no metadata leader (an election is running) and did not get one in time."""


class LiftbridgeTimeoutError(LiftbridgeError, TimeoutError):
    """An operation did not finish within its deadline."""


class AckTimeoutError(LiftbridgeTimeoutError):
    """A publish got no ack in time. The message may or may not have been stored."""


class EnvelopeError(LiftbridgeError):
    """Bytes that are not a valid Liftbridge envelope (bad magic, version, length, CRC or payload)."""


class ClientClosedError(LiftbridgeError):
    """The client was closed."""


class CursorsDisabledError(LiftbridgeError):
    """The server keeps no cursors: its ``cursors.stream.partitions`` is 0 (the server's default)."""


class CursorMovedError(LiftbridgeError):
    """A cursor move was refused: the cursor is not where its writer last saw it (another writer moved it),
    or it is past the target (the move would take it back). Nothing was written then. With
    ``overwritten`` the write was done but read back as another writer's value (see ``cursor_advance``).

    ``found``: where the cursor was (or read back); ``target``: where the move would take it;
    ``expected``: where this writer last saw it (None: no earlier view).
    """

    def __init__(
        self,
        message: str,
        *,
        cursor_id: str,
        stream: str,
        partition: int,
        found: int,
        target: int,
        expected: int | None,
        overwritten: bool = False,
    ) -> None:
        super().__init__(message, stream=stream, partition=partition)
        self.cursor_id = cursor_id
        self.found = found
        self.target = target
        self.expected = expected
        self.overwritten = overwritten

    def __str__(self) -> str:
        return self.message  # it names the stream and partition itself


# The server's words (INTERNAL) when a wait of its own ended at the call's deadline: a cursor store waiting for
# its ack, a request forwarded to the metadata leader (Go's context.DeadlineExceeded), a Raft apply.
_SERVER_WAITS_ENDED = ("context deadline exceeded", "raft operation timed out")


def error_from_rpc(exc: grpc.RpcError, *, stream: str | None = None, partition: int | None = None) -> LiftbridgeError:
    """Translate a failed RPC into the matching typed error."""
    code: grpc.StatusCode = exc.code()
    details = exc.details() or code.name
    lowered = details.lower()
    kind: type[LiftbridgeError] = LiftbridgeError
    if code == grpc.StatusCode.ALREADY_EXISTS:
        kind = StreamExistsError
    elif code == grpc.StatusCode.NOT_FOUND:
        kind = NoSuchPartitionError if "partition" in lowered else NoSuchStreamError
    elif is_too_large(details):
        kind = MessageTooLargeError
    elif code == grpc.StatusCode.INVALID_ARGUMENT:
        kind = InvalidArgumentError
    elif code == grpc.StatusCode.FAILED_PRECONDITION:
        kind = _failed_precondition_kind(lowered)
    elif code == grpc.StatusCode.PERMISSION_DENIED or "not authorized" in lowered:
        kind = PermissionDeniedError
    elif code == grpc.StatusCode.UNAVAILABLE:
        kind = UnavailableError
    elif code == grpc.StatusCode.DEADLINE_EXCEEDED or any(wait in lowered for wait in _SERVER_WAITS_ENDED):
        kind = LiftbridgeTimeoutError  # the server's own wait for the call's deadline ended (INTERNAL)
    elif code == grpc.StatusCode.RESOURCE_EXHAUSTED and "message larger than max" in lowered:
        kind = MessageTooLargeError
    elif "incorrect expected offset" in lowered:
        kind = IncorrectOffsetError
    elif "no known metadata leader" in lowered:
        kind = NoMetadataLeaderError
    elif "encrypt" in lowered:
        kind = EncryptionError
    return kind(details, stream=stream, partition=partition, code=code)


def _failed_precondition_kind(details: str) -> type[LiftbridgeError]:
    if "leader" in details:
        return NotLeaderError
    if "readonly" in details:
        return ReadonlyPartitionError
    if "encrypt" in details:
        return EncryptionError
    if "paused" in details or "closed" in details:
        return PartitionPausedError
    return LiftbridgeError


def past_a_readonly_end(exc: LiftbridgeError) -> bool:
    """The server refused a subscription that starts past the end of a readonly partition (it stops every
    subscription of a readonly partition at its newest offset, and refuses one that would stop before it
    starts): nothing is wrong, the partition has nothing new until it is writable again."""
    return "stop offset is before start offset" in str(exc).lower()
