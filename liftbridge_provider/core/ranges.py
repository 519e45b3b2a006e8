"""Frozen offset ranges: the one description shared by the freeze operator, the Spark source and the commit step.

A range is half-open, ``[start, end)``: it holds offsets ``start .. end - 1``
and is empty when ``start == end``. A :class:`RangesDocument` lists one range
per partition of one stream, and round-trips through JSON::

    {"version": 1, "stream": "orders", "cursor_id": "ingest",
     "ranges": [{"partition": 0, "start": 10, "end": 25}, ...]}

Parsing is strict: a malformed document raises InvalidArgumentError naming
the bad value, before anything is read or committed. No Airflow or Spark here.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from liftbridge_provider.core.checks import (
    INT64_MAX,
    check_cursor_id,
    check_offset,
    check_partition,
    check_stream_name,
)
from liftbridge_provider.core.errors import InvalidArgumentError

VERSION = 1
FROZEN_CURSORS = "frozen_cursors"  # document metadata: {partition: cursor offset the freeze read}
FROZEN_HIGH_WATERMARKS = "frozen_high_watermarks"  # document metadata: {partition: high watermark the freeze read}


def _load_json(value: str | bytes, what: str) -> Any:
    try:
        return json.loads(value)
    except ValueError as exc:
        raise InvalidArgumentError(f"{what} is not valid JSON: {exc}") from exc


@dataclass(frozen=True, order=True)
class OffsetRange:
    """Offsets ``start <= offset < end`` of one partition."""

    partition: int
    start: int
    end: int

    def __post_init__(self) -> None:
        check_offset(self.partition, "partition")
        check_offset(self.start, f"partition {self.partition} start")
        check_offset(self.end, f"partition {self.partition} end")
        if self.end < self.start:
            raise InvalidArgumentError(
                f"partition {self.partition}: end {self.end} is before start {self.start} (ranges are [start, end))"
            )

    @property
    def count(self) -> int:
        """How many offsets the range spans (compaction may have removed some of them)."""
        return self.end - self.start

    @property
    def last(self) -> int | None:
        """The last offset in the range (inclusive), or None when it is empty."""
        return self.end - 1 if self.end > self.start else None

    def to_json(self) -> dict[str, int]:
        return {"partition": self.partition, "start": self.start, "end": self.end}


@dataclass(frozen=True)
class RangesDocument:
    """One range per partition of ``stream``; ``cursor_id`` names the cursor the ranges start from, if any."""

    stream: str
    ranges: tuple[OffsetRange, ...]
    cursor_id: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_stream_name(self.stream)
        if self.cursor_id is not None:
            check_cursor_id(self.cursor_id)
        partitions = [r.partition for r in self.ranges]
        if len(set(partitions)) != len(partitions):
            raise InvalidArgumentError(f"partitions must appear once each, got {partitions}")
        object.__setattr__(self, "ranges", tuple(sorted(self.ranges)))

    @property
    def total(self) -> int:
        return sum(r.count for r in self.ranges)

    def range_for(self, partition: int) -> OffsetRange:
        for offset_range in self.ranges:
            if offset_range.partition == partition:
                return offset_range
        raise InvalidArgumentError(f"no range for partition {partition} in the document for {self.stream!r}")

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            "version": VERSION,
            "stream": self.stream,
            "ranges": [r.to_json() for r in self.ranges],
        }
        if self.cursor_id is not None:
            document["cursor_id"] = self.cursor_id
        if self.metadata:
            document["metadata"] = dict(self.metadata)
        return document

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)

    @classmethod
    def parse(cls, value: RangesDocument | Mapping[str, Any] | str | bytes) -> RangesDocument:
        """A document from itself, a mapping, or JSON text; refuses anything malformed."""
        if isinstance(value, RangesDocument):
            return value
        if isinstance(value, str | bytes):
            value = _load_json(value, "ranges document")
        if not isinstance(value, Mapping):
            raise InvalidArgumentError(f"ranges document must be a JSON object, got {type(value).__name__}")
        unknown = set(value) - {"version", "stream", "cursor_id", "ranges", "metadata"}
        if unknown:
            raise InvalidArgumentError(f"unknown keys in ranges document: {sorted(unknown)}")
        if value.get("version", VERSION) != VERSION:
            raise InvalidArgumentError(f"unsupported ranges document version {value.get('version')!r}; expected 1")
        ranges = value.get("ranges")
        if not isinstance(ranges, list):
            raise InvalidArgumentError(f"'ranges' must be a list of {{partition, start, end}}, got {ranges!r}")
        return cls(
            stream=value.get("stream"),  # type: ignore[arg-type]  # checked in __post_init__
            ranges=tuple(_parse_range(item) for item in ranges),
            cursor_id=value.get("cursor_id"),
            metadata=value.get("metadata") or {},
        )


def _parse_range(item: object) -> OffsetRange:
    if not isinstance(item, Mapping) or set(item) != {"partition", "start", "end"}:
        raise InvalidArgumentError(f"each range must be {{'partition', 'start', 'end'}}, got {item!r}")
    return OffsetRange(item["partition"], item["start"], item["end"])


def ranges_from_offsets(
    stream: str, starting: Mapping[int, int], ending: Mapping[int, int], cursor_id: str | None = None
) -> RangesDocument:
    """A document from per-partition start and end offsets (the same partitions in both)."""
    if set(starting) != set(ending):
        raise InvalidArgumentError(
            f"starting and ending offsets must name the same partitions, got {sorted(starting)} and {sorted(ending)}"
        )
    return RangesDocument(stream, tuple(OffsetRange(p, starting[p], ending[p]) for p in starting), cursor_id)


class _Pairs(list[tuple[Any, Any]]):
    """A JSON object's (key, value) pairs in order, duplicates kept (``json.loads``' object_pairs_hook)."""


def partition_offsets(
    value: Mapping[Any, Any] | str, what: str, *, unit: str = "offset", maximum: int = INT64_MAX
) -> dict[int, int]:
    """``{partition: offset}`` from a mapping or JSON object whose keys may be strings of digits ("0"); each
    value a whole number from 0 to ``maximum``, named ``unit`` in an error ("offset", or a time in ms).

    A partition named twice (``{"0": 1, "0": 2}``, or ``"0"`` and ``"00"``) is refused: JSON keeps the last
    value silently, and the read started past offsets it should have read. Keys other than plain digits
    (``"0_0"``, ``"+0"``, ``" 0"``, which ``int()`` reads as 0) are refused too."""
    pairs: list[tuple[Any, Any]]
    if isinstance(value, str):
        try:
            loaded = json.loads(value, object_pairs_hook=_Pairs)
        except ValueError as exc:
            raise InvalidArgumentError(
                f"{what} must be a JSON object mapping partitions to offsets, got {value!r:.80} (not JSON: {exc})"
            ) from exc
        if not isinstance(loaded, _Pairs):  # an array, a number, null
            raise InvalidArgumentError(f"{what} must map partitions to offsets, got {value!r:.80}")
        pairs = loaded
    elif isinstance(value, Mapping):
        pairs = list(value.items())
    else:
        raise InvalidArgumentError(f"{what} must map partitions to offsets, got {value!r:.80}")
    offsets: dict[int, int] = {}
    for key, offset in pairs:
        negative = isinstance(key, str) and key[:1] == "-" and key[1:].isascii() and key[1:].isdigit()
        if isinstance(key, str) and ((key.isascii() and key.isdigit()) or (negative and int(key) < 0)):
            partition = int(key)  # a negative one is refused below, naming the rule ("-0" is not a key)
        elif isinstance(key, int) and not isinstance(key, bool):
            partition = key
        else:
            raise InvalidArgumentError(f"{what}: partition {key!r} is not a number (digits only)")
        if partition in offsets:
            raise InvalidArgumentError(
                f"{what} names partition {partition} twice (key {key!r}); give each partition once"
            )
        offsets[check_offset(partition, f"{what} partition")] = check_offset(
            offset, f"{what} {unit} of partition {partition}", maximum=maximum
        )
    return offsets


@dataclass(frozen=True)
class RetentionCheck:
    """What retention left of a range: the part still to read, and the offsets it removed.

    ``lost`` is ``(first, last + 1)`` of the offsets retention removed from the
    range's head, or None when nothing is known to be lost.
    """

    readable: OffsetRange
    lost: tuple[int, int] | None

    @property
    def lost_count(self) -> int:
        return 0 if self.lost is None else self.lost[1] - self.lost[0]


def check_retention(offset_range: OffsetRange, earliest: int | None, *, compacted: bool) -> RetentionCheck:
    """Compare a range with the partition's oldest retained offset (pure).

    ``earliest`` is ``LiftbridgeClient.earliest_offset`` (None: the partition
    never held a message). Retention removes a log's head, so on a plain
    stream a range that starts before ``earliest`` lost ``[start, earliest)``.
    On a ``compacted`` stream gaps are normal: compaction removes superseded
    messages anywhere, the head included, and Liftbridge does not tell the two
    apart, so nothing is reported lost there (see docs/reliability.md).
    """
    if earliest is None or compacted or offset_range.count == 0 or earliest <= offset_range.start:
        return RetentionCheck(offset_range, None)
    first_kept = min(earliest, offset_range.end)
    readable = OffsetRange(offset_range.partition, first_kept, offset_range.end)
    return RetentionCheck(readable, (offset_range.start, first_kept))


def check_chosen(partitions: Iterable[int] | None, stream: str | None) -> list[int] | None:
    """A choice of partitions as given (None: all of them); an empty one is refused, since a sensor or a
    reader given it would check or read nothing and succeed at once."""
    if partitions is None:
        return None
    chosen = list(partitions)
    if not chosen:
        raise InvalidArgumentError(
            f"partitions of stream {stream!r} is empty: name at least one partition, or leave it unset for all"
        )
    return chosen


def check_partitions(partitions: Iterable[int] | None, count: int, stream: str) -> list[int]:
    """The given partitions (all ``0..count-1`` when None), each checked against the stream's count."""
    if partitions is None:
        return list(range(count))
    return [check_partition(partition, count, stream) for partition in partitions]


