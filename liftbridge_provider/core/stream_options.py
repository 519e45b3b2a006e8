"""A stream's settings at creation, defined once: the client, ``create_stream`` and the operator take them.

:class:`StreamOptions` holds every optional setting of CreateStream (the
load-balance group and the fourteen retention, segment, compaction, pause,
ISR, concurrency-control and encryption settings); None keeps the server's
default. :meth:`StreamOptions.checked` checks each given value and names the
request field it goes to, so a bad one is refused (InvalidArgumentError naming
it) before anything is sent; ``client/requests.py`` writes them into the
protobuf request. The subject, name, partition count and replication factor are
the request's own (``requests.create_stream_request``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from datetime import timedelta

from liftbridge_provider.core.checks import INT32_MAX, INT64_MAX, check_whole
from liftbridge_provider.core.errors import InvalidArgumentError

Duration = timedelta | int | float

MAX_DURATION_MS = INT64_MAX // 1_000_000
"""The longest duration the server can hold, in ms (about 292 years): it multiplies the milliseconds by
``time.Millisecond`` in an int64 of nanoseconds (server/config.go), and a larger value wraps around to a
tiny or negative duration (a retention of a few hundred years became 0.45 ms and emptied the stream)."""


@dataclass(frozen=True, kw_only=True)
class StreamOptions:
    """Optional settings of a new stream; None keeps the server's default.

    Sizes and counts are whole numbers, durations a ``timedelta`` or seconds.
    ``group``: load-balance group; ``retention_max_bytes``,
    ``retention_max_messages``, ``retention_max_age``: what each partition
    keeps; ``cleaner_interval``: how often retention runs;
    ``segment_max_bytes``, ``segment_max_age``: when a log segment rolls;
    ``compact_enabled``: keep only the newest message per key, with
    ``compact_max_goroutines`` at once; ``auto_pause_time``: pause a partition
    idle this long, unless ``auto_pause_disable_if_subscribers`` and it has
    subscribers; ``min_isr``: in-sync replicas needed to commit;
    ``optimistic_concurrency_control``: check expected offsets on publish;
    ``encryption``: encrypt data at rest (the server needs a key).
    """

    group: str | None = None
    retention_max_bytes: int | None = None
    retention_max_messages: int | None = None
    retention_max_age: Duration | None = None
    cleaner_interval: Duration | None = None
    segment_max_bytes: int | None = None
    segment_max_age: Duration | None = None
    compact_enabled: bool | None = None
    compact_max_goroutines: int | None = None
    auto_pause_time: Duration | None = None
    auto_pause_disable_if_subscribers: bool | None = None
    min_isr: int | None = None
    optimistic_concurrency_control: bool | None = None
    encryption: bool | None = None

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """Every setting's name, in declaration order."""
        return tuple(f.name for f in fields(cls))

    @classmethod
    def of(cls, settings: Mapping[str, object]) -> StreamOptions:
        """Options from keyword arguments; an unknown name is refused, naming it and the allowed ones."""
        unknown = sorted(set(settings) - set(cls.names()))
        if unknown:
            raise InvalidArgumentError(f"unknown stream options {unknown}; allowed: {list(cls.names())}")
        return cls(**settings)  # type: ignore[arg-type]

    def given(self) -> dict[str, object]:
        """The settings that are not None, by name."""
        return {name: value for name, value in asdict(self).items() if value is not None}

    def checked(self) -> dict[str, int | bool]:
        """Every given setting except ``group`` (the request's own), checked, by the name of its
        CreateStreamRequest field (a wrapper whose ``value`` holds it): milliseconds for durations."""
        values: dict[str, int | bool] = {}
        for field, count in (
            ("retentionMaxBytes", self.retention_max_bytes),
            ("retentionMaxMessages", self.retention_max_messages),
            ("segmentMaxBytes", self.segment_max_bytes),
        ):
            if count is not None:
                values[field] = check_whole(count, _snake(field), minimum=0, maximum=INT64_MAX)
        for field, duration in (
            ("retentionMaxAge", self.retention_max_age),
            ("cleanerInterval", self.cleaner_interval),
            ("segmentMaxAge", self.segment_max_age),
            ("autoPauseTime", self.auto_pause_time),
        ):
            if duration is not None:
                values[field] = to_millis(duration, _snake(field))
        for field, count in (("compactMaxGoroutines", self.compact_max_goroutines), ("minIsr", self.min_isr)):
            if count is not None:
                values[field] = check_whole(count, _snake(field), minimum=1, maximum=INT32_MAX)
        for field, flag in (
            ("compactEnabled", self.compact_enabled),
            ("autoPauseDisableIfSubscribers", self.auto_pause_disable_if_subscribers),
            ("optimisticConcurrencyControl", self.optimistic_concurrency_control),
            ("encryption", self.encryption),
        ):
            if flag is not None:
                if not isinstance(flag, bool):
                    raise InvalidArgumentError(f"{_snake(field)} must be True or False, got {flag!r}")
                values[field] = flag
        return values


def to_millis(value: Duration, name: str) -> int:
    """Whole milliseconds from a timedelta or seconds: 0 (the server's "none"), or 1 ms to
    :data:`MAX_DURATION_MS`. A positive value that rounds to 0 ms is refused rather than sent as 0,
    which the server reads as "no limit"."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise InvalidArgumentError(f"{name} must be a timedelta or a number of seconds, got {value!r:.80}")
    if math.isnan(seconds) or seconds < 0:
        raise InvalidArgumentError(f"{name} must not be negative, got {value!r:.80}")
    millis = round(seconds * 1000) if math.isfinite(seconds) else MAX_DURATION_MS + 1
    if millis > MAX_DURATION_MS:
        raise InvalidArgumentError(
            f"{name} must be at most {MAX_DURATION_MS / 1000:.3f} seconds (about 292 years: the server's "
            f"limit; a longer one wraps around to almost none), got {value!r:.80}"
        )
    if millis == 0 and seconds > 0:
        raise InvalidArgumentError(
            f"{name} must be 0 or at least 0.001 seconds (1 ms): {value!r:.80} would be sent as 0, which the "
            "server reads as no limit"
        )
    return millis


def _snake(camel: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", camel).lower()
