"""Public message types: ack policies, start and stop positions, received messages and acks."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.core.checks import INT64_MAX, check_offset
from liftbridge_provider.core.errors import InvalidArgumentError


class AckPolicy(enum.IntEnum):
    """When the server acknowledges a publish.

    LEADER: written to the leader's log (not yet committed). ALL: committed by
    every in-sync replica. NONE: no ack at all.
    """

    LEADER = api.LEADER
    ALL = api.ALL
    NONE = api.NONE

    @classmethod
    def parse(cls, value: AckPolicy | str | int) -> AckPolicy:
        """Accept an AckPolicy, its name in any case (``"all"``) or its number."""
        if isinstance(value, AckPolicy):
            return value
        if isinstance(value, str) and value.upper() in cls.__members__:
            return cls[value.upper()]
        if isinstance(value, int) and not isinstance(value, bool) and value in {p.value for p in cls}:
            return cls(value)
        raise InvalidArgumentError(f"unknown ack policy {value!r}; allowed: leader, all, none")


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_LATEST = _EPOCH + timedelta(microseconds=INT64_MAX // 1000)  # the server keeps times as int64 nanoseconds


def _nanos(value: datetime | int, name: str) -> int:
    """``value`` as nanoseconds since the epoch, from 0 to :data:`INT64_MAX` (1970-01-01 to 2262-04-11 UTC)."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise InvalidArgumentError(f"{name} must be timezone-aware, got naive {value!r}")
        if not _EPOCH <= value <= _LATEST:
            raise InvalidArgumentError(
                f"{name} must be from {_EPOCH.isoformat()} to {_LATEST.isoformat()} (the server keeps int64 "
                f"nanoseconds since the epoch), got {value.isoformat()}"
            )
        delta = value - _EPOCH
        return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= INT64_MAX:
        return value
    raise InvalidArgumentError(
        f"{name} must be an aware datetime or nanoseconds from 0 to {INT64_MAX}, got {value!r:.80}"
    )


def _offset(value: int, name: str) -> int:
    return check_offset(value, name)


@dataclass(frozen=True)
class StartPosition:
    """Where a subscription starts. Build with the class methods."""

    kind: int
    offset: int = 0
    timestamp: int = 0  # nanoseconds since the epoch

    @classmethod
    def new_only(cls) -> StartPosition:
        """Only messages published after subscribing (the default)."""
        return cls(api.NEW_ONLY)

    @classmethod
    def earliest(cls) -> StartPosition:
        """The oldest message still retained."""
        return cls(api.EARLIEST)

    @classmethod
    def latest(cls) -> StartPosition:
        """The newest message, then everything after it."""
        return cls(api.LATEST)

    @classmethod
    def at_offset(cls, offset: int) -> StartPosition:
        """The message at ``offset`` (or the next one retained)."""
        return cls(api.OFFSET, offset=_offset(offset, "start offset"))

    @classmethod
    def at_time(cls, when: datetime | int) -> StartPosition:
        """The first message received at or after ``when`` (aware datetime or epoch nanoseconds)."""
        return cls(api.TIMESTAMP, timestamp=_nanos(when, "start time"))

    @classmethod
    def time_delta(cls, ago: timedelta) -> StartPosition:
        """The first message received at most ``ago`` before now."""
        now = datetime.now(UTC)
        if not isinstance(ago, timedelta) or not timedelta(0) <= ago <= now - _EPOCH:
            raise InvalidArgumentError(
                f"start time delta must be a timedelta from 0 to the time since {_EPOCH.isoformat()}, got {ago!r}"
            )
        return cls.at_time(now - ago)


@dataclass(frozen=True)
class StopPosition:
    """Where a subscription ends by itself (inclusive). Build with the class methods."""

    kind: int
    offset: int = 0
    timestamp: int = 0

    @classmethod
    def at_offset(cls, offset: int) -> StopPosition:
        """End after delivering the message at ``offset``."""
        return cls(api.STOP_OFFSET, offset=_offset(offset, "stop offset"))

    @classmethod
    def latest(cls) -> StopPosition:
        """End at the newest message when subscribing (nothing at all for an empty partition)."""
        return cls(api.STOP_LATEST)

    @classmethod
    def at_time(cls, when: datetime | int) -> StopPosition:
        """End with the last message received at or before ``when``."""
        return cls(api.STOP_TIMESTAMP, timestamp=_nanos(when, "stop time"))


class Message:
    """A message read from a stream partition.

    A thin view over the received protobuf (``raw``); fields are read on access.
    ``timestamp`` is nanoseconds since the epoch; ``time`` the same as a datetime.
    """

    __slots__ = ("raw",)

    def __init__(self, raw: api.Message) -> None:
        self.raw = raw

    @property
    def offset(self) -> int:
        return self.raw.offset

    @property
    def key(self) -> bytes:
        return self.raw.key

    @property
    def value(self) -> bytes:
        return self.raw.value

    @property
    def timestamp(self) -> int:
        return self.raw.timestamp

    @property
    def time(self) -> datetime:
        return datetime.fromtimestamp(self.raw.timestamp / 1e9, tz=UTC)

    @property
    def stream(self) -> str:
        return self.raw.stream

    @property
    def partition(self) -> int:
        return self.raw.partition

    @property
    def subject(self) -> str:
        return self.raw.subject

    @property
    def reply_subject(self) -> str:
        return self.raw.replySubject

    @property
    def headers(self) -> Mapping[str, bytes]:
        return dict(self.raw.headers)

    @property
    def correlation_id(self) -> str:
        return self.raw.correlationId

    def __repr__(self) -> str:
        return (
            f"Message(stream={self.stream!r}, partition={self.partition}, offset={self.offset}, "
            f"key={self.key!r}, value={self.value[:32]!r}{'...' if len(self.value) > 32 else ''})"
        )


class Ack:
    """The server's acknowledgement of a stored message; a thin view over the received protobuf.

    ``partition`` is the partition the message was sent to (-1 if unknown);
    timestamps are epoch nanoseconds.
    """

    __slots__ = ("partition", "raw")

    def __init__(self, raw: api.Ack, partition: int) -> None:
        self.raw = raw
        self.partition = partition

    @property
    def stream(self) -> str:
        return self.raw.stream

    @property
    def offset(self) -> int:
        return self.raw.offset

    @property
    def partition_subject(self) -> str:
        return self.raw.partitionSubject

    @property
    def msg_subject(self) -> str:
        return self.raw.msgSubject

    @property
    def ack_inbox(self) -> str:
        return self.raw.ackInbox

    @property
    def correlation_id(self) -> str:
        return self.raw.correlationId

    @property
    def ack_policy(self) -> AckPolicy:
        return AckPolicy(self.raw.ackPolicy)

    @property
    def reception_timestamp(self) -> int:
        return self.raw.receptionTimestamp

    @property
    def commit_timestamp(self) -> int:
        return self.raw.commitTimestamp

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Ack) and (self.raw, self.partition) == (other.raw, other.partition)

    def __hash__(self) -> int:
        return hash((self.stream, self.partition, self.offset))

    def __repr__(self) -> str:
        return f"Ack(stream={self.stream!r}, partition={self.partition}, offset={self.offset})"