def check_chosen_partitions(partitions: Iterable[int] | None, count: int, stream: str) -> list[int]:
    """A user's choice of partitions (None: all ``0..count-1``): not empty (:func:`check_chosen`), and each
    one of the stream's (:func:`check_partitions`)."""
    return check_partitions(check_chosen(partitions, stream), count, stream)


def parse_instant(value: datetime | str, what: str) -> datetime:
    """An aware datetime from itself or ISO 8601 text (as ``{{ data_interval_start }}`` renders); naive
    times and anything else are refused, naming ``what``."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip())
        except ValueError:
            raise InvalidArgumentError(f"{what} must be an ISO 8601 time with a time zone, got {value!r}") from None
    if not isinstance(value, datetime):
        raise InvalidArgumentError(f"{what} must be a timezone-aware datetime or ISO 8601 text, got {value!r}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidArgumentError(f"{what} must carry a time zone (e.g. +00:00), got {value.isoformat()!r}")
    return value


def interval_start_may_be_lost(
    offset_range: OffsetRange, earliest: int | None, *, compacted: bool, start_time: int, latest_received: int | None
) -> bool:
    """A range found from times whose start is the oldest retained offset, after retention removed older
    ones: messages of the interval may have been removed (pure; times in nanoseconds since the epoch).

    Liftbridge keeps no record of removed messages' times, so this cannot be
    told from an interval that happens to begin there. An empty range there is
    safe only when the partition's latest message (``latest_received``, the
    leader's memory: None when unknown) came before ``start_time``: the
    interval then never held one.
    """
    if compacted or earliest is None or earliest == 0 or offset_range.start != earliest:
        return False
    if offset_range.count > 0:
        return True
    return latest_received is None or latest_received >= start_time


def cap_total(document: RangesDocument, max_messages: int) -> RangesDocument:
    """The document with its ranges cut at the end so they span at most ``max_messages`` offsets in all,
    shared evenly: each partition gets an equal share, what a short range leaves goes to the longer ones
    (in partition order), so no partition waits behind another's backlog (pure)."""
    if max_messages < 0:
        raise InvalidArgumentError(f"max_messages must be >= 0, got {max_messages}")
    left, counts = max_messages, {r.partition: 0 for r in document.ranges}
    waiting = [r for r in document.ranges if r.count > 0]
    while left > 0 and waiting:
        share = max(left // len(waiting), 1)
        for offset_range in list(waiting):
            taken = min(share, offset_range.count - counts[offset_range.partition], left)
            counts[offset_range.partition] += taken
            left -= taken
            if counts[offset_range.partition] == offset_range.count:
                waiting.remove(offset_range)
            if left == 0:
                break
    cut = tuple(OffsetRange(r.partition, r.start, r.start + counts[r.partition]) for r in document.ranges)
    return RangesDocument(document.stream, cut, document.cursor_id, document.metadata)


def frozen_cursor(document: RangesDocument, partition: int) -> int | None:
    """The cursor offset the freeze read for ``partition``, if the document records it."""
    return _recorded(document, FROZEN_CURSORS, partition)


def frozen_high_watermark(document: RangesDocument, partition: int) -> int | None:
    """The committed high watermark the freeze read for ``partition``, if the document records it."""
    return _recorded(document, FROZEN_HIGH_WATERMARKS, partition)


def _recorded(document: RangesDocument, key: str, partition: int) -> int | None:
    recorded = document.metadata.get(key)
    if not isinstance(recorded, Mapping) or str(partition) not in recorded:
        return None
    offset = recorded[str(partition)]
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < -1:
        raise InvalidArgumentError(f"metadata {key} of partition {partition} must be >= -1, got {offset!r}")
    return offset


class Committable(enum.Enum):
    """What the commit step may do with a non-empty range, from its partition's leader (:func:`committable`)."""

    COMMITTED = "committed"
    """The high watermark covers the range: commit."""
    MOVED_BACK = "moved back"
    """The freeze saw the range committed and the leader still holds it, but the high watermark is below it now:
    it moved back (a single replica restarted after a crash takes its last checkpoint, up to 5 s old, and
    commits again with the next message). Commit, with a warning."""
    HELD_UNCOMMITTED = "held uncommitted"
    """The leader holds the range above its high watermark and nothing says it was ever committed (the freeze
    froze past its high watermark, or the document does not record it): refuse for now, retryable."""
    NOT_HELD = "not held"
    """The freeze saw the range committed but the leader no longer holds all of it (a leader without them, a
    log truncated behind them): refuse for now, retryable (a leader change may bring them back)."""
    NEVER_HELD = "never held"
    """Neither committed when frozen nor held now (an ``end`` given past what the partition holds): no run can
    have ingested it; refuse without retries, as a retry could pass offsets published after the ingest."""


def committable(
    offset_range: OffsetRange, *, high_watermark: int, newest_offset: int, frozen: int | None
) -> Committable:
    """Whether the commit step may move a cursor to the end of a non-empty range (pure).

    ``high_watermark`` and ``newest_offset`` are the partition leader's now (after
    waiting for the commit), ``frozen`` the high watermark the freeze read
    (:func:`frozen_high_watermark`; None: not recorded). Only offsets that were
    committed can have been read, so a cursor moves past a committed high
    watermark only on the freeze's word that it covered them, and only while the
    leader still holds them (the offsets the ingest read, not new ones).
    """
    last = offset_range.last
    if last is None:
        raise InvalidArgumentError(f"partition {offset_range.partition}: the range is empty, nothing to commit")
    if last <= high_watermark:
        return Committable.COMMITTED
    seen_committed = frozen is not None and last <= frozen
    if last <= newest_offset:
        return Committable.MOVED_BACK if seen_committed else Committable.HELD_UNCOMMITTED
    return Committable.NOT_HELD if seen_committed else Committable.NEVER_HELD
