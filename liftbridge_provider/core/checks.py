"""Input checks shared by every layer: the client's requests, ranges, watchers, the Spark source, the events.

Each ``check_*`` takes a value from a caller and returns it (or its canonical
form), or raises :class:`~liftbridge_provider.core.errors.InvalidArgumentError`
naming the bad value and what is allowed. No I/O: checks that need the
cluster's metadata (cursors enabled, the stream exists) stay with the client
(``client/requests.py``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping

from liftbridge_provider.core.errors import InvalidArgumentError, NoSuchPartitionError

MAX_STREAM_NAME_BYTES = 255
"""The server makes a stream name a directory name (``<data.dir>/streams/<name>``, partition.go:183);
Linux file systems allow 255 bytes per name. A longer name crashes the server at every start."""

NATS_MAX_CONTROL_LINE = 4096
"""NATS's default ``max_control_line`` (nats-server const.go:65): a protocol line (SUB or PUB with its
subject, queue group, subscription id and sizes) over it makes NATS close the server's connection."""

MAX_SUBJECT_LINE_BYTES = NATS_MAX_CONTROL_LINE - 64
"""Bytes left for a subject (with its ``.<partition>`` suffix) and a group in one NATS protocol line;
64 bytes stay for what NATS adds (verb, spaces, subscription id, sizes)."""

INT32_MAX = 2**31 - 1
"""The largest partition number, partition count, replication factor and min ISR (protobuf int32 fields)."""

INT64_MAX = 2**63 - 1
"""The largest offset and byte or message count (protobuf int64 fields)."""

MAX_PARTITIONS = 4096
"""The most partitions a stream may be created with. The server creates every partition of a new stream in
one metadata step, on every replica, each with open files and memory of its own, while other metadata
requests wait: a much larger count held the metadata leader for minutes or wedged the node (docs/client.md)."""

_WHITE_SPACE = re.compile(r"\s")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_WILDCARD = re.compile(r"[*>]")


_NOT_UTF8 = "it is not UTF-8 text (it holds a lone surrogate, as surrogateescape decoding leaves for bad bytes)"


