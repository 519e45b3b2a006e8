"""The cursors of a cluster as its ``__cursors`` stream records them, and what each one is (no I/O).

Liftbridge has no call that lists cursors. Every ``SetCursor`` is a message
on the compacted ``__cursors`` stream, keyed ``<cursor id>,<stream>,<partition>``
with the server's ``Cursor`` protobuf as value (``stream`` = 1, ``partition`` = 2,
``cursorId`` = 3, ``offset`` = 4), so the last message of each key is that
cursor's position. :func:`cursor_record` decodes one message, :func:`latest`
folds a read into the newest position per key, and :func:`cursor_kind` names
what the provider uses a cursor for: a position (a freeze/commit/consume
cursor or a watcher's), a consumer group's, or bookkeeping that is no position
at all (a watcher's slots and handover marks, the task state of Airflow < 3.3),
which the page counts but does not list.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from liftbridge_provider.client.groups import GROUP_CURSOR_PREFIX
from liftbridge_provider.core.watching import CursorNames
from liftbridge_provider.cursor_state import PREFIX as TASK_STATE_PREFIX

# The suffixes CursorNames adds to a watcher's cursor id: cursors that hold bookkeeping, not a position.
_SAMPLE = CursorNames(cursor_id="w")
WATCHER_SUFFIXES: tuple[str, ...] = tuple(
    name.removeprefix(_SAMPLE.cursor_id + ".")
    for name in (
        _SAMPLE.start,
        _SAMPLE.planned,
        _SAMPLE.recorded,
        _SAMPLE.slot_start(0),
        _SAMPLE.slot_end(0),
        _SAMPLE.slot_start(1),
        _SAMPLE.slot_end(1),
        _SAMPLE.handover,
        _SAMPLE.handed_by,
    )
)

CursorKey = tuple[str, str, int]  # (cursor id, stream, partition)


@dataclass(frozen=True)
class CursorRecord:
    """One cursor's position: ``offset`` is the last offset its writer processed (-1: none yet)."""

    cursor_id: str
    stream: str
    partition: int
    offset: int

    @property
    def key(self) -> CursorKey:
        return self.cursor_id, self.stream, self.partition


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """The unsigned varint at ``at`` and the index after it; ValueError when cut short or longer than 10 bytes."""
    value = shift = 0
    for index in range(at, min(at + 10, len(data))):
        byte = data[index]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, index + 1
        shift += 7
    raise ValueError("truncated varint")


def _signed64(value: int) -> int:
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def _fields(data: bytes) -> dict[int, int | bytes]:
    """The varint and length-delimited fields of a protobuf message (last one wins); ValueError if malformed."""
    fields: dict[int, int | bytes] = {}
    at = 0
    while at < len(data):
        tag, at = _varint(data, at)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            fields[number], at = _varint(data, at)
        elif wire == 2:
            size, at = _varint(data, at)
            if at + size > len(data):
                raise ValueError("truncated field")
            fields[number], at = data[at : at + size], at + size
        elif wire == 1:
            at += 8
        elif wire == 5:
            at += 4
        else:
            raise ValueError(f"wire type {wire}")
        if at > len(data):
            raise ValueError("truncated field")
    return fields


def cursor_record(key: bytes, value: bytes) -> CursorRecord | None:
    """The cursor a ``__cursors`` message sets, or None for a message that is not a cursor.

    The value's fields are used; the key (``<cursor id>,<stream>,<partition>``: a cursor id has no comma,
    a partition no comma either) fills a field the value leaves out.
    """
    try:
        fields = _fields(value)
        text = key.decode()
    except (ValueError, UnicodeDecodeError):
        return None
    cursor_id, _, rest = text.partition(",")
    stream, _, partition_text = rest.rpartition(",")
    try:
        stream_field, id_field = fields.get(1, b""), fields.get(3, b"")
        stream = stream_field.decode() if isinstance(stream_field, bytes) and stream_field else stream
        cursor_id = id_field.decode() if isinstance(id_field, bytes) and id_field else cursor_id
        partition_field = fields.get(2)
        partition = int(partition_field) if isinstance(partition_field, int) else int(partition_text or 0)
    except (ValueError, UnicodeDecodeError):
        return None
    offset = fields.get(4, 0)
    if not cursor_id or not stream or not isinstance(offset, int):
        return None
    return CursorRecord(cursor_id, stream, partition & 0x7FFFFFFF, _signed64(offset))


def latest(records: Iterable[CursorRecord | None]) -> dict[CursorKey, CursorRecord]:
    """The newest record of each cursor, from records in log order (a later one replaces an earlier one)."""
    found: dict[CursorKey, CursorRecord] = {}
    for record in records:
        if record is not None:
            found[record.key] = record
    return found


def cursor_kind(cursor_id: str, watcher_cursors: Iterable[str] = ()) -> str:
    """What the provider uses ``cursor_id`` for.

    ``"watcher"``: the position of a watcher the page knows; ``"group"``: a consumer group's positions;
    ``"cursor"``: any other position (the freeze, commit and consume operators', the message sensor's, the
    Spark stream reader's, a watcher the page does not know); ``"watcher-state"`` and ``"task-state"``:
    bookkeeping (a watcher's batch slots and handover marks, a task's state before Airflow 3.3).
    """
    watchers = set(watcher_cursors)
    if cursor_id in watchers:
        return "watcher"
    if cursor_id.startswith(f"{TASK_STATE_PREFIX}."):
        return "task-state"
    if cursor_id.startswith(GROUP_CURSOR_PREFIX):
        return "group"
    base, dot, suffix = cursor_id.rpartition(".")
    if dot and base and suffix in WATCHER_SUFFIXES:
        return "watcher-state"
    return "cursor"


POSITION_KINDS = ("watcher", "group", "cursor")


def scan_start(high_watermark: int, limit: int) -> int:
    """The first offset a scan of a ``__cursors`` partition reads: its last ``limit`` messages at most."""
    return max(0, high_watermark + 1 - limit)


def positions(found: Mapping[CursorKey, CursorRecord], watcher_cursors: Iterable[str] = ()) -> list[CursorRecord]:
    """The records that hold positions (not bookkeeping), ordered by cursor id, stream and partition."""
    watchers = set(watcher_cursors)
    return sorted(
        (r for r in found.values() if cursor_kind(r.cursor_id, watchers) in POSITION_KINDS), key=lambda r: r.key
    )
