"""The base of the client's errors, the error of bad input and of a missing partition, without gRPC.

Pure checks (``core``) refuse bad input with :class:`InvalidArgumentError`
and a partition number the stream does not have with
:class:`NoSuchPartitionError`, the very classes the client raises (the latter
also for the server's NOT_FOUND), so a caller catches one class whichever
layer found the fault. The client's other errors, and the translation of
gRPC failures into them, are in :mod:`liftbridge_provider.client.errors`.
"""

from __future__ import annotations

import enum


class LiftbridgeError(Exception):
    """Base class of every error this client raises.

    ``code`` is the gRPC status code (a ``grpc.StatusCode``) the error came
    from, None for client-side errors.
    """

    def __init__(
        self,
        message: str,
        *,
        stream: str | None = None,
        partition: int | None = None,
        code: enum.Enum | None = None,
        may_be_stored: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.stream = stream
        self.partition = partition
        self.code = code
        self.may_be_stored = may_be_stored
        """For publishes: the message may have been stored although this error was raised."""

    def __str__(self) -> str:
        where = []
        if self.stream is not None:
            where.append(f"stream={self.stream!r}")
        if self.partition is not None:
            where.append(f"partition={self.partition}")
        if self.code is not None:
            where.append(f"grpc={self.code.name}")
        return f"{self.message} ({', '.join(where)})" if where else self.message


class InvalidArgumentError(LiftbridgeError, ValueError):
    """A value was refused, by this client before sending or by the server (INVALID_ARGUMENT)."""


class NoSuchPartitionError(InvalidArgumentError):
    """The stream exists but has no such partition (found by the client's metadata or by the server).

    An :class:`InvalidArgumentError` too: a partition number the stream does not have is a bad argument
    whether the client or the server finds it, and code that refuses bad input keeps refusing it."""