def is_utf8(text: str) -> bool:
    """``text`` encodes as UTF-8 (protobuf strings and NATS subjects must); a lone surrogate does not."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _subject_fault(text: str) -> str | None:
    """Why ``text`` cannot be (part of) a literal NATS subject, or None."""
    if not text:
        return "it is empty"
    if not is_utf8(text):
        return _NOT_UTF8
    if _WHITE_SPACE.search(text):
        return "it contains white space"
    if _CONTROL.search(text):
        return "it contains a control character"
    if "" in text.split("."):
        return "it has an empty token (a leading, trailing or double dot)"
    if _WILDCARD.search(text):
        return "it contains a NATS wildcard (* or >)"
    return None


def _shown(value: object) -> str:
    return f"{value!r:.80}" + ("..." if len(repr(value)) > 80 else "")


def check_stream_name(name: object) -> str:
    """A stream name the server can hold: 1-255 bytes of UTF-8, dot-separated non-empty tokens,
    no white space, control characters, slashes or NATS wildcards (* >)."""
    allowed = (
        f"use 1-{MAX_STREAM_NAME_BYTES} bytes (UTF-8) of dot-separated non-empty tokens without white space, "
        "control characters, slashes or NATS wildcards (* >)"
    )
    if not isinstance(name, str):
        raise InvalidArgumentError(f"invalid stream name {_shown(name)}: a stream name must be a string; {allowed}")
    fault = _subject_fault(name)
    size = len(name.encode()) if fault is None else 0
    if fault is None and size > MAX_STREAM_NAME_BYTES:
        fault = f"it is {size} bytes; at most {MAX_STREAM_NAME_BYTES}"
    if fault is None and ("/" in name or "\\" in name):
        fault = "it contains a slash (the server makes the name a directory)"
    if fault is not None:
        raise InvalidArgumentError(f"invalid stream name {_shown(name)}: {fault}; {allowed}")
    return name


def check_subject(subject: object, *, suffix: str = "", group: str = "") -> str:
    """A NATS subject to publish or subscribe on: dot-separated non-empty tokens without white
    space, control characters or wildcards (* >); with ``suffix`` (a partition's ``.N``) and
    ``group`` at most :data:`MAX_SUBJECT_LINE_BYTES` bytes."""
    allowed = "use dot-separated non-empty tokens without white space or NATS wildcards (* >)"
    if not isinstance(subject, str):
        raise InvalidArgumentError(f"invalid subject {_shown(subject)}: a subject must be a string; {allowed}")
    fault = _subject_fault(subject)
    line = len(subject.encode()) + len(suffix) + (1 + len(group.encode()) if group else 0) if fault is None else 0
    if fault is None and line > MAX_SUBJECT_LINE_BYTES:
        parts = "subject" + (f" with partition suffix {suffix!r}" if suffix else "") + (" and group" if group else "")
        fault = (
            f"the {parts} take {line} bytes; at most {MAX_SUBJECT_LINE_BYTES} bytes fit in a NATS protocol line "
            f"({NATS_MAX_CONTROL_LINE} bytes by default), and NATS closes the server's connection over it"
        )
    if fault is not None:
        raise InvalidArgumentError(f"invalid subject {_shown(subject)}: {fault}; {allowed}")
    return subject


def check_group(group: object) -> str:
    """A load-balance group (a NATS queue name): no white space or control characters; None or "" for none."""
    if group is None:
        return ""
    fault = None
    if not isinstance(group, str):
        fault = "a group must be a string"
    elif _WHITE_SPACE.search(group):
        fault = "it contains white space"
    elif _CONTROL.search(group):
        fault = "it contains a control character"
    elif not is_utf8(group):
        fault = _NOT_UTF8
    if fault is not None:
        raise InvalidArgumentError(
            f"invalid group {_shown(group)}: {fault}; NATS queue names have no white space or control characters"
        )
    return group  # type: ignore[return-value]


def check_stream_names(streams: object) -> list[str]:
    """A list of stream names (not a single string)."""
    if isinstance(streams, str | bytes) or not isinstance(streams, Iterable):
        raise InvalidArgumentError(f"streams must be a list of stream names, got {_shown(streams)}")
    return [check_stream_name(s) for s in streams]


def rendered_int(value: object) -> object:
    """The int a templated field's rendered ASCII digits stand for (``"7"`` -> 7); any other value as it is,
    for the field's own check to judge ("²" is a digit to ``str.isdigit`` but not to ``int``)."""
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        return int(value)
    return value


def check_flag(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be True or False, got {_shown(value)}")
    return value


def check_partition(partition: object, partitions: int | None = None, stream: str | None = None) -> int:
    """A partition number >= 0, and below ``partitions`` when the count is known (else NoSuchPartitionError,
    as the server answers for a partition it does not have)."""
    if not isinstance(partition, int) or isinstance(partition, bool) or partition < 0:
        raise InvalidArgumentError(f"partition must be a whole number >= 0, got {_shown(partition)}", stream=stream)
    if partition > INT32_MAX:
        raise InvalidArgumentError(f"partition must be at most {INT32_MAX}, got {partition}", stream=stream)
    if partitions is not None and partition >= partitions:
        raise NoSuchPartitionError(
            f"no partition {partition}: stream {stream!r} has partitions 0-{partitions - 1}",
            stream=stream,
            partition=partition,
        )
    return partition


def check_partition_selection(partitions: object, count: int | Callable[[], int], stream: str) -> list[int] | None:
    """Partitions chosen by the caller: None (every partition), or a list of existing partition numbers.

    ``count`` is the stream's partition count, or a function that looks it up: it is called only once
    the selection is a non-empty list of partition numbers, so a malformed selection is refused before
    anything is asked of the cluster. An empty list stays empty: it selects no partition (the server
    would read it as "all").
    """
    if partitions is None:
        return None
    if isinstance(partitions, str | bytes) or not isinstance(partitions, Iterable):
        raise InvalidArgumentError(
            f"partitions must be a list of partition numbers (or None for all), got {_shown(partitions)}",
            stream=stream,
        )
    numbers = [check_partition(p, None, stream) for p in partitions]
    if numbers:
        known = count() if callable(count) else count
        for number in numbers:
            check_partition(number, known, stream)
    return numbers


def check_batch_messages(messages: object) -> Iterable[object]:
    """The messages of a batch: any iterable of values or PublishMessage, but not one bytes or str value."""
    if isinstance(messages, str | bytes | bytearray | memoryview) or not isinstance(messages, Iterable):
        got = "None" if messages is None else f"{type(messages).__name__} {_shown(messages)}"
        raise InvalidArgumentError(
            f"messages must be an iterable of bytes or PublishMessage, got {got}; nothing was sent"
        )
    return messages


def check_partition_count(partitions: object) -> int:
    """A stream's partition count: a whole number from 1 to :data:`MAX_PARTITIONS`."""
    count = check_whole(partitions, "partitions", minimum=1)
    if count > MAX_PARTITIONS:
        raise InvalidArgumentError(
            f"partitions must be at most {MAX_PARTITIONS}, got {count}: the server creates a stream's partitions "
            "all at once, holding its metadata leader meanwhile (minutes, or for good, for counts far above)"
        )
    return count


def check_whole(value: object, name: str, *, minimum: int, maximum: int = INT64_MAX) -> int:
    """``value`` when it is a whole number (an int, not a bool) from ``minimum`` to ``maximum`` (default
    :data:`INT64_MAX`, what the server keeps in an int64)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InvalidArgumentError(f"{name} must be a whole number >= {minimum}, got {_shown(value)}")
    if value > maximum:
        raise InvalidArgumentError(f"{name} must be at most {maximum}, got {value}")
    return value


def check_offset(offset: object, name: str = "offset", *, minimum: int = 0, maximum: int = INT64_MAX) -> int:
    """An offset: a whole number from ``minimum`` (default 0) to ``maximum`` (:func:`check_whole`)."""
    return check_whole(offset, name, minimum=minimum, maximum=maximum)


MAX_TIMESTAMP_MS = INT64_MAX // 1_000_000
"""The latest time in milliseconds since the epoch (2262-04-11): the server keeps times as int64 nanoseconds."""


_BYTES_LIKE = (bytes, bytearray, memoryview)


def check_bytes(value: object, name: str) -> bytes:
    """``value`` as bytes (bytes itself returned as is: the publish paths call this per message)."""
    if type(value) is bytes:
        return value
    if isinstance(value, _BYTES_LIKE):
        return bytes(value)
    raise InvalidArgumentError(f"{name} must be bytes, got {type(value).__name__} {value!r:.60}")


def check_headers(headers: Mapping[str, bytes] | None) -> dict[str, bytes]:
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise InvalidArgumentError(f"headers must be a mapping of str to bytes, got {headers!r:.60}")
    checked = {}
    for key, value in headers.items():
        if not isinstance(key, str):
            raise InvalidArgumentError(f"header names must be str, got {key!r}")
        if not is_utf8(key):
            raise InvalidArgumentError(f"header name {key!r}: {_NOT_UTF8}")
        checked[key] = check_bytes(value, f"header {key!r}")
    return checked


def check_cursor_id(cursor_id: object) -> str:
    if not isinstance(cursor_id, str) or not cursor_id or "," in cursor_id:
        raise InvalidArgumentError(f"cursor_id must be a non-empty string without commas, got {cursor_id!r}")
    if not is_utf8(cursor_id):
        raise InvalidArgumentError(f"cursor_id {cursor_id!r}: {_NOT_UTF8}")
    return cursor_id


MAX_SECONDS = 1e9
"""The longest timeout or wait, in seconds (about 31 years). gRPC's deadline overflows far above it: a
request_timeout of 1e12 made every call fail at once with "no answer within 1e+12s"."""


def check_timeout(name: str, value: object) -> float | None:
    """A call's timeout: None (the default) or seconds > 0 up to :data:`MAX_SECONDS`; never a bool, NaN
    or negative."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    if value is not None and not ok:
        raise InvalidArgumentError(f"{name} must be a number of seconds > 0 (or None for the default), got {value!r}")
    if value is not None and value > MAX_SECONDS:  # type: ignore[operator]
        raise InvalidArgumentError(f"{name} must be at most {MAX_SECONDS:g} seconds, got {value!r}")
    return None if value is None else float(value)  # type: ignore[arg-type]


def check_seconds(name: str, value: object, *, allow_zero: bool = False) -> float:
    """Validate a positive duration in seconds (a number, not NaN or infinite, at most :data:`MAX_SECONDS`)."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):  # type: ignore[operator]
        bound = ">= 0" if allow_zero else "> 0"
        raise InvalidArgumentError(f"{name} must be a number of seconds {bound}, got {value!r}")
    if value > MAX_SECONDS:  # type: ignore[operator]
        raise InvalidArgumentError(f"{name} must be at most {MAX_SECONDS:g} seconds, got {value!r}")
    return float(value)  # type: ignore[arg-type]


MIN_POLL_SECONDS = 0.1
"""The shortest interval between two polls of the cluster, in seconds: every poll is a request, so a shorter
interval would be a busy loop against the brokers."""


def check_poll_interval(name: str, value: object) -> float:
    """Seconds between two polls of the cluster: from :data:`MIN_POLL_SECONDS` to :data:`MAX_SECONDS`."""
    seconds = check_seconds(name, value)
    if seconds < MIN_POLL_SECONDS:
        raise InvalidArgumentError(
            f"{name} must be at least {MIN_POLL_SECONDS:g} seconds (every poll is a request to the cluster), "
            f"got {value!r}"
        )
    return seconds
